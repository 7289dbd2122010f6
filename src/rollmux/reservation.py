"""Nodes held for a regrouping on bounded pools until its new groups open.

A regrouping (``improve.RegroupPlan``) stops each of its jobs at that job's iteration
end and opens a new group once the group's members have all stopped. On an unbounded
pool a new group takes fresh nodes. On a bounded pool it can only take nodes that
exist, so a regrouping is kept only when, for every bounded pool p (``fits``),

    need_p  =  nodes of p in the new groups  <=  free_p + replaced_p

where free_p is the free nodes of p now and replaced_p the nodes of p held by the groups
that the regrouping empties. The driver (the simulator, the live control plane) then
keeps a ``Reservation`` until every new group has opened:

* at the decision it holds free nodes of p, up to need_p (so a new group need not wait
  for nodes that other new groups' members still hold, when there are free ones);
* as the moved jobs stop, it holds each node their old groups give back, until need_p
  nodes of p are held (the rest go back to the free list as usual);
* a new group opens once its members have all stopped and the held plus free nodes
  cover it (``covers``). Its share of the held nodes returns to the free list just
  before it takes its nodes (``hand_over``); after the last group opens, any node still
  held goes back too (``group_done``).

So no arrival takes a node that the regrouping counted on. While a reservation waits
for released nodes (``waits_for_releases``), the groups it empties are marked closing
(``PlanState.closing``: no arrival is placed there, where it would keep their nodes),
so every new group opens at the latest when the last moved job has stopped; the
planner then checks each new group's pace with the longest pause of every moved job
(``improve.plan_regroup``'s ``joint_pause``), not only its own members'. When the free
nodes cover the whole regrouping at the decision, it runs exactly as on unbounded pools.
A new group still short when its members have stopped (not expected) waits for nodes
like a queued job, ahead of the queue: the driver retries on every release.

Pools are named as the plan names them: ``rollout``/``train`` on a ``PlanState``, the
fleet's pool names on a ``FleetState`` (a group's view maps its sides to them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rollmux.model import ROLLOUT, TRAIN, Group


def group_need(state, view: str, group: Group) -> dict[str, int]:
    """Nodes of each bounded pool that ``group`` (a solver group that opens in ``view``;
    "" on a ``PlanState``) takes."""
    need: dict[str, int] = {}
    for side in (ROLLOUT, TRAIN):
        pool = state.views[view][0].pool_of(side).name if view else side
        count = len(group.nodes(side))
        if count and state.bounded(pool):
            need[pool] = need.get(pool, 0) + count
    return need


def replaced_nodes(state, replaced: tuple[str, ...], excluded=frozenset()) -> dict[str, list[str]]:
    """The nodes of each bounded pool held by the groups ``replaced`` (their ids in
    ``state``), less those in ``excluded`` (drained: they will not come back)."""
    out: dict[str, list[str]] = {}
    for gid in replaced:
        group = state.groups[gid]
        for node in dict.fromkeys([*group.rollout_nodes, *group.train_nodes]):
            pool = state.pool_of(node)
            if pool is not None and state.bounded(pool) and node not in excluded:
                out.setdefault(pool, []).append(node)
    return out


def total_need(state, view: str, groups) -> dict[str, int]:
    """``group_need`` summed over ``groups``, all opening in ``view``."""
    return _summed(state, [(view, group) for group in groups])


def _summed(state, placed) -> dict[str, int]:
    need: dict[str, int] = {}
    for view, group in placed:
        for pool, count in group_need(state, view, group).items():
            need[pool] = need.get(pool, 0) + count
    return need


def fits(state, view: str, replaced: tuple[str, ...], groups, excluded=frozenset()) -> bool:
    """The module's condition: need_p <= free_p + replaced_p on every bounded pool (the
    replaced groups' nodes in ``excluded`` not counted)."""
    return fits_views(state, replaced, [(view, group) for group in groups], excluded)


def fits_views(state, replaced: tuple[str, ...], placed, excluded=frozenset()) -> bool:
    """``fits`` for new groups that open in several views: ``placed`` is (view, group) pairs."""
    have = replaced_nodes(state, replaced, excluded)
    return all(count <= state.free_count(pool) + len(have.get(pool, ()))
               for pool, count in _summed(state, placed).items())


def covered_by_free(state, view: str, groups) -> bool:
    """Whether the free nodes alone cover the new groups (then nothing waits for a release)."""
    return all(count <= state.free_count(pool) for pool, count in total_need(state, view, groups).items())


@dataclass(slots=True)
class Reservation:
    """What one regrouping still wants (``want``: pool -> nodes), holds (``held``), has
    left to open (``unopened``: its new groups not yet open) and empties (``replaced``)."""

    want: dict[str, int] = field(default_factory=dict)
    held: dict[str, list[str]] = field(default_factory=dict)
    unopened: int = 0
    replaced: tuple[str, ...] = ()

    @classmethod
    def start(cls, state, view: str, replaced: tuple[str, ...], groups) -> "Reservation | None":
        """The reservation of a regrouping just decided (None when it needs no bounded
        node), holding now as many free nodes as it needs and there are, the groups it
        empties marked closing while it still waits for their nodes (``mark_closing``)."""
        need = total_need(state, view, groups)
        if not need:
            return None
        res = cls(dict(need), {pool: [] for pool in need}, len(groups), tuple(replaced))
        for pool in need:
            while res.take_free(state, pool):
                pass
        res.mark_closing(state)
        return res

    def mark_closing(self, state) -> None:
        """While it waits for released nodes, no arrival may join a group it empties
        (``PlanState.closing``; the mark stays until the group is gone, and the live plane
        persists it)."""
        if self.waits_for_releases:
            for gid in self.replaced:
                if gid in state.groups:
                    state.close_group(gid)

    @property
    def waits_for_releases(self) -> bool:
        """Whether it still counts on nodes that the emptied groups have not given back."""
        return any(self.want.values())

    def take_free(self, state, pool: str) -> bool:
        """Hold one free node of ``pool`` if one is wanted and free; whether it did."""
        if not self.want.get(pool) or not state.free_count(pool):
            return False
        node = state.first_free(pool)
        state.withhold(pool, node)
        self.held[pool].append(node)
        self.want[pool] -= 1
        return True

    def drop(self, pool: str, node: str) -> bool:
        """Stop holding ``node`` (drained: it stays out of service) and want another in
        its place; whether it was held."""
        if node not in self.held.get(pool, ()):
            return False
        self.held[pool].remove(node)
        self.want[pool] += 1
        return True

    def take_released(self, state, nodes) -> None:
        """Hold the nodes a moved job's old group just gave back, while more are wanted."""
        for node in nodes:
            pool = state.pool_of(node)
            if self.want.get(pool) and state.withhold(pool, node):
                self.held[pool].append(node)
                self.want[pool] -= 1

    def covers(self, state, need: dict[str, int]) -> bool:
        """Whether the held plus free nodes cover a new group's ``need``."""
        return all(len(self.held.get(pool, ())) + (state.free_count(pool) or 0) >= count
                   for pool, count in need.items())

    def hand_over(self, state, need: dict[str, int]) -> None:
        """Give back to the free list the held nodes a new group of ``need`` is about to
        take (as many as it needs of each pool, or all that are held)."""
        for pool, count in need.items():
            mine = self.held.get(pool, [])
            for node in mine[:count]:
                state.reinstate(pool, node)
            self.held[pool] = mine[count:]
            self.want[pool] = max(0, self.want.get(pool, 0) - max(0, count - len(mine)))

    def group_done(self, state) -> bool:
        """One of the new groups opened (or never will): after the last, every node still
        held goes back (``close``). Whether that was the last."""
        self.unopened -= 1
        if self.unopened > 0:
            return False
        self.close(state)
        return True

    def close(self, state) -> None:
        """Give back every node still held (the regrouping has nothing left to open)."""
        for pool, nodes in self.held.items():
            for node in nodes:
                state.reinstate(pool, node)
        self.held = {pool: [] for pool in self.held}
        self.want = {pool: 0 for pool in self.want}

    def to_dict(self) -> dict:
        return {"want": dict(self.want), "held": {pool: list(nodes) for pool, nodes in self.held.items()},
                "unopened": self.unopened, "replaced": list(self.replaced)}

    @classmethod
    def from_dict(cls, data: dict) -> "Reservation":
        return cls({str(p): int(c) for p, c in data["want"].items()},
                   {str(p): [str(n) for n in nodes] for p, nodes in data["held"].items()}, int(data["unopened"]),
                   tuple(str(g) for g in data["replaced"]))
