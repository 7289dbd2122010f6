"""Intra-group analysis: what the execution rule does to a group in steady state.

Given the members of a group (phase durations, pinning, switch seconds), ``analyze``
runs a specialised copy of the execution rule of ``rollmux.execution`` (``rollmux.kernel``, checked against
``GroupExecutor`` by tests/test_intra_kernel.py) from the moment every member is ready
for rollout, until the group's state repeats, and reports:

* ``t_cycle``  = max_j (T_roll_j + T_train_j): the longest solo iteration of a
  synchronous member (for an asynchronous one, too, the sum of its phases: the
  saturation gate below is a prune, the SLO check decides);
* ``t_load``   = max over nodes n of sum_{j pinned to n} T_phase_j (the pool's phase of
  j on n): the busiest node's work per meta-iteration;
* ``saturated`` when t_load >= t_cycle (such a group takes no new job, Algorithm 1);
* ``period``: the length of the repeating window the rule settles into;
* each member's steady-state iteration time (period / iterations it completes in the
  window) and slowdown against running alone (iteration time / T_solo, where T_solo is
  max(T_roll, T_train) for an asynchronous member: ``MemberProfile.t_solo``);
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

``worst_start`` runs the same kernel from the group's other extreme starts (each member
ready for rollout or for training, all at once) and reports each member's slowest steady
iteration: the schedule a group settles into can depend on where it starts.

A group with an asynchronous member (``staleness`` >= 1, rules 10-12 of
``rollmux.execution``) is analysed by ``rollmux.intra_async`` instead: the same search
(anchor, snapshots, integer ticks, limits, window, fallback) run by ``GroupExecutor``
itself, whose state then also holds each asynchronous member's counters. The kernel
(``rollmux.kernel``) serves all-synchronous groups only.

Members that share no node, directly or through others, never wait for each other (no
node is common, and a switch depends only on a node's own last job), so a synchronous
group whose sharing graph falls apart is analysed one connected part at a time: each
member's iteration is its part's, the period the longest part's (the wait of a newcomer
and the settling of a move happen within one part), and a pool's utilization the parts'
weighted by their nodes. Run whole, such a group repeats only once every part's
schedule lines up, often beyond ``MAX_ITERATIONS``.

Results are memoized on the group's shape (durations, pinning pattern with nodes
renamed by first use, switch seconds): the planner asks about the same shapes again
and again. The memo is bounded, as is the one of each pinning pattern's bit masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rollmux import kernel
from rollmux.kernel import TICKS_PER_S, _Shape
from rollmux.model import ROLLOUT, TRAIN


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
    staleness: int = 0
    solo_s: float | None = None  # the SLO basis when not these phases' own (a hosted member: Job.t_solo)

    @property
    def t_solo(self) -> float:
        """Steady-state solo iteration (``Job.t_solo``): R + T, or max(R, T) when asynchronous;
        ``solo_s`` when given (a member whose phases here are not its profile's)."""
        if self.solo_s is not None:
            return self.solo_s
        if self.staleness:
            return max(self.t_roll, self.t_train)
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
    period: float
    iteration_s: dict[str, float]
    slowdown: dict[str, float]
    utilization: dict[str, float]
    _shape: "_Shape"
    _ids: tuple[str, ...]
    _nodes: tuple[str, ...]
    _members: tuple[MemberProfile, ...]

    @property
    def t_cycle(self) -> float:
        """The longest member's solo iteration (``t_cycle``)."""
        return t_cycle(self._members)

    @property
    def t_load(self) -> float:
        """The busiest node's work per round (``t_load``)."""
        return t_load(self._members)

    @property
    def saturated(self) -> bool:
        """T_load >= T_cycle: the group has no bubble left (facts section 5)."""
        return self.t_load >= self.t_cycle

    @property
    def timeline(self) -> tuple[PhaseSpan, ...]:
        """Every phase of one period, times relative to its start (built on demand)."""
        ids, names, t0, tick = self._ids, self._nodes, self._shape.t0, TICKS_PER_S
        return tuple(PhaseSpan(ids[i], pool, tuple(names[int(k)] for k in nodes), (s - t0) / tick, sw / tick,
                               (e - t0) / tick) for i, pool, nodes, s, sw, e in self._shape.window)


def t_cycle(members: Sequence[MemberProfile]) -> float:
    return max(m.t_roll + m.t_train for m in members)


def t_load(members: Sequence[MemberProfile]) -> float:
    load: dict[str, float] = {}
    for m in members:
        for n in m.rollout_nodes:
            load[n] = load.get(n, 0.0) + m.t_roll
        for n in m.train_nodes:
            load[n] = load.get(n, 0.0) + m.t_train
    return max(load.values())


def analyze(members: Sequence[MemberProfile]) -> GroupAnalysis:
    """Steady state of the execution rule for ``members`` (admission order). O(n^2 x iterations)."""
    if not members:
        raise ValueError("a group needs at least one member")
    pipelined = any(m.staleness for m in members)
    key, names = kernel.key_of(members, pipelined)
    if pipelined:
        from rollmux.intra_async import simulate_async
        shape = kernel.shape_of(key, simulate_async)
    else:
        shape = kernel.shape_of(key)
    ids = tuple([m.job_id for m in members])
    iteration = dict(zip(ids, shape.iteration_s))
    return GroupAnalysis(
        period=shape.period,
        iteration_s=iteration,
        slowdown={m.job_id: iteration[m.job_id] / m.t_solo for m in members},
        utilization={ROLLOUT: shape.utilization[0], TRAIN: shape.utilization[1]},
        _shape=shape,
        _ids=ids,
        _nodes=names,
        _members=tuple(members),
    )


def sync_key(members: Sequence[MemberProfile]) -> tuple:
    """The memo key of synchronous ``members`` as ``analyze`` builds it: per member its
    durations, its nodes numbered by first use, and its switch seconds."""
    return kernel.key_of(members, False)[0]


def worst_start(members: Sequence[MemberProfile], orders: bool = False,
                limit: dict[str, float] | None = None) -> dict[str, float]:
    """Each member's slowest steady iteration over the group's starts: every member ready
    at the same instant, each for rollout or for training (2^n starts; ``analyze`` runs
    the one with all ready for rollout).

    The rule is deterministic, but the periodic schedule it settles into depends on where
    it starts: a group whose membership changes mid-rotation starts from its members'
    phases at that moment, not from all of them ready for rollout. These starts are
    the extreme ones (each member just before one of its phases).

    With ``orders``, the same over every order of the members (n! x 2^n starts), as if
    each order were the admission order. The rule breaks ties by admission order, so an
    order stands for the members becoming ready in that order an instant apart, and a
    spell of short phases can leave a group in such a state: the one cyclic order of
    trainings on a shared node that no start of the admission order leads to
    (docs/placement_space.md, "SLOs in states the check never saw"). Orders that give the
    same part the same key (equal members in each other's places) are run once.

    Either way the result bounds the schedules reachable from these starts, not every
    schedule. Synchronous members only (an asynchronous group is analysed by
    ``rollmux.intra_async``); a group falling into parts is taken part by part, and a
    member alone in its part has one schedule.

    With ``limit`` (seconds, by member id) the search stops at the first start that gives
    a member an iteration above its limit: that member's value is then above its limit
    and the others' are lower bounds. A caller that only asks whether every member stays
    within its limit gets the same answer sooner when some member does not."""
    if any(m.staleness for m in members):
        raise ValueError("worst_start takes synchronous members only")
    cap = [limit[m.job_id] for m in members] if limit is not None else None
    worst = kernel.worst_iterations(sync_key(members), orders, cap)
    return {m.job_id: w for m, w in zip(members, worst)}
