"""Intra-group analysis: what the execution rule does to a group in steady state.

Given the members of a group (phase durations, pinning, switch seconds), ``analyze``
runs the execution rule of ``rollmux.execution`` from the moment every member is ready
for rollout, until the group's state repeats, and reports:

* ``t_cycle``  = max_j (T_roll_j + T_train_j): the longest solo iteration;
* ``t_load``   = max over nodes n of sum_{j pinned to n} T_phase_j (the pool's phase of
  j on n): the busiest node's work per meta-iteration;
* ``saturated`` when t_load >= t_cycle (such a group takes no new job, Algorithm 1);
* ``period``: the length of the repeating window the rule settles into;
* each member's steady-state iteration time (period / iterations it completes in the
  window) and slowdown against running alone (iteration time / T_solo);
* each pool's utilization: useful phase seconds / (pool nodes x period);
* the timeline of the window (every phase with its nodes, start, switch and end).

Steady state: the rule is deterministic, so once the group's full state (what runs and
for how much longer, who waits since when, which job each node ran last) seen at the
start of the anchor's rollout repeats (the anchor is the member with the longest solo
iteration, so a repeat needs the fewest snapshots), the schedule is periodic from there. The rule runs
in integer microsecond ticks (durations rounded to 1 us), so repeats are seen exactly.
If no repeat is found within
``MAX_ITERATIONS`` iterations of the anchor (or the anchor stops being served), each
member's rate is measured over the second half of the run instead.

Results are memoized on the group's shape (durations, pinning pattern with nodes
renamed by first use, switch seconds): the planner asks about the same shapes again
and again. The memo is bounded.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from rollmux.execution import GroupExecutor
from rollmux.model import POOLS, ROLLOUT, TRAIN

MAX_ITERATIONS = 60
TICKS_PER_S = 1_000_000
_MEMO_LIMIT = 200_000
_memo: dict[tuple, "_Shape"] = {}


@dataclass(slots=True, frozen=True)
class MemberProfile:
    """One member as the analysis sees it."""

    job_id: str
    t_roll: float
    t_train: float
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    switch_roll: float = 0.0
    switch_train: float = 0.0

    @property
    def t_solo(self) -> float:
        return self.t_roll + self.t_train

    def duration(self, pool: str) -> float:
        return self.t_roll if pool == ROLLOUT else self.t_train

    def nodes(self, pool: str) -> tuple[str, ...]:
        return self.rollout_nodes if pool == ROLLOUT else self.train_nodes


@dataclass(slots=True, frozen=True)
class PhaseSpan:
    job_id: str
    pool: str
    nodes: tuple[str, ...]
    start: float
    switch_s: float
    end: float


@dataclass(slots=True, frozen=True)
class GroupAnalysis:
    t_cycle: float
    t_load: float
    saturated: bool
    period: float
    iteration_s: dict[str, float]
    slowdown: dict[str, float]
    utilization: dict[str, float]
    _shape: "_Shape"
    _ids: tuple[str, ...]
    _nodes: tuple[str, ...]

    @property
    def timeline(self) -> tuple[PhaseSpan, ...]:
        """Every phase of one period, times relative to its start (built on demand)."""
        ids, names, t0, tick = self._ids, self._nodes, self._shape.t0, TICKS_PER_S
        return tuple(PhaseSpan(ids[i], pool, tuple(names[int(k)] for k in nodes), (s - t0) / tick, sw / tick,
                               (e - t0) / tick) for i, pool, nodes, s, sw, e in self._shape.window)


@dataclass(slots=True, frozen=True)
class _Shape:
    """Analysis in positional form (member index, node index), shared by equal shapes."""

    period: float
    iteration_s: tuple[float, ...]
    utilization: tuple[float, float]
    window: list[tuple[int, str, tuple[str, ...], int, int, int]]  # one period, in ticks; nodes: str(index)
    t0: int


def t_cycle(members: Sequence[MemberProfile]) -> float:
    return max(m.t_solo for m in members)


def t_load(members: Sequence[MemberProfile]) -> float:
    load: dict[str, float] = {}
    for m in members:
        for pool in POOLS:
            d = m.duration(pool)
            for n in m.nodes(pool):
                load[n] = load.get(n, 0.0) + d
    return max(load.values())


def analyze(members: Sequence[MemberProfile]) -> GroupAnalysis:
    """Steady state of the execution rule for ``members`` (admission order). O(n^2 x iterations)."""
    if not members:
        raise ValueError("a group needs at least one member")
    node_index: dict[str, int] = {}
    key_parts = []
    for m in members:
        r = tuple(node_index.setdefault(n, len(node_index)) for n in m.rollout_nodes)
        t = tuple(node_index.setdefault(n, len(node_index)) for n in m.train_nodes)
        key_parts.append((m.t_roll, m.t_train, r, t, m.switch_roll, m.switch_train))
    key = tuple(key_parts)
    shape = _memo.get(key)
    if shape is None:
        shape = _simulate(key)
        if len(_memo) >= _MEMO_LIMIT:
            _memo.clear()
        _memo[key] = shape
    ids = tuple(m.job_id for m in members)
    iteration = dict(zip(ids, shape.iteration_s))
    tc = t_cycle(members)
    tl = t_load(members)
    return GroupAnalysis(
        t_cycle=tc,
        t_load=tl,
        saturated=tl >= tc,
        period=shape.period,
        iteration_s=iteration,
        slowdown={m.job_id: iteration[m.job_id] / m.t_solo for m in members},
        utilization={ROLLOUT: shape.utilization[0], TRAIN: shape.utilization[1]},
        _shape=shape,
        _ids=ids,
        _nodes=tuple(node_index),
    )


def _ticks(seconds: float) -> int:
    return round(seconds * TICKS_PER_S)


def _simulate(key: tuple) -> _Shape:
    """Run the rule in integer microsecond ticks, so that a repeated state is seen exactly."""
    n = len(key)
    ex = GroupExecutor()
    ids = [str(i) for i in range(n)]
    index = {job_id: i for i, job_id in enumerate(ids)}
    push, pop = heapq.heappush, heapq.heappop
    for i, (_, _, r, t, sr, st) in enumerate(key):
        ex.admit(ids[i], tuple(str(x) for x in r), tuple(str(x) for x in t), 0, _ticks(sr), _ticks(st))
    dur = [{ROLLOUT: _ticks(k[0]), TRAIN: _ticks(k[1])} for k in key]
    pool_nodes = {pool: {x for k in key for x in (k[2] if pool == ROLLOUT else k[3])} for pool in POOLS}
    anchor = max(range(n), key=lambda i: (dur[i][ROLLOUT] + dur[i][TRAIN], -i))
    done = [0] * n
    spans: list[tuple[int, str, tuple[str, ...], int, int, int]] = []
    seen: dict[tuple, tuple[int, tuple[int, ...], int]] = {}
    heap: list[tuple[int, int, str]] = []  # (end, member, pool)
    now = 0
    steps = 0
    starts0 = 0
    while True:
        grants = ex.dispatch(now)
        snap = False
        for g in grants:
            i = index[g.job_id]
            end = now + g.switch_s + dur[i][g.pool]
            push(heap, (end, i, g.pool))
            spans.append((i, g.pool, g.nodes, now, g.switch_s, end))
            if i == anchor and g.pool == ROLLOUT:
                starts0 += 1
                snap = True
        if snap:
            state = _state(ex, heap, now)
            prev = seen.get(state)
            if prev is not None:
                t0, done0, span0 = prev
                iters = tuple(done[i] - done0[i] for i in range(n))
                window = [s for s in spans[span0:] if s[3] < now]
                return _finish(now - t0, iters, window, t0, dur, pool_nodes)
            seen[state] = (now, tuple(done), len(spans) - len(grants))
            if starts0 > MAX_ITERATIONS:
                break
        if not heap:
            break
        steps += 1
        if steps > 4 * MAX_ITERATIONS * n + 100:
            break
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, i, pool = pop(heap)
            ex.finish(ids[i], now)
            if pool == TRAIN:
                done[i] += 1
    return _fallback(spans, now, n, dur, pool_nodes)


def _state(ex: GroupExecutor, heap: list, now: int) -> tuple:
    running = tuple(sorted((i, pool, end - now) for end, i, pool in heap))
    queues = tuple(tuple((j, ready - now) for ready, _, j in ex.queue_entries(pool)) for pool in POOLS)
    return running, queues, tuple(sorted(ex.last_jobs().items()))


def _finish(period_ticks, iters, window, t0, dur, pool_nodes) -> _Shape:
    period = period_ticks / TICKS_PER_S
    iteration = tuple(period / k if k > 0 else float("inf") for k in iters)
    util = []
    for pool in POOLS:
        busy = sum(dur[i][pool] * len(nodes) for i, p, nodes, *_ in window if p == pool)
        util.append(busy / (len(pool_nodes[pool]) * period_ticks) if period_ticks > 0 else 0.0)
    return _Shape(period, iteration, (util[0], util[1]), window, t0)


def _fallback(spans, now, n, dur, pool_nodes) -> _Shape:
    """No repeat found: measure each member's rate over the second half of the run.

    A member's iteration time is the mean gap between its training ends in that half;
    one with fewer than two ends there is reported as starved (infinite).
    """
    half = now // 2
    window = [s for s in spans if s[3] >= half and s[5] <= now]
    ends: list[list[int]] = [[] for _ in range(n)]
    for i, pool, _, _, _, end in window:
        if pool == TRAIN:
            ends[i].append(end)
    shape = _finish(now - half, (0,) * n, window, half, dur, pool_nodes)
    iteration = tuple((e[-1] - e[0]) / (len(e) - 1) / TICKS_PER_S if len(e) > 1 else float("inf") for e in ends)
    return _Shape(shape.period, iteration, shape.utilization, shape.window, shape.t0)
