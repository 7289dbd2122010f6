"""ControlPlane with a fake clock: placement, grants, waiting line, expiry, restore, persistence."""
from __future__ import annotations

import json

import pytest

from rollmux.model import ROLLOUT, Cluster, Job, NodeSpec, PoolSpec, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import Planner
from rollmux.runtime.control import (DONE, EXPIRED, PLACED, WAITING, ControlError, ControlPlane, DuplicateJob,
                                     JobEnded, NeverFits, NODE_ADDS_KEPT, PhaseOrderError, RequestReused)

TOKEN = "0" * 64


def submit(cp: ControlPlane, job: Job, now: float, request_id: str | None = None, token: str = TOKEN):
    return cp.submit(job, now, token, request_id)


def _cluster(nodes: int | None = 2) -> Cluster:
    return Cluster(rollout=PoolSpec("H20", 1.85, nodes=nodes), train=PoolSpec("H800", 5.28, nodes=nodes),
                   switch_cost=SwitchCost("fixed"))


def _job(job_id: str, iterations: int | None = 3, t: float = 10.0, gpus: int = 8) -> Job:
    return Job(job_id, t, t, rollout_gpus=gpus, train_gpus=gpus, slo=2.0, iterations=iterations)


def _run_phase(cp: ControlPlane, job_id: str, start: float, seconds: float) -> float:
    phase = cp.record(job_id).next_phase
    grant = cp.acquire(job_id, phase)
    assert grant is not None, f"{job_id} has no {phase} grant at {start}"
    cp.release(job_id, phase, grant.seq, seconds, start + seconds)
    return start + seconds


def test_placement_is_the_planners_decision_on_the_same_state():
    cp = ControlPlane(_cluster(None))
    mirror = PlanState(_cluster(None))
    for i, t in enumerate((10.0, 10.0, 4.0, 30.0)):
        job = _job(f"j{i}", t=t)
        expected = Planner().decide(mirror, job)
        rec = submit(cp, job, float(i))
        mirror.apply(job, expected.placement)
        assert (rec.group_id, rec.rollout_nodes, rec.train_nodes) == \
            (mirror.job_group[job.job_id], expected.placement.rollout_nodes, expected.placement.train_nodes)


def test_members_sharing_a_node_never_hold_it_together():
    cp = ControlPlane(_cluster())
    a, b = submit(cp, _job("a"), 0.0), submit(cp, _job("b"), 0.0)
    assert a.group_id == b.group_id and a.grant is not None and b.grant is None
    _run_phase(cp, "a", 0.0, 10.0)
    assert cp.record("a").grant.pool == "train" and cp.record("b").grant.pool == "rollout"
    assert set(cp.record("a").grant.nodes).isdisjoint(cp.record("b").grant.nodes)
    assert cp.acquire("b", "rollout").seq == cp.record("b").grant.seq


def test_phase_out_of_order_and_release_without_grant_are_refused():
    cp = ControlPlane(_cluster())
    submit(cp, _job("a"), 0.0)
    submit(cp, _job("b"), 0.0)
    before = json.dumps(cp.snapshot(), sort_keys=True)
    with pytest.raises(PhaseOrderError, match="out of order"):
        cp.acquire("a", "train")
    with pytest.raises(PhaseOrderError, match="no grant"):
        cp.release("b", "rollout", 1, 1.0, 1.0)
    assert json.dumps(cp.snapshot(), sort_keys=True) == before


def test_repeated_release_is_answered_once():
    cp = ControlPlane(_cluster())
    submit(cp, _job("a"), 0.0)
    seq = cp.acquire("a", "rollout").seq
    cp.release("a", "rollout", seq, 10.0, 10.0)
    snap = json.dumps(cp.snapshot(), sort_keys=True)
    cp.release("a", "rollout", seq, 10.0, 11.0)
    assert json.dumps(cp.snapshot(), sort_keys=True) == snap


def test_last_iteration_departs_and_frees_the_nodes():
    cp = ControlPlane(_cluster())
    submit(cp, _job("a", iterations=2), 0.0)
    now = 0.0
    for _ in range(4):
        now = _run_phase(cp, "a", now, 5.0)
    rec = cp.record("a")
    assert rec.state == DONE and rec.iterations_done == 2 and cp.plan.groups == {}
    assert cp.plan.free_count("rollout") == 2 and cp.plan.free_count("train") == 2
    assert rec.measured_slowdown() == pytest.approx(10.0 / 20.0)


def test_waiting_jobs_are_placed_in_order_when_nodes_free():
    cp = ControlPlane(_cluster(nodes=1))
    submit(cp, _job("a", t=10.0), 0.0)
    submit(cp, _job("b", t=10.0), 0.0)
    c, d = submit(cp, _job("c", t=30.0), 1.0), submit(cp, _job("d", t=30.0), 2.0)
    assert (c.state, d.state) == (WAITING, WAITING) and cp.waiting == ["c", "d"]
    cp.cancel("a", 3.0)
    assert cp.waiting == ["c", "d"], "b still pins the only nodes"
    cp.complete("b", 4.0)
    c, d = cp.record("c"), cp.record("d")
    assert (c.state, d.state) == (PLACED, PLACED) and c.group_id == d.group_id and cp.waiting == []
    ex = cp.executors[c.group_id]
    assert ex.order_of("c") < ex.order_of("d") and c.grant is not None and d.grant is None


def test_a_newcomer_that_fits_waits_behind_the_line_first_come_first_placed():
    """As in the simulator, strictly in order (``backfill=False``): e would pack into x's
    group now, but c (which shares with nobody) came first and cannot be placed until x
    leaves, so e waits behind c. Backfilled (the default), e passes the line into x's
    group, which takes no free node, and says so."""
    c_job = Job("c", 10.0, 10.0, rollout_gpus=16, train_gpus=16, slo=1.0, iterations=3)
    probe = ControlPlane(_cluster(nodes=2))
    submit(probe, _job("x", t=10.0, gpus=16), 0.0)
    assert submit(probe, _job("e", t=10.0), 2.0).state == PLACED  # e fits beside x
    passing = ControlPlane(_cluster(nodes=2))
    x = submit(passing, _job("x", t=10.0, gpus=16), 0.0)
    assert submit(passing, c_job, 1.0).state == WAITING
    e = submit(passing, _job("e", t=10.0), 2.0)
    assert (e.state, e.group_id, passing.waiting) == (PLACED, x.group_id, ["c"])
    assert e.explanation[0].startswith("passed the waiting line (first c, 1 waiting)")
    cp = ControlPlane(_cluster(nodes=2), backfill=False)
    submit(cp, _job("x", t=10.0, gpus=16), 0.0)
    assert submit(cp, c_job, 1.0).state == WAITING
    e = submit(cp, _job("e", t=10.0), 2.0)
    assert (e.state, e.outcome, cp.waiting) == (WAITING, "wait", ["c", "e"])
    assert e.explanation[0].startswith("behind the waiting line (1 jobs, first c)")
    cp.complete("x", 3.0)
    assert (cp.record("c").state, cp.waiting) == (PLACED, ["e"]), "c first; e shares with nobody's group"


def test_a_waiting_job_the_inventory_shrank_under_blocks_nobody():
    """c waits for 3 nodes per pool; the pools shrink to 2 (a free node removed), so c can
    never be placed: it stays in the line, says why, and e behind it is placed when x
    leaves instead of waiting behind c for ever."""
    cp = ControlPlane(_cluster(nodes=3))
    submit(cp, Job("x", 10.0, 10.0, rollout_gpus=16, train_gpus=16, slo=1.0, iterations=3), 0.0)
    assert submit(cp, Job("c", 10.0, 10.0, rollout_gpus=24, train_gpus=24, slo=1.0, iterations=3), 1.0).state == WAITING
    assert submit(cp, Job("e", 10.0, 10.0, slo=1.0, iterations=3), 2.0).state == WAITING  # behind c
    cp.reconcile(_cluster(nodes=2), 3.0)
    assert cp.waiting == ["c", "e"]
    cp.complete("x", 4.0)
    assert (cp.record("e").state, cp.waiting) == (PLACED, ["c"])
    assert cp.record("c").end_reason.startswith("never fits the inventory now")


def test_job_that_can_never_fit_is_refused_without_change():
    cp = ControlPlane(_cluster())
    before = json.dumps(cp.snapshot(), sort_keys=True)
    with pytest.raises(NeverFits) as err:
        submit(cp, _job("big", gpus=24), 0.0)
    assert err.value.field == "rollout_gpus"
    assert json.dumps(cp.snapshot(), sort_keys=True) == before


def test_duplicate_job_id_is_refused_unless_the_same_request_is_retried():
    cp = ControlPlane(_cluster())
    first = submit(cp, _job("x"), 0.0, request_id="r1")
    assert submit(cp, _job("x"), 1.0, request_id="r1") is first
    with pytest.raises(DuplicateJob):
        submit(cp, _job("x"), 1.0, request_id="r2")
    with pytest.raises(DuplicateJob):
        submit(cp, _job("x"), 1.0, request_id="r1", token="1" * 64)  # same request id, another secret


def test_a_departed_jobs_id_can_be_used_again():
    cp = ControlPlane(_cluster())
    submit(cp, _job("x"), 0.0)
    cp.complete("x", 1.0)
    first = cp.take_changes()
    assert [r["state"] for r in first.ended] == ["done"] and first.jobs_deleted == ["x"]
    again = submit(cp, _job("x"), 2.0)
    assert again.state == PLACED and again.iterations_done == 0
    changes = cp.take_changes()
    assert "x" in changes.jobs and changes.jobs_deleted == [] and changes.ended == []
    copy = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), first.ended)
    assert copy.record("x").state == PLACED


def test_expired_job_loses_its_turn():
    cp = ControlPlane(_cluster())
    submit(cp, _job("a"), 0.0)
    submit(cp, _job("b"), 0.0)
    assert cp.expire(["a", "nobody"], 6.0, "silent") == ["a"]
    assert cp.expire(["a"], 7.0, "silent") == [], "an expired job is not expired twice"
    assert cp.record("a").state == EXPIRED and cp.record("b").grant.pool == "rollout"
    assert [m.job.job_id for m in cp.plan.group_of("b").members] == ["b"]
    with pytest.raises(JobEnded) as err:
        cp.acquire("a", "rollout")
    assert err.value.state == EXPIRED


def test_restored_plane_continues_exactly_like_the_original():
    """Oracle: a restored copy and the original, driven by the same calls, make the same grants."""
    original = ControlPlane(_cluster(nodes=2))
    for job_id in ("a", "b", "c"):
        submit(original, _job(job_id, iterations=4), 0.0)
    now = _run_phase(original, "a", 0.0, 10.0)
    copy = ControlPlane.restore(json.loads(json.dumps(original.snapshot())))
    original.take_changes()
    assert {r.job_id: r.grant for r in copy.jobs.values()} == {r.job_id: r.grant for r in original.jobs.values()}
    for cp in (original, copy):
        t = now
        for _ in range(3):
            for job_id in ("b", "a", "c"):
                if cp.record(job_id).grant is not None:
                    t = _run_phase(cp, job_id, t, 7.0)
    assert copy.take_changes().events == original.take_changes().events
    assert copy.snapshot() == original.snapshot()


def test_drained_node_is_not_used_for_new_jobs():
    cp = ControlPlane(_cluster(nodes=2))
    assert cp.drain("R0", 0.0) == []
    rec = submit(cp, _job("a"), 1.0)
    assert rec.rollout_nodes == ("R1",)
    assert cp.drain("R1", 2.0) == ["a"]
    cp.complete("a", 3.0)
    assert cp.plan.free_count("rollout") == 0
    assert submit(cp, _job("b"), 4.0).state == WAITING


def test_departed_jobs_leave_the_snapshot_and_are_handed_over_once():
    cp = ControlPlane(_cluster(None))
    submit(cp, _job("a", iterations=1), 0.0)
    submit(cp, _job("b", iterations=5), 0.0)
    now = _run_phase(cp, "a", 0.0, 10.0)
    _run_phase(cp, "a", now, 10.0)
    assert cp.record("a").state == DONE
    ended = cp.take_changes().ended
    assert [r["job"]["job_id"] for r in ended] == ["a"] and cp.take_changes().ended == []
    snap = json.loads(json.dumps(cp.snapshot()))
    assert list(snap["jobs"]) == ["b"]
    copy = ControlPlane.restore(snap, ended=ended)
    assert copy.record("a").state == DONE and copy.record("a").iterations_done == 1
    assert copy.snapshot() == cp.snapshot()


def test_a_phase_longer_than_its_profile_is_flagged_and_shown():
    """Within 10% of the profile is fine; beyond it counts, is logged and survives a restore."""
    cp = ControlPlane(_cluster())
    submit(cp, _job("a", iterations=5, t=10.0), 0.0)
    t = _run_phase(cp, "a", 0.0, 10.9)  # rollout, within 10%
    t = _run_phase(cp, "a", t, 12.5)  # train, 25% over
    t = _run_phase(cp, "a", t, 11.5)  # rollout, 15% over
    rec = cp.record("a")
    assert rec.over_profile == 2 and rec.phase_max_s == {"rollout": 11.5, "train": 12.5}
    flagged = [e for e in cp.take_changes().events if e["kind"] == "over-profile"]
    assert [(e["pool"], e["detail"]["duration_s"], e["detail"]["profile_s"]) for e in flagged] == \
        [("train", 12.5, 10.0), ("rollout", 11.5, 10.0)]
    (job,) = [j for j in cp.status(t)["jobs"] if j["job_id"] == "a"]
    assert job["over_profile"] == 2 and job["profile_s"] == {"rollout": 10.0, "train": 10.0}
    again = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())))
    assert again.record("a").over_profile == 2 and again.record("a").phase_max_s == rec.phase_max_s


def test_a_phase_that_does_not_end_shows_as_overdue_in_status_and_metrics(monkeypatch):
    """A hung worker whose process still heartbeats held its grant unseen: ``over_profile``
    counts a phase only when it is released. Now a phase held beyond its profile x 1.1
    plus its switch is listed, and counted per pool at scrape time."""
    from rollmux.runtime.metrics import ServiceMetrics

    cp = ControlPlane(_cluster())
    submit(cp, _job("a", iterations=5, t=10.0), 0.0)
    grant = cp.acquire("a", ROLLOUT)
    allowed = 10.0 * 1.1 + grant.switch_s
    assert cp.overdue(grant.granted_at + allowed - 0.01) == []
    late = grant.granted_at + allowed + 5.0
    (entry,) = cp.overdue(late)
    assert entry["job_id"] == "a" and entry["pool"] == ROLLOUT and entry["seq"] == grant.seq
    assert entry["held_s"] == pytest.approx(allowed + 5.0) and entry["allowed_s"] == pytest.approx(allowed)
    assert cp.status(late)["overdue"] == [entry]
    text = ServiceMetrics(lambda: cp, lambda _: None, now=lambda: late).render().decode()
    assert 'rollmux_phases_overdue{pool="rollout"} 1.0' in text and 'rollmux_phases_overdue{pool="train"} 0.0' in text
    import io

    from rich.console import Console

    import rollmux.cli_service as cli_service

    shown = io.StringIO()
    monkeypatch.setattr(cli_service, "console", Console(file=shown, width=200))
    cli_service._print_status({**cp.status(late), "tenants": {}})
    assert f"overdue: a has held its rollout phase on {','.join(grant.nodes)} for {allowed + 5.0:,.0f} s" \
        in shown.getvalue()
    cp.release("a", ROLLOUT, grant.seq, allowed + 5.0, late)
    assert cp.overdue(late) == []


def test_a_failed_update_may_restart_its_iteration_at_the_rollout():
    """``restart`` (a framework that cannot redo an update: its batch went with the
    failure) makes the job due for its rollout, nothing counted; refused, changing
    nothing, without ``failed``, on a rollout, or for an asynchronous job."""
    cp = ControlPlane(_cluster())
    submit(cp, _job("a", iterations=3, t=10.0), 0.0)
    t = _run_phase(cp, "a", 0.0, 10.0)  # rollout
    grant = cp.acquire("a", "train")
    before = json.dumps(cp.snapshot(), sort_keys=True)
    for phase, failed in (("train", False), ("rollout", True)):
        with pytest.raises(ControlError, match="restart"):
            cp.release("a", phase, grant.seq, 1.0, t + 1.0, failed=failed, restart=True)
    assert json.dumps(cp.snapshot(), sort_keys=True) == before
    cp.release("a", "train", grant.seq, 1.0, t + 1.0, failed=True, restart=True)
    rec = cp.record("a")
    assert rec.next_phase == ROLLOUT and rec.iterations_done == 0 and rec.grant.pool == ROLLOUT
    with pytest.raises(PhaseOrderError):
        cp.acquire("a", "train")
    t = _run_phase(cp, "a", t + 1.0, 10.0)  # the iteration again: rollout, then train
    t = _run_phase(cp, "a", t, 10.0)
    assert cp.record("a").iterations_done == 1
    again = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())))
    assert again.record("a").next_phase == ROLLOUT
    submit(cp, Job("b", 10.0, 10.0, slo=2.0, iterations=3, staleness=1), t)  # (checked before its grant)
    with pytest.raises(ControlError, match="synchronous job's failed training phase"):
        cp.release("b", "train", 1, 1.0, t + 2.0, failed=True, restart=True)


def test_status_table_shows_profile_against_measured():
    from rollmux.cli_service import _vs_profile

    assert _vs_profile({"profile_s": {"rollout": 10.0, "train": 30.0}, "measured_max_s": {"rollout": 12.0},
                        "over_profile": 1}) == "12.0/- vs 10.0/30.0 (1 over)"
    assert _vs_profile({"job_id": "x"}) == "-"


def test_a_repeated_node_add_gets_the_first_answer_also_after_a_restart():
    """``request_id`` makes an add idempotent (an SDK retry after a lost answer added a
    second node to a counted pool); the same id for another add is refused, changing
    nothing; without an id every add adds a node, as before."""
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=1),
                      train=PoolSpec("H800", 5.28, nodes=1, node_list=(NodeSpec("ta", 2048.0),)),
                      switch_cost=SwitchCost("fixed"))
    cp = ControlPlane(cluster)
    first = cp.add_node("rollout", "", None, 1.0, request_id="r1")
    assert first == ("R1", []) and cp.add_node("rollout", "", None, 2.0, request_id="r1") == first
    assert cp.add_node("rollout", "R1", None, 2.0, request_id="r1") == first  # naming the node it got
    listed = cp.add_node("train", "tb", 1024.0, 1.0, request_id="t1")
    copy = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())))
    assert copy.add_node("train", "tb", 1024.0, 3.0, request_id="t1") == listed
    before = json.dumps(copy.snapshot(), sort_keys=True)
    for pool, node, mem in (("train", "", None), ("rollout", "R2", None), ("train", "tc", 1024.0),
                            ("train", "tb", None)):
        with pytest.raises(RequestReused, match="'t1' added node 'tb'"):
            copy.add_node(pool, node, mem, 3.0, request_id="t1")
    assert json.dumps(copy.snapshot(), sort_keys=True) == before
    assert copy.cluster.rollout.nodes == 2 and [n.node_id for n in copy.cluster.train.node_list] == ["ta", "tb"]
    assert copy.add_node("rollout", "", None, 3.0)[0] == "R2" and copy.add_node("rollout", "", None, 3.0)[0] == "R3"
    for i in range(NODE_ADDS_KEPT + 1):  # the oldest ids are forgotten, the newest kept
        copy.node_adds[f"x{i}"] = {"pool": "rollout", "node": "R0", "host_mem_gb": None, "placed": []}
    copy.add_node("rollout", "", None, 3.0, request_id="last")
    assert len(copy.node_adds) == NODE_ADDS_KEPT and "last" in copy.node_adds and "r1" not in copy.node_adds


def test_a_node_added_live_may_not_take_a_name_the_counted_pool_gives():
    """Rollout named by count (R0, R1), training listed: a training node called R2 would
    be a second R2 once the rollout pool grows (two jobs granted 'R2' at once, a drain
    that cannot tell them apart), so adding it is refused naming ``node_id``, and nothing
    changes; another name is added."""
    from rollmux.runtime.control import ControlError

    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2),
                      train=PoolSpec("H800", 5.28, nodes=2, node_list=(NodeSpec("ta", 2048.0), NodeSpec("tb", 2048.0))),
                      switch_cost=SwitchCost("fixed"))
    cp = ControlPlane(cluster)
    before = json.dumps(cp.snapshot(), sort_keys=True)
    for name in ("R2", "R0", "R17"):
        with pytest.raises(ControlError) as err:
            cp.add_node("train", name, None, 1.0)
        assert err.value.field == "node_id" and ("rollout pool" in err.value.reason or name == "R0")
    assert json.dumps(cp.snapshot(), sort_keys=True) == before
    cp.add_node("train", "tc", None, 1.0)
    cp.add_node("rollout", "", None, 1.0)
    assert [n.node_id for n in cp.cluster.train.node_list] == ["ta", "tb", "tc"] and cp.cluster.rollout.nodes == 3


def test_node_seconds_read_at_any_time_never_decrease_and_end_at_the_ledger():
    """``node_seconds(now)`` (what /metrics exports as the busy and idle counters) read
    between and at every change of a run: busy and provisioned-less-busy never go down,
    a phase held counts until ``now``, and once no phase is held the reading is the
    ledger itself (``busy_s``, ``provisioned_s``)."""
    cp = ControlPlane(_cluster())
    readings = []

    def read(now: float) -> None:
        busy, provisioned = cp.node_seconds(now)
        readings.append((now, {p: busy[p] for p in busy}, {p: provisioned[p] - busy[p] for p in busy}))

    submit(cp, _job("a", iterations=2), 0.0)
    read(4.0)
    submit(cp, _job("b", iterations=2), 5.0)  # a change while a's rollout is held
    now = 5.0
    for _ in range(20):
        holders = [r for r in cp.jobs.values() if r.live and r.grant is not None]
        if not holders:
            break
        rec = min(holders, key=lambda r: r.grant.granted_at)
        read(now + 1.5)
        now = _run_phase(cp, rec.job_id, now, 3.0)
        read(now)
    assert not any(r.live for r in cp.jobs.values())
    for (_, busy0, idle0), (_, busy1, idle1) in zip(readings, readings[1:]):
        for pool in busy0:
            assert busy1[pool] >= busy0[pool] - 1e-9 and idle1[pool] >= idle0[pool] - 1e-9, readings
    assert readings[0][1][ROLLOUT] == pytest.approx(4.0)  # a's rollout on one node, held since 0
    assert cp.node_seconds(now) == (cp.busy_s, cp.provisioned_s)


def test_the_busy_and_idle_counters_of_metrics_count_a_held_phase_until_the_scrape():
    """The auditor's case: a's rollout held from 0 s, a change at 3 s (b submitted), a's
    release at 6 s; scraped at 3 s and after the release, idle never went down (it read
    3.0 then 0.0 when busy counted only ended phases)."""
    from prometheus_client.parser import text_string_to_metric_families

    from rollmux.runtime.metrics import ServiceMetrics

    cp = ControlPlane(_cluster(None))
    clock = [0.0]
    metrics = ServiceMetrics(lambda: cp, lambda job_id: None, now=lambda: clock[0])

    def counters() -> dict[tuple[str, str], float]:
        return {(s.name, s.labels["pool"]): s.value for f in text_string_to_metric_families(metrics.render().decode())
                for s in f.samples if s.name.startswith("rollmux_pool_") and s.name.endswith("_total")}

    submit(cp, _job("a"), 0.0)
    clock[0] = 3.0
    submit(cp, _job("b"), 3.0)
    first = counters()
    _run_phase(cp, "a", 3.0, 3.0)
    clock[0] = 6.0
    second = counters()
    assert first[("rollmux_pool_busy_node_seconds_total", "rollout")] == pytest.approx(3.0)
    assert all(second[key] >= first[key] - 1e-9 for key in first), (first, second)


def test_job_lists_come_in_pages_and_the_tables_never_cut_an_id_short():
    """(``jobs list`` stopped at 1,000 with no way to the rest, and at 80 columns every
    128-character id ended in '...': ``cancel`` needs the whole id)"""
    import io

    from rich.console import Console

    from rollmux.cli_service import _jobs_table

    cp = ControlPlane(_cluster(None))
    ids = [f"j{i}-" + "x" * 120 + f"-{i}" for i in range(5)]
    for i, job_id in enumerate(ids):
        submit(cp, _job(job_id), float(i))
    assert [r.job_id for r in cp.list_jobs(limit=2, offset=3)] == ids[3:5]
    assert [r.job_id for r in cp.list_jobs(limit=2)] == ids[:2] and cp.list_jobs(offset=5) == []
    shown = io.StringIO()
    Console(file=shown, width=80).print(_jobs_table(cp.status(10.0)["jobs"]))
    text = shown.getvalue()
    assert "…" not in text
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.count("│") > 2)
    assert all(job_id in cells for job_id in ids), cells


def test_adding_a_counted_node_that_exists_says_so():
    cp = ControlPlane(_cluster(2))
    with pytest.raises(ControlError, match="'R1' is already a node of this cluster"):
        cp.add_node("rollout", "R1", None, 1.0)
    assert cp.add_node("rollout", "R2", None, 1.0)[0] == "R2"


@pytest.mark.parametrize("policy", ["rollmux-full", "rollmux-hedge"])
def test_a_co_located_rollout_is_busy_time_of_the_training_nodes_it_runs_on(policy):
    """(an auditor's case) a job co-located on T0: its rollout grant is on T0, and was
    booked as busy rollout-pool time, above the rollout pool's provisioned 0, so the idle
    counter of the training pool read the node idle and the rollout one fell."""
    cp = ControlPlane(_cluster(3), policy=policy)
    rec = cp.submit(Job("c", 1.0, 5.0, slo=3.0, iterations=2), 0.0, TOKEN)
    assert rec.rollout_nodes == rec.train_nodes and rec.grant.pool == ROLLOUT  # co-located: one set of nodes
    busy, provisioned = cp.node_seconds(2.0)
    assert busy == {"rollout": 0.0, "train": 2.0} and provisioned == {"rollout": 0.0, "train": 2.0}
    cp.release("c", ROLLOUT, rec.grant.seq, 2.0, 2.0)
    assert cp.busy_s == {"rollout": 0.0, "train": 2.0}


def test_an_asynchronous_job_at_solo_speed_measures_a_slowdown_of_one():
    """(an auditor's case) an asynchronous job alone, each phase released at its profile
    time, ends at n x max(R, T) + min(R, T); the live plane measured 2.0 then 1.5 against
    n x T_solo (the pipeline's fill left out), the simulator 1.0. Now 1.0 as well."""
    from rollmux.model import TRAIN

    job = Job("a", 4.0, 4.0, slo=1.5, iterations=2, staleness=1)
    cp = ControlPlane(_cluster(2))
    submit(cp, job, 0.0)
    ends = sorted([(i * 4.0, ROLLOUT) for i in (1, 2)] + [(i * 4.0 + 4.0, TRAIN) for i in (1, 2)],
                  key=lambda e: (e[0], e[1] == ROLLOUT))
    measured = []
    for at, pool in ends:
        rec = cp.jobs["a"]
        cp.release("a", pool, rec.held(pool).seq, 4.0, at)
        if pool == TRAIN:
            measured.append(rec.measured_slowdown())
    assert measured == [pytest.approx(1.0), pytest.approx(1.0)] and cp.jobs["a"].ended_at == 12.0
