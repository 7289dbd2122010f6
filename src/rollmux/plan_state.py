"""The cluster's current plan: groups, pinning, node inventory; decisions are applied here.

A ``PlanState`` changes only through ``apply`` (a placement decision) and ``release``
(a departure). Policies read it and return decisions; they never mutate it. Node ids
come from the pool's inventory: ``R0, R1, ...`` and ``T0, T1, ...``; a bounded pool owns
exactly ``nodes`` ids, an unbounded one mints a fresh id whenever a node is provisioned.
With a ``prefix`` (a fleet's view, ``rollmux.fleet_planner``) every minted node id and
group id starts with it, so the plans of several views never share an id.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from rollmux import colocation
from rollmux.errors import PlacementError
from rollmux.intra import GroupAnalysis, MemberProfile, analyze, t_cycle, t_load
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Group, Job, Member

_PREFIX = {ROLLOUT: "R", TRAIN: "T"}


@dataclass(slots=True, frozen=True)
class Placement:
    """Where a job goes: an existing group (``group_id``) or a new one (None), its nodes,
    and how many of those nodes are newly provisioned in each pool. ``colocated``: both
    phases on ``train_nodes`` (= ``rollout_nodes``), in a new co-located group or, with a
    ``group_id``, hosted inside that group (``Member.hosted``)."""

    group_id: str | None
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    new_rollout: tuple[str, ...] = ()
    new_train: tuple[str, ...] = ()
    colocated: bool = False

    @property
    def packs(self) -> bool:
        """Whether it joins a running group on that group's own nodes (packing, or hosting):
        it takes no free node of any pool. Such a job may pass the waiting line."""
        return self.group_id is not None and not self.new_rollout and not self.new_train

    @classmethod
    def colocated_on(cls, train_nodes: tuple[str, ...]) -> "Placement":
        """A new co-located group on fresh training nodes: both phases run there."""
        return cls(None, train_nodes, train_nodes, (), train_nodes, colocated=True)

    @classmethod
    def hosted_in(cls, group_id: str, train_nodes: tuple[str, ...]) -> "Placement":
        """Hosting in group ``group_id``: both phases on these of its training nodes (no new node)."""
        return cls(group_id, train_nodes, train_nodes, colocated=True)


def member_profile(cluster: Cluster, member: Member, colocated: bool = False) -> MemberProfile:
    """The member as the analysis sees it; a co-located member's phases are
    ``rollmux.colocation``'s, each with its switch inside (its nodes only ever run it).
    A hosted member (``Member.hosted``) takes the same times, with every phase paying
    its switch, and keeps its disaggregated solo iteration as its SLO basis. The planner's
    plans and the exact solver's candidates are profiled here alike."""
    job = member.job
    if colocated or member.hosted:
        (roll, sw_r), (train, sw_t) = (colocation.phase_time(job, p, cluster) for p in POOLS)
        return MemberProfile(job.job_id, roll + sw_r, train + sw_t, member.rollout_nodes, member.train_nodes,
                             0.0, 0.0, job.staleness, job.t_solo if member.hosted else None)
    sw = cluster.switch_cost
    return MemberProfile(job.job_id, job.t_roll_s, job.t_train_s, member.rollout_nodes, member.train_nodes,
                         sw.seconds(job.model, ROLLOUT), sw.seconds(job.model, TRAIN), job.staleness)


@dataclass(slots=True, frozen=True)
class Release:
    """The outcome of a departure: which group lost the job and which nodes it gave back."""

    job_id: str
    group_id: str
    released_nodes: tuple[str, ...]
    group_closed: bool


@dataclass(slots=True, frozen=True)
class NodeEntry:
    """One node of a group as placement reads it: which members it holds, memory used and capacity."""

    node: str
    members: tuple[str, ...]  # job ids pinned to it, sorted
    used_gb: float
    capacity_gb: float


@dataclass(slots=True, frozen=True)
class GroupView:
    """What the planner reads about a group on every arrival, computed once per change.

    ``share[n]`` is the node's load at its members' SLO rates:
    sum over members k on n of (k's phase on n's pool) / (SLO_k * T_solo_k), in the order
    members and their nodes are listed (admission order, rollout before training).
    """

    profiles: tuple[MemberProfile, ...]
    slo: dict[str, float]
    share: dict[str, float]
    nodes: dict[str, tuple[NodeEntry, ...]]  # pool -> the group's nodes of that pool, in group order
    peak: float = 0.0  # max(share.values()): the busiest node before a newcomer
    saturated: bool = False  # T_load >= T_cycle of its profiles (facts section 5; ``GroupAnalysis.saturated``)
    memo: dict = field(default_factory=dict)  # the planner's per-version caches (node choices)


class FreeNodes(dict):
    """Bounded pool -> its free nodes, kept in inventory order (``order``: a node's place).
    A drain takes a free node out of service (``withhold``) and ``reinstate`` puts it back.
    ``PlanState`` keeps one for its two pools, a fleet's ``FleetState`` one for the fleet."""

    def __init__(self, order: Callable[[str], int]) -> None:
        super().__init__()
        self.order = order

    def count(self, pool: str) -> int | None:
        """Free nodes of ``pool`` (None: unbounded)."""
        return len(self[pool]) if pool in self else None

    def give_back(self, pool: str, nodes: list[str]) -> None:
        if pool in self:
            self[pool].extend(nodes)
            self[pool].sort(key=self.order)

    def withhold(self, pool: str, node: str) -> bool:
        """Take a free node of a bounded pool out of service (drain); False if not free."""
        free = self.get(pool)
        if free is None or node not in free:
            return False
        free.remove(node)
        return True

    def reinstate(self, pool: str, node: str) -> None:
        """Give a withheld (drained) node of a bounded pool back to its free nodes."""
        if node not in self[pool]:
            self.give_back(pool, [node])


@dataclass(slots=True)
class PlanState:
    cluster: Cluster
    groups: dict[str, Group] = field(default_factory=dict)
    job_group: dict[str, str] = field(default_factory=dict)
    prefix: str = ""  # of every minted node id and group id
    _free: FreeNodes = field(init=False)
    _minted: dict[str, int] = field(default_factory=lambda: {ROLLOUT: 0, TRAIN: 0})
    _next_group: int = 0
    _analysis: dict[str, GroupAnalysis] = field(default_factory=dict)
    # groups a regrouping on bounded pools is emptying: the planner places no job there
    # (it would keep nodes that the regrouping's new groups count on; rollmux.reservation)
    closing: set[str] = field(default_factory=set)
    _views: dict[str, GroupView] = field(default_factory=dict)
    _in_use: dict[str, int] = field(default_factory=lambda: {ROLLOUT: 0, TRAIN: 0})  # nodes in groups, per pool
    _listed: dict[str, tuple[str, int, float]] = field(default_factory=dict)  # node -> (pool, index, GB)

    def __post_init__(self) -> None:
        self._free = FreeNodes(lambda n: self._listed[n][1])
        for pool in POOLS:
            spec = self.cluster.pool(pool)
            if spec.node_list:
                ids = [n.node_id for n in spec.node_list]
                for i, n in enumerate(spec.node_list):
                    self._listed[n.node_id] = (pool, i, n.host_mem_gb)
            elif spec.nodes is not None:
                ids = [f"{self.prefix}{_PREFIX[pool]}{i}" for i in range(spec.nodes)]
                for i, node in enumerate(ids):
                    self._listed[node] = (pool, i, spec.host_mem_gb)
            else:
                continue
            self._free[pool] = ids
            self._minted[pool] = len(ids)

    # --- inventory -------------------------------------------------------------
    def bounded(self, pool: str) -> bool:
        return pool in self._free

    def free_count(self, pool: str) -> int | None:
        return self._free.count(pool)

    def capacity(self, pool: str, node: str) -> float:
        """Host memory of ``node`` (GB)."""
        listed = self._listed.get(node)
        return listed[2] if listed is not None else self.cluster.pool(pool).host_mem_gb

    def peek_new(self, pool: str, k: int, mem: float = 0.0) -> tuple[str, ...] | None:
        """The ids the next ``k`` provisioned nodes of ``pool`` with room for ``mem`` GB would
        get (free nodes in inventory order); None if the pool cannot provide them."""
        if pool in self._free:
            fit = [n for n in self._free[pool] if self._listed[n][2] >= mem]
            return tuple(fit[:k]) if len(fit) >= k else None
        start = self._minted[pool]
        return tuple(f"{self.prefix}{_PREFIX[pool]}{start + i}" for i in range(k))

    def _take(self, pool: str, ids: tuple[str, ...]) -> None:
        if pool in self._free:
            free = self._free[pool]
            for node in ids:
                free.remove(node)
        else:
            self._minted[pool] += len(ids)

    def withhold(self, pool: str, node: str) -> bool:
        return self._free.withhold(pool, node)

    def close_group(self, group_id: str) -> None:
        """Mark a group that a regrouping empties: no arrival is placed there (``closing``)."""
        self.closing.add(group_id)

    def closing_groups(self) -> set[str]:
        """The groups marked closing (``close_group``), as ``FleetState.closing_groups``."""
        return set(self.closing)

    def first_free(self, pool: str) -> str:
        """The free node of bounded ``pool`` that a new group would take first."""
        return self._free[pool][0]

    def reinstate(self, pool: str, node: str) -> None:
        self._free.reinstate(pool, node)

    def has_node(self, pool: str, node: str) -> bool:
        """Whether ``node`` is a node of ``pool``: in the cluster's inventory of a bounded
        pool, issued by this state for an unbounded one."""
        if self.bounded(pool):
            listed = self._listed.get(node)
            return listed is not None and listed[0] == pool
        return self.pool_of(node) == pool

    def pool_of(self, node: str) -> str | None:
        """The pool a node id this state has issued belongs to, or None."""
        listed = self._listed.get(node)
        if listed is not None:
            return listed[0]
        for pool in POOLS:
            prefix = self.prefix + _PREFIX[pool]
            number = node[len(prefix):]
            if node.startswith(prefix) and number.isdigit() and int(number) < self._minted[pool]:
                return pool
        return None

    # --- persistence ----------------------------------------------------------------
    def inventory(self) -> dict:
        """What ``restore`` needs besides the groups: free nodes, ids minted, next group id."""
        return {"free": {p: list(f) for p, f in self._free.items()}, "minted": dict(self._minted),
                "next_group": self._next_group}

    def restore(self, groups: list[Group], inventory: dict) -> None:
        """Rebuild a saved plan into this (empty) state: the inverse of ``groups`` + ``inventory()``."""
        if self.groups:
            raise PlacementError("restore needs an empty plan state")
        for group in groups:
            self.groups[group.group_id] = group
            for m in group.members:
                self.job_group[m.job.job_id] = group.group_id
        for pool in POOLS:
            self._in_use[pool] = sum(len(g.nodes(pool)) for g in groups)
        for pool, free in inventory["free"].items():
            self._free[pool] = list(free)
        self._minted = dict(inventory["minted"])
        self._next_group = inventory["next_group"]

    # --- queries ------------------------------------------------------------------
    def profile(self, member: Member, colocated: bool = False) -> MemberProfile:
        """``member_profile`` on this plan's cluster."""
        return member_profile(self.cluster, member, colocated)

    def analysis(self, group_id: str) -> GroupAnalysis:
        cached = self._analysis.get(group_id)
        if cached is None:
            group = self.groups[group_id]
            cached = analyze([self.profile(m, group.colocated) for m in group.members])
            self._analysis[group_id] = cached
        return cached

    def view(self, group_id: str) -> GroupView:
        """The group's planning view (profiles, SLOs, node shares and residency), cached until it changes."""
        cached = self._views.get(group_id)
        if cached is None:
            group = self.groups[group_id]
            profiles = tuple(self.profile(m, group.colocated) for m in group.members)
            share: dict[str, float] = {}
            for m, p in zip(group.members, profiles):
                limit = m.job.slo * p.t_solo
                for node in p.rollout_nodes:
                    share[node] = share.get(node, 0.0) + p.t_roll / limit
                for node in p.train_nodes:
                    share[node] = share.get(node, 0.0) + p.t_train / limit
            nodes = {}
            for pool in POOLS:
                entries = []
                for node in group.nodes(pool):
                    on = [m for m in group.members if node in m.nodes(pool)]
                    entries.append(NodeEntry(node, tuple(sorted(m.job.job_id for m in on)),
                                             sum(m.mem_on(pool) for m in on), self.capacity(pool, node)))
                nodes[pool] = tuple(entries)
            saturated = bool(profiles) and t_load(profiles) >= t_cycle(profiles)
            cached = GroupView(profiles, {m.job.job_id: m.job.slo for m in group.members}, share, nodes,
                               max(share.values(), default=0.0), saturated)
            self._views[group_id] = cached
        return cached

    def group_cost_per_hour(self, group_id: str) -> float:
        """One group's $/h: its nodes at their pool's price."""
        return self.groups[group_id].cost_per_hour(self.cluster)

    def gpus_by_pool(self) -> dict[str, int]:
        """GPUs held per pool, by pool role (a fleet's plan names its GPU types)."""
        return {pool: self.gpus_in_use(pool) for pool in POOLS}

    def placement_kind(self, job_id: str, outcome: str) -> str:
        """How a report names the placement ``outcome`` of placed job ``job_id`` (the outcome;
        a fleet's plan adds the GPU types)."""
        return outcome

    def cost_per_hour(self) -> float:
        """The plan's $/h: every node in some group at its pool's price (O(1): the in-use counts)."""
        return sum(self._in_use[p] * self.cluster.node_price(p) for p in POOLS)

    def effective_cost_per_hour(self) -> float:
        """What the planner minimises: $/h, with a co-located group's nodes counted at its
        co-located slowdown (they are held that much longer per unit of work; see
        "Placement space" in ``rollmux.planner``)."""
        return sum(colocation.effective_cost(g, self.cluster) for g in self.groups.values())

    def nodes_in_use(self, pool: str) -> int:
        """Nodes of ``pool`` in some group (kept up to date by ``apply``, ``release`` and ``restore``)."""
        return self._in_use[pool]

    def gpus_in_use(self, pool: str) -> int:
        return self._in_use[pool] * self.cluster.gpus_per_node

    def group_of(self, job_id: str) -> Group:
        gid = self.job_group.get(job_id)
        if gid is None:
            raise PlacementError(f"job {job_id!r} is not placed")
        return self.groups[gid]

    # --- changes ------------------------------------------------------------------
    def apply(self, job: Job, placement: Placement) -> str:
        """Pin ``job`` as ``placement`` says; returns its group id."""
        if job.job_id in self.job_group:
            raise PlacementError(f"job {job.job_id!r} is already placed")
        self._take(ROLLOUT, placement.new_rollout)
        self._take(TRAIN, placement.new_train)
        if placement.group_id is None:
            gid = f"{self.prefix}g{self._next_group}"
            self._next_group += 1
            group = Group(gid, colocated=placement.colocated)
            self.groups[gid] = group
        else:
            gid = placement.group_id
            group = self.groups[gid]
        group.rollout_nodes.extend(placement.new_rollout)
        group.train_nodes.extend(placement.new_train)
        self._in_use[ROLLOUT] += len(placement.new_rollout)
        self._in_use[TRAIN] += len(placement.new_train)
        hosted = placement.colocated and placement.group_id is not None  # co-located inside a shared group
        group.members.append(Member(job, placement.rollout_nodes, placement.train_nodes, hosted))
        self.job_group[job.job_id] = gid
        self._analysis.pop(gid, None)
        self._views.pop(gid, None)
        return gid

    def release(self, job_id: str) -> Release:
        """Unpin a departing job; nodes no member uses any more go back to the pool."""
        group = self.group_of(job_id)
        group.members = [m for m in group.members if m.job.job_id != job_id]
        del self.job_group[job_id]
        released: list[str] = []
        for pool in POOLS:
            used = {n for m in group.members for n in m.nodes(pool)}
            gone = [n for n in group.nodes(pool) if n not in used]
            if gone:
                kept = [n for n in group.nodes(pool) if n in used]
                if pool == ROLLOUT:
                    group.rollout_nodes = kept
                else:
                    group.train_nodes = kept
                self._free.give_back(pool, gone)
                self._in_use[pool] -= len(gone)
                released.extend(gone)
        closed = not group.members
        if closed:
            del self.groups[group.group_id]
            self.closing.discard(group.group_id)
        self._analysis.pop(group.group_id, None)
        self._views.pop(group.group_id, None)
        return Release(job_id, group.group_id, tuple(released), closed)
