"""The execution rule of a co-execution group, as a pure step machine.

This is the reference semantics that the planner's SLO check, the simulator and the
live control plane all run (one brain, several bodies). It holds no clock: callers
pass ``now`` and carry out the grants it returns.

The rule
--------
1. Each member alternates rollout -> training -> rollout ... A member admitted at time
   t becomes ready for rollout at t.
2. A phase starts only when *every* node it is pinned to in its pool is free (gang
   start). Two phases that share a node never overlap; phases on disjoint nodes may run
   at once. A co-located member is pinned to the same nodes in both pools, so its two
   phases exclude each other through those nodes.
3. Ready phases are served first come, first served per pool: ordered by the time they
   became ready, ties broken by admission order in the group. A ready phase that cannot
   start *reserves* its nodes for the rest of the pass: a later phase (in the pass order
   of rule 4) that needs any of them waits too, even if its own nodes are free. A later
   phase on other nodes still starts. So a phase waits only for the phases running on
   its nodes and those served before it, never for phases that arrived after it: without
   the reservation, a member pinned to several nodes could wait for ever while members
   pinned to some of them took turns keeping one busy (on the full Philly trace a
   4 + 4-node job with three one-node jobs on its training nodes waited 1,479 s for a
   34 s training and ran at 2.06x against an SLO of 1.70).
4. Same-instant order: the caller first applies every phase completion at instant t
   (the order among them does not matter, because the queue order above is total),
   then calls ``dispatch(t)`` once. ``dispatch`` serves the rollout queue, then the
   training queue.
5. Switch cost: when a phase starts and any of its nodes last ran a different job, the
   grant carries the member's switch seconds for that pool; the phase body begins after it. A node that only ever
   serves one job never pays.

Complexity: ``dispatch`` is O(queue length x nodes per job); groups are small.

Long-tail hand-off (``tail``; facts section 5, "long-tail migration")
----------------------------------------------------------------------
6. A running rollout of job A may report that its tail has begun (``tail(A, now,
   keep_gpus)``: the fraction of its responses done reached the threshold, 0.8 by
   default). A keeps ``keep_gpus`` of its GPUs, packed onto its rollout nodes in pinning
   order (node 1 keeps min(keep, G), node 2 the rest, ...; G = ``gpus_per_node``); the
   others are *freed*. A still owns every node it is pinned to (``busy_nodes`` is
   unchanged, so every node-granular rule above sees the same state), but the freed
   GPUs may be handed off.
7. Hand-off, at the next ``dispatch(now)``, after the rollout queue's normal pass and
   before the training queue: the rollout queue is walked in FCFS order; a queued
   rollout of B gets a slice when (a) every node B is pinned to in the rollout pool is a
   rollout node of one donor A in its tail with freed GPUs not yet handed off, and (b)
   no queued entry ahead of B (either pool) touches any of B's nodes. B then takes every
   freed GPU of its nodes and the grant carries ``share`` = min over its nodes of freed
   GPUs / G (< 1; B runs synchronously, so its slowest node sets its rate). A slice always
   pays B's switch seconds (its nodes last ran A). A recipient in a slice reports no tail
   of its own (a ``tail`` call for it is ignored and returns 0).
8. When A's rollout ends (``finish``), each recipient still running becomes the sole
   owner of its nodes (it runs at full rate from then on: the caller rescales it, see
   ``recipients``); A's other nodes are freed. A recipient whose slice ended before A's
   rollout is *parked*: its next phase is queued only when A's rollout ends, with A's end
   as its ready time and just behind A's own next phase. A node that ran a recipient
   records that recipient as its last job (A's weights were evicted from those GPUs), so
   A's next rollout there pays the switch as it would have in the plain rule.
9. ``remove`` of a donor hands its running recipients their nodes as ``finish`` does
   (parked entries are queued at ``now``); ``remove`` of a recipient returns its GPUs to
   the donor's freed pool.

Without any ``tail`` call the rule is the plain rule above, step for step: ``tail`` is the
only way into the new state, and every new branch is guarded by it (tested by
tests/test_execution_tail.py against a frozen copy of the plain rule).

Asynchronous members (``staleness``; RollArt's trajectory-level asynchrony)
-----------------------------------------------------------------------------
Math first. A member of staleness k >= 0 has started r rollouts, finished f of them and
finished t trainings (t <= f <= r). Rollout r+1 would be generated with policy version t,
while training r+1 will update version r; it is at most k versions stale iff

    r - t <= k        (k = 0: r = t, strict alternation, rule 1).

10. A member with k >= 1 (*asynchronous*) is queued in the rollout pool when it runs no
    rollout, has none queued and r - t <= k; in the training pool when it runs no
    training, has none queued and f > t (training t+1 needs rollout t+1 finished;
    trainings are sequential). Its ready time is the instant the condition became true
    (its admission, or the phase end that made it so). So it may run its rollout and its
    training at once, on its (disjoint) rollout and training nodes; a co-located member
    cannot (its two phases share nodes, rule 2). Rules 2-5 apply per phase unchanged.
11. ``finish(job, now, pool=...)`` names the phase that ended (required while an
    asynchronous member runs both). The phase ends of one instant may be applied in any
    order: both conditions of rule 10 only grow true as phases end, each pool ends at
    most one phase of a member per instant, and every entry made at ``now`` is ready at
    ``now``, so the queues after the instant are the same.
12. ``admit(..., rollouts=n)`` bounds the rollouts an asynchronous member starts (its
    remaining iterations: no rollout past its last training). An asynchronous member
    reports no tail and takes no hand-off slice (rules 6-9 are for synchronous
    members only).

With every member at k = 0 the rule is the one above, step for step: the new state lives
in ``_Slot.pipe``, None for a synchronous member, and every new branch is guarded by it.
Steady state of an asynchronous member alone (k >= 1, phases R and T, no switch: one
job): rollout i runs [(i-1) R, i R] when R >= T and training i [i R, i R + T]; when
T > R, training i runs [R + (i-1) T, R + i T]. Either way n iterations take
n max(R, T) + min(R, T): the period is max(R, T) (tests/test_execution_async.py).

Capacity: at every instant, on every node, the donor's kept GPUs plus the recipients'
GPUs are at most G (a recipient takes only freed GPUs; freed GPUs go to one recipient).
Residency: a recipient's rollout nodes are its own pinned nodes, already shared with the
donor in the plan, and the planner admits a member only if the states of *all* members
pinned to a node fit that node's host memory (``rollmux.planner`` residency check); so both
models resident on a node during a hand-off is a state the plan already allows.

Timeline rule (why the hand-off is safe for the recipient): by (b) and the FCFS order,
the plain rule would grant B those nodes at A's rollout end t_e (nothing ahead of B touches
them, and A holds them until t_e), paying the same switch. In the tail rule B starts at
t_h < t_e, pays the switch, then runs at rate ``share`` until t_e and at rate 1 after, so
B's rollout ends at or before t_e + switch + body: never later than without the hand-off.
Parking (8) keeps A's next phase ahead of B's, as in the plain rule. What the tail does
*not* guarantee in every group: a phase that ends earlier can make a later-ready phase of
a third job find its nodes busy (a list-scheduling anomaly, which the plain rule shows as
well when phases run shorter than their worst case); see docs/long_tail.md for where the
end-no-later property is proved and where it is tested.
"""
from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from typing import NamedTuple

from rollmux.model import POOLS, ROLLOUT, TRAIN


class Grant(NamedTuple):
    """Start ``pool`` phase of ``job_id`` on ``nodes`` at ``start``; body begins after ``switch_s``.

    A named tuple: the planner's analysis creates millions of these."""

    job_id: str
    pool: str
    nodes: tuple[str, ...]
    start: float
    switch_s: float
    share: float = 1.0  # < 1: a hand-off slice (rule 7), at this fraction of the nodes' rate


@dataclass(slots=True)
class _Tail:
    """A donor's rollout in its tail: GPUs kept and still freed per node, who got slices."""

    kept: dict[str, int]
    freed: dict[str, int]  # freed GPUs not handed off yet
    taken: dict[str, tuple[str, int]] = field(default_factory=dict)  # node -> (recipient, GPUs)
    recipients: list[str] = field(default_factory=list)  # running in a slice now
    parked: list[tuple[str, float]] = field(default_factory=list)  # (recipient, its end): waits for the donor
    ran: dict[str, str] = field(default_factory=dict)  # node -> the last recipient it ran


@dataclass(slots=True)
class _Pipe:
    """An asynchronous member's counters (rule 10): r, f, t, and its pools in flight."""

    staleness: int
    rollouts: int | None  # rollouts it may start in all (None: no bound)
    started: int = 0  # r
    rolled: int = 0  # f
    trained: int = 0  # t
    running: set[str] = field(default_factory=set)
    queued: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Slot:
    job_id: str
    order: int
    nodes: dict[str, tuple[str, ...]]
    switch_s: dict[str, float]
    running: str | None = None  # a synchronous member's phase (an asynchronous one: ``pipe``)
    pipe: _Pipe | None = None


@dataclass(slots=True)
class GroupExecutor:
    """Tracks which node runs what and who waits; returns grants. No clock, no I/O."""

    _members: dict[str, _Slot] = field(default_factory=dict)
    _queues: dict[str, list[tuple[float, int, str]]] = field(default_factory=lambda: {p: [] for p in POOLS})
    _busy: dict[str, str] = field(default_factory=dict)
    _last: dict[str, str] = field(default_factory=dict)
    _next_order: int = 0
    gpus_per_node: int = 8
    _tails: dict[str, _Tail] = field(default_factory=dict)  # donor -> its tail
    _donor: dict[str, str] = field(default_factory=dict)  # recipient in a slice -> donor

    def admit(self, job_id: str, rollout_nodes: tuple[str, ...], train_nodes: tuple[str, ...],
              now: float, switch_rollout_s: float = 0.0, switch_train_s: float = 0.0,
              staleness: int = 0, rollouts: int | None = None) -> None:
        """Add a member; it is ready for rollout at ``now``. ``staleness`` >= 1 makes it
        asynchronous (rule 10), starting at most ``rollouts`` rollouts (rule 12)."""
        if job_id in self._members:
            raise ValueError(f"job {job_id!r} is already a member of this group")
        slot = _Slot(job_id, self._next_order, {ROLLOUT: tuple(rollout_nodes), TRAIN: tuple(train_nodes)},
                     {ROLLOUT: switch_rollout_s, TRAIN: switch_train_s})
        self._next_order += 1
        self._members[job_id] = slot
        if staleness:
            slot.pipe = _Pipe(staleness, rollouts)
            self._requeue_async(slot, now)
            return
        insort(self._queues[ROLLOUT], (now, slot.order, job_id))

    def restore(self, job_id: str, order: int, rollout_nodes: tuple[str, ...], train_nodes: tuple[str, ...],
                switch_rollout_s: float, switch_train_s: float, queued: tuple | None,
                running: str | None, last_on: tuple[str, ...] = ()) -> None:
        """Rebuild a member from persisted state (the live service after a restart).

        ``queued`` is (pool, ready time) or (pool, ready time, queue order) as
        ``queue_entries`` gave it (a parked recipient queues at a fractional order)."""
        slot = _Slot(job_id, order, {ROLLOUT: tuple(rollout_nodes), TRAIN: tuple(train_nodes)},
                     {ROLLOUT: switch_rollout_s, TRAIN: switch_train_s}, running=running)
        self._members[job_id] = slot
        self._next_order = max(self._next_order, order + 1)
        if running is not None:
            for node in slot.nodes[running]:
                self._busy[node] = job_id
        if queued is not None:
            insort(self._queues[queued[0]], (queued[1], queued[2] if len(queued) > 2 else order, job_id))
        for node in last_on:
            self._last[node] = job_id

    def pipe_state(self, job_id: str) -> dict:
        """An asynchronous member's state as plain data (``restore_pipe`` inverts it): its
        counters, the pools it runs in and its queue entries (pool, ready time, order)."""
        pipe = self._members[job_id].pipe
        queued = [[pool, ready, order] for pool in POOLS for ready, order, j in self._queues[pool] if j == job_id]
        return {"staleness": pipe.staleness, "rollouts": pipe.rollouts, "started": pipe.started, "rolled": pipe.rolled,
                "trained": pipe.trained, "running": sorted(pipe.running), "queued": queued}

    def restore_pipe(self, job_id: str, state: dict) -> None:
        """Rebuild an asynchronous member, restored first as an idle synchronous one
        (``restore``), from ``pipe_state``: ``restore`` takes one queue entry and one
        running phase, and an asynchronous member may run and queue in both pools."""
        slot = self._members[job_id]
        slot.pipe = _Pipe(state["staleness"], state["rollouts"], state["started"], state["rolled"], state["trained"],
                          set(state["running"]), {q[0] for q in state["queued"]})
        for pool in state["running"]:
            for node in slot.nodes[pool]:
                self._busy[node] = job_id
        for pool, ready, order in state["queued"]:
            insort(self._queues[pool], (ready, order, job_id))

    def remove(self, job_id: str) -> None:
        """Drop a member wherever it is: queued, running (its nodes are freed) or idle."""
        if self._tails or job_id in self._donor:
            self._tail_leave(job_id, None)
        slot = self._members.pop(job_id)
        for pool in (slot.pipe.running if slot.pipe is not None else (slot.running,) if slot.running else ()):
            for node in slot.nodes[pool]:
                if self._busy.get(node) == job_id:
                    del self._busy[node]
        for pool in POOLS:
            self._queues[pool] = [e for e in self._queues[pool] if e[2] != job_id]
        for tail in self._tails.values():
            tail.parked = [p for p in tail.parked if p[0] != job_id]

    def finish(self, job_id: str, now: float, requeue: bool = True, pool: str | None = None,
               failed: bool = False, restart: bool = False) -> str:
        """End the running phase of ``job_id`` at ``now``; queue its next phase unless told not to.

        ``pool`` names the phase (rule 11; needed when an asynchronous member runs two).
        ``failed``: the phase did not complete (the job's code raised): its nodes are freed
        and the same phase is queued again, as if it had never been granted (an
        asynchronous member's counters do not count it); with ``restart`` (a synchronous
        member's failed training phase) its rollout is queued instead: the iteration starts
        again. Returns the pool of the phase that ended.
        """
        slot = self._members[job_id]
        if slot.pipe is not None:
            return self._finish_async(slot, now, requeue, pool, failed)
        if pool is not None and pool != slot.running:
            raise ValueError(f"job {job_id!r} is not running a {pool} phase (running: {slot.running!r})")
        pool = slot.running
        if pool is None:
            raise ValueError(f"job {job_id!r} is not running a phase")
        if job_id in self._donor:  # a slice ends before its donor (rule 8): park (a failed one queues again)
            self._slice_end(job_id, now if requeue and not failed else None)
            slot.running = None
            if requeue and failed:
                insort(self._queues[pool], (now, slot.order, job_id))
            return pool
        for node in slot.nodes[pool]:
            del self._busy[node]
            self._last[node] = job_id
        slot.running = None
        if requeue:
            nxt = (ROLLOUT if restart else pool) if failed else TRAIN if pool == ROLLOUT else ROLLOUT
            insort(self._queues[nxt], (now, slot.order, job_id))
        if job_id in self._tails:
            self._tail_leave(job_id, now)
        return pool

    def _finish_async(self, slot: _Slot, now: float, requeue: bool, pool: str | None, failed: bool = False) -> str:
        """Rules 10-11 for an asynchronous member: count the phase (unless it ``failed``: a
        rollout then no longer counts as started), free its nodes, requeue."""
        pipe = slot.pipe
        if pool is None and len(pipe.running) == 1:
            pool = next(iter(pipe.running))
        if pool not in pipe.running:
            raise ValueError(f"job {slot.job_id!r} is not running a {pool or 'single'} phase "
                             f"(running: {sorted(pipe.running)})")
        pipe.running.discard(pool)
        for node in slot.nodes[pool]:
            del self._busy[node]
            self._last[node] = slot.job_id
        if failed:
            if pool == ROLLOUT:
                pipe.started -= 1
        elif pool == ROLLOUT:
            pipe.rolled += 1
        else:
            pipe.trained += 1
        if requeue:
            self._requeue_async(slot, now)
        return pool

    def _requeue_async(self, slot: _Slot, now: float) -> None:
        """Queue each phase rule 10 allows now (training first: the order of insertion is
        immaterial, the queues are sorted)."""
        pipe = slot.pipe
        if TRAIN not in pipe.running and TRAIN not in pipe.queued and pipe.rolled > pipe.trained:
            pipe.queued.add(TRAIN)
            insort(self._queues[TRAIN], (now, slot.order, slot.job_id))
        if (ROLLOUT not in pipe.running and ROLLOUT not in pipe.queued
                and pipe.started - pipe.trained <= pipe.staleness
                and (pipe.rollouts is None or pipe.started < pipe.rollouts)):
            pipe.queued.add(ROLLOUT)
            insort(self._queues[ROLLOUT], (now, slot.order, slot.job_id))

    def tail(self, job_id: str, now: float, keep_gpus: int) -> int:
        """Job ``job_id``'s running rollout reports its tail at ``now`` (rule 6); it keeps
        ``keep_gpus`` GPUs (at least 1). Returns the GPUs freed (0: nothing changes, e.g. a
        recipient in a slice, a repeated report, or a job that keeps all its GPUs). The
        hand-offs are granted by the next ``dispatch(now)``."""
        slot = self._members[job_id]
        if slot.pipe is not None:  # rule 12
            return 0
        if slot.running != ROLLOUT:
            raise ValueError(f"job {job_id!r} is not running a rollout (running: {slot.running!r})")
        if job_id in self._tails or job_id in self._donor:
            return 0
        g = self.gpus_per_node
        nodes = slot.nodes[ROLLOUT]
        left = max(1, int(keep_gpus))
        if left >= g * len(nodes):
            return 0
        kept, freed = {}, {}
        for n in nodes:
            kept[n] = min(left, g)
            left -= kept[n]
            freed[n] = g - kept[n]
        self._tails[job_id] = _Tail(kept, freed)
        return sum(freed.values())

    def _handoff(self, now: float, grants: list[Grant]) -> None:
        """Rule 7: give freed GPUs to queued rollouts, FCFS, no entry ahead touching them."""
        owner = {}
        for donor, tail in self._tails.items():
            for n, free in tail.freed.items():
                if free > 0:
                    owner[n] = donor
        if not owner:
            return
        ahead: set[str] = set()
        for entry in self._queues[TRAIN]:  # a queued training on a tail node blocks it too
            ahead.update(self._members[entry[2]].nodes[TRAIN])
        queue = self._queues[ROLLOUT]
        kept = []
        for entry in queue:
            slot = self._members[entry[2]]
            nodes = slot.nodes[ROLLOUT]
            donor = owner.get(nodes[0]) if nodes else None
            ok = (slot.running is None and slot.pipe is None and donor is not None
                  and all(owner.get(n) == donor and n not in ahead for n in nodes))
            if not ok:
                ahead.update(nodes)
                kept.append(entry)
                continue
            tail = self._tails[donor]
            share = min(tail.freed[n] for n in nodes) / self.gpus_per_node
            for n in nodes:
                tail.taken[n] = (slot.job_id, tail.freed[n])
                tail.freed[n] = 0
                del owner[n]
            tail.recipients.append(slot.job_id)
            self._donor[slot.job_id] = donor
            slot.running = ROLLOUT
            grants.append(Grant(slot.job_id, ROLLOUT, nodes, now, slot.switch_s[ROLLOUT], share))
        if len(kept) != len(queue):
            self._queues[ROLLOUT] = kept

    def _slice_end(self, job_id: str, parked_at: float | None) -> None:
        """A recipient's slice ends while its donor is in its tail: GPUs back, next phase parked."""
        donor = self._donor.pop(job_id)
        tail = self._tails[donor]
        tail.recipients.remove(job_id)
        for n in self._members[job_id].nodes[ROLLOUT]:
            _, gpus = tail.taken.pop(n)
            tail.freed[n] += gpus
            tail.ran[n] = job_id
        if parked_at is not None:
            tail.parked.append((job_id, parked_at))

    def _tail_leave(self, job_id: str, now: float | None) -> None:
        """``job_id`` leaves (``finish``, or ``remove`` when ``now`` is None): as a recipient in
        a slice, its GPUs go back; as a donor in its tail, its recipients take over (rule 8)."""
        if job_id in self._donor:
            self._slice_end(job_id, None)
            self._members[job_id].running = None
            return
        tail = self._tails.pop(job_id, None)
        if tail is None:
            return
        if now is None:  # a removed donor: its nodes are freed by remove, recipients keep theirs
            for n in self._members[job_id].nodes[ROLLOUT]:
                if self._busy.get(n) == job_id:
                    del self._busy[n]
        for n, rec in tail.ran.items():
            self._last[n] = rec
        for rec in tail.recipients:
            del self._donor[rec]
            for n in self._members[rec].nodes[ROLLOUT]:
                self._busy[n] = rec
        order = self._members[job_id].order
        for k, (rec, ended) in enumerate(tail.parked, 1):  # just behind the donor's own next phase
            ready = now if now is not None else ended  # a removed donor: as the recipient ended
            insort(self._queues[TRAIN], (ready, order + k / (len(tail.parked) + 1), rec))

    def dispatch(self, now: float) -> list[Grant]:
        """Start every ready phase whose nodes are all free, rollout queue first, FCFS."""
        grants: list[Grant] = []
        busy = self._busy
        last = self._last
        members = self._members
        held: set[str] = set()  # nodes of the entries that could not start, in this pass
        for pool in POOLS:
            queue = self._queues[pool]
            if not queue:
                continue
            kept = []
            for entry in queue:
                slot = members[entry[2]]
                nodes = slot.nodes[pool]
                free = slot.running is None
                if free:
                    for n in nodes:
                        if n in busy or n in held:
                            free = False
                            break
                if not free:
                    held.update(nodes)
                    kept.append(entry)
                    continue
                job_id = slot.job_id
                switch = 0
                for n in nodes:
                    if last.get(n, job_id) != job_id:
                        switch = slot.switch_s[pool]
                        break
                for n in nodes:
                    busy[n] = job_id
                pipe = slot.pipe
                if pipe is None:
                    slot.running = pool
                else:
                    pipe.queued.discard(pool)
                    pipe.running.add(pool)
                    if pool == ROLLOUT:
                        pipe.started += 1
                grants.append(Grant(job_id, pool, nodes, now, switch))
            if len(kept) != len(queue):
                self._queues[pool] = kept
            if pool == ROLLOUT and self._tails:
                self._handoff(now, grants)
        return grants

    def shift(self, delta: float) -> None:
        """Move every queued ready time ``delta`` seconds later: the state one whole period
        on, for a simulator that skips periods of a group whose schedule repeats
        (``rollmux.sim.periodic``). Order, nodes and last jobs are unchanged."""
        for pool in POOLS:
            self._queues[pool] = [(ready + delta, order, job) for ready, order, job in self._queues[pool]]

    # Read-only views, for the analyzer, the service's status and the tests.
    def running(self, job_id: str) -> str | None:
        """The pool of a synchronous member's running phase (None for an asynchronous
        member: see ``running_pools``)."""
        return self._members[job_id].running

    def running_pools(self, job_id: str) -> tuple[str, ...]:
        """The pools in which ``job_id`` runs a phase now, in ``POOLS`` order."""
        slot = self._members[job_id]
        if slot.pipe is None:
            return (slot.running,) if slot.running is not None else ()
        return tuple(p for p in POOLS if p in slot.pipe.running)

    def pipeline(self, job_id: str) -> tuple[int, int, int] | None:
        """An asynchronous member's (rollouts started, rollouts finished, trainings
        finished); None for a synchronous member."""
        pipe = self._members[job_id].pipe
        return None if pipe is None else (pipe.started, pipe.rolled, pipe.trained)

    def queued(self, pool: str) -> list[str]:
        return [e[2] for e in self._queues[pool]]

    def queue_entries(self, pool: str) -> list[tuple[float, int, str]]:
        return list(self._queues[pool])

    def busy_nodes(self) -> dict[str, str]:
        return dict(self._busy)

    def last_jobs(self) -> dict[str, str]:
        return dict(self._last)

    def restore_last(self, last: dict[str, str]) -> None:
        """Rebuild ``last_jobs`` (node -> the job that last ran there) from persisted state,
        jobs that have left the group included: the next job on such a node pays its switch."""
        self._last.update(last)

    def order_of(self, job_id: str) -> int:
        return self._members[job_id].order

    def members(self) -> list[str]:
        return list(self._members)

    # Views of the long-tail state (rules 6-9).
    def in_tail(self, job_id: str) -> bool:
        return job_id in self._tails

    def donor_of(self, job_id: str) -> str | None:
        """The donor whose freed GPUs ``job_id`` runs on now, or None."""
        return self._donor.get(job_id)

    def recipients(self, job_id: str) -> list[str]:
        """Jobs running in slices of ``job_id``'s tail now; they run at full rate once it ends."""
        tail = self._tails.get(job_id)
        return list(tail.recipients) if tail else []

    def tail_state(self) -> dict:
        """The long-tail state as plain data (``restore_tail_state`` inverts it, after the
        members are restored)."""
        return {"tails": {d: {"kept": t.kept, "freed": t.freed, "taken": {n: list(v) for n, v in t.taken.items()},
                              "recipients": list(t.recipients), "parked": [list(p) for p in t.parked],
                              "ran": t.ran} for d, t in self._tails.items()},
                "donor": dict(self._donor)}

    def restore_tail_state(self, state: dict) -> None:
        for d, t in state["tails"].items():
            self._tails[d] = _Tail(dict(t["kept"]), dict(t["freed"]), {n: tuple(v) for n, v in t["taken"].items()},
                                   list(t["recipients"]), [tuple(p) for p in t["parked"]], dict(t["ran"]))
        self._donor = dict(state["donor"])
        for rec, donor in self._donor.items():  # a recipient runs on its donor's nodes, which the donor still owns
            self._members[rec].running = ROLLOUT
            for n in self._members[rec].nodes[ROLLOUT]:
                if self._busy.get(n) == rec:
                    self._busy[n] = donor

    def gpu_use(self) -> dict[str, dict[str, int]]:
        """GPUs in use per node and job: a node-granular owner holds all of them; during a
        tail, the donor its kept GPUs and each recipient the GPUs it took."""
        use: dict[str, dict[str, int]] = {}
        for n, job in self._busy.items():
            tail = self._tails.get(job)
            if tail is None:
                use[n] = {job: self.gpus_per_node}
            else:
                use[n] = {job: tail.kept[n]}
                if n in tail.taken:
                    rec, gpus = tail.taken[n]
                    use[n][rec] = gpus
        return use
