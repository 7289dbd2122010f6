"""Regroupings decided off the service's lock (``rollmux.runtime.regroup_ticket``): with
nothing in between, the plane decided apart is the simulator decision for decision, on
unbounded and bounded pools and through restores; a decision that went stale while it was
made is never carried out; deciding never touches the live plan."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rollmux.fleet import Profiles
from rollmux.fleet_file import load_fleet
from rollmux.model import Cluster, Job, SwitchCost
from rollmux.policies import make_policy
from rollmux.policies.fleet import fleet_rollmux
from rollmux.runtime.control import ControlPlane
from rollmux.runtime.regroup_ticket import MAX_TRIES, still_holds
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate
from test_bounded_regroup import _refusals, queueing
from test_live_moves import _live_replay, _moves_of

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fleet"


def _spans(r) -> list:
    return [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]


def _same(sim: list, live: list, moves: list) -> None:
    assert moves, "the trace must move jobs"
    assert sorted((j, f, t) for j, f, t, _ in moves) == sorted(_moves_of(sim))
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live, key=key) == sorted(sim, key=key)


def _fixed(jobs: list[Job]) -> list[Job]:
    for j in jobs:  # a fixed length, as the live service runs a job
        j.iterations, j.duration_s = j.solo_iterations(), None
    return jobs


def test_decided_apart_with_nothing_in_between_rollmux_hedge_is_the_simulators_through_restores():
    cluster = Cluster()
    jobs = _fixed(generate(12, seed=3, mean_interarrival_s=900.0, mean_duration_s=20_000.0))
    r = simulate(jobs, cluster, make_policy("rollmux-hedge", cluster=cluster), record_spans=True, migration_s=300.0)
    live, moves = _live_replay(jobs, cluster, 300.0, "rollmux-hedge", restore_every=3, decide_apart=True)
    _same(_spans(r), live, moves)


@pytest.mark.parametrize("name,seed", [("rollmux-hedge", 10), ("rollmux-full-regroup", 17)])
def test_decided_apart_on_bounded_pools_the_waiting_line_waits_for_the_regroupings_as_under_the_lock(name, seed):
    """Where jobs queue, the line is retried only once the regroupings a change asked for
    are decided and marked (they hold the nodes they need first, as under the lock): the
    same phases and moves as the simulator, through restores. (Retried first, the line
    took nodes that the regroupings would have held, and the runs parted.)"""
    _asked, r = _refusals(name, seed, None)
    assert any(o.placed_s > o.arrival_s for o in r.jobs), "the trace must queue"
    live, moves = _live_replay(*queueing(seed), 300.0, name, restore_every=3, decide_apart=True)
    _same(_spans(r), live, moves)


def test_decided_apart_on_a_fleet_is_the_fleet_simulators():
    fleet = load_fleet(EXAMPLE / "three_types.yaml")
    jobs = _fixed(generate(14, seed=2, mean_interarrival_s=900.0, mean_duration_s=20_000.0))
    policy = fleet_rollmux(fleet, Profiles(), "rollmux-full-regroup")
    r = simulate(jobs, fleet.views()[0].cluster, policy, record_spans=True, migration_s=300.0)
    live, moves = _live_replay(jobs, fleet, 300.0, "rollmux-full-regroup", profiles=Profiles(), decide_apart=True)
    _same(_spans(r), live, moves)


def _settle(cp: ControlPlane, now: float) -> None:
    """Decide and carry out what is asked for, as the service does with nothing in between."""
    cp.gather()
    while (ticket := cp.regroup_ticket(now)) is not None:
        cp.apply_regroups(ticket, ticket.decide(), now)


def _pair(decide_apart: bool = True) -> ControlPlane:
    """Jobs a and b alone under ``rollmux-hedge``: b's arrival asks for their gathering
    (under the lock: decided by ``gather``)."""
    cp = ControlPlane(Cluster(), policy="rollmux-hedge", decide_apart=decide_apart)
    cp.submit(Job("a", 100.0, 100.0, slo=1.5, iterations=1000, model="7B"), 0.0, "0" * 64)
    _settle(cp, 0.0)  # a alone: nobody to gather with
    cp.submit(Job("b", 100.0, 100.0, slo=1.5, iterations=1000, model="7B"), 1.0, "0" * 64)
    cp.gather()
    return cp


def _gathered(cp: ControlPlane) -> list[list[str]]:
    return sorted(sorted(m["job_id"] for m in e["group"]["members"]) for e in cp.regroups.values())


def test_a_decision_carried_out_is_the_one_made_under_the_lock_and_deciding_leaves_the_plane_alone():
    locked, apart = _pair(False), _pair()
    assert _gathered(locked) == [["a", "b"]]
    assert apart.regroups_asked and apart.regroups == {} and not apart.gathers_pending
    ticket = apart.regroup_ticket(1.0)
    before = json.dumps(apart.snapshot(), sort_keys=True)
    decided = ticket.decide()
    assert json.dumps(apart.snapshot(), sort_keys=True) == before, "decided on a copy"
    assert [sorted(m.job.job_id for g in d.plan.groups for m in g.members) for d in decided] == [["a", "b"]]
    assert apart.apply_regroups(ticket, decided, 1.0) == 1
    assert not apart.regroups_asked and _gathered(apart) == [["a", "b"]]
    strip = lambda cp: [{k: v for k, v in e.items() if k != "hold"} for e in cp.regroups.values()]  # noqa: E731
    assert strip(apart) == strip(locked)


def test_a_decision_whose_groups_changed_meanwhile_is_dropped_and_asked_for_again(caplog):
    cp = _pair()
    ticket = cp.regroup_ticket(1.0)
    decided = ticket.decide()
    assert len(decided) == 1
    cp.cancel("a", 2.0)  # a change in between: one of the groups it replaces is gone
    with caplog.at_level("INFO", logger="rollmux.service"):
        assert cp.apply_regroups(ticket, decided, 2.0) == 0
    assert cp.regroups == {}
    stale = [r for r in caplog.records if r.getMessage() == "regroup_stale"]
    assert len(stale) == 1 and stale[0].tries == 1 and stale[0].asked_again  # b's group is still there
    again = cp.regroup_ticket(3.0)
    assert again.decide() == [] and cp.apply_regroups(again, [], 3.0) == 0  # b alone: nobody left to gather
    assert not cp.regroups_asked and cp.record("b").move is None


def test_a_decision_that_no_longer_keeps_pace_is_not_carried_out():
    """Checked with the jobs' progress when it comes back: 250,000 s later each job has
    50,000 s of its SLO's allowance left, far less than its 1,000 iterations in the pair
    take, so the move that passed at 1 s is refused, and refused again when decided anew."""
    cp = _pair()
    ticket = cp.regroup_ticket(1.0)
    decided = ticket.decide()
    assert still_holds(cp.plan, decided[0], lambda k: cp._movable(k, 1.0), cp._pause)
    late = 250_000.0
    assert not still_holds(cp.plan, decided[0], lambda k: cp._movable(k, late), cp._pause)
    assert cp.apply_regroups(ticket, decided, late) == 0 and cp.regroups == {}
    again = cp.regroup_ticket(late)
    assert again.decide() == []


def test_a_stale_ask_is_decided_at_most_max_tries_times():
    cp = _pair()
    rounds = 0
    while (ticket := cp.regroup_ticket(1.0 + rounds)) is not None:
        rounds += 1
        decided = ticket.decide()
        assert len(decided) == 1
        # as if each group it replaces had changed while it was decided
        forged = [dataclasses.replace(d, seen=tuple((g, ("changed",)) for g, _ in d.seen)) for d in decided]
        assert cp.apply_regroups(ticket, forged, 1.0 + rounds) == 0
    assert rounds == MAX_TRIES and cp.regroups == {} and not cp.regroups_asked


def test_a_ticket_of_another_plane_changes_nothing():
    cp = _pair()
    ticket = cp.regroup_ticket(1.0)
    decided = ticket.decide()
    restored = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), policy="rollmux-hedge",
                                    decide_apart=True)
    before = json.dumps(restored.snapshot(), sort_keys=True)
    assert restored.apply_regroups(ticket, decided, 1.0) == 0
    assert json.dumps(restored.snapshot(), sort_keys=True) == before
    assert restored.regroups_asked  # the asks came back with the state: its own ticket decides them
    mine = restored.regroup_ticket(1.0)
    assert restored.apply_regroups(mine, mine.decide(), 1.0) == 1 and _gathered(restored) == [["a", "b"]]


def test_a_regrouping_the_policy_fails_to_decide_apart_is_logged_and_no_change_fails(caplog):
    cp = _pair()

    def broken(*args, **kw):
        raise ZeroDivisionError("float division by zero")

    cp._regroup = broken
    ticket = cp.regroup_ticket(1.0)
    with caplog.at_level("ERROR", logger="rollmux.service"):
        decided = ticket.decide()
    assert decided == []
    failed = [r for r in caplog.records if r.getMessage() == "regroup_failed"]
    assert len(failed) == 1 and failed[0].exc_info[0] is ZeroDivisionError
    assert cp.apply_regroups(ticket, decided, 1.0) == 0 and not cp.regroups_asked
    cp.report_progress("a", 0.5)


def test_a_group_asked_for_twice_is_asked_once_and_again_after_a_ticket_took_it():
    cp = _pair()
    gid = cp.record("b").group_id
    cp._plan_regroup(gid, 2.0)
    assert [a[0] for a in cp._gathers] == [gid]
    ticket = cp.regroup_ticket(2.0)
    cp._plan_regroup(gid, 3.0)  # asked again while the ticket is out: after it, for the state it changed
    assert [a[0] for a in cp._gathers] == [gid, gid]
    cp.apply_regroups(ticket, ticket.decide(), 3.0)
    assert [a[0] for a in cp._gathers] == [gid]


def _bounded(nodes: int) -> Cluster:
    base = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    return dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, nodes=nodes),
                               train=dataclasses.replace(base.train, nodes=nodes))


def _full_line(decide_apart: bool) -> ControlPlane:
    """5 + 5 nodes under ``rollmux-regroup``: four pairs, L alone, W waiting for L's nodes."""
    cp = ControlPlane(_bounded(5), policy="rollmux-regroup", decide_apart=decide_apart)
    for i in range(8):
        cp.submit(Job(f"a{i}", 20.0, 20.0, slo=1.2, iterations=10_000, model="7B"), 0.0, "0" * 64)
    for j in ("L", "W"):
        cp.submit(Job(j, 1000.0, 10.0, slo=1.01, iterations=10_000, model="7B"), 0.0, "0" * 64)
    assert cp.waiting == ["W"] and len(cp.plan.groups) == 5
    return cp


def test_the_waiting_line_waits_for_the_asks_before_it_not_for_those_made_while_they_are_decided():
    """Under the lock W is placed the moment L leaves. Decided apart, L leaves while a
    departure's regrouping is being decided: W waits for that decision only, and is placed
    when it comes back, although every round meanwhile has a new ask (the departures go on)."""
    locked = _full_line(False)
    locked.cancel("a0", 1.0)
    locked.cancel("L", 2.0)
    assert locked.waiting == []
    cp = _full_line(True)
    cp.cancel("a0", 1.0)  # asks for a regrouping of a0's group
    ticket = cp.regroup_ticket(1.0)
    cp.cancel("L", 2.0)  # frees L's nodes: the line waits for the ask above
    assert cp.waiting == ["W"]
    cp.cancel("a2", 3.0)  # a new ask while the round is out
    cp.apply_regroups(ticket, ticket.decide(), 4.0)
    assert cp.waiting == [] and cp.record("W").group_id is not None
    assert cp.regroups_asked  # a2's ask, for the next round


def test_an_ask_survives_the_member_it_was_made_for_leaving_its_group():
    """Two departures from one group before a round: the group's one ask is still decided
    (it names the group; its first member left too), and gives the regrouping the lock gives."""
    specs = {"x": (20.0, 20.0, 1.6), "y": (10.0, 10.0, 3.0), "z": (20.0, 20.0, 1.6), "v": (10.0, 30.0, 1.5)}
    planes = {}
    for apart in (False, True):
        cp = ControlPlane(Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0)), policy="rollmux-regroup",
                          decide_apart=apart)
        for name, (r, t, slo) in specs.items():
            cp.submit(Job(name, r, t, slo=slo, iterations=1000, model="7B"), 0.0, "0" * 64)
        cp.cancel("y", 10.0)
        cp.cancel("x", 11.0)
        _settle(cp, 12.0)
        planes[apart] = cp
    assert _gathered(planes[False]) == [["v", "z"]]
    assert _gathered(planes[True]) == _gathered(planes[False])


@pytest.mark.parametrize("policy,decide_apart", [("rollmux-regroup", False), ("rollmux", True)])
def test_a_retry_of_the_line_left_for_later_survives_a_restart_that_decides_otherwise(policy, decide_apart):
    """A state saved while W waited for a regrouping's decision, restored deciding under the
    lock, or under a policy that regroups nothing (its asks dropped): the first change
    retries the line, and W gets L's nodes."""
    cp = _full_line(True)
    cp.cancel("a0", 1.0)
    cp.cancel("L", 2.0)
    snap = json.loads(json.dumps(cp.snapshot()))
    assert cp.waiting == ["W"] and snap["globals"]["line_due"]["kind"] == "retry"
    back = ControlPlane.restore(snap, policy=policy, decide_apart=decide_apart)
    back.report_progress("a1", 0.5)  # any change
    assert back.waiting == [] and back.record("W").group_id is not None


def test_an_ask_made_as_a_round_finds_none_starts_the_next_round(tmp_path):
    """The service's round takes its ticket in the same batch as a submit that asks, just
    before it: the round ends with nothing asked, and the ask it missed starts the next one
    (the gathering of a and b is decided without any other change)."""
    import asyncio

    from rollmux.runtime.service import Service, ServiceConfig

    async def main() -> list[list[str]]:
        svc = Service(Cluster(), str(tmp_path / "state.db"), "t" * 40, ServiceConfig(policy="rollmux-hedge"))
        try:
            job = lambda j: Job(j, 100.0, 100.0, slo=1.5, iterations=1000, model="7B")  # noqa: E731
            await svc.mutate(lambda c, now: c.submit(job("a"), now, "0" * 64))
            for _ in range(500):
                if svc._regrouper is not None and svc._regrouper.done():
                    break
                await asyncio.sleep(0.01)
            svc._regrouper = None
            svc.kick_regroups()  # nothing asked: no round
            assert svc._regrouper is None
            svc._regrouper = asyncio.get_running_loop().create_task(svc.regroup_apart())
            svc._regrouper.add_done_callback(svc._round_over)
            # queued after the round's ticket: the same batch, just after it
            await asyncio.get_running_loop().create_task(svc.mutate(lambda c, now: c.submit(job("b"), now, "0" * 64)))
            for _ in range(500):
                if svc.control.regroups:
                    break
                await asyncio.sleep(0.01)
            return _gathered(svc.control)
        finally:
            svc.close()

    assert asyncio.run(main()) == [["a", "b"]]
