"""The long-tail hand-off of the execution rule (rollmux.execution, rules 6-9)."""
import importlib.util
import pathlib
import sys
from fractions import Fraction as F

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.execution import GroupExecutor
from rollmux.model import ROLLOUT, TRAIN

_spec = importlib.util.spec_from_file_location("plain_execution_rule",
                                               pathlib.Path(__file__).with_name("plain_execution_rule.py"))
plain = sys.modules["plain_execution_rule"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain)

G = 8


def drive(members, tails=None, phases=40, check=None, slices=None):
    """Run a group to ``phases`` grants with exact (Fraction) durations and the fluid rate model.

    ``members``: (job, roll, train, rollout nodes, train nodes, switch_roll, switch_train).
    ``tails``: job -> (head fraction h, keep GPUs): a full-rate rollout reports its tail
    ``h x roll`` into its body. A slice runs at its grant's share until its donor's rollout
    ends, then at full rate. Returns {(job, pool, k): (start, end)} of the k-th phase.
    """
    tails = tails or {}
    ex = GroupExecutor()
    by = {}
    for job, roll, train, rn, tn, swr, swt in members:
        by[job] = {ROLLOUT: F(roll), TRAIN: F(train)}
        ex.admit(job, rn, tn, F(0), F(swr), F(swt))
    run = {}  # job -> [pool, body_start, work_left, rate, last, k]
    tail_at = {}
    count = {}
    out = {}
    now = F(0)
    granted = 0
    while granted < phases:
        for g in ex.dispatch(now):
            granted += 1
            k = count[(g.job_id, g.pool)] = count.get((g.job_id, g.pool), -1) + 1
            body = now + g.switch_s
            run[g.job_id] = [g.pool, body, by[g.job_id][g.pool], F(g.share).limit_denominator(G), body, k]
            out[(g.job_id, g.pool, k)] = (now, None)
            if g.share < 1 and slices is not None:  # (recipient phase, donor's phase, switch, work)
                donor = ex.donor_of(g.job_id)
                slices.append(((g.job_id, g.pool, k), (donor, ROLLOUT, run[donor][5]), g.switch_s,
                               by[g.job_id][ROLLOUT]))
            if g.pool == ROLLOUT and g.share == 1 and g.job_id in tails:
                h, _ = tails[g.job_id]
                tail_at[g.job_id] = body + F(h) * by[g.job_id][ROLLOUT]
        if check:
            check(ex)
        if not run:
            break

        def end_of(r):
            t0 = max(now, r[1])
            return t0 + r[2] / r[3]
        nxt = min([end_of(r) for r in run.values()] + list(tail_at.values()))
        for r in run.values():  # progress to nxt
            t0 = max(r[4], r[1])
            if nxt > t0:
                r[2] -= r[3] * (nxt - t0)
            r[4] = max(r[4], nxt)
        now = nxt
        ended = [j for j, r in run.items() if r[2] <= 0]
        for j in ended:
            pool, *_, k = run.pop(j)
            tail_at.pop(j, None)
            promoted = ex.recipients(j) if pool == ROLLOUT else []
            ex.finish(j, now)
            out[(j, pool, k)] = (out[(j, pool, k)][0], now)
            for rcp in promoted:
                run[rcp][3] = F(1)
        for j in [j for j, t in tail_at.items() if t == now]:
            del tail_at[j]
            ex.tail(j, now, tails[j][1])
    return {k: v for k, v in out.items() if v[1] is not None}


def test_a_slice_starts_at_the_tail_and_speeds_up_when_the_donor_ends():
    # One rollout node R0 shared by A (roll 10, train 4) and B (roll 6, train 4); one
    # training node T0 shared too. A reports its tail at 8 (h = 0.8) keeping 2 of 8 GPUs.
    # Plain rule: A roll [0,10], A train [10,14], B roll [10,16], B train [16,20], A roll [16,26].
    # Tail rule: B gets the 6 freed GPUs at 8 (share 6/8): by 10 it has done 2 x 0.75 = 1.5
    # of its 6 s, the 4.5 left at full rate end at 14.5. A train [10,14] (T0 free), B train
    # [14.5,18.5], A's next rollout waits for R0 until 14.5 (plain: 16).
    members = [("A", 10, 4, ("R0",), ("T0",), 0, 0), ("B", 6, 4, ("R0",), ("T0",), 0, 0)]
    plain_run = drive(members, phases=8)
    assert plain_run[("A", ROLLOUT, 0)] == (0, 10) and plain_run[("B", ROLLOUT, 0)] == (10, 16)
    assert plain_run[("B", TRAIN, 0)] == (16, 20) and plain_run[("A", ROLLOUT, 1)][0] == 16
    got = drive(members, tails={"A": (F(8, 10), 2)}, phases=8)
    assert got[("A", ROLLOUT, 0)] == (0, 10)
    assert got[("B", ROLLOUT, 0)] == (8, F(29, 2))
    assert got[("A", TRAIN, 0)] == (10, 14)
    assert got[("B", TRAIN, 0)] == (F(29, 2), F(37, 2))
    assert got[("A", ROLLOUT, 1)][0] == F(29, 2)


def test_a_slice_that_ends_in_the_tail_is_parked_behind_its_donor():
    # B's rollout is 1 s: in the slice (share 6/8 from 8) it ends at 8 + 1/0.75 = 28/3,
    # before A's rollout ends at 10. Its training is parked until 10 and queued behind A's:
    # A train [10,14], B train [14,18], as in the plain rule (B roll [10,11], T0 busy to 14).
    # Without parking B would train [28/3, 40/3] and delay A's training to 40/3.
    members = [("A", 10, 4, ("R0",), ("T0",), 0, 0), ("B", 1, 4, ("R0",), ("T0",), 0, 0)]
    got = drive(members, tails={"A": (F(8, 10), 2)}, phases=4)
    assert got[("B", ROLLOUT, 0)] == (8, F(28, 3))
    assert got[("A", TRAIN, 0)] == (10, 14)
    assert got[("B", TRAIN, 0)] == (14, 18)


def test_a_slice_pays_the_recipients_switch_and_the_donor_pays_after_it():
    ex = GroupExecutor()
    ex.admit("A", ("R0",), ("T0",), 0, 3, 1)
    ex.admit("B", ("R0",), ("T1",), 0, 2, 1)
    assert [g.job_id for g in ex.dispatch(0)] == ["A"]
    assert ex.tail("A", 5, 1) == 7
    (g,) = ex.dispatch(5)
    assert (g.job_id, g.switch_s, g.share, g.start) == ("B", 2, 7 / 8, 5)
    assert ex.gpu_use() == {"R0": {"A": 1, "B": 7}}
    assert ex.busy_nodes() == {"R0": "A"}
    assert ex.recipients("A") == ["B"] and ex.donor_of("B") == "A"
    ex.finish("B", 6)  # the slice ends first: parked
    assert ex.queued(TRAIN) == [] and ex.gpu_use() == {"R0": {"A": 1}}
    ex.finish("A", 7)
    assert ex.queued(TRAIN) == ["A", "B"]
    assert ex.last_jobs()["R0"] == "B"  # A's weights left those GPUs: its next rollout pays


def test_a_recipient_reports_no_tail_and_a_repeat_report_frees_nothing():
    ex = GroupExecutor()
    ex.admit("A", ("R0",), ("T0",), 0)
    ex.admit("B", ("R0",), ("T1",), 0)
    ex.dispatch(0)
    assert ex.tail("A", 1, 2) == 6 and ex.tail("A", 2, 2) == 0
    ex.dispatch(2)
    assert ex.tail("B", 3, 1) == 0
    assert ex.tail("A", 3, 8) == 0


def test_no_slice_when_an_earlier_queued_phase_needs_the_node():
    # C (queued first) needs R0 and R1; R1 is busy, so C waits; B behind it gets no slice of R0.
    ex = GroupExecutor()
    ex.admit("A", ("R0",), ("T0",), 0)
    ex.admit("D", ("R1",), ("T1",), 0)
    ex.admit("C", ("R0", "R1"), ("T2",), 0)
    ex.admit("B", ("R0",), ("T3",), 0)
    assert [g.job_id for g in ex.dispatch(0)] == ["A", "D"]
    ex.tail("A", 1, 1)
    assert ex.dispatch(1) == []


def test_removing_a_donor_hands_its_nodes_to_the_running_recipient():
    ex = GroupExecutor()
    ex.admit("A", ("R0",), ("T0",), 0)
    ex.admit("B", ("R0",), ("T1",), 0)
    ex.dispatch(0)
    ex.tail("A", 1, 1)
    ex.dispatch(1)
    ex.remove("A")
    assert ex.busy_nodes() == {"R0": "B"} and ex.donor_of("B") is None
    ex.finish("B", 4)
    assert ex.busy_nodes() == {} and ex.queued(TRAIN) == ["B"]


# --- properties --------------------------------------------------------------------------

@st.composite
def groups(draw, max_jobs=4):
    n = draw(st.integers(1, max_jobs))
    rn = draw(st.integers(1, 3))
    tn = draw(st.integers(1, 3))
    members = []
    for i in range(n):
        r = draw(st.lists(st.integers(0, rn - 1), min_size=1, max_size=rn, unique=True))
        t = draw(st.lists(st.integers(0, tn - 1), min_size=1, max_size=tn, unique=True))
        members.append((f"J{i}", draw(st.integers(1, 30)), draw(st.integers(1, 30)),
                        tuple(f"R{k}" for k in sorted(r)), tuple(f"T{k}" for k in sorted(t)),
                        draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    return members


@settings(max_examples=150, deadline=None)
@given(groups(), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.booleans()), max_size=40))
def test_without_tail_reports_the_rule_is_the_plain_rule_step_for_step(members, ops):
    new, old = GroupExecutor(), plain.GroupExecutor()
    for m in members:
        for ex in (new, old):
            ex.admit(m[0], m[3], m[4], 0.0, m[5], m[6])
    now = 0.0
    for k, (pick, dt, requeue) in enumerate(ops):
        now += dt
        a, b = new.dispatch(now), old.dispatch(now)
        assert [tuple(g)[:5] for g in a] == [tuple(g) for g in b] and all(g.share == 1 for g in a)
        live = new.members()
        running = [j for j in live if new.running(j)]
        if running:
            job = running[pick % len(running)]
            if k % 7 == 6:
                new.remove(job), old.remove(job)
            else:
                assert new.finish(job, now, requeue) == old.finish(job, now, requeue)
        for view in ("busy_nodes", "last_jobs", "members"):
            assert getattr(new, view)() == getattr(old, view)()
        for pool in (ROLLOUT, TRAIN):
            assert new.queue_entries(pool) == old.queue_entries(pool)


def _capacity(ex):
    for node, use in ex.gpu_use().items():
        assert sum(use.values()) <= G, (node, use)


@settings(max_examples=150, deadline=None)
@given(groups(), st.data())
def test_with_tails_no_node_runs_more_gpus_than_it_has(members, data):
    tails = {m[0]: (F(data.draw(st.integers(1, 9))) / 10, data.draw(st.integers(1, 12))) for m in members
             if data.draw(st.booleans())}
    drive(members, tails, phases=30, check=_capacity)


@settings(max_examples=150, deadline=None)
@given(groups(), st.data())
def test_a_slice_never_ends_later_than_waiting_for_its_donor_would(members, data):
    # Rule 7's timeline: waiting, the recipient would start at the donor's rollout end with
    # the same switch and run its whole body at full rate.
    tails = {m[0]: (F(data.draw(st.integers(1, 9))) / 10, data.draw(st.integers(1, 12))) for m in members}
    slices = []
    out = drive(members, tails, phases=30, slices=slices)
    for phase, donor_phase, switch, work in slices:
        if phase in out and donor_phase in out:
            assert out[phase][1] <= out[donor_phase][1] + switch + work


def test_a_later_phase_of_the_donor_can_end_later_than_in_the_plain_rule():
    # The limit of the guarantee (docs/long_tail.md): A (roll 1, train 1) and B (roll 1,
    # train 2) share R0, train on T0 and T1; A's tail at 0.1 keeps 1 GPU. B's slice ends at
    # 1 + (1 - 0.9 x 7/8) = 1.2125 instead of 2, so B's second rollout is ready at 3.2125,
    # before A's third (ready at 4), and takes R0 first: A's third rollout runs
    # [4.2125, 5.2125] instead of [4, 5] (plain rule: both ready at 4, A first by admission).
    members = [("A", 1, 1, ("R0",), ("T0",), 0, 0), ("B", 1, 2, ("R0",), ("T1",), 0, 0)]
    base = drive(members, phases=24)
    got = drive(members, {"A": (F(1, 10), 1)}, phases=24)
    assert base[("A", ROLLOUT, 2)] == (4, 5)
    assert got[("B", ROLLOUT, 0)] == (F(1, 10), F(97, 80))
    assert got[("A", ROLLOUT, 2)] == (F(337, 80), F(417, 80))
    assert got[("B", ROLLOUT, 1)][1] < base[("B", ROLLOUT, 1)][1]


def test_a_failed_phase_is_queued_again_in_its_own_pool_also_from_a_slice():
    """``finish(failed=True)``: the job's code raised, so the phase is due again: its nodes
    are freed and the same pool queued (a plain phase, and a recipient's rollout that
    failed in its slice, which is queued at once rather than parked for a training)."""
    ex = GroupExecutor()
    ex.admit("A", ("R0",), ("T0",), 0, 0, 0)
    ex.admit("B", ("R0",), ("T0",), 0, 0, 0)
    assert [(g.job_id, g.pool) for g in ex.dispatch(0)] == [("A", ROLLOUT)]
    ex.finish("A", 1, failed=True)
    assert ex.running("A") is None and ex.queued(ROLLOUT) == ["B", "A"] and ex.queued(TRAIN) == []
    assert [(g.job_id, g.pool) for g in ex.dispatch(1)] == [("B", ROLLOUT)]
    assert ex.tail("B", 2, 2) == 6  # B's tail: A's rollout gets a slice of R0
    granted = ex.dispatch(2)
    assert [(g.job_id, g.pool, g.share) for g in granted] == [("A", ROLLOUT, 0.75)]
    ex.finish("A", 3, failed=True)
    assert ex.running("A") is None and ex.queued(ROLLOUT) == ["A"] and ex.queued(TRAIN) == []
    ex.finish("B", 4)
    assert sorted((g.job_id, g.pool) for g in ex.dispatch(4)) == [("A", ROLLOUT), ("B", TRAIN)]
