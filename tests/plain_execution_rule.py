"""A frozen copy of the plain execution rule (src/rollmux/execution.py before the long-tail
hand-off), the oracle of tests/test_execution_tail.py. Do not edit, except where the plain
rule itself changes (2026-11-26: a ready phase that cannot start reserves its nodes for
the rest of the pass, rule 3)."""
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


@dataclass(slots=True)
class _Slot:
    job_id: str
    order: int
    nodes: dict[str, tuple[str, ...]]
    switch_s: dict[str, float]
    running: str | None = None
    shares: bool = False


@dataclass(slots=True)
class GroupExecutor:
    """Tracks which node runs what and who waits; returns grants. No clock, no I/O."""

    _members: dict[str, _Slot] = field(default_factory=dict)
    _queues: dict[str, list[tuple[float, int, str]]] = field(default_factory=lambda: {p: [] for p in POOLS})
    _busy: dict[str, str] = field(default_factory=dict)
    _last: dict[str, str] = field(default_factory=dict)
    _next_order: int = 0

    def admit(self, job_id: str, rollout_nodes: tuple[str, ...], train_nodes: tuple[str, ...],
              now: float, switch_rollout_s: float = 0.0, switch_train_s: float = 0.0) -> None:
        """Add a member; it is ready for rollout at ``now``."""
        if job_id in self._members:
            raise ValueError(f"job {job_id!r} is already a member of this group")
        slot = _Slot(job_id, self._next_order, {ROLLOUT: tuple(rollout_nodes), TRAIN: tuple(train_nodes)},
                     {ROLLOUT: switch_rollout_s, TRAIN: switch_train_s})
        self._next_order += 1
        self._members[job_id] = slot
        insort(self._queues[ROLLOUT], (now, slot.order, job_id))

    def restore(self, job_id: str, order: int, rollout_nodes: tuple[str, ...], train_nodes: tuple[str, ...],
                switch_rollout_s: float, switch_train_s: float, queued: tuple[str, float] | None,
                running: str | None, last_on: tuple[str, ...] = ()) -> None:
        """Rebuild a member from persisted state (the live service after a restart)."""
        slot = _Slot(job_id, order, {ROLLOUT: tuple(rollout_nodes), TRAIN: tuple(train_nodes)},
                     {ROLLOUT: switch_rollout_s, TRAIN: switch_train_s}, running=running)
        self._members[job_id] = slot
        self._next_order = max(self._next_order, order + 1)
        if running is not None:
            for node in slot.nodes[running]:
                self._busy[node] = job_id
        if queued is not None:
            insort(self._queues[queued[0]], (queued[1], order, job_id))
        for node in last_on:
            self._last[node] = job_id

    def remove(self, job_id: str) -> None:
        """Drop a member wherever it is: queued, running (its nodes are freed) or idle."""
        slot = self._members.pop(job_id)
        if slot.running is not None:
            for node in slot.nodes[slot.running]:
                if self._busy.get(node) == job_id:
                    del self._busy[node]
        for pool in POOLS:
            self._queues[pool] = [e for e in self._queues[pool] if e[2] != job_id]

    def finish(self, job_id: str, now: float, requeue: bool = True) -> str:
        """End the running phase of ``job_id`` at ``now``; queue its next phase unless told not to.

        Returns the pool of the phase that ended.
        """
        slot = self._members[job_id]
        pool = slot.running
        if pool is None:
            raise ValueError(f"job {job_id!r} is not running a phase")
        for node in slot.nodes[pool]:
            del self._busy[node]
            self._last[node] = job_id
        slot.running = None
        if requeue:
            nxt = TRAIN if pool == ROLLOUT else ROLLOUT
            insort(self._queues[nxt], (now, slot.order, job_id))
        return pool

    def dispatch(self, now: float) -> list[Grant]:
        """Start every ready phase whose nodes are all free, rollout queue first, FCFS."""
        grants: list[Grant] = []
        busy = self._busy
        last = self._last
        members = self._members
        held = set()
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
                slot.running = pool
                grants.append(Grant(job_id, pool, nodes, now, switch))
            if len(kept) != len(queue):
                self._queues[pool] = kept
        return grants

    # Read-only views, for the analyzer, the service's status and the tests.
    def running(self, job_id: str) -> str | None:
        return self._members[job_id].running

    def queued(self, pool: str) -> list[str]:
        return [e[2] for e in self._queues[pool]]

    def queue_entries(self, pool: str) -> list[tuple[float, int, str]]:
        return list(self._queues[pool])

    def busy_nodes(self) -> dict[str, str]:
        return dict(self._busy)

    def last_jobs(self) -> dict[str, str]:
        return dict(self._last)

    def order_of(self, job_id: str) -> int:
        return self._members[job_id].order

    def members(self) -> list[str]:
        return list(self._members)
