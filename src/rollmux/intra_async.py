"""Steady state of a group with an asynchronous member, found by ``GroupExecutor`` itself.

Contract: ``simulate_async(key)`` returns the ``intra._Shape`` of the group ``key``
(``intra.analyze``'s memo key with each member's staleness as a 7th field), found as
``intra._simulate`` finds it for an all-synchronous group: member i is job ``str(i)``,
admitted i-th at tick 0; durations and switch seconds in integer microsecond ticks;
every phase end of an instant applied (rule 11: in any order), then one dispatch. Right
after each dispatch that started the anchor's rollout (the anchor: the member with the
largest T_roll + T_train, first on ties), the group's full state is recorded:

    running phases (member, pool, ticks left), both queues (ticks waited, order, member),
    last job per node, and per asynchronous member (r - t, f - t)

(the counters relative to t, as only their differences steer rule 10). The rule is
deterministic and its future depends on that state only, so the first repeat, at
instants t0 < t1, makes the schedule periodic with period t1 - t0; member i's iteration
is the period over the trainings it started in [t0, t1) (equal to those it ended, the
state repeating). Without a repeat within ``MAX_ITERATIONS`` starts of the anchor (or
within the step limit), each member's rate is measured over the second half of the run
(``intra._fallback``). No rollout bound (rule 12): the analysis is of a long run.
"""
from __future__ import annotations

import heapq

from rollmux.execution import GroupExecutor
from rollmux.intra import MAX_ITERATIONS, TICKS_PER_S, _fallback, _finish, _layout, _Shape
from rollmux.model import ROLLOUT, TRAIN

_SLOT = {ROLLOUT: 0, TRAIN: 1}


def simulate_async(key: tuple) -> _Shape:
    """The steady state of ``key`` (members with staleness); see the module contract."""
    n = len(key)
    layout = _layout(tuple((k[2], k[3]) for k in key))
    length = [round(k[p] * TICKS_PER_S) for k in key for p in (0, 1)]
    ex = GroupExecutor()
    for i, k in enumerate(key):
        ex.admit(str(i), tuple(map(str, k[2])), tuple(map(str, k[3])), 0,
                 round(k[4] * TICKS_PER_S), round(k[5] * TICKS_PER_S), staleness=k[6])
    anchor = max(range(n), key=lambda i: (length[2 * i] + length[2 * i + 1], -i))
    ids = [str(i) for i in range(n)]
    pipelined = [i for i in range(n) if key[i][6]]
    heap: list[tuple[int, int, str]] = []  # (end, member, pool)
    spans: list[tuple[int, str, tuple[str, ...], int, int, int]] = []
    seen: dict[tuple, tuple[int, int]] = {}
    now = starts = 0
    for step in range(4 * MAX_ITERATIONS * n + 100):
        if step:
            if not heap:
                break
            now = heap[0][0]
            while heap and heap[0][0] == now:
                _, i, pool = heapq.heappop(heap)
                ex.finish(ids[i], now, pool=pool)
        first = len(spans)
        snap = False
        for g in ex.dispatch(now):
            i = int(g.job_id)
            end = now + g.switch_s + length[2 * i + _SLOT[g.pool]]
            heapq.heappush(heap, (end, i, g.pool))
            spans.append((i, g.pool, g.nodes, now, g.switch_s, end))
            if i == anchor and g.pool == ROLLOUT:
                starts += 1
                snap = True
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
            return _finish(now - t0, iters, window, t0, length, layout)
        seen[state] = (now, first)
        if starts > MAX_ITERATIONS:
            break
    return _fallback(spans, now, n, length, layout)


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
