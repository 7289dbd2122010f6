"""Brute-force check of the intra-group theorem (facts section 5) against ``intra.analyze``.

Oracle (independent of ``rollmux.execution``): a *fixed-order cyclic schedule* gives
every node a cyclic order of the phases pinned to it, repeated every meta-iteration,
each job's phases once per meta-iteration. With s(v, k) the start of phase v in
meta-iteration k and d_v its duration, the earliest schedule obeys the max-plus
recurrences

    s(T_j, k) >= s(R_j, k) + d_{R_j}           (a job's training follows its rollout)
    s(R_j, k) >= s(T_j, k-1) + d_{T_j}         (its next rollout follows that training)
    s(q, k)   >= s(p, k) + d_p                  (p right before q in a node's order)
    s(first, k) >= s(last, k-1) + d_last        (the node's order wraps around)

Its steady-state period is the maximum cycle ratio of that event graph:
max over simple cycles C of sum_{v in C} d_v / (meta-iterations the cycle spans); a
cycle spanning none means the orders deadlock. ``cycle_period`` computes it exactly
with integer durations; ``simulated_slope`` runs the recurrences as a check.

Theorem under test: with one rollout node and one training node, switch cost 0, and
an unsaturated (t_load < t_cycle) or exactly full (t_load == t_cycle) group, the
round robin of ``analyze`` reaches period t_cycle, which is the minimum over all
fixed orders, so its utilizations are the maxima. Saturated groups are only checked
for period >= t_load; ``python tests/test_intra_optimality.py`` surveys them and
multi-node pinnings (results in docs/exact.md).
"""
from __future__ import annotations

import itertools
import math
import random
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.intra import MemberProfile, analyze
from rollmux.model import ROLLOUT, TRAIN

Phase = tuple[int, str]  # (job index, pool)


def _pinned(jobs: list[MemberProfile]) -> dict[str, list[Phase]]:
    """Node -> phases pinned to it, in job order."""
    on: dict[str, list[Phase]] = {}
    for j, m in enumerate(jobs):
        for n in m.rollout_nodes:
            on.setdefault(n, []).append((j, ROLLOUT))
        for n in m.train_nodes:
            on.setdefault(n, []).append((j, TRAIN))
    return on


def all_orders(jobs: list[MemberProfile]):
    """Every assignment node -> cyclic order (a permutation of the phases pinned to it)."""
    on = _pinned(jobs)
    nodes = sorted(on)
    for perms in itertools.product(*(itertools.permutations(on[n]) for n in nodes)):
        yield dict(zip(nodes, perms))


def _edges(jobs: list[MemberProfile], orders: dict[str, tuple[Phase, ...]]) -> dict[tuple[Phase, Phase], int]:
    """Event-graph edges (p, q) -> lag in meta-iterations (the smaller lag kept: it binds)."""
    edges: dict[tuple[Phase, Phase], int] = {}

    def add(p: Phase, q: Phase, lag: int) -> None:
        edges[(p, q)] = min(lag, edges.get((p, q), lag))

    for j in range(len(jobs)):
        add((j, ROLLOUT), (j, TRAIN), 0)
        add((j, TRAIN), (j, ROLLOUT), 1)
    for seq in orders.values():
        for a, b in zip(seq, seq[1:]):
            add(a, b, 0)
        add(seq[-1], seq[0], 1)
    return edges


def _duration(jobs: list[MemberProfile], phase: Phase) -> int:
    return jobs[phase[0]].t_roll if phase[1] == ROLLOUT else jobs[phase[0]].t_train


def cycle_period(jobs: list[MemberProfile], orders: dict[str, tuple[Phase, ...]]) -> Fraction | None:
    """Exact steady-state period of a fixed-order cyclic schedule; None if it deadlocks."""
    edges = _edges(jobs, orders)
    succ: dict[Phase, list[tuple[Phase, int]]] = {}
    for (p, q), lag in edges.items():
        succ.setdefault(p, []).append((q, lag))
    vertices = sorted({v for e in edges for v in e})
    rank = {v: i for i, v in enumerate(vertices)}
    best = Fraction(0)
    for s in vertices:  # simple cycles whose smallest vertex is s
        stack = [(s, 0, _duration(jobs, s), (s,))]
        while stack:
            v, lag, weight, path = stack.pop()
            for w, l in succ.get(v, ()):
                if w == s:
                    if lag + l == 0:
                        return None
                    best = max(best, Fraction(weight, lag + l))
                elif rank[w] > rank[s] and w not in path:
                    stack.append((w, lag + l, weight + _duration(jobs, w), path + (w,)))
    return best


def simulated_slope(jobs: list[MemberProfile], orders: dict[str, tuple[Phase, ...]], k: int, span: int) -> Fraction:
    """Run the recurrences for ``k`` meta-iterations; (s(v,k) - s(v,k-span)) / span, equal over v."""
    edges = _edges(jobs, orders)
    same = {(p, q) for (p, q), lag in edges.items() if lag == 0}
    order: list[Phase] = []
    left = sorted({v for e in edges for v in e})
    while left:  # topological order of the lag-0 edges
        ready = [v for v in left if not any((u, v) in same for u in left if u != v)]
        order += ready
        left = [v for v in left if v not in ready]
    history = [{v: 0 for v in order}]
    for _ in range(k):
        prev, cur = history[-1], {}
        for v in order:
            cur[v] = max([0] + [(cur if lag == 0 else prev)[p] + _duration(jobs, p)
                                for (p, q), lag in edges.items() if q == v])
        history.append(cur)
    slopes = {Fraction(history[-1][v] - history[-1 - span][v], span) for v in order}
    assert len(slopes) == 1, f"not yet periodic after {k} meta-iterations: {slopes}"
    return slopes.pop()


def single_node_group(durations: list[tuple[int, int]]) -> list[MemberProfile]:
    return [MemberProfile(f"j{i}", r, t, ("R0",), ("T0",)) for i, (r, t) in enumerate(durations)]


def min_period(jobs: list[MemberProfile]) -> Fraction:
    periods = [p for o in all_orders(jobs) if (p := cycle_period(jobs, o)) is not None]
    return min(periods)


def _loads(durations: list[tuple[int, int]]) -> tuple[int, int]:
    return max(r + t for r, t in durations), max(sum(r for r, _ in durations), sum(t for _, t in durations))


def check_theorem(durations: list[tuple[int, int]]) -> None:
    jobs = single_node_group(durations)
    cycle, load = _loads(durations)
    assert load <= cycle, "the theorem covers unsaturated and exactly-full groups only"
    a = analyze(jobs)
    best = min_period(jobs)
    assert best == cycle
    for j in jobs:
        assert a.iteration_s[j.job_id] == pytest.approx(cycle, rel=1e-9)
    for pool, total in ((ROLLOUT, sum(r for r, _ in durations)), (TRAIN, sum(t for _, t in durations))):
        most = max(Fraction(total) / p for o in all_orders(jobs) if (p := cycle_period(jobs, o)) is not None)
        assert a.utilization[pool] == pytest.approx(float(most), rel=1e-9)


durations_st = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=2, max_size=4)


def _unsaturated(durations: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Lengthen job 0 until the group is unsaturated or exactly full.

    With r_0 >= sum of the others' trainings and t_0 >= sum of the others' rollouts,
    T_solo_0 = r_0 + t_0 >= both pools' sums, so t_load <= t_cycle.
    """
    r, t = durations[0]
    others = durations[1:]
    first = (max(r, sum(x for _, x in others)), max(t, sum(x for x, _ in others)))
    return [first] + others


@settings(max_examples=40, deadline=None)
@given(durations_st)
def test_round_robin_is_optimal_when_unsaturated(durations):
    check_theorem(_unsaturated(durations))


@pytest.mark.parametrize("durations", [
    [(5, 5), (5, 5)],                   # exactly full, both pools: t_load == t_cycle
    [(10, 1), (1, 10)],                 # complementary pair
    [(12, 5), (2, 2), (3, 4)],          # one long job hides the others; rollout exactly full
    [(6, 6), (2, 1), (2, 1), (2, 1)],   # exactly full rollout pool, four jobs
    [(3, 20), (1, 1), (1, 1), (1, 1)],  # training-heavy leader; training exactly full
])
def test_round_robin_is_optimal_hand_picked(durations):
    check_theorem(durations)


@settings(max_examples=30, deadline=None)
@given(durations_st)
def test_saturated_period_at_least_t_load(durations):
    jobs = single_node_group(durations)
    cycle, load = _loads(durations)
    a = analyze(jobs)
    assert a.period >= load - 1e-9
    assert a.saturated == (load >= cycle)
    assert min_period(jobs) >= max(cycle, load)  # no fixed order beats either bound
    rates = set(round(x, 6) for x in a.iteration_s.values())
    if len(rates) == 1:  # equal rates: every node does its whole load each iteration
        assert rates.pop() >= max(cycle, load) - 1e-6


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), min_size=2, max_size=3),
       st.randoms(use_true_random=False))
def test_oracle_matches_simulation(durations, rnd):
    jobs = single_node_group(durations)
    orders = list(all_orders(jobs))
    o = rnd.choice(orders)
    span = math.lcm(*range(1, 2 * len(jobs) + 1))
    assert simulated_slope(jobs, o, 4 * span, span) == cycle_period(jobs, o)


def test_oracle_detects_deadlock():
    jobs = [MemberProfile("a", 1, 1, ("R0", "R1"), ("T0",)), MemberProfile("b", 1, 1, ("R0", "R1"), ("T0",))]
    orders = {"R0": ((0, ROLLOUT), (1, ROLLOUT)), "R1": ((1, ROLLOUT), (0, ROLLOUT)),
              "T0": ((0, TRAIN), (1, TRAIN))}
    assert cycle_period(jobs, orders) is None


def survey(samples: int, seed: int) -> None:
    """Compare analyze with the best fixed order and print the cases where it loses.

    Families: saturated and unsaturated one-node groups, and groups of 2-3 jobs on two
    rollout nodes (each job on one or both) and one training node, split by analyze's
    saturation flag. A fixed order runs every job at period P, so its max slowdown is
    P / min T_solo and its pool utilization is the pool's work / (nodes x P); the best
    order (least P) is best on all three. Analyze may run jobs at different rates, so
    it is compared on each measure separately: worst iteration time, max slowdown, and
    the utilization of each pool.
    """
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    worse: dict[str, dict[str, list]] = {}
    for _ in range(samples):
        n = rng.randint(2, 4)
        durations = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(n)]
        if rng.random() < 0.5:
            jobs = single_node_group(durations)
            family = "1R/1T"
        else:
            jobs = [MemberProfile(f"j{i}", r, t, tuple(sorted(rng.sample(["R0", "R1"], rng.randint(1, 2)))), ("T0",))
                    for i, (r, t) in enumerate(durations[:3])]
            family = "2R/1T"
        a = analyze(jobs)
        kind = f"{family}, {'saturated' if a.saturated else 'unsaturated'}"
        seen[kind] = seen.get(kind, 0) + 1
        best = float(min_period(jobs))
        nodes = {pool: len({x for m in jobs for x in m.nodes(pool)}) for pool in (ROLLOUT, TRAIN)}
        order_util = {pool: sum(m.duration(pool) * len(m.nodes(pool)) for m in jobs) / (nodes[pool] * best)
                      for pool in (ROLLOUT, TRAIN)}
        losses = {
            "worst iteration": max(a.iteration_s.values()) > best + 1e-9,
            "max slowdown": max(a.slowdown.values()) > best / min(m.t_solo for m in jobs) + 1e-9,
            "utilization": any(a.utilization[p] < order_util[p] - 1e-9 for p in (ROLLOUT, TRAIN)),
        }
        case = ([(m.t_roll, m.t_train, m.rollout_nodes) for m in jobs], a, best)
        for measure, lost in losses.items():
            if lost:
                worse.setdefault(kind, {}).setdefault(measure, []).append(case)
    for kind in sorted(seen):
        counts = ", ".join(f"{m} {len(worse.get(kind, {}).get(m, []))}"
                           for m in ("worst iteration", "max slowdown", "utilization"))
        print(f"{kind}: {seen[kind]} groups; analyze worse than the best fixed order on: {counts}")
        for measure, cases in worse.get(kind, {}).items():
            for members, a, best in cases[:3]:
                print(f"  [{measure}] {members}: iteration {[round(x, 2) for x in a.iteration_s.values()]}, "
                      f"slowdown {[round(x, 3) for x in a.slowdown.values()]}, "
                      f"U {a.utilization[ROLLOUT]:.3f}/{a.utilization[TRAIN]:.3f}; best order period {best:.2f}")


if __name__ == "__main__":
    survey(int(sys.argv[1]) if len(sys.argv) > 1 else 300, 7)
