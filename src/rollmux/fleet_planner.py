"""Planning on a fleet of GPU types: each job's phases on the best-fit types.

Problem
-------
A fleet (``rollmux.fleet``) offers views: pairs (rollout pool a, training pool b). A
group lives in one view; a job placed in view v runs with v's phase times
(``fleet.translate``). For an arriving job j choose a view v and a placement in it
minimising the *effective* marginal cost

    dE(v, p) = E(G') - E(G)          (G the group p joins, empty for a new group)
    E(G)     = C_v(G) * s(G) * sigma(G)

where C_v(G) is G's $/h at v's prices, s(G) the co-located slowdown of a co-located
group (1 otherwise; ``colocation.effective_cost``) and

    sigma(G) = mean over members k of T_solo_v(k) / T_solo_ref(k)

how much longer (or, on faster types, shorter) the members hold the group's nodes per
unit of work than on the reference types. On the reference view sigma = 1 and E is
``PlanState.effective_cost_per_hour``'s group term, so a two-pool fleet plans exactly as
``rollmux.planner`` does. Every check of the planner (residency, SLO, departures,
start-up, size, the saturation gate) applies unchanged inside the view, on the
translated job, whose SLO is rescaled to keep its deadline (``fleet.translate``).

E counts the slowdown of *sharing* a group as free, as the paper's model does, while a
replay pays it (members run up to SLO times longer, holding the nodes). So on a fleet
of several views the marginal of joining an existing group G is taken at the members'
analysed iterations instead (``sharing_cost``):

    dE_share(v, p) = (C_v(G) + dC) * mean_{k in G'} iter_k(G') / T_solo_ref(k)
                     - C_v(G) * mean_{k in G} iter_k(G) / T_solo_ref(k)

(a new or co-located group alone is unchanged: iter = T_solo_v, or the co-located
iteration). Measured by benchmarks/fleet_replay.py on random three-type traces: RollMux
over the cheapest other policy 1.078 -> 1.038 on average (docs/fleet.md). A two-pool
fleet keeps dE, so it still plans exactly as ``rollmux.planner``, except under ``hedge``
(below), which takes dE_share on every fleet; the plan's E
(``FleetState.effective_cost_per_hour``), the exact optimum and regrouping
(``rollmux.fleet_exact``) stay on E.

Method
------
Per view v (in the fleet's order), the view's own ``Planner`` decides for the
translated job (its cheapest placement by its own rule: pack < scalings < new group <
co-location; co-location only in ``Fleet.colocation_view`` of the pool). A view is
skipped when the job misses its SLO there even alone (slo_v < 1), and a view's choice
is refused when a bounded pool lacks the new nodes (the pools' inventories are shared
by every view that uses them). A view's planner plans on an unbounded cluster, so it is
given the view's inventory (``view_inventory``, ``planner.Inventory``): it never offers
a candidate that needs more nodes of a pool than the pool has in all, which no wait
could ever place; when the job's own nodes of both sides exceed the inventory, only
co-location is offered there (or the view rejects the job, naming the pool). The
decision takes the view with the least dE (or dE_share), ties in view order. A
co-location offer must also cost less than the job's share of a pair in any view
(``_prospect``). With ``explain`` each view's verdict (and its planner's candidates) is
kept. The views' planners never see each other's groups: a group never spans views.

Dominance over Gavel+ (``hedge``; the policy ``rollmux-hedge``)
--------------------------------------------------------------
Gavel+ runs each job k alone on its cheapest option that meets its SLO (solo-d on a
view or co-located on a pool, ``gavel_option``), whose E

    g_k = C_o * iter_o / T_solo_ref(k)

is what it pays per hour of k's solo work on the reference types (options that need
more nodes of a bounded pool than it has in all never run, so Gavel+ never takes
them, ``gavel_ranking``); over a trace it pays
sum_k g_k W_k (W_k: k's work in solo hours). A group G of $/h C(G) in which member k
runs iterations of iter_k(G) does T_solo_ref(k) / iter_k(G) hours of k's work per hour,
so it is *dominated* (no dearer than Gavel+ for the work it does) when

    C(G) <= V(G) = sum_{k in G} g_k * T_solo_ref(k) / iter_k(G).

If every group were dominated at every instant, the plan's bill, the integral of
sum_G C(G), would be at most the integral of sum_G V(G) = sum_k g_k W_k: Gavel+'s bill.
With ``hedge`` an arrival keeps that invariant where it can: each view offers its
planner's choice when the group it makes (analysed with the newcomer) is dominated, else
the cheapest dominated candidate among the others its planner found feasible (in its
own order), else nothing; the job's Gavel+ option is offered too, on its own nodes
(dominated by definition: C = g_j T_ref / iter). The least dE_share among these wins,
on two pools too: by dE a pack that adds no node is free however much it slows the
group, so it always beat the job's own option (dE_share was cheaper on 11 of 12 replays,
docs/fleet.md). When none has the nodes now (bounded pools), the views' own choices
compete as they are. The
co-location prospect test is left out: dominance decides where co-location pays. A
lone group is dominated only when it is the job's Gavel+ option, so a job that arrives
alone starts there; ``fleet_exact.plan_fleet_regroup`` with ``value`` then gathers it
with one to three other jobs alone when their joint group is dominated and pays for the
move.
Departures and the moves' pauses can still break the invariant for a while (the
survivors of a group, a job stopped in a move), so the bound is a target, not a
guarantee: docs/fleet.md measures it.

Limits: a job keeps its GPU count on every type (GPU memory capacity is not modelled).
"""
from __future__ import annotations

import statistics
from collections import ChainMap, Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from rollmux import colocation
from rollmux.fleet import Fleet, Profiles, View, speed_factor, translate
from rollmux.model import ROLLOUT, TRAIN, Cluster, Group, Job, Member
from rollmux.errors import PlacementError, SpecError
from rollmux.improve import materialize
from rollmux.intra import GroupAnalysis, analyze
from rollmux.lifetime import Remaining, lifetime_cost
from rollmux.plan_state import FreeNodes, Placement, PlanState, Release
from rollmux.ray_tasks import Mapper, serial_map
from rollmux.planner import (COLOCATE, NEW, OUTCOME, PAPER_SPACE, SLO_EPS, Candidate, Decision, Inventory, Planner,
                             Space)

_COST_TOL = 1e-9
#: relative slack of the dominance check: the analysis rounds phases to microseconds
VALUE_TOL = 1e-6
_GAVEL_MEMO_LIMIT = 10_000  # jobs whose Gavel+ option is remembered (a long trace never ends)


@dataclass(slots=True, frozen=True)
class ViewVerdict:
    """What one view offered a job: its planner's decision (None: the view was skipped),
    the effective marginal cost dE and why it was not taken (the taken view's: "chosen",
    then any note of its offer)."""

    view: str
    decision: Decision | None
    effective_cost: float | None  # what the views compare: dE, or L under the lifetime objective
    reason: str = ""
    rate_cost: float | None = None  # dE, which the co-location prospect test reads


@dataclass(slots=True, frozen=True)
class FleetDecision:
    """Where a job goes on a fleet: the chosen view (None: nowhere) and every view's verdict."""

    job_id: str
    view: str | None
    decision: Decision | None
    effective_cost: float
    verdicts: tuple[ViewVerdict, ...]
    reason: str = ""

    @property
    def placement(self) -> Placement | None:
        """The chosen view's placement (its ids name the view), or None."""
        return self.decision.placement if self.decision is not None else None

    @property
    def outcome(self) -> str:
        if self.decision is not None and self.decision.placement is not None:
            return self.decision.outcome
        return "wait" if any(v.reason.startswith("inventory") for v in self.verdicts) else "rejected"

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "view": self.view, "outcome": self.outcome,
                "effective_marginal_cost": round(self.effective_cost, 4), "reason": self.reason,
                "views": [{"view": v.view, "effective_marginal_cost": None if v.effective_cost is None
                           else round(v.effective_cost, 4), "reason": v.reason,
                           "outcome": v.decision.outcome if v.decision else None,
                           "candidates": [c.describe() for c in v.decision.candidates] if v.decision else []}
                          for v in self.verdicts]}


@dataclass(slots=True)
class FleetState:
    """The plan on a fleet: one ``PlanState`` per view (group ids prefixed ``<view>:``),
    the fleet's physical nodes, the original jobs and where they are.

    It also reads like one ``PlanState`` to the simulator (``rollmux.sim.engine``) and to
    the live control plane (``rollmux.runtime.control``): ``groups`` and ``job_group``
    span every view (live), ``apply`` takes a placement whose ids name its view,
    ``release``, ``analysis``, ``cost_per_hour`` and ``gpus_in_use`` (per role) are the
    views' together; ``pool_of``, ``bounded``, ``free_count``, ``withhold``, ``reinstate``,
    ``inventory`` and ``restore`` speak of the fleet's pools by name. Group members hold
    the translated jobs, so a phase takes its time on the group's types.

    Nodes are physical: a view's planner names the nodes it adds by its own local ids
    (``<view>:R0``), and ``apply`` gives each of them a node of the fleet pool on that
    side, ``<pool>-<i>``: the lowest free one of a bounded pool (shared by every view
    that uses it, a diagonal view's two sides included), a fresh one of an unbounded
    pool. So a node id names one machine whatever view holds it, and two views never
    hold the same node.
    """

    fleet: Fleet
    profiles: Profiles = field(default_factory=Profiles)
    only: tuple[str, ...] = ()  # the views this plan may use (empty: all of the fleet's)
    views: dict[str, tuple[View, PlanState]] = field(init=False)
    originals: dict[str, Job] = field(default_factory=dict)
    job_view: dict[str, str] = field(default_factory=dict)
    groups: ChainMap = field(init=False)
    job_group: ChainMap = field(init=False)
    _free: FreeNodes = field(default_factory=lambda: FreeNodes(lambda n: int(n.rsplit("-", 1)[1])))
    _minted: dict[str, int] = field(default_factory=dict)  # pool -> node ids issued so far
    _node_pool: dict[str, str] = field(default_factory=dict)  # node id -> its pool
    _local: dict[str, str] = field(default_factory=dict)  # a view's local node id -> the node it became
    _one_view: bool = field(init=False)  # the fleet is a two-pool cluster (``fleet.fleet_of``)

    def __post_init__(self) -> None:
        self._one_view = len(self.fleet.views()) == 1
        self.views = {v.name: (v, PlanState(v.cluster, prefix=f"{v.name}:")) for v in self.fleet.views()
                      if not self.only or v.name in self.only}
        self.groups = ChainMap(*(state.groups for _, state in self.views.values()))
        self.job_group = ChainMap(*(state.job_group for _, state in self.views.values()))
        for pool in self.fleet.pools:
            self._minted[pool.name] = 0
            if pool.nodes is not None:
                self._free[pool.name] = [self._mint(pool.name) for _ in range(pool.nodes)]

    def _mint(self, pool: str) -> str:
        node = f"{pool}-{self._minted[pool]}"
        self._minted[pool] += 1
        self._node_pool[node] = pool
        return node

    def _adopt(self, view: str, group_id: str) -> None:
        """Give every node of group ``group_id`` that still has a local id of ``view`` a
        physical node of the fleet pool on its side (class docstring). A later placement
        of the same plan may name such a node by its local id (the exact solver places a
        group member by member): ``apply`` reads it through ``_local``."""
        v, state = self.views[view]
        group = state.groups[group_id]
        physical: dict[str, str] = {}
        for side, nodes in ((ROLLOUT, group.rollout_nodes), (TRAIN, group.train_nodes)):
            pool = v.pool_of(side).name
            for i, node in enumerate(nodes):
                if node not in self._node_pool:
                    physical[node] = self._free[pool].pop(0) if pool in self._free else self._mint(pool)
                    nodes[i] = self._local[node] = physical[node]
        if physical:
            rename = lambda ids: tuple(physical.get(n, n) for n in ids)  # noqa: E731
            group.members = [replace(m, rollout_nodes=rename(m.rollout_nodes), train_nodes=rename(m.train_nodes))
                             for m in group.members]

    def sigma(self, group: Group) -> float:
        """sigma(G) of the module docstring."""
        return statistics.fmean(speed_factor(self.originals[m.job.job_id], m.job) for m in group.members)

    def group_effective(self, view: str, group: Group) -> float:
        """E(G): the group's $/h, at its co-located slowdown, times sigma(G)."""
        return colocation.effective_cost(group, self.views[view][0].cluster) * self.sigma(group)

    def cost_per_hour(self) -> float:
        """$/h of every node in some group, at its pool's price."""
        return sum(state.cost_per_hour() for _, state in self.views.values())

    def group_cost_per_hour(self, group_id: str) -> float:
        """One group's $/h at its view's prices."""
        return self.views[group_id.split(":", 1)[0]][1].group_cost_per_hour(group_id)

    def gpus_by_pool(self) -> dict[str, int]:
        """GPUs held per fleet pool (by name), over every view that uses it."""
        return {p.name: self.nodes_in_use(p.name) * self.fleet.gpus_per_node for p in self.fleet.pools}

    def placement_kind(self, job_id: str, outcome: str) -> str:
        """The outcome and the GPU types (view) of placed job ``job_id``: "packed on H20/H800";
        the outcome alone on a fleet of one view (a two-pool cluster), as ``PlanState`` says it."""
        return outcome if self._one_view else f"{outcome} on {self.job_view[job_id]}"

    def effective_cost_per_hour(self) -> float:
        """What the fleet planner minimises: the sum of E(G) over groups."""
        return sum(self.group_effective(name, g) for name, (_, state) in self.views.items()
                   for g in state.groups.values())

    def nodes_in_use(self, pool: str) -> int:
        """Nodes of fleet pool ``pool`` held by some group, over every view that uses it."""
        return sum(state.nodes_in_use(side) for view, state in self.views.values()
                   for side in (ROLLOUT, TRAIN) if view.pool_of(side).name == pool)

    def bounded_pools(self) -> tuple[str, ...]:
        """The fleet's pools with a fixed inventory (shared by every view that uses them)."""
        return tuple(p.name for p in self.fleet.pools if p.nodes is not None)

    def free_nodes(self, pool: str) -> int | None:
        """Nodes of fleet pool ``pool`` that no group holds and none is withheld (None: unbounded)."""
        return self._free.count(pool)

    # --- the fleet's nodes, as ``PlanState`` speaks of a pool's ---------------------------
    def bounded(self, pool: str) -> bool:
        return pool in self._free

    def free_count(self, pool: str) -> int | None:
        return self.free_nodes(pool)

    def pool_of(self, node: str) -> str | None:
        """The fleet pool of a node this plan has issued, or None."""
        return self._node_pool.get(node)

    def withhold(self, pool: str, node: str) -> bool:
        return self._free.withhold(pool, node)

    def close_group(self, group_id: str) -> None:
        """Mark a group that a regrouping empties: no arrival is placed there (``PlanState.closing``)."""
        self.views[group_id.split(":", 1)[0]][1].closing.add(group_id)

    def closing_groups(self) -> set[str]:
        """Every view's groups marked closing (``close_group``)."""
        return set().union(*(sub.closing for _, sub in self.views.values()))

    def first_free(self, pool: str) -> str:
        """The free node of bounded fleet pool ``pool`` that a new group would take first."""
        return self._free[pool][0]

    def reinstate(self, pool: str, node: str) -> None:
        self._free.reinstate(pool, node)

    def inventory(self) -> dict:
        """What ``restore`` needs besides the groups: each bounded pool's free nodes, the
        ids issued per pool, each view's next group id."""
        return {"free": {p: list(f) for p, f in self._free.items()}, "minted": dict(self._minted),
                "next_group": {name: state.inventory()["next_group"] for name, (_, state) in self.views.items()}}

    def restore(self, groups: list[Group], inventory: dict) -> None:
        """Rebuild a saved plan into this (empty) state: the inverse of ``groups`` +
        ``inventory()``. The groups' members hold the original jobs (as the live service
        keeps them); each is translated to its group's view here."""
        if self.originals:
            raise PlacementError("restore needs an empty fleet state")
        by_view: dict[str, list[Group]] = {name: [] for name in self.views}
        for group in groups:
            name = group.group_id.split(":", 1)[0]
            view = self.views[name][0]
            for m in group.members:
                self.originals[m.job.job_id] = m.job
                self.job_view[m.job.job_id] = name
            members = [replace(m, job=translate(self.fleet, self.profiles, m.job, view, strict=False))
                       for m in group.members]
            by_view[name].append(Group(group.group_id, list(group.rollout_nodes), list(group.train_nodes), members,
                                       group.colocated))
        self._minted = dict(inventory["minted"])
        for pool, count in self._minted.items():
            for i in range(count):
                self._node_pool[f"{pool}-{i}"] = pool
        self._free.clear()
        self._free.update({p: list(f) for p, f in inventory["free"].items()})
        for name, (_, state) in self.views.items():
            minted = {side: 0 for side in (ROLLOUT, TRAIN)}  # a view's own ids are never kept: it mints afresh
            state.restore(by_view[name], {"free": {}, "minted": minted, "next_group": inventory["next_group"][name]})

    def gpus_in_use(self, side: str) -> int:
        """GPUs held in the ``side`` role (rollout or train), over every view."""
        return sum(state.gpus_in_use(side) for _, state in self.views.values())

    def view_of(self, placement: Placement) -> str:
        """The view a placement's ids name (its group's, or its first node's)."""
        first = placement.group_id or (placement.train_nodes or placement.rollout_nodes)[0]
        return first.split(":", 1)[0]

    def analysis(self, group_id: str) -> GroupAnalysis:
        return self.views[group_id.split(":", 1)[0]][1].analysis(group_id)

    def apply(self, job: Job, placement: Placement) -> str:
        """Pin ``job`` (the original, untranslated job) as ``placement`` says, in the view
        its ids name, as that view's translation; returns its group id."""
        name = self.view_of(placement)
        view, state = self.views[name]
        if self._local:  # a placement that names nodes an earlier one added by their local ids
            local = lambda ids: tuple(self._local.get(n, n) for n in ids)  # noqa: E731
            placement = replace(placement, rollout_nodes=local(placement.rollout_nodes),
                                train_nodes=local(placement.train_nodes))
        gid = state.apply(translate(self.fleet, self.profiles, job, view, strict=False), placement)
        self._adopt(name, gid)
        self.originals[job.job_id] = job
        self.job_view[job.job_id] = name
        return gid

    def materialize(self, view: str, group: Group, originals: Mapping[str, Job] | None = None) -> str:
        """``improve.materialize`` of an exact solver's group into ``view``, on physical
        nodes. With ``originals`` (job id -> the untranslated job: the jobs of a regrouping,
        released from their groups before), each member is pinned as its original's
        translation to ``view`` and recorded as a job placed there."""
        if originals is not None:
            v = self.views[view][0]
            group = replace(group, members=[replace(m, job=translate(self.fleet, self.profiles,
                                                                     originals[m.job.job_id], v, strict=False))
                                            for m in group.members])
        gid = materialize(self.views[view][1], group)
        self._adopt(view, gid)
        if originals is not None:
            for m in group.members:
                self.originals[m.job.job_id] = originals[m.job.job_id]
                self.job_view[m.job.job_id] = view
        return gid

    def release(self, job_id: str) -> Release:
        """Unpin a departing job from its view; its bounded pools get back the nodes it freed."""
        view = self.job_view.pop(job_id)
        del self.originals[job_id]
        out = self.views[view][1].release(job_id)
        for node in out.released_nodes:
            self._free.give_back(self._node_pool[node], [node])
        return out


class FleetPlanner:
    """Chooses each job's view and placement (module docstring). Pure: never mutates state."""

    def __init__(self, fleet: Fleet, profiles: Profiles | None = None, tie_break: str = "first",
                 space: Space = PAPER_SPACE, sharing_cost: bool | None = None, objective: str = "rate",
                 hedge: bool = False) -> None:
        fleet.validate()
        if space.hosting:  # a hosted member's phases are not translated between views
            raise SpecError("space", space, "a space without hosting (the paper's or the full space): hosting is "
                            "not offered across views", "FleetPlanner")
        self.fleet = fleet
        self.profiles = profiles or Profiles()
        self.hedge = hedge  # dominance over Gavel+ (module docstring)
        self._gavel: dict[str, tuple[Job, AloneOption | None]] = {}
        colocating = {fleet.colocation_view(p) for p in fleet.pools}
        self.space = space
        # dE of joining a group at its members' iterations there (None: with hedge, or on a
        # fleet of several views; otherwise a two-pool fleet keeps the planner's own objective)
        self.sharing_cost = (hedge or len(fleet.views()) > 1) if sharing_cost is None else sharing_cost
        self.objective = objective
        self._planners = {v.name: Planner(tie_break, space=replace(space, colocation=space.colocation
                                                                   and v.name in colocating), objective=objective)
                          for v in fleet.views()}
        # the same planners without co-location, for a view whose co-location fails the fleet's prospects
        self._plain = {name: Planner(tie_break, space=replace(space, colocation=False), objective=objective)
                       for name in colocating if name is not None and space.colocation}

    def new_state(self, only: tuple[str, ...] = ()) -> FleetState:
        """An empty plan on every view, or on the views named in ``only``."""
        return FleetState(self.fleet, self.profiles, only)

    def decide(self, state: FleetState, job: Job, explain: bool = False,
               remaining: Remaining | None = None) -> FleetDecision:
        """The view and placement for ``job`` (module docstring). With the lifetime
        objective and ``remaining`` (iterations each job has left; a job keeps its count on
        every type), each view's planner chooses by L and the views compare their L."""
        if self.objective != "lifetime" or remaining is None or remaining(job.job_id) is None:
            remaining = None
        moved = {name: translate(self.fleet, self.profiles, job, view) for name, (view, _) in state.views.items()}
        if self.hedge:
            both = [self._hedged(state, job, name, moved[name], explain) for name in state.views]
            hedged = [h for _, h in both] + self._gavel_verdict(state, job, moved)
            verdicts = hedged if any(v.effective_cost is not None for v in hedged) else [v for v, _ in both]
        else:
            verdicts = [self._verdict(state, job, name, moved[name], self._planners[name], explain,
                                      remaining=remaining) for name in state.views]
        if self._plain and not self.hedge and not job.colocate:
            prospect = self._prospect(state, job, moved)
            verdicts = [self._verdict(state, job, v.view, moved[v.view], self._plain[v.view], explain,
                                      f"co-location {v.rate_cost:.2f} >= the share of a pair {prospect:.2f}",
                                      remaining)
                        if v.decision is not None and v.decision.outcome == OUTCOME[COLOCATE]
                        and v.rate_cost is not None and v.rate_cost >= prospect - _COST_TOL else v
                        for v in verdicts]
        best: ViewVerdict | None = None
        for verdict in verdicts:
            if verdict.effective_cost is not None and (
                    best is None or verdict.effective_cost < best.effective_cost - _COST_TOL):
                best = verdict
        verdicts = [replace(v, reason=f"chosen {v.reason}".rstrip()) if v is best else v if v.reason
                    else replace(v, reason="costlier") for v in verdicts]
        if best is None:
            reasons = "; ".join(f"{v.view}: {v.reason}" for v in verdicts)
            return FleetDecision(job.job_id, None, None, 0.0, tuple(verdicts), f"no view can take it ({reasons})")
        return FleetDecision(job.job_id, best.view, best.decision, best.effective_cost, tuple(verdicts))

    def _verdict(self, state: FleetState, job: Job, name: str, moved: Job | None, planner: Planner,
                 explain: bool, note: str = "", remaining: Remaining | None = None) -> ViewVerdict:
        """What view ``name``'s planner offers ``job`` (``moved``: its translation there);
        ``note`` says why a first offer was replaced. With ``remaining`` the view's planner
        chooses by the lifetime objective and the verdict's cost is that L (dollars)."""
        view, sub = state.views[name]
        if moved is None:
            return ViewVerdict(name, None, None, "only co-located on its own type" if job.colocate else
                               f"slower than its SLO even alone on {view.rollout.gpu}+{view.train.gpu}")
        decision = planner.decide(sub, moved, explain=explain, remaining=remaining, inventory=view_inventory(view))
        return self._offer(state, job, name, moved, decision, note, remaining)

    def _offer(self, state: FleetState, job: Job, name: str, moved: Job, decision: Decision, note: str = "",
               remaining: Remaining | None = None) -> ViewVerdict:
        """``_verdict`` of view ``name``'s ``decision`` for ``job``: none when it places
        nothing or a bounded pool lacks its nodes, else its dE (or L with ``remaining``)."""
        view, sub = state.views[name]
        prefix = f"{note}; then " if note else ""
        if decision.placement is None:
            return ViewVerdict(name, decision, None, f"{prefix}{decision.outcome}: {decision.reason}")
        short = short_text(state, view, decision.placement)
        if short:
            return ViewVerdict(name, decision, None, f"{prefix}inventory: {short}")
        rate = self._marginal(state, view, sub, job, moved, decision)
        cost = rate if remaining is None else lifetime_cost(sub, moved, decision.placement, remaining(job.job_id),
                                                            remaining)
        return ViewVerdict(name, decision, cost, f"({note})" if note else "", rate)

    def gavel_value(self, job: Job) -> float:
        """g_j of the module docstring: E of ``job``'s Gavel+ option (memoized per job).
        Every job the planner can place has one: a placement's nodes fit the inventory, so
        do the job's own nodes alone in its view."""
        option = self.gavel_option(job)
        assert option is not None, f"job {job.job_id}: no option of it can ever run, so it is never placed"
        return option.effective_cost

    def gavel_option(self, job: Job) -> AloneOption | None:
        """``gavel_option`` of this planner's fleet and profiles, memoized per job (by id,
        checked against the job it was computed for)."""
        got = self._gavel.get(job.job_id)
        if got is None or (got[0] is not job and got[0] != job):
            if len(self._gavel) >= _GAVEL_MEMO_LIMIT:
                self._gavel.clear()
            got = self._gavel[job.job_id] = (job, gavel_option(self.fleet, self.profiles, job))
        return got[1]

    def group_value(self, members: list[tuple[Job, float]]) -> float:
        """V(G) of the module docstring for (original job, its iteration in G) pairs."""
        return sum(self.gavel_value(j) * j.t_solo / it for j, it in members)

    def _dominated(self, state: FleetState, name: str, job: Job, moved: Job, placement: Placement) -> bool:
        """Whether the group ``placement`` makes in view ``name`` is dominated (module docstring)."""
        view, sub = state.views[name]
        cluster = view.cluster
        cost = _added_cost(cluster, placement)
        if placement.group_id is None:
            it = colocation.iteration_s(moved, cluster) if placement.colocated else moved.t_solo
            members = [(job, it)]
        else:
            group = sub.groups[placement.group_id]
            cost += group.cost_per_hour(cluster)
            profile = sub.profile(Member(moved, placement.rollout_nodes, placement.train_nodes, placement.colocated))
            it = analyze([*sub.view(group.group_id).profiles, profile]).iteration_s
            members = [(state.originals[m.job.job_id], it[m.job.job_id]) for m in group.members]
            members.append((job, it[job.job_id]))
        return cost <= self.group_value(members) * (1 + VALUE_TOL)

    def _hedged(self, state: FleetState, job: Job, name: str, moved: Job | None,
                explain: bool) -> tuple[ViewVerdict, ViewVerdict]:
        """View ``name``'s plain verdict (its planner's choice) and its verdict under
        dominance (module docstring): that choice when it is dominated, else the first
        dominated candidate with the nodes now among those its planner finds feasible after
        it, in the planner's order, else none. One pass of the planner: dominance and the
        inventory are tested before the SLO checks of every candidate after its choice
        (``Planner.decide``'s ``admit``)."""
        view, sub = state.views[name]
        if moved is None:
            plain = self._verdict(state, job, name, moved, self._planners[name], explain)
            return plain, plain

        def admit(placement: Placement) -> bool:
            return not short_text(state, view, placement) and self._dominated(state, name, job, moved, placement)

        decision = self._planners[name].decide(sub, moved, explain=explain, admit=admit, inventory=view_inventory(view))
        first = next((c for c in decision.candidates if c.verdict in ("chosen", "feasible")), None)
        choice = decision if first is None or first.verdict == "chosen" else Decision(
            job.job_id, OUTCOME[first.kind], first.placement, first.marginal_cost, decision.candidates)
        plain = self._offer(state, job, name, moved, choice)
        if plain.effective_cost is None or first.verdict == "chosen":
            return plain, plain
        if decision.placement is None:
            return plain, replace(plain, effective_cost=None, reason=f"{choice.outcome} costs more than the jobs "
                                                                     "alone on their Gavel+ options")
        alt = next(c for c in decision.candidates if c.verdict == "chosen")
        offer = self._offer(state, job, name, moved, Decision(job.job_id, OUTCOME[alt.kind], alt.placement,
                                                              alt.marginal_cost, (alt,)))
        return plain, replace(offer, reason="(dominated alternative)")

    def _gavel_verdict(self, state: FleetState, job: Job, moved: dict[str, Job | None]) -> list[ViewVerdict]:
        """The job's Gavel+ option on its own nodes (dominated by definition), when they are
        free; else nothing. ``moved``: the job's strict translations (``decide``'s)."""
        option = self.gavel_option(job)
        if option is None or option.view not in state.views:  # (none can ever run, or not in this plan's views)
            return []
        view, sub = state.views[option.view]
        mine = moved.get(option.view) or translate(self.fleet, self.profiles, job, view, strict=False)
        placement = _alone_placement(sub, mine, option.kind == "co-located")
        if placement is None or short_text(state, view, placement):
            return []
        outcome = OUTCOME[COLOCATE] if placement.colocated else OUTCOME[NEW]
        added = _added_cost(view.cluster, placement)
        cand = Candidate(COLOCATE if placement.colocated else NEW, None, placement, added, "chosen",
                         f"Gavel+ option: {option.name}")
        decision = Decision(job.job_id, outcome, placement, added, (cand,))
        return [ViewVerdict(option.view, decision, option.effective_cost, "", option.effective_cost)]

    def _prospect(self, state: FleetState, job: Job, moved: dict[str, Job | None]) -> float:
        """The co-location prospect test across views: the least effective $/h of the job's
        share of a pair in any view (``Planner.shared_cost`` there, times the job's speed
        factor in that view; only pairs the view's inventory could hold). Co-location is kept
        only below it (``rollmux.planner``)."""
        best = float("inf")
        for name, (view, sub) in state.views.items():
            m = moved[name]
            if m is None or m.staleness:
                continue
            need = {side: m.nodes(side, self.fleet.gpus_per_node) for side in (ROLLOUT, TRAIN)}
            share = self._planners[name].shared_cost(sub, m, need, view_inventory(view))
            best = min(best, share * speed_factor(job, m))
        return best

    def _marginal(self, state: FleetState, view: View, sub: PlanState, job: Job, moved: Job,
                  decision: Decision) -> float:
        """dE of the module docstring for ``decision`` in ``view``."""
        placement = decision.placement
        cluster = view.cluster
        added = _added_cost(cluster, placement)
        factor = speed_factor(job, moved)
        if placement.group_id is None:
            slow = colocation.slowdown(moved, cluster) if placement.colocated else 1.0
            return added * slow * factor
        group = sub.groups[placement.group_id]
        if self.sharing_cost:  # E at the members' iterations in the group, before and after
            solo = {m.job.job_id: state.originals[m.job.job_id].t_solo for m in group.members}
            solo[job.job_id] = job.t_solo
            now = sub.analysis(group.group_id).iteration_s
            after = analyze([*sub.view(group.group_id).profiles,
                             sub.profile(Member(moved, placement.rollout_nodes, placement.train_nodes))]).iteration_s
            before = group.cost_per_hour(cluster) * statistics.fmean(now[k] / solo[k] for k in now)
            return (group.cost_per_hour(cluster) + added) * statistics.fmean(after[k] / solo[k] for k in after) - before
        n, cost, sigma = len(group.members), group.cost_per_hour(cluster), state.sigma(group)
        return (cost + added) * (sigma * n + factor) / (n + 1) - cost * sigma  # sigma(G'): one member more


def _shortages(state: FleetState, view: View, placement: Placement) -> dict[str, tuple[int, int]]:
    """The bounded fleet pools that lack the nodes ``placement`` adds in ``view``:
    pool -> (nodes it needs there, nodes free)."""
    want: dict[str, int] = {}
    for side, new in ((ROLLOUT, placement.new_rollout), (TRAIN, placement.new_train)):
        if new:
            want[view.pool_of(side).name] = want.get(view.pool_of(side).name, 0) + len(new)
    return {pool: (count, free) for pool, count in want.items()
            if (free := state.free_nodes(pool)) is not None and count > free}


def short_sides(state: FleetState, view: View, placement: Placement) -> tuple[str, ...]:
    """The sides (``rollout``, ``train``) of ``placement`` in ``view`` whose bounded fleet
    pool lacks the nodes it adds: what a waiting job's time is charged to (``Decision.short_pools``)."""
    short = _shortages(state, view, placement)
    return tuple(side for side, new in ((ROLLOUT, placement.new_rollout), (TRAIN, placement.new_train))
                 if new and view.pool_of(side).name in short)


def short_text(state: FleetState, view: View, placement: Placement) -> str:
    """Which bounded fleet pools lack the nodes ``placement`` adds in ``view``, as text ('' when none)."""
    return "; ".join(f"{pool} has {free} free nodes, needs {count}"
                     for pool, (count, free) in _shortages(state, view, placement).items())


def plan_jobs(planner: FleetPlanner, jobs: list[Job], explain: bool = False,
              only: tuple[str, ...] = ()) -> tuple[FleetState, list[FleetDecision]]:
    """Place ``jobs`` in arrival order on an empty fleet (every job present at once),
    on every view or on those named in ``only``."""
    state = planner.new_state(only)
    decisions = []
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        decision = planner.decide(state, job, explain=explain)
        decisions.append(decision)
        if decision.view is not None:
            state.apply(job, decision.decision.placement)
    return state, decisions


@dataclass(slots=True, frozen=True)
class Alternative:
    """One way to run every job on the fleet: its effective $/h and the jobs it cannot serve."""

    name: str
    kind: str  # fleet | fixed-view | solo-d | co-located | gavel+
    effective_cost: float
    misses: tuple[str, ...] = ()


def fixed_view_plan(planner: FleetPlanner, jobs: list[Job], view: str,
                    improve: Callable[[FleetState], object] | None = None) -> Alternative:
    """``jobs`` planned on ``view`` alone (a fixed-type assignment, ``plan_jobs``), then
    ``improve(state)`` if given: its row of ``alternatives``. A module-level function of
    picklable arguments, so that it can run as a task in another process."""
    state, decisions = plan_jobs(planner, jobs, only=(view,))
    if improve is not None:
        improve(state)
    return Alternative(f"rollmux on {view}", "fixed-view", state.effective_cost_per_hour(),
                       tuple(d.job_id for d in decisions if d.view is None))


def alternatives(planner: FleetPlanner, jobs: list[Job],
                 improve: Callable[[FleetState], object] | None = None,
                 progress: Callable[[int], None] | None = None,
                 planned: tuple[FleetState, list[FleetDecision]] | None = None,
                 mapper: Mapper = serial_map) -> list[Alternative]:
    """The fleet plan against fixed-type assignments and the no-sharing baselines, all
    counted as E (effective $/h, module docstring), every job present at once:

    * ``fleet``: ``plan_jobs`` (each job's view chosen), then ``improve(state)`` if given;
    * ``rollmux on a/b``: the same, confined to one view (``fixed_view_plan``);
    * ``solo-d on a/b``: each job alone on its own nodes of view a/b;
    * ``co-located on c``: each job alone, both phases on pool c (``rollmux.colocation``);
    * ``gavel+``: each job alone on its cheapest feasible one of the above.
    A job that would miss its SLO in an alternative, or whose nodes a bounded pool no
    longer holds (the baselines take them in trace order, ``_alone_row``; the plans through
    the planner's inventory), is listed in ``misses`` and not counted.
    ``planned``: the fleet plan and its decisions when the caller has made them already
    (``plan_jobs`` on every view, then ``improve``), used as they are. ``progress(k)`` is
    called after each of the 1 + (number of views) plans, which take nearly all the time
    (the baselines are sums over the jobs): the fleet's first, then k counts the
    fixed-type plans finished. ``mapper`` runs the fixed-type plans (``serial_map``: one
    after the other here; ``rollmux.ray_tasks.map_tasks``: in parallel on Ray); the rows
    are the same either way, in the fleet's order of views. ``improve`` must then be
    picklable (a module-level function or a ``functools.partial`` of one).
    """
    fleet, profiles = planner.fleet, planner.profiles
    if planned is None:
        state, decisions = plan_jobs(planner, jobs)
        if improve is not None:
            improve(state)
    else:
        state, decisions = planned
    rows = [Alternative("rollmux (fleet)", "fleet", state.effective_cost_per_hour(),
                        tuple(d.job_id for d in decisions if d.view is None))]
    if progress is not None:
        progress(1)
    rows += mapper(fixed_view_plan, (planner, jobs), [(v.name, improve) for v in fleet.views()],
                   on_done=None if progress is None else lambda i, row, done, total: progress(1 + done))
    options = {j.job_id: alone_options(fleet, profiles, j) for j in jobs}
    for name, kind in [(o.name, o.kind) for o in options[jobs[0].job_id]] if jobs else []:
        rows.append(_alone_row(fleet, name, kind, [[o for o in options[j.job_id] if o.name == name] for j in jobs],
                               jobs))
    rows.append(_alone_row(fleet, "gavel+ (cheapest alone per job)", "gavel+",
                           [sorted(options[j.job_id], key=lambda o: o.effective_cost) for j in jobs], jobs))
    return rows


def _alone_row(fleet: Fleet, name: str, kind: str, choices: list[list[AloneOption]], jobs: list[Job]) -> Alternative:
    """A no-sharing baseline's row: each job, in trace order, alone on the first of its
    ``choices`` that meets its SLO and whose nodes the bounded pools still hold (every job
    is present at once, so each keeps its nodes); a job with none is a miss."""
    free = {p.name: p.nodes for p in fleet.pools if p.nodes is not None}
    cost, misses = 0.0, []
    for job, mine in zip(jobs, choices):
        option = next((o for o in mine if o.feasible and all(n <= free.get(pool, n) for pool, n in o.nodes)), None)
        if option is None:
            misses.append(job.job_id)
            continue
        cost += option.effective_cost
        for pool, n in option.nodes:
            if pool in free:
                free[pool] -= n
    return Alternative(name, kind, cost, tuple(misses))


@dataclass(slots=True, frozen=True)
class AloneOption:
    """One way to run a job alone on the fleet: solo-d on a view, or co-located on a pool
    (in that pool's ``Fleet.colocation_view``), its E and whether it meets the SLO there."""

    name: str
    kind: str  # solo-d | co-located
    view: str
    effective_cost: float
    feasible: bool
    nodes: tuple[tuple[str, int], ...] = ()  # (pool name, nodes it holds there), one entry per pool


def alone_short(fleet: Fleet, option: AloneOption) -> str:
    """Why ``option`` can never run: it holds more nodes of a bounded pool than the pool
    has in all ('' when it can run once the pools have the nodes free)."""
    totals = {p.name: p.nodes for p in fleet.pools}
    for pool, count in option.nodes:
        total = totals[pool]
        if total is not None and count > total:
            return f"needs {count} {pool} nodes, the pool has {total}"
    return ""


def gavel_ranking(fleet: Fleet, profiles: Profiles, job: Job) -> list[AloneOption]:
    """Gavel+'s order for ``job``: among its alone options that can ever run
    (``alone_short``), those that meet its SLO (all of them when none does), cheapest
    (least E) first; empty when none can ever run."""
    options = [o for o in alone_options(fleet, profiles, job) if not alone_short(fleet, o)]
    return sorted([o for o in options if o.feasible] or options, key=lambda o: o.effective_cost)


def gavel_option(fleet: Fleet, profiles: Profiles, job: Job) -> AloneOption | None:
    """Gavel+'s choice for ``job``: the first of ``gavel_ranking`` (None when it is empty)."""
    return next(iter(gavel_ranking(fleet, profiles, job)), None)


def view_inventory(view: View) -> Inventory:
    """The nodes in all of the fleet pools a group of ``view`` draws on, as its planner
    reads them (``planner.Inventory``)."""
    return Inventory(view.rollout.nodes, view.train.nodes, (view.rollout.name, view.train.name))


def _added_cost(cluster: Cluster, placement: Placement) -> float:
    """$/h of the nodes ``placement`` adds in a view of ``cluster``."""
    return (len(placement.new_rollout) * cluster.node_price(ROLLOUT)
            + len(placement.new_train) * cluster.node_price(TRAIN))


def _alone_placement(sub: PlanState, job: Job, colocated: bool) -> Placement | None:
    """``job`` alone on free nodes of ``sub``: co-located on its training nodes, or solo-d
    on its own nodes of both pools; None when the nodes are short."""
    gpn = sub.cluster.gpus_per_node
    if colocated:
        ids = sub.peek_new(TRAIN, job.nodes(TRAIN, gpn), colocation.node_mem_gb(job))
        return None if ids is None else Placement.colocated_on(ids)
    roll = sub.peek_new(ROLLOUT, job.nodes(ROLLOUT, gpn), job.mem(ROLLOUT))
    train = sub.peek_new(TRAIN, job.nodes(TRAIN, gpn), job.mem(TRAIN))
    return None if roll is None or train is None else Placement(None, roll, train, roll, train)


def alone_options(fleet: Fleet, profiles: Profiles, job: Job) -> list[AloneOption]:
    """Every alone option for ``job``: solo-d on each view (E = its nodes' $/h x its speed
    factor; feasible when the view's translation keeps the SLO), then co-located on each
    pool that trains (E = its training nodes' $/h x iteration / T_solo_ref; feasible when
    that ratio is within the SLO). A job that only runs co-located is never solo-d."""
    out = []
    views = {v.name: v for v in fleet.views()}
    translated = {name: translate(fleet, profiles, job, view, strict=False) for name, view in views.items()}
    for view in views.values():
        moved = translated[view.name]
        e = sum(moved.nodes(side, fleet.gpus_per_node) * view.cluster.node_price(side)
                for side in (ROLLOUT, TRAIN)) * speed_factor(job, moved)
        held = Counter({view.rollout.name: moved.nodes(ROLLOUT, fleet.gpus_per_node)})
        held[view.train.name] += moved.nodes(TRAIN, fleet.gpus_per_node)
        # (the strict translation refuses exactly the views where slo_v < 1)
        out.append(AloneOption(f"solo-d on {view.name}", "solo-d", view.name, e,
                               not job.colocate and moved.slo >= 1.0, tuple(held.items())))
    for pool in fleet.pools:
        name = fleet.colocation_view(pool)
        if name is None:
            continue
        moved = translated[name]
        slow = colocation.iteration_s(moved, views[name].cluster) / job.t_solo
        fits = colocation.node_mem_gb(moved) <= pool.host_mem_gb
        out.append(AloneOption(f"co-located on {pool.name}", "co-located", name,
                               slow * moved.nodes(TRAIN, fleet.gpus_per_node) * views[name].cluster.node_price(TRAIN),
                               fits and slow <= job.slo * (1 + SLO_EPS)
                               and (not job.colocate or translate(fleet, profiles, job, views[name]) is not None),
                               ((pool.name, moved.nodes(TRAIN, fleet.gpus_per_node)),)))
    return out
