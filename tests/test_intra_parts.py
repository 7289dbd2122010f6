"""A group whose members fall into parts that share no node is analysed part by part
(``rollmux.intra``, module contract), and that is what the execution rule does."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.execution import GroupExecutor
from rollmux.intra import MemberProfile, analyze, sync_key
from rollmux.kernel import _parts, _simulate

_member = st.tuples(st.integers(1, 300), st.integers(1, 300), st.integers(0, 1), st.integers(0, 1))


def _group(a: list, b: list, switch: tuple[float, float]) -> tuple[list[MemberProfile], list[str], list[str]]:
    """Members of part A on nodes RA*/TA*, of part B on RB*/TB*, interleaved in admission."""
    members, ids_a, ids_b = [], [], []
    for i in range(max(len(a), len(b))):
        for tag, spec, ids in (("A", a, ids_a), ("B", b, ids_b)):
            if i < len(spec):
                r, t, rn, tn = spec[i]
                job = f"{tag.lower()}{i}"
                members.append(MemberProfile(job, r + 0.37, t + 0.61, (f"R{tag}{rn}",), (f"T{tag}{tn}",), *switch))
                ids.append(job)
    return members, ids_a, ids_b


@settings(max_examples=150, deadline=None)
@given(st.lists(_member, min_size=1, max_size=3), st.lists(_member, min_size=1, max_size=3),
       st.sampled_from([(0.0, 0.0), (0.9, 4.1)]))
def test_parts_are_analysed_alone(a, b, switch):
    members, ids_a, ids_b = _group(a, b, switch)
    whole = analyze(members)
    alone = {tag: analyze([m for m in members if m.job_id in ids]) for tag, ids in (("A", ids_a), ("B", ids_b))}
    assert len(_parts(sync_key(members))) >= 2  # the kernel's key: nodes numbered by first use
    for tag, ids in (("A", ids_a), ("B", ids_b)):
        for job in ids:
            assert whole.iteration_s[job] == alone[tag].iteration_s[job]
    assert whole.period == max(x.period for x in alone.values())
    # one period of each part in the timeline, as the part alone has it
    for tag, ids in (("A", ids_a), ("B", ids_b)):
        spans = sorted((s.start, s.job_id, s.pool, s.nodes, s.end) for s in whole.timeline if s.job_id in ids)
        assert spans == sorted((s.start, s.job_id, s.pool, s.nodes, s.end) for s in alone[tag].timeline)


def test_parts_match_the_execution_rule():
    """Two parts whose periods line up only every 20,803.4 s (1,000.37 s against 225 s):
    the whole group's period is its longest part's, and each member's mean iteration
    under ``GroupExecutor`` over many periods is its part's."""
    a = MemberProfile("a", 600.0, 400.37, ("R0",), ("T0",))
    b1 = MemberProfile("b1", 120.0, 100.0, ("R1",), ("T1",), 0.9, 4.1)
    b2 = MemberProfile("b2", 90.0, 27.61, ("R1",), ("T1",), 0.9, 4.1)
    whole = analyze([a, b1, b2])
    part_b = analyze([b1, b2])
    assert whole.iteration_s["a"] == pytest.approx(1000.37)
    assert whole.iteration_s["b1"] == part_b.iteration_s["b1"]
    assert whole.period == max(1000.37, part_b.period) == pytest.approx(1000.37)
    key = tuple((m.t_roll, m.t_train, (2 * i,), (2 * i + 1,), m.switch_roll, m.switch_train)
                for i, m in enumerate((a, b1, b2)))
    key = key[:2] + ((*key[2][:2], key[1][2], key[1][3], *key[2][4:]),)
    assert _simulate(key).period == pytest.approx(20803.4)  # run whole, it repeats only then
    ex = GroupExecutor()
    switch = {m.job_id: (m.switch_roll, m.switch_train) for m in (a, b1, b2)}
    dur = {m.job_id: (m.t_roll, m.t_train) for m in (a, b1, b2)}
    for m in (a, b1, b2):
        ex.admit(m.job_id, m.rollout_nodes, m.train_nodes, 0.0, *switch[m.job_id])
    ends: dict[str, list[float]] = {k: [] for k in dur}
    running: list[tuple[float, str, str]] = []
    now = 0.0
    for _ in range(4000):
        for g in ex.dispatch(now):
            d = dur[g.job_id][0 if g.pool == "rollout" else 1]
            running.append((now + g.switch_s + d, g.job_id, g.pool))
        running.sort()
        end, job, pool = running.pop(0)
        now = end
        ex.finish(job, now, pool=pool)
        if pool == "train":
            ends[job].append(now)
    for job, times in ends.items():
        half = times[len(times) // 2:]
        mean = (half[-1] - half[0]) / (len(half) - 1)
        assert mean == pytest.approx(whole.iteration_s[job], rel=1e-6)
