"""Live consolidation: the control plane moves jobs exactly as the simulator does, a move
survives a kill -9 at each of its steps, and a job that cannot move is never lost.

The parity oracle drives ``ControlPlane`` with the simulator's own timing (phases last
their worst-case time, a moved job acknowledges ``migration_s`` after the move) and
compares every phase (job, pool, group, nodes, start) and every move with the
simulator's record of the same trace.
"""
from __future__ import annotations

import heapq
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from loopback_server import free_port
from rollmux.colocation import worst_phase
from rollmux.model import Cluster, Job, SwitchCost
from rollmux.policies import make_policy
from rollmux.runtime.control import (PLACED, WAITING, ControlError, ControlPlane, MoveUndone,
                                     PhaseOrderError)
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate

ADMIN = "moves-admin"
ROLLMUX = str(Path(sys.executable).with_name("rollmux"))


def _live_replay(jobs: list[Job], cluster: Cluster, migration_s: float,
                 policy: str = "rollmux-consolidate", restore_every: int = 0,
                 fault: str = "", profiles=None, out: dict | None = None,
                 backfill: bool = True, reconcile: bool = False, on_step=None,
                 decide_apart: bool = False) -> tuple[list, list]:
    """Run ``jobs`` through a ControlPlane in virtual time: arrivals at their times, each
    granted phase released after its worst-case time (plus the grant's switch cost),
    each move acknowledged ``migration_s`` after it was decided. With ``restore_every``
    k, the plane is rebuilt from its persisted form (snapshot + departed records, through
    JSON) after every k-th step, as a restarted service would be. ``fault``: "cancel"
    cancels the second member (the only one, when alone) of the first regrouping as soon
    as it is decided; "fail"
    makes the first move's acknowledgement report a failure. ``cluster`` may be a fleet
    (with its ``profiles``). ``backfill``: the plane's waiting line. ``reconcile``: each
    restored plane is also reconciled with the cluster it already has, as ``rollmux serve
    --cluster`` does on a restart (which must change nothing). ``on_step(plane, now)`` is
    called after each step (it must not change the plane). ``decide_apart``: the plane
    only records the regroupings it is asked for, and each step is followed by deciding
    them on a ticket and applying them, as ``rollmux serve`` does with nothing in between
    (``rollmux.runtime.regroup_ticket``). Returns the phases
    (job, pool, group, nodes, start) and the moves (job, from, to, time); ``out["plane"]``
    gets the plane as it ends."""
    cp = ControlPlane(cluster, policy=policy, migration_s=migration_s, profiles=profiles, backfill=backfill,
                      decide_apart=decide_apart)
    ended: list[dict] = []
    steps = 0
    faults: list[str] = []
    by_id = {j.job_id: j for j in jobs}
    heap: list = []
    seq = 0
    phases, moves = [], []

    def push(at: float, kind: int, payload) -> None:
        nonlocal seq
        heapq.heappush(heap, (at, kind, seq, payload))
        seq += 1

    def collect() -> None:
        changes = cp.take_changes()
        ended.extend(changes.ended)
        for e in changes.events:
            if e["kind"] == "grant":
                group = cp.plan.groups[e["group_id"]]  # co-located: both phases on training nodes
                member = group.member(e["job_id"])  # as pinned: on a fleet, its times on the group's types
                on_train = group.colocated or member.hosted
                body, overhead = worst_phase(member.job, e["pool"], cp.cluster, on_train)
                phases.append((e["job_id"], e["pool"], e["group_id"], tuple(e["nodes"]), e["at"]))
                push(e["at"] + e["detail"]["switch_s"] + overhead + body, 0, (e["job_id"], e["pool"], e["seq"]))
            elif e["kind"] == "move":
                moves.append((e["job_id"], e["detail"]["from_group"], e["group_id"], e["at"]))
                push(e["at"] + migration_s, 2, e["job_id"])
            elif e["kind"] == "regroup" and fault == "cancel" and not faults:
                members = e["job_id"].split(",")
                faults.append(members[1] if len(members) > 1 else members[0])
                push(e["at"], 3, faults[-1])

    for j in jobs:
        push(j.arrival_s, 1, j.job_id)
    while heap:
        now, kind, _, payload = heapq.heappop(heap)
        if kind == 1:
            cp.submit(by_id[payload], now, "0" * 64)
        elif kind in (0, 2) and not cp.record(payload[0] if kind == 0 else payload).live:
            continue  # the job was cancelled meanwhile: its process would get a 410
        elif kind == 0:
            job_id, pool, grant_seq = payload
            cp.release(job_id, pool, grant_seq, 0.0, now)
        elif kind == 3:
            cp.cancel(payload, now)
        elif fault == "fail" and not faults:
            faults.append(payload)
            cp.moved(payload, now, ok=False, reason="injected")
        else:
            cp.moved(payload, now)
            assert cp.pending_move(payload) is None, "an acknowledged move is not directed again"
        while (ticket := cp.regroup_ticket(now)) is not None:
            cp.apply_regroups(ticket, ticket.decide(), now)
        collect()
        steps += 1
        if on_step is not None:
            on_step(cp, now)
        if restore_every and steps % restore_every == 0:
            cp = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), json.loads(json.dumps(ended)),
                                      policy=policy, migration_s=migration_s, backfill=backfill,
                                      decide_apart=decide_apart)
            if reconcile:
                assert cp.reconcile(cluster, now, profiles) == {"added": [], "removed": [], "changed": [],
                                                                "placed": []}
    assert all(not r.live for r in cp.jobs.values()), "every job ran to its end"
    for job in jobs:
        rec = cp.record(job.job_id)
        if job.job_id not in faults or fault == "fail":
            assert (rec.state, rec.iterations_done) == ("done", job.iterations), job.job_id
    assert cp.plan.groups == {} and cp.regroups == {}
    per_job = defaultdict(list)
    for job_id, pool, _gid, _nodes, start in phases:
        per_job[job_id].append(pool)
    for job in jobs:
        if job.job_id not in faults or fault == "fail":
            assert per_job[job.job_id] == ["rollout", "train"] * job.iterations, f"{job.job_id}: lost or repeated"
    if fault:
        assert faults, f"the fault {fault!r} never had a chance"
    if out is not None:
        out["plane"] = cp
    return phases, moves


def _sim_record(jobs: list[Job], cluster: Cluster, migration_s: float,
                policy: str = "rollmux-consolidate", backfill: bool = True) -> tuple[list, list, dict]:
    r = simulate(jobs, cluster, make_policy(policy), record_spans=True, migration_s=migration_s, backfill=backfill)
    phases = [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]
    return phases, _moves_of(phases), r.outcomes


def _moves_of(phases: list) -> list:
    """(job, from group, to group) for each change of group between a job's phases, in time order."""
    moves = []
    last_group: dict[str, str] = {}
    for job, pool, gid, _nodes, start in sorted(phases, key=lambda p: p[4]):
        if job in last_group and last_group[job] != gid:
            moves.append((job, last_group[job], gid))
        last_group[job] = gid
    return moves


@pytest.mark.parametrize("policy,seed", [("rollmux-consolidate", s) for s in (0, 3, 6, 11)]
                         + [("rollmux-regroup", s) for s in (0, 6, 11, 15)])
def test_live_moves_are_the_simulators_decision_for_decision(policy, seed):
    jobs = generate(14, seed=seed, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    sim_phases, sim_moves, outcomes = _sim_record(jobs, cluster, 300.0, policy)
    live_phases, live_moves = _live_replay(jobs, cluster, 300.0, policy)
    assert outcomes.get("repacked", 0) + outcomes.get("regrouped", 0) >= 1, "the trace must exercise a move"
    # members of one regrouped group move at one instant; the simulator's order is that of their first phases
    assert sorted((j, f, t) for j, f, t, _ in live_moves) == sorted(sim_moves)
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)


@pytest.mark.parametrize("policy,seed,every", [("rollmux-consolidate", 3, 7), ("rollmux-regroup", 11, 5),
                                               ("rollmux-regroup", 15, 3)])
def test_a_plane_restored_at_any_step_moves_exactly_as_the_simulator(policy, seed, every):
    jobs = generate(14, seed=seed, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    sim_phases, sim_moves, _ = _sim_record(jobs, cluster, 300.0, policy)
    live_phases, live_moves = _live_replay(jobs, cluster, 300.0, policy, restore_every=every)
    assert sorted((j, f, t) for j, f, t, _ in live_moves) == sorted(sim_moves)
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)


def test_a_restored_plane_charges_the_switch_on_a_node_whose_last_job_has_left():
    """With switch costs, a node last run by a job that has since moved away or departed
    makes the next job there pay its switch; the snapshot keeps each node's last job, so a
    plane restored at every third step still runs exactly as the simulator."""
    jobs = generate(14, seed=11, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    cluster = Cluster(switch_cost=SwitchCost("fixed", 5.0, 7.0))
    sim_phases, sim_moves, _ = _sim_record(jobs, cluster, 300.0, "rollmux-regroup")
    live_phases, live_moves = _live_replay(jobs, cluster, 300.0, "rollmux-regroup", restore_every=3)
    assert sorted((j, f, t) for j, f, t, _ in live_moves) == sorted(sim_moves) != []
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)


@pytest.mark.parametrize("policy,fault", [("rollmux-regroup", "cancel"), ("rollmux-regroup", "fail"),
                                           ("rollmux-consolidate", "fail")])
def test_a_member_that_leaves_or_fails_a_move_loses_nothing_for_anyone(policy, fault):
    """Every other job still runs every iteration exactly once, on nodes nobody else holds
    (the executor's rule), and the plan ends empty."""
    jobs = generate(14, seed=11, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    _live_replay(jobs, Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0)), 300.0, policy, restore_every=4,
                 fault=fault)


def _cluster() -> Cluster:
    return Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))


def _consolidation_jobs() -> list[Job]:
    """x and y share a group; z arrives alone; when y leaves, x can join z and free its nodes."""
    return [Job("x", 100, 20, slo=2.0, iterations=200), Job("y", 20, 100, slo=2.0, iterations=5),
            Job("z", 100, 20, slo=2.0, iterations=200)]


def _submit_consolidation_jobs(cp: ControlPlane) -> float:
    """Submit x, y (at 0 s) and z (at 10 s); returns the time."""
    x, y, z = _consolidation_jobs()
    cp.submit(x, 0.0, "0" * 64)
    cp.submit(y, 0.0, "1" * 64)
    cp.submit(z, 10.0, "2" * 64)
    return 10.0


def _run_until_move(cp: ControlPlane) -> float:
    """Drive the three jobs until x's move is decided; returns the time."""
    now = _submit_consolidation_jobs(cp)
    for _ in range(2000):
        if any(r.move for r in cp.jobs.values() if r.live):
            return now
        now = _drive(cp, now, 1)
    raise AssertionError("no move")


def test_a_move_is_one_persisted_step_and_admission_waits_for_the_job():
    cp = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _run_until_move(cp)
    x = cp.record("x")
    assert x.move["from_group"] != x.move["to_group"] == x.group_id == cp.record("z").group_id
    assert "x" not in cp.executors[x.group_id].members(), "not admitted before it says it arrived"
    assert cp.acquire("x", "rollout") is None
    snap = json.loads(json.dumps(cp.snapshot()))
    again = ControlPlane.restore(snap, policy="rollmux-consolidate")
    assert again.record("x").move == x.move
    for plane in (cp, again):
        plane.moved("x", now + 60.0)
        assert plane.record("x").move is None and plane.record("x").moves == 1
        assert "x" in plane.executors[plane.record("x").group_id].members()
        assert plane.move_s == {"32": 60.0} and plane.migration_seconds(Job("q", 1, 1)) == 60.0
        plane.moved("x", now + 61.0)  # a repeated acknowledgement is answered
    assert again.snapshot() == cp.snapshot()


def test_a_failed_move_places_the_job_afresh_and_loses_nothing():
    cp = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _run_until_move(cp)
    done = cp.record("x").iterations_done
    cp.moved("x", now + 5.0, ok=False, reason="state transfer failed")
    x = cp.record("x")
    assert x.move is None and x.state in (PLACED, WAITING) and x.iterations_done == done
    if x.state == PLACED:
        assert "x" in cp.executors[x.group_id].members()
    assert cp.moved("x", now + 6.0, ok=False) is x  # a repeat of the failure report is answered
    with pytest.raises(MoveUndone):  # it reported the move failed: it cannot be done now
        cp.moved("x", now + 6.0)


def test_a_move_not_acknowledged_in_time_is_undone_and_a_dead_mover_departs():
    cp = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _run_until_move(cp)
    assert cp.abort_stale_moves(now + 10.0, timeout_s=60.0) == []
    assert cp.abort_stale_moves(now + 61.0, timeout_s=60.0) == ["x"]
    assert cp.record("x").move is None
    cp2 = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _run_until_move(cp2)
    target = cp2.record("x").group_id
    cp2.expire(["x"], now + 1.0, "silent")
    assert "x" not in {m.job.job_id for g in cp2.plan.groups.values() for m in g.members}
    assert target in cp2.plan.groups  # z still runs there


def _drive(cp: ControlPlane, now: float, steps: int) -> float:
    """Release the oldest grant ``steps`` times (each phase its profiled length); returns the time."""
    for _ in range(steps):
        holders = [r for r in cp.jobs.values() if r.live and r.grant is not None]
        if not holders:
            break
        r = min(holders, key=lambda r: r.grant.granted_at)
        now = max(now, r.grant.granted_at) + (r.job.t_roll_s if r.grant.pool == "rollout" else r.job.t_train_s)
        cp.release(r.job_id, r.grant.pool, r.grant.seq, 1.0, now)
    return now


def test_a_restart_under_another_policy_drops_what_only_the_old_one_could_carry_out():
    """A state saved with a move offered (``rollmux-consolidate``), restored under
    ``rollmux``, which moves no job: the offer is dropped and every release is answered
    (it used to fail with a TypeError at the offered job's iteration boundary, on every
    retry); under ``rollmux-regroup`` it is kept. A gathering a ``rollmux-hedge`` submit
    left pending, restored under ``rollmux`` (which the fleet plane also runs): dropped.
    A two-pool state under ``rollmux-hedge`` (which plans as a fleet) and a fleet's state
    under a two-pool-only policy are refused naming ``policy``."""
    cp = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _submit_consolidation_jobs(cp)
    for _ in range(400):
        if cp.offer:
            break
        now = _drive(cp, now, 1)
    assert "x" in cp.offer
    snap = json.loads(json.dumps(cp.snapshot()))
    assert ControlPlane.restore(snap, policy="rollmux-regroup").offer == cp.offer
    plain = ControlPlane.restore(snap, policy="rollmux")
    assert plain.offer == set()
    done = plain.record("x").iterations_done
    _drive(plain, now, 40)
    assert plain.record("x").iterations_done > done and plain.record("x").moves == 0
    with pytest.raises(ControlError) as err:
        ControlPlane.restore(snap, policy="rollmux-hedge")
    assert err.value.field == "policy" and "two-pool" in err.value.reason
    hedge = ControlPlane(Cluster(), policy="rollmux-hedge")
    hedge.submit(Job("a", 100.0, 100.0, slo=1.5, iterations=1000), 0.0, "0" * 64)
    hedge.gather()
    hedge.submit(Job("b", 100.0, 100.0, slo=1.5, iterations=1000), 60.0, "1" * 64)
    assert hedge.gathers_pending
    fleet_snap = json.loads(json.dumps(hedge.snapshot()))
    again = ControlPlane.restore(fleet_snap, policy="rollmux")
    assert not again.gathers_pending
    again.report_progress("a", 0.5)  # a change, which ran the pending gatherings first
    assert again.regroups == {}
    with pytest.raises(ControlError) as err:
        ControlPlane.restore(fleet_snap, policy="rollmux-consolidate")
    assert err.value.field == "policy" and "fleet" in err.value.reason


def test_a_move_reported_done_after_it_was_undone_is_answered_undone_and_a_repeat_as_before():
    """x's move is undone (not acknowledged in 60 s); its late report of success, with
    the directive's seq or without (and after a restart), is a ``MoveUndone`` naming
    ``move`` and changes nothing. A done move's repeated report is answered with its seq
    or without; a seq that is no move of the job's is a ``PhaseOrderError``."""
    cp = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _run_until_move(cp)
    seq = cp.record("x").move["seq"]
    assert cp.abort_stale_moves(now + 61.0, timeout_s=60.0) == ["x"]
    before = json.dumps(cp.snapshot(), sort_keys=True)
    restored = ControlPlane.restore(json.loads(before), policy="rollmux-consolidate")
    for plane in (cp, restored):
        for which in (seq, None):
            with pytest.raises(MoveUndone) as err:
                plane.moved("x", now + 62.0, seq=which)
            assert err.value.field == "move" and err.value.code == "move_undone"
            assert "not acknowledged within 60s" in err.value.reason
        assert json.dumps(plane.snapshot(), sort_keys=True) == before
    done = ControlPlane(_cluster(), policy="rollmux-consolidate")
    now = _run_until_move(done)
    seq = done.record("x").move["seq"]
    done.moved("x", now + 5.0, seq=seq)
    after = json.dumps(done.snapshot(), sort_keys=True)
    assert done.moved("x", now + 6.0, seq=seq).moves == done.moved("x", now + 6.0).moves == 1
    with pytest.raises(PhaseOrderError, match=f"no move with directive seq {seq + 1000}"):
        done.moved("x", now + 7.0, seq=seq + 1000)
    assert json.dumps(done.snapshot(), sort_keys=True) == after


def test_a_regrouping_the_policy_fails_to_decide_is_logged_and_skipped_and_no_change_fails(caplog):
    """A policy whose regrouping raises (a bug): the gathering a submit left pending is
    logged as ``regroup_failed`` with the traceback and dropped; the change that ran it,
    and every later one, goes on. (A submit with phases below the analysis's microsecond
    tick did this, and every change after it failed: such phases are now refused.)"""
    cp = ControlPlane(Cluster(), policy="rollmux-hedge")
    cp.submit(Job("a", 100.0, 100.0, slo=1.5, iterations=1000), 0.0, "0" * 64)
    cp.gather()
    cp.submit(Job("b", 100.0, 100.0, slo=1.5, iterations=1000), 60.0, "1" * 64)
    assert cp.gathers_pending

    def broken(*args, **kw):
        raise ZeroDivisionError("float division by zero")

    cp._regroup = broken
    with caplog.at_level("ERROR", logger="rollmux.service"):
        cp.report_progress("a", 0.5)
    assert not cp.gathers_pending and cp.regroups == {} and cp.record("a").progress == 0.5
    failed = [r for r in caplog.records if r.getMessage() == "regroup_failed"]
    assert len(failed) == 1 and failed[0].exc_info[0] is ZeroDivisionError
    cp.report_progress("b", 0.25)


def test_an_unmovable_job_stays_where_it_is():
    cp = ControlPlane(_cluster(), policy="rollmux-consolidate")
    x, y, z = _consolidation_jobs()
    cp.submit(x, 0.0, "0" * 64, movable=False)
    cp.submit(y, 0.0, "1" * 64)
    cp.submit(z, 10.0, "2" * 64)
    now = 10.0
    for _ in range(400):
        holders = [r for r in cp.jobs.values() if r.live and r.grant is not None]
        r = min(holders, key=lambda r: r.grant.granted_at)
        now = max(now, r.grant.granted_at) + (r.job.t_roll_s if r.grant.pool == "rollout" else r.job.t_train_s)
        cp.release(r.job_id, r.grant.pool, r.grant.seq, 1.0, now)
        assert all(rec.move is None for rec in cp.jobs.values())
    assert cp.record("y").state == "done" and cp.record("x").moves == 0


# --- kill -9 at each step of a live move -----------------------------------------------

WORKER = textwrap.dedent("""
    import json, os, sys, time
    from rollmux import Client
    url, spec, out, phase_s = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    gate = sys.argv[6] if len(sys.argv) > 6 else ""
    moves = []
    job = Client(url, sys.argv[5], give_up_s=30.0, poll_s=1.0).submit(spec, on_move=lambda m: (moves.append(m), time.sleep(1.5)))
    deadline = time.monotonic() + 60
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)  # wait for the test to say the scenario is set up
    for i in range(spec["iterations"]):
        for name in ("rollout", "train"):
            with job.phase(name):
                time.sleep(phase_s[name])
    json.dump({"history": job.history, "moves": moves, "view": job.view}, open(out, "w"))
""")


def _serve(tmp: Path, port: int, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN)
    (tmp / "cluster.yaml").write_text("switch_cost_s: 0\n")
    proc = subprocess.Popen([ROLLMUX, "serve", "--cluster", str(tmp / "cluster.yaml"), "--state",
                             str(tmp / "state.db"), "--port", str(port), "--policy", "rollmux-consolidate",
                             "--migration-s", "0.5", "--lease-s", "5", "--log-file", str(tmp / "log.jsonl"), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc
        except httpx.TransportError:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read1().decode()
            time.sleep(0.1)


def _start_xyz(tmp: Path, url: str, worker: str, workers: dict) -> None:
    """x and y share a group, z starts alone (registered in that order: the scenario
    depends on it), y leaves once z is there: x is moved next to z. Each job runs
    ``worker`` (a script of the WORKER form); ``workers`` receives the processes."""
    script = tmp / "worker.py"
    script.write_text(worker)
    for name in ("x", "y", "z"):
        spec, phase_s = MOVE_SPECS[name]
        gate = [str(tmp / "z-registered")] if name == "y" else []  # y leaves only once z is there
        workers[name] = subprocess.Popen(
            [sys.executable, str(script), url, json.dumps(spec), str(tmp / f"{name}.json"),
             json.dumps(phase_s), ADMIN, *gate], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        registered = time.monotonic() + 30
        while httpx.get(f"{url}/v1/jobs/{name}", headers={"Authorization": f"Bearer {ADMIN}"}).status_code != 200:
            assert time.monotonic() < registered, f"{name} never registered"
            time.sleep(0.02)
    (tmp / "z-registered").touch()


def _every_iteration_ran(tmp: Path) -> None:
    for name, (spec, _) in MOVE_SPECS.items():
        out = json.loads((tmp / f"{name}.json").read_text())
        assert [h[0] for h in out["history"]] == ["rollout", "train"] * spec["iterations"], name
        assert out["view"]["state"] == "done"


def _wait_all(workers: dict) -> None:
    for name, w in workers.items():
        assert w.wait(90) == 0, f"{name}: {w.stderr.read().decode()[-2000:]}"


def _stop(workers: dict, proc: subprocess.Popen) -> None:
    """Kill the workers still running (after a failure) and the service."""
    for w in workers.values():
        if w.poll() is None:
            w.kill()
    proc.kill()
    proc.wait(10)


MOVE_SPECS = {"x": ({"job_id": "x", "t_roll_s": 1.0, "t_train_s": 0.2, "slo": 2.0, "iterations": 60},
                    {"rollout": 0.1, "train": 0.02}),
              "y": ({"job_id": "y", "t_roll_s": 0.2, "t_train_s": 1.0, "slo": 2.0, "iterations": 6},
                    {"rollout": 0.02, "train": 0.1}),
              "z": ({"job_id": "z", "t_roll_s": 1.0, "t_train_s": 0.2, "slo": 2.0, "iterations": 60},
                    {"rollout": 0.1, "train": 0.02})}


def test_a_job_whose_move_outlasts_the_move_timeout_goes_on_where_the_service_placed_it(tmp_path):
    """``--move-timeout-s 1`` and an ``on_move`` that takes 3 s the first time: the
    service undoes x's move before x acknowledges it; the SDK's acknowledgement is
    answered ``move_undone``, the handle lists the directive in ``undone_moves`` (not in
    ``moves``) and x runs every iteration from where the service placed it, as do y and
    z. (It used to raise out of ``phase()``.)"""
    port = free_port()
    proc = _serve(tmp_path, port, "--move-timeout-s", "1")
    worker = WORKER.replace("on_move=lambda m: (moves.append(m), time.sleep(1.5))",
                            "on_move=lambda m: (moves.append(m), time.sleep(3.0 if len(moves) == 1 else 0.1))")
    worker = worker.replace('"moves": moves,', '"moves": job.moves, "undone": job.undone_moves,')
    assert worker != WORKER
    workers: dict = {}
    try:
        _start_xyz(tmp_path, f"http://127.0.0.1:{port}", worker, workers)
        _wait_all(workers)
        events = _events(port)
    finally:
        _stop(workers, proc)
    aborted = [e for e in events if e["kind"] == "move_aborted"]
    assert aborted and aborted[0]["job_id"] == "x" and "not acknowledged within 1s" in aborted[0]["detail"]["reason"]
    _every_iteration_ran(tmp_path)
    x = json.loads((tmp_path / "x.json").read_text())
    assert len(x["undone"]) == 1 and x["undone"][0]["seq"] not in [m["seq"] for m in x["moves"]]


def _events(port: int) -> list[dict]:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/events", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
    return r.json()


@pytest.mark.parametrize("kill_at", ["move", "directive", "moved"])
def test_kill_9_at_each_step_of_a_live_move_loses_nothing(tmp_path, kill_at):
    """x and y share a group, z starts alone; y finishes and x is moved next to z. The
    service is killed right after the move is decided, while the job holds the
    directive, or right after it acknowledged; every job still runs every iteration,
    and no node is ever held by two jobs."""
    port = free_port()
    proc = _serve(tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    workers: dict = {}
    try:
        _start_xyz(tmp_path, url, WORKER, workers)
        deadline = time.monotonic() + 60
        step = {"move": "move", "directive": "move", "moved": "moved"}[kill_at]
        while not any(e["kind"] == step for e in _events(port)):
            assert time.monotonic() < deadline, "no move happened: " + "".join(
                line for line in (tmp_path / "log.jsonl").read_text().splitlines(True)
                if '"grant"' not in line and '"finish"' not in line)[-3000:]
            time.sleep(0.01)
        if kill_at == "directive":
            time.sleep(0.7)  # the job holds the directive: its state hand-off takes 1.5 s
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.5)
        proc = _serve(tmp_path, port)
        _wait_all(workers)
        events = _events(port)
    finally:
        _stop(workers, proc)
    moves = [e for e in events if e["kind"] == "moved"]
    assert [e["job_id"] for e in moves] == ["x"]
    _every_iteration_ran(tmp_path)
    x = json.loads((tmp_path / "x.json").read_text())
    assert len(x["moves"]) == 1 and x["moves"][0]["to_group"] != x["moves"][0]["from_group"]
    spans = defaultdict(list)
    for name in MOVE_SPECS:
        for _pool, nodes, _seq, start, end in json.loads((tmp_path / f"{name}.json").read_text())["history"]:
            for n in nodes:
                spans[n].append((start, end, name))
    for node, s in spans.items():
        s.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(s, s[1:]):
            assert e1 <= s2 + 0.05, f"node {node}: {j1} and {j2} overlap"


def _regrouped_pair() -> tuple[ControlPlane, float]:
    """Two jobs alone under ``rollmux-hedge``, each through one iteration: both stopped for
    the regrouping that gathers them, each holding its move directive."""
    cp = ControlPlane(Cluster(), policy="rollmux-hedge", migration_s=0.1)
    for j in ("a", "b"):
        cp.submit(Job(j, 100.0, 100.0, slo=1.5, iterations=1000, model="7B"), 0.0, "0" * 64)
    now = 1.0
    for j in ("a", "b"):
        for phase in ("rollout", "train"):
            grant = cp.acquire(j, phase)
            now += 1.0
            cp.release(j, phase, grant.seq, 1.0, now)
    assert cp.pending_move("a")["regroup"] == cp.pending_move("b")["regroup"]
    return cp, now


def test_a_regrouped_job_s_repeated_acknowledgement_is_answered_not_applied_again():
    cp, now = _regrouped_pair()
    cp.moved("a", now + 1.0)
    after_first = (json.dumps(cp.snapshot(), sort_keys=True), dict(cp.move_s))
    assert cp.record("a").move["acked"] and cp.pending_move("a") is None
    cp.moved("a", now + 30.0)  # a client retrying after a lost answer, 29 s later
    assert (json.dumps(cp.snapshot(), sort_keys=True), dict(cp.move_s)) == after_first
    with pytest.raises(PhaseOrderError, match="already reported its move done"):
        cp.moved("a", now + 31.0, ok=False, reason="a late failure report")
    assert (json.dumps(cp.snapshot(), sort_keys=True), dict(cp.move_s)) == after_first
    cp.moved("b", now + 32.0)  # the last member: the new group admits both
    group = cp.record("a").group_id
    assert group == cp.record("b").group_id and cp.record("a").move is None
    assert set(cp.executors[group].members()) == {"a", "b"}
