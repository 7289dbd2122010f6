"""Steady state of a group with an asynchronous member, found by ``GroupExecutor`` itself.

Contract: ``simulate_async(key)`` returns the ``kernel._Shape`` of the group ``key``
(``intra.analyze``'s memo key with each member's staleness as a 7th field).

One run (``_search``) is ``kernel._simulate``'s search done by ``GroupExecutor``: member i
is job ``str(i)``, admitted i-th at its admission tick (all at 0 for the base run);
durations and switch seconds in integer microsecond ticks; at each instant every phase
end is applied (rule 11: in any order), then the admissions of that instant, then one
dispatch. Once every member is admitted, right after each dispatch that started the
anchor's rollout (the anchor: the member with the largest T_roll + T_train, first on
ties), the group's full state is recorded:

    running phases (member, pool, ticks left), both queues (ticks waited, order, member),
    last job per node, and per asynchronous member (r - t, f - t)

(the counters relative to t, as only their differences steer rule 10). The rule is
deterministic and its future depends on that state only, so the first repeat, at
instants t0 < t1, makes the schedule periodic with period t1 - t0 (an *orbit*); member
i's iteration is the period over the trainings it started in [t0, t1). Without a repeat
within ``MAX_ITERATIONS`` starts of the anchor (or the step limit), each member's rate is
measured over the second half of the run (``kernel._fallback``).

Why more than one run: with an asynchronous member the orbit depends on *when* a member
joined. Measured (docs/rollart.md): an asynchronous A (R = 144.6 s, T = 422.2 s, k = 1)
and a synchronous B (R = 399.5 s, T = 96 s) sharing a rollout and a training node reach
B's solo-like orbit (547.6 s) when admitted together, but B admitted while A runs falls,
at 80 of 85 admission instants tried, into an orbit where A trains twice per B iteration
(951 s: B's slowdown 1.92). So the analysis takes every orbit it can reach by admitting
the last member (the newcomer, for the planner) into each orbit of the others
(recursively, at most ``MAX_PRIOR`` of them, the worst first) at each of up to
``MAX_OFFSETS`` instants of the others' run from their last admission to the end of their
first period, transient included: the distinct phase starts and ends and the midpoints
between them, evenly thinned. Not covered: a long transient before the orbit. In one
random mix (docs/rollart.md, "Limits") a synchronous B of 24 iterations admitted 45 s
after an asynchronous A spent its whole run in a 518.2 s pattern that settles into the
344.2 s orbit only after about 12,000 s; the planner's start-up term (one period over n)
does not cover that. It reports, per member, the worst iteration over those
orbits, the longest period, and the timeline and utilization of the orbit with the
largest slowdown (its window may be shorter than the reported period). This samples the
admission instants: it is a search, not a proof (tests/test_planner_async.py replays
random mixes with spread arrivals against the SLOs).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from rollmux.execution import GroupExecutor
from rollmux.kernel import MAX_ITERATIONS, TICKS_PER_S, _fallback, _finish, _layout, _Shape
from rollmux.model import ROLLOUT, TRAIN

_SLOT = {ROLLOUT: 0, TRAIN: 1}


MAX_PRIOR = 3
MAX_OFFSETS = 12


@dataclass(slots=True, frozen=True)
class _Orbit:
    admits: tuple[int, ...]  # admission tick per member
    shape: _Shape
    states: frozenset  # the snapshot states of one period: the orbit's identity
    worst: float  # its largest slowdown
    marks: tuple[int, ...]  # phase starts and ends from the last admission to the end of the first period


def simulate_async(key: tuple) -> _Shape:
    """The worst steady state of ``key`` over the orbits found; see the module contract."""
    orbits = _orbits(key)
    top = max(orbits, key=lambda o: o.worst)
    n = len(key)
    iteration = tuple(max(o.shape.iteration_s[i] for o in orbits) for i in range(n))
    period = max(o.shape.period for o in orbits)
    return _Shape(period, iteration, top.shape.utilization, top.shape.window, top.shape.t0)


@lru_cache(maxsize=4096)
def _orbits(key: tuple) -> tuple[_Orbit, ...]:
    """The orbits reached by admitting all at 0, and the last member into each orbit of
    the others at each of their offsets (module contract), without repeats."""
    base = _search(key, (0,) * len(key))
    if len(key) == 1:
        return (base,)
    found = {base.states: base}
    prior = sorted(_orbits(key[:-1]), key=lambda o: -o.worst)[:MAX_PRIOR]
    for other in prior:
        for tick in _offsets(other.marks):
            orbit = _search(key, other.admits + (tick,))
            found.setdefault(orbit.states, orbit)
    return tuple(found.values())


def _offsets(marks: tuple[int, ...]) -> list[int]:
    """Up to ``MAX_OFFSETS`` admission instants: ``marks`` and the midpoints between them,
    evenly thinned."""
    points = sorted(set(marks) | {(a + b) // 2 for a, b in zip(marks, marks[1:])})
    if len(points) > MAX_OFFSETS:
        points = [points[i * len(points) // MAX_OFFSETS] for i in range(MAX_OFFSETS)]
    return points


def _search(key: tuple, admits: tuple[int, ...]) -> _Orbit:
    """One run of the rule from the admissions ``admits`` (nondecreasing ticks)."""
    n = len(key)
    layout = _layout(tuple((k[2], k[3]) for k in key))
    length = [round(k[p] * TICKS_PER_S) for k in key for p in (0, 1)]
    solo = [max(1, max(length[2 * i], length[2 * i + 1]) if k[6] else length[2 * i] + length[2 * i + 1])
            for i, k in enumerate(key)]
    ex = GroupExecutor()
    anchor = max(range(n), key=lambda i: (length[2 * i] + length[2 * i + 1], -i))
    ids = [str(i) for i in range(n)]
    pipelined = [i for i in range(n) if key[i][6]]
    heap: list[tuple[int, int, str]] = []  # (end, member, pool)
    spans: list[tuple[int, str, tuple[str, ...], int, int, int]] = []
    seen: dict[tuple, tuple[int, int]] = {}
    waiting = 0  # members admitted so far
    now = starts = steps = 0
    limit = 4 * MAX_ITERATIONS * n + 100
    shape = None
    while steps <= limit:
        if waiting < n and (not heap or admits[waiting] <= heap[0][0]):
            now = admits[waiting]
        elif heap:
            now = heap[0][0]
        else:
            break
        while heap and heap[0][0] == now:
            _, i, pool = heapq.heappop(heap)
            ex.finish(ids[i], now, pool=pool)
        while waiting < n and admits[waiting] == now:
            k = key[waiting]
            ex.admit(ids[waiting], tuple(map(str, k[2])), tuple(map(str, k[3])), now,
                     round(k[4] * TICKS_PER_S), round(k[5] * TICKS_PER_S), staleness=k[6])
            waiting += 1
        first = len(spans)
        snap = False
        for g in ex.dispatch(now):
            i = int(g.job_id)
            end = now + g.switch_s + length[2 * i + _SLOT[g.pool]]
            heapq.heappush(heap, (end, i, g.pool))
            spans.append((i, g.pool, g.nodes, now, g.switch_s, end))
            if i == anchor and g.pool == ROLLOUT and waiting == n:
                starts += 1
                snap = True
        if waiting < n:
            continue
        steps += 1
        if not snap:
            continue
        state = _state(ex, heap, now, ids, pipelined)
        prev = seen.get(state)
        if prev is not None:
            t0, span0 = prev
            window = spans[span0:first]
            iters = [0] * n
            for span in window:
                if span[1] == TRAIN:
                    iters[span[0]] += 1
            shape = _finish(now - t0, iters, window, t0, length, layout)
            states = frozenset(st for st, (t, _) in seen.items() if t >= t0)
            break
        seen[state] = (now, first)
        if starts > MAX_ITERATIONS:
            break
    if shape is None:
        shape = _fallback(spans, now, n, length, layout)
        states = frozenset({("fallback", admits)})
    worst = max(it * TICKS_PER_S / s for it, s in zip(shape.iteration_s, solo))
    until = shape.t0 + max(1, round(shape.period * TICKS_PER_S))
    marks = tuple(sorted({t for span in spans for t in (span[3], span[5]) if admits[-1] <= t < until}))
    return _Orbit(admits, shape, states, worst, marks)


def _state(ex: GroupExecutor, heap: list, now: int, ids: list[str], pipelined: list[int]) -> tuple:
    """The group's full state right after a dispatch at ``now``, times relative to it."""
    counters = []
    for i in pipelined:
        r, f, t = ex.pipeline(ids[i])
        counters.append((r - t, f - t))
    return (tuple(sorted((end - now, i, pool) for end, i, pool in heap)),
            tuple((now - ready, order, job) for ready, order, job in ex.queue_entries(ROLLOUT)),
            tuple((now - ready, order, job) for ready, order, job in ex.queue_entries(TRAIN)),
            tuple(sorted(ex.last_jobs().items())), tuple(counters))
