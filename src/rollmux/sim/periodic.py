"""Skipping the periods of a group whose schedule repeats (the simulator's fast-forward).

Why it is exact
---------------
Under worst-case durations a group's future depends only on its state right after a
dispatch at instant t: which phase each member runs and the seconds it has left, the two
FCFS queues (order, and how long each entry has been ready), which job each node runs and
which job each node last ran (switch costs). Phase lengths are fixed per (job, pool), and
placement decisions never read the execution state (the planner sees the plan only), so
two instants t0 < t1 with the same state (``signature``) and the same members start the
same future shifted by P = t1 - t0: the schedule is periodic with period P from t0 on,
for as long as nobody joins or leaves. In one period member j finishes d_j iterations and
the group's phases busy B_pool GPU-seconds; both repeat every period.

Member j has r_j iterations left at t1. After m more periods it has r_j - m d_j left; the
group's membership cannot change from inside before one of them finishes, so the engine
may skip any m <= k = min_j floor((r_j - 1) / d_j) periods without passing a departure
(k unbounded when departures are fixed times: those are events of their own). It skips
lazily: the group is *frozen* at t1 (its pending phase ends withdrawn) and *thawed* at
the first instant t that needs its exact state (a job admitted to it, a fixed departure of
a member, or t1 + k P): jump m = the last whole period ending before t, then replay
event by event the part of a period up to t (``Cycle.periods_before``). The same phases
start at the same offsets, so the results are those of the event-by-event run up to
floating-point rounding (t1 + m P against a sum of phase lengths; tested on the builtin
traces to 1e-9 relative).

A state is recognised by its signature with times rounded to ``DIGITS`` decimals of a second (so
that a float sum that differs in the last bit still matches); the cycle found must also
show every member progressing (d_j >= 1), else it is not used. A group keeps at most
``MAX_STATES`` states between membership changes, then starts over (a long transient
only delays the skip; it never changes the result).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rollmux.execution import GroupExecutor
from rollmux.model import POOLS

DIGITS = 6  # a microsecond
MAX_STATES = 512
#: Skip only when at least this many periods can be skipped (fewer is not worth the thaw).
MIN_PERIODS = 2


def signature(ex: GroupExecutor, now: float, ends: dict[str, float]) -> tuple:
    """The group's state right after a dispatch at ``now``, times relative to ``now``.

    ``ends``: member -> the end of the phase it runs (members not running are absent)."""
    members = ex.members()
    running = tuple((j, ex.running(j), round(ends[j] - now, DIGITS)) for j in members if ex.running(j) is not None)
    queues = tuple(tuple((round(now - ready, DIGITS), order, j) for ready, order, j in ex.queue_entries(p)) for p in POOLS)
    return (tuple(members), running, queues, tuple(sorted(ex.busy_nodes().items())),
            tuple(sorted(ex.last_jobs().items())))


@dataclass(frozen=True, slots=True)
class Cycle:
    """A group found periodic at ``t1`` with ``period`` seconds; see the module docstring.

    ``gains``: member -> iterations per period; ``busy``: GPU-seconds per period per pool
    (in ``POOLS`` order); ``periods``: how many may be skipped (None: no bound);
    ``ends``: member -> (end, pool) of the phase it ran at ``t1``."""

    t1: float
    period: float
    gains: dict[str, int]
    busy: tuple[float, ...]
    periods: int | None
    ends: dict[str, tuple[float, str]]

    def periods_before(self, t: float) -> int:
        """The most whole periods m (within ``periods``) with t1 + m x period < t."""
        m = max(0, math.ceil((t - self.t1) / self.period) - 1)
        while self.t1 + (m + 1) * self.period < t:
            m += 1
        while m > 0 and self.t1 + m * self.period >= t:
            m -= 1
        return m if self.periods is None else min(m, self.periods)

    @property
    def wake_s(self) -> float | None:
        """When the group must be thawed at the latest (None: only by an event of its own)."""
        return None if self.periods is None else self.t1 + self.periods * self.period


class CycleFinder:
    """The states a group went through since its membership last changed."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[float, dict[str, int], tuple[float, ...]]] = {}

    def reset(self) -> None:
        self._seen.clear()

    def observe(self, sig: tuple, now: float, done: dict[str, int], busy: tuple[float, ...],
                left: dict[str, int] | None, ends: dict[str, tuple[float, str]]) -> Cycle | None:
        """Record the state ``sig`` at ``now`` (``done``: iterations per member so far,
        ``busy``: the group's GPU-seconds so far per pool, ``left``: iterations each member
        has left, None when departures are fixed times). Return the cycle when ``sig`` was
        seen before and at least ``MIN_PERIODS`` periods may be skipped."""
        seen = self._seen.get(sig)
        if seen is None:
            if len(self._seen) >= MAX_STATES:
                self._seen.clear()
            self._seen[sig] = (now, dict(done), busy)
            return None
        t0, done0, busy0 = seen
        gains = {j: done[j] - done0[j] for j in done}
        if now <= t0 or min(gains.values()) < 1:
            return None
        periods = None if left is None else min((left[j] - 1) // gains[j] for j in gains)
        if periods is not None and periods < MIN_PERIODS:
            return None
        return Cycle(now, now - t0, gains, tuple(b - b0 for b, b0 in zip(busy, busy0)), periods, dict(ends))
