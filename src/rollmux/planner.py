"""Inter-group planner: where an arriving job goes (Algorithm 1 of the paper, plus options).

Problem
-------
Given the current plan (groups with pinned members) and an arriving job j, choose a
placement p that minimises the marginal cost

    dC(p) = price_R * (new rollout nodes of p) + price_T * (new training nodes of p)

subject to, for the group G' that p produces:

    residency:  for every node n of G':  sum_{k pinned to n} mem_k(pool of n) <= host_mem(n)
    SLO:        for every member k of G':  iter_k(G') <= SLO_k * (T_roll_k + T_train_k)
    departures: the SLO constraint also holds for every subset of G' that keeps j
    start-up:   for every member k with a known length of n_k iterations:
                iter_k(G') + period(G') / n_k <= SLO_k * (T_roll_k + T_train_k)
    size:       |G'| <= max_group_size
    inventory:  the new nodes exist (bounded pools)

where iter_k(G') is the steady-state iteration time of k under the execution rule
(``rollmux.intra.analyze``) with worst-case phase durations and the switch seconds that
execution charges. The departure constraint goes beyond the paper: under first come,
first served a departure can slow the others down, and since every arrival is checked
this way, every group that departures can leave behind keeps its SLOs. The start-up
constraint covers the wait of a job joining mid-rotation (and the hold-up its admission
causes), which matters for short jobs. Before any analysis a necessary condition prunes
candidates: at SLO rates no node may be busier than all the time (``_peak_demand``), and
in a group on one node per pool the members take turns (``_shared_pair_miss``), and so do
members that share a node in each pool in a group of any shape (``_peer_miss``, fast path
only).

Objective (``objective``)
-------------------------
``rate`` (Algorithm 1, the default): the least dC above, ties by kind and generation
order. ``lifetime``: the same feasible candidates, every one evaluated, and the one of
least L(p) = C(G') T(G') - C(G) T(G), the dollars the plan spends more to run every
member of G' to its end at its analysed iteration (``rollmux.lifetime`` has the math).
It needs each member's remaining iterations, which ``decide`` takes as ``remaining``
(the simulator and the live plane count them); an arriving job of unknown length, and
any decision without ``remaining``, fall back to ``rate``. Under an accounting where a
job leaves at its trace time whatever its speed (``fixed_departures``) the objective is
``rate``: a member's stay does not depend on its group.

Asynchronous jobs (``Job.staleness`` = k >= 1; rules 10-12 of ``rollmux.execution``)
---------------------------------------------------------------------------------------
Math first. Alone on its own nodes (no switch: one job) an asynchronous job with phases
R and T starts rollout i+1 as soon as rollout i has ended and r - t <= k (with k = 1:
training i-1 has ended), and training i as soon as rollout i and training i-1 have.
If R >= T the rollouts run back to back (training i-1 ends at (i-1) R + T <= i R) and
training i runs [i R, i R + T]; if T > R the trainings do (rollout i ends at
R + (i-2) T + R <= R + (i-1) T) and training i runs [R + (i-1) T, R + i T]. A larger k
only loosens the first condition. So in steady state one node set is always busy, and

    T_solo = max(R, T)          (not R + T as for a synchronous job),
    n iterations alone take  n max(R, T) + min(R, T)  (``Job.solo_run_s``; the first
    iteration runs both phases in turn, ``Job.fill_s`` = min(R, T)).

Every SLO is relative to that solo time: the SLO constraint above reads
iter_k(G') <= SLO_k * T_solo_k with T_solo_k = max(R_k, T_k) for an asynchronous k
(``Job.t_solo``, ``MemberProfile.t_solo``); the simulator's slowdowns use
``Job.solo_run_s`` (``rollmux.sim.metrics``), and ``Job.solo_iterations`` inverts it. The
necessary conditions, for asynchronous members:
* ``_peak_demand`` stays sound: its proof only uses that each member runs each of its
  phases once per iteration on its nodes and that iter_k <= SLO_k * T_solo_k, true for
  any k with its own T_solo_k.
* ``_shared_pair_miss`` is skipped for a group with an asynchronous member: its bound
  uses R_k + T_k as a floor of every member's iteration, false for a pipelined one.
* ``_peer_miss`` only pairs synchronous members: its proof needs A's rollout between
  two trainings of A (A synchronous) and only the FCFS queue order of its peers (also
  synchronous); other members may be anything, except that its component floor is
  applied to all-synchronous groups only.
The saturation gate keeps T_cycle = max_k (R_k + T_k) (``rollmux.intra``): a prune, not
an SLO check. tests/test_planner_async.py places random mixes and replays them.

Placement: an asynchronous job opens a group of its own and no job joins a group with
one (``ASYNC_APART``; the exact solver and regrouping keep them apart too). The steady
state of a mixed group is analysed (``rollmux.intra_async``), but its transients are not
bounded: a synchronous job of 8 iterations that joined an asynchronous one 55 s after it
started ran at 1.351x against an SLO of 1.3 (found by that property test), the mixed
group reaching the analysed orbit only after many periods. Until the start-up allowance
covers such orbits, mixing is not offered.

Candidates
----------
For every existing group that is not full and not saturated (T_load >= T_cycle), in
creation order:
* direct packing: j's rollout nodes are chosen among the group's rollout nodes and its
  training nodes among the group's training nodes (dC = 0);
* rollout scaling: m = 1..r_j of j's rollout nodes are new, the rest existing
  (dC = m * price_R); in the paper's space (``PAPER_SPACE``) the training side of a
  group is never scaled.
Node choices are enumerated up to symmetry: two nodes of a pool with the same set of
pinned jobs are interchangeable, so only multisets of such classes are tried.
Last, a new isolated group for j (dC = all its own nodes); alone, j's slowdown is 1.

Placement space beyond the paper (``Space``; ``FULL_SPACE``: training scaling and co-location)
---------------------------------------------------------------------------------------------
* training scaling (``train_scaling``): the same as rollout scaling on the other side.
  j takes m_T of its t_j training nodes new and the rest among the group's, with m_R of
  its rollout nodes new, for every (m_R, m_T) except (r_j, t_j) (sharing no node: the
  new group does that better), dC = m_R * price_R + m_T * price_T. Kinds: "scale"
  (m_T = 0), "scale-train" (m_R = 0), "scale-both". The execution rule is per node (gang
  start on a member's own nodes), so nothing else changes; every check above applies
  to the group that results, and the necessary conditions need one change: the
  group-level start-up floor (``_group_floor``) may no longer assume that j trains on one
  of the group's nodes when it can take all its training nodes new.
* co-location (``colocation``): j opens a group of its own on t_j training nodes and
  runs both phases there (``rollmux.colocation``: rollout at the bandwidth ratio unless
  the trace gives co-located times, a switch on every phase). Alone, its iteration is
  I_c = sum_p (body_p + switch_p) and its slowdown s_c = I_c / T_solo_j, which must be
  <= SLO_j (no start-up wait: it shares nothing). Its nodes must hold both phases'
  state (mem_R + mem_T). Since the job keeps its nodes s_c times as long per unit of
  work, the option is ranked by its *effective* marginal cost
  dC_c = s_c * t_j * price_T (the rate that buys the work of one hour alone); against
  the new group, co-location wins iff s_c * t_j * price_T < r_j * price_R + t_j * price_T
  (s_c < 1.35 for an 8+8-GPU job at H20/H800 prices). An asynchronous job is never
  co-located (its phases could no longer overlap); neither is any job under the paper's
  accounting (``one_node_per_pool``: the authors' simulator has no such option).
  Prospects: a co-located group takes no one, so choosing it for a job that would have
  shared a group with the next arrivals loses money later (greedily, on the benchmark's
  rollout-heavy instances, 1.65x the optimum). The option is therefore offered only when
  dC_c is below the job's share of the cheapest group of two it could form with a copy
  of itself or a job like one running now (``Planner.shared_cost``: half the pair's
  $/h times its slowdown there, bounded in closed form, both SLOs and residency kept):
  the running jobs stand for the ones to come. The test runs only when the option is
  reached in the order below (every cheaper option failed); a rejected option says so
  ("prospects").
* hosting (``hosting``; ``HOSTING_SPACE`` is the paper's space plus it): j runs
  co-located inside an existing group G, both phases on t_j of G's training nodes
  (``Member.hosted``), with the co-located phase times and every phase paying its switch
  (as co-location does), no rollout node, dC = 0. Its SLO basis stays its disaggregated
  T_solo_j. Each such node must hold both its phases' state next to the members' training
  state. The busiest-node bound applies with j's share I_c / (SLO_j T_solo_j) on each of
  its nodes (I_c its co-located iteration alone), and the option is offered only when
  I_c <= SLO_j T_solo_j. Every check above applies to G + j, with two changes to the
  necessary conditions: a hosted member's iteration is at least the sum of its
  co-located phases, not T_solo (``_least_iteration``), and the turn-taking bounds skip
  it (its rollout and training share nodes). One guard (``_gang_over_hosted``): no
  member may train on a hosted member's nodes and others at once (kept as the cheaper
  choice; see its docstring). Consolidation never moves a hosted member. Regrouping in a
  space with hosting re-solves groups that host like any other, and the exact solver
  searches hosting there (``rollmux.exact``, "hosting"); in a space without it, groups
  that host are left as they are.
* a job that only runs co-located (``Job.colocate``: veRL's hybrid engine) gets the
  co-location option alone, in every space and accounting; its profile is co-located,
  so alone its slowdown is 1.
Order of kinds at equal dC: pack < hosting < the scalings < new group < co-location.

Choice
------
Candidates are evaluated in the order (dC, kind: pack < scale < new, generation order).
``tie_break="first"`` (Algorithm 1) takes the first feasible one and stops.
``tie_break="best-fit"`` evaluates every candidate at the cheapest feasible dC and
takes the one whose group ends up with the highest cost-weighted utilization
(U_R * cost_R + U_T * cost_T) / cost, ties in evaluation order.
``explain=True`` evaluates every candidate, so the decision carries a verdict for each;
it never changes the choice. If nothing is feasible because a bounded pool has no free
node, the job waits; if the job can never fit the inventory, it is rejected (below).

Inventory (bounded pools)
-------------------------
A bounded pool p has N_p nodes in all (``Inventory``: a cluster's, or a fleet view's,
whose two sides may be one pool). Every candidate of j but the co-located kinds pins
it to r_j rollout and t_j training nodes, all distinct; co-location and hosting pin it
to t_j training nodes only, hosting inside a group that holds a rollout node. A
candidate whose group, its nodes and the new ones, would hold more nodes of a pool than
N_p can never be placed however long j waits, so it is never generated (in a bounded
``PlanState`` the free nodes rule it out already; a fleet's views plan on unbounded
clusters, so ``rollmux.fleet_planner`` passes each view's ``Inventory``). Hence:

* t_j > N_train: nothing can ever hold j, which is rejected, naming the pool;
* r_j rollout and t_j training nodes beyond the inventory: only the co-located kinds
  can ever hold j, so they alone are offered, where the space has them, j's co-located
  slowdown is within its SLO and both phases' state fits a training node
  (``colocation.fits``); otherwise j is rejected, naming the pool. A wait is then a
  wait for co-location's training nodes; hosting adds no node, so when only hosting is
  offered and no group can host j now there is no node to wait for: j is rejected;
* the co-location prospect test counts only the pairs the inventory can hold.

Every start (``Space.all_starts``; on in every space, off under the paper's accounting)
------------------------------------------------------------------------------------
``analyze`` runs the execution rule from one start: every member ready for rollout at
once. The rule is deterministic, but the periodic schedule it settles into can depend on
the start, and a group whose membership changes starts from wherever its members are.
In the paper's space, ``rollmux-regroup`` on production regrouped job13 (SLO 1.179,
T_solo 1,447.5 s) with two 2 + 2-node 32B gangs bridging its training node and another
one's: all ready for rollout that group settles at 1,672.4 s per iteration for job13,
from other starts at 2,236.0 s, and job13 ran at 1.32 (tests/test_intra_kernel.py). So
the SLO constraint must hold for each member's slowest steady iteration over the 2^n
starts in which every member is ready at once, each for rollout or for training
(``intra.worst_start``), for the group and for every subset the departure constraint
checks. These starts are the extreme ones (each member just before one of its phases);
the check bounds every schedule reachable from them, not every schedule. It runs last,
on candidates that pass everything else. (The first such group, job93's under
``rollmux-full``, settled at 320.8 s from one start and 357.8 s from another until the
execution rule reserved a waiting phase's nodes, rule 3 of ``rollmux.execution``; since
then it has one schedule.) The paper's accounting (steady-state check only) leaves the
check out.

Every order (``Space.all_orders``; on wherever ``all_starts`` is). The rule breaks ties
between phases ready at the same instant by admission order, so from one start the
order decides which member a shared node serves first, and with it the cyclic order of
phases there, which the steady schedule keeps. A spell of phases shorter than their
worst case reorders members freely: the group then runs from a state in which they
became ready in another order, an instant apart. So the check above runs over every
order of the members as well (n! x 2^n starts, ``intra.worst_start(orders=True)``;
members with equal keys are not told apart), for the group and for each subset the
departure constraint checks. Measured before it (docs/placement_space.md, "SLOs in
states the check never saw"): in the paper's space, seed 17 of the mixed synthetic
trace put gen-0003 (SLO 1.138) and gen-0008 (SLO 1.075) in a group whose every start
in admission order kept them at 1.058 and 1.055; after a noisy spell it settled at
1.245 and 1.241, the figures that the reversed order of two members on T4 gives. Orders
are still extreme starts; the check bounds what they lead to, not every schedule.

``Planner(accounting=PAPER)`` (``rollmux.accounting``) drops the saturation gate, keeps
only the steady-state SLO check and gives every job one node per pool, as the authors'
simulator does.

``repack`` (consolidation, beyond the paper) offers a running job a zero-cost move into
another group when that gives back nodes; see its docstring.

Fast path
---------
``decide`` without ``explain`` makes the same choice with less work; the candidate list of
its Decision then holds only the candidates it generated. (1) Per group version
(``PlanState.view``, dropped on every change) it memoizes ``node_choices`` per
(pool, nodes, memory), each choice with the largest ``share`` among its nodes, and the
group's largest share ``peak``. (2) It generates only candidates that pass
``_peak_demand``, decided without building the demand map: with x >= 0 the newcomer's
share, the map's maximum exceeds 1 + eps iff ``peak`` does, or fl(s + x) does for the
largest share s among the chosen nodes of a pool (rounding is monotone, so
max_n fl(s_n + x) = fl(max_n s_n + x) and fl(s + x) >= s), or fl(0 + x) does for a new
node. A candidate that ``_peak_demand`` rejects is never chosen, under either tie
break, so leaving it out changes nothing; a group none of whose candidates pass is not
expanded at all. (3) Before the analysis it applies ``_peer_miss`` and, with the
whole-run checks, ``_startup_floor_miss``: necessary conditions that only reject what the
steady or start-up check would (proofs in their docstrings). On the first 2,000 jobs of
the full Philly trace the second alone stands in for 90% of the analyses (85,283 of
94,170 rejected ones, none of the feasible 385), mostly short jobs whose start-up
allowance cannot cover one period. tests/test_planner_scale.py compares both paths.

Complexity: O(groups x node choices x analysis); ``analyze`` is memoized per shape.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations
from typing import Callable

from rollmux import colocation, lifetime
from rollmux.accounting import OURS, CostAccounting
from rollmux.errors import PlacementError
from rollmux.intra import GroupAnalysis, MemberProfile, analyze, t_cycle, t_load, worst_start
from rollmux.kernel import peer_floors
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Group, Job, Member
from rollmux.plan_state import GroupView, Placement, PlanState

PACK, SCALE, SCALE_TRAIN, SCALE_BOTH, NEW, COLOCATE = "pack", "scale", "scale-train", "scale-both", "new-group", "co-locate"
HOST = "host"
_KIND_RANK = {PACK: 0, HOST: 1, SCALE: 2, SCALE_TRAIN: 2, SCALE_BOTH: 2, NEW: 3, COLOCATE: 4}
OUTCOME = {PACK: "packed", HOST: "hosted", SCALE: "scaled", SCALE_TRAIN: "scaled-train", SCALE_BOTH: "scaled-both",
           NEW: "new-group", COLOCATE: "co-located"}
TIE_BREAKS = ("first", "best-fit")
OBJECTIVES = ("rate", "lifetime")  # see "Objective" in the module docstring
SLO_EPS = 1e-9
#: Why a job that only runs co-located gets no other option (``Job.colocate``).
COLOCATE_ONLY = "the job runs both phases on the same GPUs (colocate): only co-location is offered"
NOT_ADMITTED = "refused by the caller's test before its evaluation (Planner.decide's admit)"
#: Why an asynchronous job shares no group (see "Asynchronous jobs" above).
ASYNC_APART = ("asynchronous jobs run in groups of their own: the analysis does not bound the transients "
               "of a group with one (docs/rollart.md)")
#: Periods allowed for a group to settle after a running job joins it. One is not enough:
#: on philly-mix two moves into a group with a short two-node job took it from a planned
#: 8,460 s of its 8,589 s allowance to 14,005 s. Measured safe on the builtin traces.
TRANSIENT_PERIODS = 3
#: Distinct running job shapes the co-location prospect test tries (``Planner.shared_cost``).
PROSPECTS = 32
_TICK_SLACK = 1e-4  # seconds; rounding of up to 2 x 5 members' phases to 1 us, with room


@dataclass(slots=True, frozen=True)
class Space:
    """Which placements beyond the paper's the planner may choose (see "Placement space")."""

    train_scaling: bool = False
    colocation: bool = False
    hosting: bool = False
    all_starts: bool = True  # SLO checks over every start of a group ("Every start" below)
    all_orders: bool = True  # ... and over every order of its members (with all_starts; "Every order")


@dataclass(slots=True, frozen=True)
class Inventory:
    """The nodes in all of the pools a group draws on (see "Inventory"): ``rollout`` and
    ``train`` (None: unbounded), of the pools named ``pools``; a group's rollout and
    training nodes come from one pool when the two names are the same (a fleet's
    diagonal view)."""

    rollout: int | None = None
    train: int | None = None
    pools: tuple[str, str] = (ROLLOUT, TRAIN)

    @staticmethod
    def of(cluster: Cluster) -> Inventory:
        """A two-pool cluster's inventory."""
        return Inventory(cluster.rollout.nodes, cluster.train.nodes)

    @property
    def bounded(self) -> bool:
        return self.rollout is not None or self.train is not None

    def short(self, rollout: int, train: int) -> str:
        """Why no group of ``rollout`` rollout and ``train`` training nodes can ever be held
        ('' when one can)."""
        one = self.pools[0] == self.pools[1]
        for pool, count, total in ((self.pools[0], rollout + train if one else rollout, self.rollout),
                                   (self.pools[1], rollout + train if one else train, self.train)):
            if total is not None and count > total:
                return f"needs {count} {pool} nodes, the pool has {total}"
        return ""


PAPER_SPACE = Space()
FULL_SPACE = Space(train_scaling=True, colocation=True)
HOSTING_SPACE = Space(hosting=True)  # the paper's space plus hosting (``rollmux-host``)


def _kind(new_rollout: int, new_train: int) -> str:
    if not new_train:
        return SCALE if new_rollout else PACK
    return SCALE_BOTH if new_rollout else SCALE_TRAIN


@dataclass(slots=True, frozen=True)
class Candidate:
    """One option the planner looked at and what it concluded.

    ``verdict`` is "chosen", "feasible", "rejected" or "not evaluated" (a cheaper or
    equal option was already taken); ``reason`` says why it was rejected.
    """

    kind: str
    group_id: str | None
    placement: Placement | None
    marginal_cost: float
    verdict: str
    reason: str = ""
    max_slowdown: float | None = None
    utilization: float | None = None

    def describe(self) -> str:
        where = self.group_id or "new group"
        nodes = ""
        if self.placement is not None:
            nodes = f" R[{','.join(self.placement.rollout_nodes)}] T[{','.join(self.placement.train_nodes)}]"
        cost = f" +${self.marginal_cost:.2f}/h" if self.placement is not None else ""
        tail = f": {self.reason}" if self.reason else ""
        slow = f" max slowdown {self.max_slowdown:.3f}" if self.max_slowdown is not None else ""
        return f"{self.kind} {where}{nodes}{cost} {self.verdict}{slow}{tail}"


@dataclass(slots=True, frozen=True)
class Decision:
    """A placement decision as a value; ``PlanState.apply`` carries it out.

    ``short_pools`` (for "wait" and "rejected") names the pools that lacked the nodes the
    job needs: free now ("wait") or in the whole inventory ("rejected"). The simulator
    charges a waiting job's time to these pools (the binding constraint).
    """

    job_id: str
    outcome: str  # packed | scaled | new-group | wait | rejected
    placement: Placement | None
    marginal_cost: float
    candidates: tuple[Candidate, ...]
    reason: str = ""
    short_pools: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "job_id": self.job_id,
            "outcome": self.outcome,
            "group_id": self.placement.group_id if self.placement else None,
            "marginal_cost": round(self.marginal_cost, 4),
            "reason": self.reason,
            "candidates": [c.describe() for c in self.candidates],
        }


@dataclass(slots=True, frozen=True)
class _Option:
    """A candidate before evaluation; what it implies for an existing group (members,
    SLOs, busiest node) is worked out only if it is evaluated."""

    kind: str
    group: Group | None
    placement: Placement
    cost: float
    rank: int
    peak_checked: bool = False  # its busiest-node bound is known to pass (fast path; hosting options)

    def members(self, state: PlanState, job: Job) -> list[MemberProfile]:
        """The group's members after the move, admission order, newcomer last."""
        assert self.group is not None, "an option into no group has no members"
        view = state.view(self.group.group_id)
        newcomer = Member(job, self.placement.rollout_nodes, self.placement.train_nodes, self.kind == HOST)
        return [*view.profiles, state.profile(newcomer)]

    def slo(self, state: PlanState, job: Job) -> dict[str, float]:
        assert self.group is not None, "an option into no group has no SLOs"
        return {**state.view(self.group.group_id).slo, job.job_id: job.slo}


class Planner:
    """RollMux's inter-group planner over a ``PlanState``. Pure: it never mutates state."""

    def __init__(self, tie_break: str = "first", accounting: CostAccounting = OURS,
                 space: Space = PAPER_SPACE, objective: str = "rate") -> None:
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break={tie_break!r}: expected one of {TIE_BREAKS}")
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: expected one of {OBJECTIVES}")
        self.tie_break = tie_break
        self.objective = objective if not accounting.fixed_departures else "rate"
        self.accounting = accounting  # saturation gate and whole-run SLO checks (rollmux.accounting)
        self.space = space

    def decide(self, state: PlanState, job: Job, explain: bool = False,
               remaining: lifetime.Remaining | None = None,
               admit: Callable[[Placement], bool] | None = None, inventory: Inventory | None = None) -> Decision:
        """Where ``job`` goes (see the module docstring); ``remaining`` (iterations each job
        has left, by id) is what the ``lifetime`` objective reads. ``inventory``: the nodes
        of the pools ``state``'s groups draw on, when the caller keeps them (a fleet's view,
        ``rollmux.fleet_planner``); by default those of ``state``'s cluster.

        With ``admit`` (a caller's own test of a placement; by the rate objective only) the
        decision is the first feasible candidate, in the order above, that ``admit``
        accepts. The first feasible candidate is evaluated and tested as usual and, when
        refused, reported "feasible" among the candidates. Without ``explain`` every later
        candidate is tested by ``admit`` before its evaluation (a refused one is reported
        "not evaluated"), so a cheap test spares the SLO checks of what the caller would
        refuse anyway; with ``explain`` every candidate is evaluated first."""
        if admit is not None:
            if self.objective == "lifetime":
                raise ValueError("Planner.decide: admit chooses by the rate objective, not the lifetime one")
            return self._decide(state, job, explain, inventory, admit)
        if self.objective == "lifetime" and remaining is not None and remaining(job.job_id) is not None:
            decision = self._decide(state, job, True, inventory)
            picked = lifetime.choose(state, job, decision.candidates, remaining) if decision.placement else None
            if picked is None:
                return decision
            cands, i = picked
            chosen = cands[i]
            return replace(decision, outcome=OUTCOME[chosen.kind], placement=chosen.placement,
                           marginal_cost=chosen.marginal_cost, candidates=cands)
        return self._decide(state, job, explain, inventory)

    def _decide(self, state: PlanState, job: Job, explain: bool, inventory: Inventory | None = None,
                admit: Callable[[Placement], bool] | None = None) -> Decision:
        cluster = state.cluster
        job.validate(cluster)
        if job.job_id in state.job_group:
            raise PlacementError(f"job {job.job_id!r} is already placed")
        need = {pool: job.nodes(pool, cluster.gpus_per_node) for pool in POOLS}
        if self.accounting.one_node_per_pool:
            need = dict.fromkeys(POOLS, 1)
        inventory = Inventory.of(cluster) if inventory is None else inventory
        never = inventory.short(0, need[TRAIN])  # every kind holds the job's training nodes ("Inventory")
        if never:
            return Decision(job.job_id, "rejected", None, 0.0, (), never, (TRAIN,))
        apart = self._apart(inventory, job, need)
        if apart and not self._colocated_kinds(job, need, inventory):
            return Decision(job.job_id, "rejected", None, 0.0, (), apart, (ROLLOUT,))
        if apart and (miss := self._colocated_miss(state, job)):
            return Decision(job.job_id, "rejected", None, 0.0, (), f"{apart}; {miss}", (ROLLOUT,))
        if not explain:
            return self._decide_fast(state, job, need, inventory, admit)
        rejected: list[Candidate] = []
        options: list[_Option] = []
        for group in () if job.colocate else state.groups.values():
            if group.colocated or group.group_id in state.closing:
                continue
            gate = self._gate(state, group, need, job)
            if gate:
                rejected.append(Candidate("group", group.group_id, None, 0.0, "rejected", gate))
                continue
            if apart:
                rejected.append(Candidate("group", group.group_id, None, 0.0, "rejected", apart))
            else:
                self._group_options(state, group, job, need, options, rejected, inventory)
            if self._may_host(state, job):
                self._host_options(state, group, job, need, options, rejected)
        return self._decide_among(state, job, need, options, rejected, explain, inventory, admit)

    def _apart(self, inventory: Inventory, job: Job, need: dict[str, int]) -> str:
        """Why ``job``'s own rollout and training nodes can never be held ('' when they can,
        or when the job only runs co-located)."""
        return "" if job.colocate else inventory.short(need[ROLLOUT], need[TRAIN])

    def _offers_colocation(self, job: Job) -> bool:
        """Whether the co-location option is offered to ``job`` (see "Placement space")."""
        return job.colocate or (self.space.colocation and not job.staleness and not self.accounting.one_node_per_pool)

    def _colocated_kinds(self, job: Job, need: dict[str, int], inventory: Inventory) -> bool:
        """Whether the space offers ``job`` a co-located kind that ``inventory`` could ever
        hold ("Inventory"): co-location, or hosting (in a group, which holds a rollout node
        and the job's training nodes)."""
        hosts = self.space.hosting and not job.staleness and not self.accounting.one_node_per_pool
        return self._offers_colocation(job) or (hosts and not inventory.short(1, need[TRAIN]))

    @staticmethod
    def _colocated_miss(state: PlanState, job: Job) -> str:
        """Why ``job`` could never run co-located, alone or hosted: its co-located slowdown
        misses its SLO, or both phases' state fits no training node ('' when neither)."""
        slow = colocation.slowdown(job, state.cluster)
        if slow > job.slo * (1 + SLO_EPS):
            return f"co-located {slow:.3f} > its SLO {job.slo:.3f}"
        if not colocation.fits(job, state.cluster):
            return f"co-located: both phases' state ({colocation.node_mem_gb(job):g} GB a node) fits no training node"
        return ""

    def _decide_among(self, state: PlanState, job: Job, need: dict[str, int], options: list[_Option],
                      rejected: list[Candidate], explain: bool, inventory: Inventory,
                      admit: Callable[[Placement], bool] | None = None) -> Decision:
        """Add the new-group option, evaluate in (cost, kind, generation) order and choose;
        a wait names the pools that lack free nodes."""
        apart = self._apart(inventory, job, need)
        new = None if job.colocate or apart else self._new_group_option(state, job, need, len(options))
        if job.colocate:
            rejected.append(Candidate(NEW, None, None, 0.0, "rejected", COLOCATE_ONLY))
        elif apart:
            rejected.append(Candidate(NEW, None, None, 0.0, "rejected", apart))
        elif new is None:
            rejected.append(Candidate(NEW, None, None, 0.0, "rejected", self._inventory_reason(state, job, need)))
        else:
            options.append(new)
        if self._offers_colocation(job):
            colo = self._colocated_option(state, job, need, len(options))
            if isinstance(colo, str):
                rejected.append(Candidate(COLOCATE, None, None, 0.0, "rejected", colo))
            else:
                options.append(colo)
        options.sort(key=lambda o: (o.cost, _KIND_RANK[o.kind], o.rank))
        decision = self._choose(state, job, options, rejected, explain, inventory, admit)
        if decision.outcome == "wait" and apart and not self._offers_colocation(job):  # no node to wait for
            decision = replace(decision, outcome="rejected", reason=f"{apart}; no group can host it",
                               short_pools=(ROLLOUT,))
        elif decision.outcome == "wait" and (job.colocate or apart):
            decision = replace(decision, short_pools=(TRAIN,))
        elif decision.outcome == "wait":
            short = tuple(p for p in POOLS if state.peek_new(p, need[p], job.mem(p)) is None)
            decision = replace(decision, short_pools=short)
        return decision

    def _decide_fast(self, state: PlanState, job: Job, need: dict[str, int], inventory: Inventory,
                     admit: Callable[[Placement], bool] | None = None) -> Decision:
        """``decide`` without ``explain``: the same choice, generating only candidates that
        pass the ``_peak_demand`` prune (see "Fast path" in the module docstring)."""
        cluster = state.cluster
        limit_size = cluster.max_group_size
        gate = self.accounting.saturation_gate
        lim = 1.0 + SLO_EPS
        limit = job.slo * job.t_solo
        share_r, share_t = job.t_roll_s / limit, job.t_train_s / limit
        mem_r, mem_t = job.mem(ROLLOUT), job.mem(TRAIN)
        need_r, need_t = need[ROLLOUT], need[TRAIN]
        price_r, price_t = cluster.node_price(ROLLOUT), cluster.node_price(TRAIN)
        # the start-up floor at group level (_group_floor): the newcomer's own allowance
        floors = self.accounting.whole_run_slo_checks and not job.staleness
        cap_j = _floor_cap(job) if floors else float("inf")
        scale_t = self.space.train_scaling
        new_ids: dict[str, dict[int, tuple[str, ...] | None]] = {}
        for pool, most, share in ((ROLLOUT, need_r, share_r), (TRAIN, need_t if scale_t else 0, share_t)):
            new_ids[pool] = {0: ()}
            for m in range(1, most + 1):
                ids = state.peek_new(pool, m, job.mem(pool))
                new_ids[pool][m] = None if ids is None or 0.0 + share > lim else ids
        # with every training node new the newcomer may share no training node (_group_floor)
        all_new_t = scale_t and new_ids[TRAIN][need_t] is not None
        host = self._may_host(state, job)
        apart, bounded = self._apart(inventory, job, need), inventory.bounded
        options: list[_Option] = []
        for group in () if job.staleness or job.colocate else state.groups.values():
            n_train = len(group.train_nodes)
            if (group.colocated or len(group.members) >= limit_size or (not scale_t and need_t > n_train)
                    or group.group_id in state.closing):
                continue
            if any(m.job.staleness for m in group.members):  # ASYNC_APART
                continue
            gid = group.group_id
            view = state.view(gid)
            if view.peak > lim or (gate and view.saturated):
                continue
            if host and need_t <= n_train:
                self._host_options(state, group, job, need, options, None)
            if apart:  # ("Inventory")
                continue
            floor = _group_floor(view, group) if floors else None
            if floor is not None and max(floor[0], job.t_solo, (0.0 if all_new_t else floor[2]) + job.t_train_s) > min(
                    floor[1], cap_j):
                continue
            trains = []
            for m_t, fresh_t in new_ids[TRAIN].items():
                if need_t - m_t > n_train or fresh_t is None:
                    continue
                choices = [c + fresh_t for c, top in _choices(state, view, group, TRAIN, need_t - m_t, mem_t)
                           if not top + share_t > lim]
                if choices:
                    trains.append((m_t, fresh_t, choices))
            n_roll = len(group.rollout_nodes)
            for m_t, fresh_t, train_choices in trains:
                for m, fresh_r in new_ids[ROLLOUT].items():
                    k = need_r - m
                    if (k > n_roll or fresh_r is None or (m == need_r and m_t == need_t)
                            or (bounded and inventory.short(n_roll + m, n_train + m_t))):
                        continue
                    kind, cost = _kind(m, m_t), m * price_r + m_t * price_t
                    for roll, top in _choices(state, view, group, ROLLOUT, k, mem_r):
                        if top + share_r > lim:
                            continue
                        roll = roll + fresh_r
                        for train in train_choices:
                            placement = Placement(gid, roll, train, new_rollout=fresh_r, new_train=fresh_t)
                            options.append(_Option(kind, group, placement, cost, len(options), True))
        return self._decide_among(state, job, need, options, [], False, inventory, admit)

    def repack(self, state: PlanState, job_id: str, remaining: int, spare_s: float,
               progress: Callable[[str], tuple[int, float]] | None = None) -> Decision | None:
        """Consolidation (beyond the paper): move a running job into another group at zero
        marginal cost when that gives back nodes only it used in its own group.

        The target must pass every check of a new arrival (residency, size, SLOs of all
        members, also after departures); the source group stays feasible because every
        group is already checked against the departure of any member. ``remaining``
        iterations at the target's steady iteration time must fit in ``spare_s``, the
        seconds the caller can still spend without breaking the job's SLO over its whole
        run (the caller subtracts what has elapsed and the migration pause).
        ``progress(k)``, when given, says the same (remaining iterations, spare seconds)
        for each member k of the target: the move must leave
        remaining_k x iter_k + TRANSIENT_PERIODS x period <= spare_k (the group has to
        settle after the admission), so that repeated admissions never add up past an
        SLO over a member's whole run. Returns a Decision with outcome "repacked" and marginal cost
        minus the freed nodes' price, or None when no such move exists. Candidates in
        creation order; first fit.
        """
        group = state.group_of(job_id)
        member = group.member(job_id)
        assert member is not None, f"job {job_id} is in no group's members"
        if group.colocated or member.hosted:  # its phase times are the co-located ones; it stays where it is
            return None
        others = [m for m in group.members if m is not member]
        freed = {pool: [n for n in member.nodes(pool) if not any(n in o.nodes(pool) for o in others)]
                 for pool in POOLS}
        saving = sum(len(freed[p]) * state.cluster.node_price(p) for p in POOLS)
        if saving <= 0:
            return None
        job = member.job
        need = {pool: len(member.nodes(pool)) for pool in POOLS}
        options: list[_Option] = []
        for target in state.groups.values():
            if (target is group or target.colocated or target.group_id in state.closing
                    or self._gate(state, target, need, job)):
                continue
            self._group_options(state, target, job, need, options, [])
        for opt in options:
            if opt.kind != PACK:
                continue
            cand = self._evaluate(state, job, opt)
            if cand.verdict != "feasible":
                continue
            a = analyze(opt.members(state, job))
            if a.iteration_s[job_id] * remaining > spare_s:
                continue
            assert opt.group is not None, "a repacking option always targets a group"
            if progress is not None and not members_keep_pace(a, opt.group.members, progress):
                continue
            chosen = Candidate(PACK, cand.group_id, cand.placement, -saving, "chosen",
                               f"frees {', '.join(freed[ROLLOUT] + freed[TRAIN])}", cand.max_slowdown)
            return Decision(job_id, "repacked", opt.placement, -saving, (chosen,))
        return None

    # --- gates and generation -------------------------------------------------------
    def _gate(self, state: PlanState, group: Group, need: dict[str, int], job: Job) -> str:
        if job.staleness or any(m.job.staleness for m in group.members):
            return ASYNC_APART
        limit = state.cluster.max_group_size
        if len(group.members) >= limit:
            return f"group full ({len(group.members)}/{limit} jobs)"
        if need[TRAIN] > len(group.train_nodes) and not self.space.train_scaling:
            return f"needs {need[TRAIN]} training nodes, group has {len(group.train_nodes)} (training side is never scaled)"
        view = state.view(group.group_id)
        if view.saturated and self.accounting.saturation_gate:
            return f"saturated (T_load {t_load(view.profiles):.1f}s >= T_cycle {t_cycle(view.profiles):.1f}s)"
        return ""

    def _group_options(self, state: PlanState, group: Group, job: Job, need: dict[str, int],
                       options: list[_Option], rejected: list[Candidate], inventory: Inventory = Inventory()) -> None:
        """Every pack and scaling candidate of ``group`` for ``job`` (see "Candidates"):
        per pool the ways to take its nodes (m new, the rest among the group's), then
        their products, training ways outer; none whose group ``inventory`` could never
        hold ("Inventory")."""
        price = {pool: state.cluster.node_price(pool) for pool in POOLS}
        gid = group.group_id
        ways: dict[str, list[tuple[int, tuple[str, ...], list[tuple[str, ...]]]]] = {}
        for pool in (TRAIN, ROLLOUT):
            ways[pool] = []
            top = need[pool] if pool == ROLLOUT or self.space.train_scaling else 0
            for m in range(0, top + 1):
                k = need[pool] - m
                if k > len(group.nodes(pool)):
                    continue
                kind = _kind(m, 0) if pool == ROLLOUT else _kind(0, m)
                fresh = state.peek_new(pool, m, job.mem(pool)) if m else ()
                if fresh is None:
                    rejected.append(Candidate(kind, gid, None, m * price[pool], "rejected",
                                              f"{pool} pool has {state.free_count(pool)} free nodes, needs {m}"))
                    continue
                choices, full = node_choices(state, group, pool, k, job.mem(pool))
                if not choices:
                    rejected.append(Candidate(kind, gid, None, m * price[pool], "rejected", f"residency: {full}"))
                    continue
                ways[pool].append((m, fresh, [c + fresh for c in choices]))
            if not ways[pool]:
                return
        for m_t, fresh_t, train_choices in ways[TRAIN]:
            for m_r, fresh_r, roll_choices in ways[ROLLOUT]:
                if m_r == need[ROLLOUT] and m_t == need[TRAIN]:
                    continue
                kind, cost = _kind(m_r, m_t), m_r * price[ROLLOUT] + m_t * price[TRAIN]
                never = inventory.short(len(group.rollout_nodes) + m_r, len(group.train_nodes) + m_t)
                if never:
                    rejected.append(Candidate(kind, gid, None, cost, "rejected", never))
                    continue
                for roll in roll_choices:
                    for train in train_choices:
                        placement = Placement(gid, roll, train, new_rollout=fresh_r, new_train=fresh_t)
                        options.append(_Option(kind, group, placement, cost, len(options)))

    def _may_host(self, state: PlanState, job: Job) -> bool:
        """Whether ``job`` is offered hosting at all (see "Placement space"): the space has it,
        the job is synchronous and not co-located-only, the accounting is ours, and alone
        co-located it would meet its SLO (hosted, it can only be slower)."""
        return (self.space.hosting and not job.staleness and not job.colocate
                and not self.accounting.one_node_per_pool
                and colocation.slowdown(job, state.cluster) <= job.slo * (1 + SLO_EPS))

    @staticmethod
    def _host_options(state: PlanState, group: Group, job: Job, need: dict[str, int], options: list[_Option],
                      rejected: list[Candidate] | None) -> None:
        """The hosting candidates of ``group`` (see "Placement space"): each distinct choice of
        t_j of its training nodes with room for both phases' state, kept when the busiest
        one passes ``_peak_demand``'s bound with the job's co-located share
        I_c / (SLO_j T_solo_j) on it (so the options are ``peak_checked``). ``rejected``
        (explain) collects what was left out and why; None (fast path) drops it."""
        gid = group.group_id
        choices, full = node_choices(state, group, TRAIN, need[TRAIN], colocation.node_mem_gb(job))
        if not choices:
            if rejected is not None:
                rejected.append(Candidate(HOST, gid, None, 0.0, "rejected", f"residency: {full}"))
            return
        share = state.view(gid).share
        x = colocation.iteration_s(job, state.cluster) / (job.slo * job.t_solo)
        for train in choices:
            placement = Placement.hosted_in(gid, train)
            node, top = max(((n, share.get(n, 0.0)) for n in train), key=lambda kv: kv[1])
            if top + x > 1.0 + SLO_EPS:
                if rejected is not None:
                    rejected.append(Candidate(HOST, gid, placement, 0.0, "rejected",
                                              f"SLO bound: node {node} would need {top + x:.2f}x its time at the "
                                              f"members' SLO rates"))
                continue
            options.append(_Option(HOST, group, placement, 0.0, len(options), True))

    @staticmethod
    def _new_group_option(state: PlanState, job: Job, need: dict[str, int], rank: int) -> _Option | None:
        roll = state.peek_new(ROLLOUT, need[ROLLOUT], job.mem(ROLLOUT))
        train = state.peek_new(TRAIN, need[TRAIN], job.mem(TRAIN))
        if roll is None or train is None:
            return None
        cost = sum(need[p] * state.cluster.node_price(p) for p in POOLS)
        return _Option(NEW, None, Placement(None, roll, train, roll, train), cost, rank)

    def shared_cost(self, state: PlanState, job: Job, need: dict[str, int],
                    inventory: Inventory | None = None) -> float:
        """The prospect test for co-location: the least $/h ``job``'s share of a group of two
        would cost, per hour of its solo work, with a copy of itself or with a job like one
        running now (at most ``PROSPECTS`` distinct shapes of the same widths; the running
        jobs stand for the ones to come); infinite when no such pair keeps both SLOs and
        fits in memory. Pinnings: the same nodes in both pools, or its own rollout nodes and
        the partner's training nodes (rollout scaling), or, with training scaling, the other
        way round. Members sharing a pool's nodes take turns there (the claim of
        ``_shared_pair_miss``), so each one's iteration is at least
        I = max(R_a + T_a (+ switches on shared pools), sum over the two of their phases on
        each shared pool (with switches)); the test takes I as the pair's iteration, a
        bound, not an analysis: it is a heuristic about arrivals to come. Its share of a
        pair is half the pair's $/h times I / T_solo. Only pairs that ``inventory`` (by
        default ``state``'s cluster's) could hold count ("Inventory"). The running jobs'
        shapes are kept per group version (``GroupView.memo``)."""
        cluster = state.cluster
        inventory = Inventory.of(cluster) if inventory is None else inventory
        sharings = [(share_r, share_t) for share_r, share_t in
                    [(True, True), (False, True)] + ([(True, False)] if self.space.train_scaling else [])
                    if not inventory.short((1 if share_r else 2) * need[ROLLOUT], (1 if share_t else 2) * need[TRAIN])]
        if not sharings:
            return float("inf")
        price = {p: cluster.node_price(p) for p in POOLS}
        cap = {p: cluster.pool(p).host_mem_gb for p in POOLS}
        mine = _pair_shape(job, cluster)
        partners = {mine: None}
        key = ("prospects", need[ROLLOUT], need[TRAIN])
        for gid in state.groups:
            view = state.view(gid)
            shapes = view.memo.get(key)
            if shapes is None:  # its members that could pair with a job of these widths
                shapes = view.memo[key] = [
                    _pair_shape(m.job, cluster) for m in state.groups[gid].members
                    if not m.job.staleness and not m.job.colocate
                    and all(m.job.nodes(p, cluster.gpus_per_node) == need[p] for p in POOLS)]
            for other in shapes:
                if len(partners) > PROSPECTS:
                    break
                partners.setdefault(other, None)
        (r0, t0), (sr0, st0), (mr0, mt0), slo0 = mine
        solo0, lim0 = r0 + t0, slo0 * (1 + SLO_EPS)
        best = float("inf")
        for (r1, t1), (sr1, st1), (mr1, mt1), slo1 in partners:  # plain arithmetic: a memo's keys cost more
            solo1, lim1 = r1 + t1, slo1 * (1 + SLO_EPS)
            for share_r, share_t in sharings:
                if (share_r and mr0 + mr1 > cap[ROLLOUT]) or (share_t and mt0 + mt1 > cap[TRAIN]):
                    continue
                turn = max(r0 + r1 + sr0 + sr1 if share_r else 0.0, t0 + t1 + st0 + st1 if share_t else 0.0)
                slow0 = max(solo0 + ((sr0 if share_r else 0.0) + (st0 if share_t else 0.0)), turn) / solo0
                slow1 = max(solo1 + ((sr1 if share_r else 0.0) + (st1 if share_t else 0.0)), turn) / solo1
                if slow0 <= lim0 and slow1 <= lim1:
                    pair = ((1 if share_r else 2) * need[ROLLOUT] * price[ROLLOUT]
                            + (1 if share_t else 2) * need[TRAIN] * price[TRAIN])
                    best = min(best, pair / 2 * slow0)
        return best

    @staticmethod
    def _colocated_option(state: PlanState, job: Job, need: dict[str, int], rank: int) -> _Option | str:
        """The co-location option (see "Placement space"), or why there is none."""
        mem = colocation.node_mem_gb(job)
        ids = state.peek_new(TRAIN, need[TRAIN], mem)  # a bounded pool checks each listed node's memory
        if ids is None or (not state.bounded(TRAIN) and mem > state.cluster.train.host_mem_gb):
            return (f"co-located: train pool has {state.free_count(TRAIN)} free nodes, needs {need[TRAIN]} "
                    f"with {mem:g} GB (both phases)")
        cost = colocation.slowdown(job, state.cluster) * need[TRAIN] * state.cluster.node_price(TRAIN)
        return _Option(COLOCATE, None, Placement.colocated_on(ids), cost, rank)

    @staticmethod
    def _inventory_reason(state: PlanState, job: Job, need: dict[str, int]) -> str:
        parts = [f"{p} pool has {state.free_count(p)} free nodes, needs {need[p]} with {job.mem(p):g} GB"
                 for p in POOLS if state.peek_new(p, need[p], job.mem(p)) is None]
        return "; ".join(parts)

    # --- evaluation and choice ------------------------------------------------------
    def _choose(self, state: PlanState, job: Job, options: list[_Option], rejected: list[Candidate],
                explain: bool, inventory: Inventory, admit: Callable[[Placement], bool] | None = None) -> Decision:
        evaluated: list[Candidate] = []
        best: tuple[float, int] | None = None  # (-score, index in evaluated)
        best_cost: float | None = None
        stop_at = len(options)
        refused = False  # ``admit`` refused the first feasible candidate
        for idx, opt in enumerate(options):
            if best_cost is not None and (self.tie_break == "first" or opt.cost > best_cost):
                if not explain:
                    stop_at = idx
                    break
                evaluated.append(self._evaluate(state, job, opt, inventory))
                continue
            if refused and not explain and not admit(opt.placement):
                evaluated.append(Candidate(opt.kind, opt.group.group_id if opt.group else None, opt.placement,
                                           opt.cost, "not evaluated", NOT_ADMITTED))
                continue
            cand = self._evaluate(state, job, opt, inventory)
            evaluated.append(cand)
            if (cand.verdict == "feasible" and admit is not None and (explain or not refused)
                    and not admit(opt.placement)):
                refused = True
                continue
            if cand.verdict == "feasible":
                if best_cost is None:
                    best_cost = opt.cost
                score = -(cand.utilization or 0.0)
                if best is None or (self.tie_break == "best-fit" and score < best[0]):
                    best = (score, len(evaluated) - 1)
        skipped = [Candidate(o.kind, o.group.group_id if o.group else None, o.placement, o.cost, "not evaluated",
                             "a cheaper or equal candidate was chosen first") for o in options[stop_at:]]
        if best is None:
            return Decision(job.job_id, "wait", None, 0.0, tuple(rejected + evaluated),
                            "no free node can host it now: " + (rejected[-1].reason if rejected else "inventory"))
        chosen = evaluated[best[1]]
        evaluated[best[1]] = Candidate(chosen.kind, chosen.group_id, chosen.placement, chosen.marginal_cost,
                                       "chosen", chosen.reason, chosen.max_slowdown, chosen.utilization)
        return Decision(job.job_id, OUTCOME[chosen.kind], chosen.placement, chosen.marginal_cost,
                        tuple(evaluated + skipped + rejected))

    def _evaluate(self, state: PlanState, job: Job, opt: _Option, inventory: Inventory | None = None) -> Candidate:
        """``opt``'s verdict; ``inventory`` bounds the co-location prospect test's pairs."""
        gid = opt.group.group_id if opt.group else None
        if opt.kind == COLOCATE:
            slow = colocation.slowdown(job, state.cluster)
            if slow > job.slo * (1 + SLO_EPS):
                return Candidate(opt.kind, gid, opt.placement, opt.cost, "rejected",
                                 f"SLO of job {job.job_id}: co-located {slow:.3f} > {job.slo:.3f}", slow)
            if not job.colocate:  # the prospect test, only once co-location is the cheapest option left
                need = {p: job.nodes(p, state.cluster.gpus_per_node) for p in POOLS}
                share = self.shared_cost(state, job, need, inventory)
                if opt.cost >= share:
                    return Candidate(opt.kind, gid, opt.placement, opt.cost, "rejected",
                                     f"prospects: its share of a pair would cost ${share:.2f}/h", slow)
            busy = 1.0 - sum(colocation.phase_time(job, p, state.cluster)[1] for p in POOLS) / (slow * job.t_solo)
            return Candidate(opt.kind, gid, opt.placement, opt.cost, "feasible",
                             f"{slow:.3f}x as long on its own training nodes (cost counted {slow:.3f}x)", slow, busy)
        if opt.group is None:
            util = _cost_weighted(state, _solo_analysis(state, job, opt.placement), 1, 1)
            return Candidate(opt.kind, gid, opt.placement, opt.cost, "feasible", "", 1.0, util)
        if not opt.peak_checked:
            node, peak = _peak_demand(state.view(opt.group.group_id).share, job, opt.placement)
        if not opt.peak_checked and peak > 1.0 + SLO_EPS:
            return Candidate(opt.kind, gid, opt.placement, opt.cost, "rejected",
                             f"SLO bound: node {node} would need {peak:.2f}x its time at the members' SLO rates")
        members, slo = opt.members(state, job), opt.slo(state, job)
        if opt.kind == HOST or opt.group.hosts:
            spread = _gang_over_hosted(members)
            if spread:
                return Candidate(opt.kind, gid, opt.placement, opt.cost, "rejected", spread)
        miss = _shared_pair_miss(members, slo)
        if not miss and opt.peak_checked:
            jobs = [m.job for m in opt.group.members] + [job] if self.accounting.whole_run_slo_checks else None
            miss = _peer_miss(members, slo, jobs) or (_startup_floor_miss(members, jobs) if jobs is not None else "")
        if miss:
            return Candidate(opt.kind, gid, opt.placement, opt.cost, "rejected", miss)
        a = analyze(members)
        worst = max(a.slowdown.values())
        miss = _slo_miss(a, slo)
        whole_run = self.accounting.whole_run_slo_checks
        if not miss and whole_run:
            miss = _startup_miss(a, [m.job for m in opt.group.members] + [job]) or _departure_miss(members, slo)
        if not miss and whole_run and self.space.all_starts and not any(m.staleness for m in members):  # last
            orders = self.space.all_orders
            miss = (_start_miss(members, slo, orders=orders)
                    or _departure_miss(members, slo, all_starts=True, orders=orders))
        if miss:
            return Candidate(opt.kind, gid, opt.placement, opt.cost, "rejected", miss, worst)
        n_roll = len(opt.group.rollout_nodes) + len(opt.placement.new_rollout)
        util = _cost_weighted(state, a, n_roll, len(opt.group.train_nodes) + len(opt.placement.new_train))
        return Candidate(opt.kind, gid, opt.placement, opt.cost, "feasible", "", worst, util)


def _peak_demand(share: dict[str, float], job: Job, placement: Placement) -> tuple[str, float]:
    """The busiest node at SLO rates: a necessary condition checked before the analysis.

    Over a long window W a node n is busy at most W, and member k runs its phase d_k(n)
    there once per iteration, W / iter_k times. If every member met its SLO,
    iter_k <= SLO_k * T_solo_k, so  sum_{k on n} d_k(n) / (SLO_k * T_solo_k) <= 1  must hold
    on every node. Switch seconds are left out, which keeps the bound safe. ``share`` is
    that sum for the group's current members (``PlanState.view``); the newcomer ``job``
    adds its own share on the nodes of ``placement``. Returns the node with the largest
    left-hand side and that value.
    """
    demand = dict(share)
    limit = job.slo * job.t_solo
    share_r, share_t = job.t_roll_s / limit, job.t_train_s / limit
    for node in placement.rollout_nodes:
        demand[node] = demand.get(node, 0.0) + share_r
    for node in placement.train_nodes:
        demand[node] = demand.get(node, 0.0) + share_t
    return max(demand.items(), key=lambda kv: kv[1])


def _gang_over_hosted(members: list[MemberProfile]) -> str:
    """Hosting's guard: no member's training may span a hosted member's nodes and others.

    A hosted member runs both phases on its nodes, back to back; a member whose training
    needs those nodes and another one at once waits for all of them to be free together.
    Before the execution rule reserved a waiting phase's nodes (rule 3), the dispatch kept
    starting the hosted phases whenever one of those nodes was free: on the production
    trace a 2 + 2-node job with single-node jobs hosted on each of its training nodes ran
    one iteration in 43,373 s instead of the analysed 803 s. The reservation bounds that
    wait, and the check of every start covers the schedules it leads to; the guard stays
    because it is cheaper: without it ``rollmux-host`` cost $686.1/h on production
    instead of $661.6/h, and $474.0/h on philly-mix instead of $473.1/h, every SLO met
    either way (2026-11-26). So a member (hosted or not) whose training nodes meet a
    hosted member's must have them all among that member's nodes."""
    for h in members:
        if h.rollout_nodes != h.train_nodes:
            continue
        mine = set(h.train_nodes)
        for m in members:
            if m is not h and not mine.isdisjoint(m.train_nodes) and not mine.issuperset(m.train_nodes):
                return (f"hosting: job {m.job_id} trains on {', '.join(m.train_nodes)}, across hosted job "
                        f"{h.job_id}'s {', '.join(h.train_nodes)} (it could wait on them for ever)")
    return ""


def _shared_pair_miss(members: list[MemberProfile], slo: dict[str, float]) -> str:
    """A second necessary condition, for a group on one rollout node and one training node.

    Claim: there, between two training phases of member A every other member B runs a
    training phase. Proof: let A's training end at t1; A then queues for rollout. At t1, B
    is either (a) queued for training: the training node is free at t1 and A is not
    queued there, so B runs next; (b) queued for rollout since before t1: first come,
    first served runs B's rollout before A's, so B queues for training first and runs
    before A's next training; (c) running rollout: A's rollout starts after it ends, so
    again B queues for training first. (B cannot finish training at t1: one node.) The
    same holds for rollout phases. So in steady state the members take turns: equal
    iteration time I, every phase follows another member's on its node and pays its
    switch seconds, and

        I >= max( max_k (T_roll_k + s_roll_k + T_train_k + s_train_k),
                  sum_k (T_roll_k + s_roll_k),  sum_k (T_train_k + s_train_k) ).

    If that exceeds some member's SLO_k * T_solo_k, no analysis can pass it. A slack of
    ``_TICK_SLACK`` seconds covers the analysis' rounding of durations to microseconds.
    """
    if len(members) < 2 or any(m.staleness for m in members):  # (see "Asynchronous jobs")
        return ""
    first = members[0]
    if first.rollout_nodes == first.train_nodes:  # hosted: both phases on one node (the claim needs two)
        return ""
    if len(first.rollout_nodes) != 1 or len(first.train_nodes) != 1 or any(
            m.rollout_nodes != first.rollout_nodes or m.train_nodes != first.train_nodes for m in members):
        return ""
    roll = [m.t_roll + m.switch_roll for m in members]
    train = [m.t_train + m.switch_train for m in members]
    period = max(max(r + t for r, t in zip(roll, train)), sum(roll), sum(train))
    for m in members:
        if period > slo[m.job_id] * m.t_solo * (1 + SLO_EPS) + _TICK_SLACK:
            return (f"SLO of job {m.job_id}: at least {period / m.t_solo:.3f} > {slo[m.job_id]:.3f} "
                    f"(one node per pool: members take turns, iteration >= {period:.1f}s)")
    return ""


def _peer_miss(members: list[MemberProfile], slo: dict[str, float], jobs: list[Job] | None) -> str:
    """A third necessary condition: members that share a node in each pool take turns.

    ``rollmux.kernel.peer_floors`` has the proofs. Synchronous members sharing a rollout
    node and a training node ("peers") alternate, whatever the other members do, so
    every gap between two training ends of a member A with a peer is at least its gap
    floor g_A; and in a group of synchronous members only, the analysis reports every
    member of a connected set C of peers at least F_C, C's busiest node (phases plus
    switch seconds) or its longest switched iteration (a run without a repeat is raised
    to it). So F_C > SLO_A x T_solo_A (g_A with an asynchronous member in the group) fails
    the steady check. With ``jobs`` (whole-run checks on) the start-up check
    ``_startup_miss`` needs iter_A + period / n_A <= SLO_A x T_solo_A, and the period is
    at least g_A (a whole number of A's gaps, or the fallback's half that holds A's
    measured gaps), so iter_A + g_A / n_A above it fails that check too. ``_TICK_SLACK``
    (doubled for the start-up form) covers the analysis' rounding to microseconds.
    Members pinned identically share both nodes, so this subsumes the turn classes of
    earlier versions, and a group on one node per pool is one set C
    (``_shared_pair_miss``'s bound is F_C). Asynchronous members take no part: the
    claims need A's rollout between two trainings of A (and B's queue order); the
    floors of the others hold whatever the asynchronous ones do, F_C aside, as
    ``rollmux.intra_async`` does not raise its fallback to it.
    """
    sync = [m for m in members if not m.staleness]
    floors = peer_floors([(m.t_roll, m.t_train, m.rollout_nodes, m.train_nodes, m.switch_roll, m.switch_train)
                          for m in sync])
    whole = len(sync) == len(members)
    by_id = {j.job_id: j for j in jobs} if jobs is not None else {}
    for m, f in zip(sync, floors):
        if f is None:
            continue
        gap, comp = f
        floor = comp if whole else gap
        if floor > slo[m.job_id] * m.t_solo * (1 + SLO_EPS) + _TICK_SLACK:
            return (f"SLO of job {m.job_id}: at least {floor / m.t_solo:.3f} > {slo[m.job_id]:.3f} "
                    f"(members sharing a node in each pool take turns, iteration >= {floor:.1f}s)")
        job = by_id.get(m.job_id)
        if job is None or (job.iterations is None and job.duration_s is None):
            continue
        n = job.solo_iterations()
        mean = floor + gap / n
        if mean > job.slo * job.t_solo * (1 + SLO_EPS) + 2 * _TICK_SLACK:
            return (f"SLO of job {m.job_id}: at least {mean / job.t_solo:.3f} > {job.slo:.3f} over its {n} "
                    f"iterations with start-up (members sharing a node in each pool take turns)")
    return ""


def members_keep_pace(a: GroupAnalysis, members: list[Member], progress: Callable[[str], tuple[int, float]],
                      pause_s: float = 0.0) -> bool:
    """Every member k still fits its SLO over its whole run: remaining_k x iter_k, plus
    ``TRANSIENT_PERIODS`` periods for the way into the new steady state, plus ``pause_s``
    stopped, within the spare seconds ``progress(k)`` reports."""
    for m in members:
        left, spare = progress(m.job.job_id)
        if a.iteration_s[m.job.job_id] * left + TRANSIENT_PERIODS * a.period + pause_s > spare:
            return False
    return True


def _slo_miss(a: GroupAnalysis, slo: dict[str, float], remaining: str = "") -> str:
    for job_id, s in a.slowdown.items():
        if s > slo[job_id] * (1 + SLO_EPS):
            return f"SLO of job {job_id}: {s:.3f} > {slo[job_id]:.3f}{remaining}"
    return ""


def _startup_floor_miss(members: list[MemberProfile], jobs: list[Job]) -> str:
    """A necessary condition for ``_startup_miss`` before any analysis (synchronous groups).

    Claim: every analysis of ``members`` either gives some member an infinite iteration
    time (the steady check fails), or has iter_k >= T_solo_k for every member k and
    period >= F = max(t_load, t_cycle). Proof. A synchronous member runs its rollout and
    its training one after the other, so two of its training ends are at least
    R_k + T_k apart, and iter_k (period / iterations in a repeating window, or the mean
    gap between training ends in the fallback's second half) is at least T_solo_k. With
    every iteration time finite, the window (repeating, or the fallback's half) holds a
    whole iteration of every member: in a repeating window each member completes c_k >= 1
    iterations and, by periodicity, runs each of its phases c_k times on each of its nodes;
    in the fallback each member has two training ends in the half, so one rollout and one
    training in between. Phases on one node never overlap, so the window is at least
    sum_{k on n} d_k(n) for every node n (t_load), and at least one whole iteration of
    each member (t_cycle).
    So steady + period / n_k >= T_solo_k + F / n_k, and if that exceeds
    SLO_k x T_solo_k for a member of known length n_k, the start-up check (or the
    steady one) rejects. ``_TICK_SLACK`` covers the analysis' microsecond rounding.
    Asynchronous members pipeline their phases, so the first step fails for them: the
    condition is not applied to a group with one. A hosted member runs its co-located
    phases, so its iteration is at least their sum, which may be below T_solo_k
    (``_least_iteration``).
    """
    if any(job.staleness for job in jobs):
        return ""
    floor = max(t_load(members), t_cycle(members))
    for job, m in zip(jobs, members):
        if job.iterations is None and job.duration_s is None:
            continue
        n = job.solo_iterations()
        mean = _least_iteration(job, m) + floor / n
        if mean > job.slo * job.t_solo * (1 + SLO_EPS) + _TICK_SLACK:
            return (f"SLO of job {job.job_id}: at least {mean / job.t_solo:.3f} > {job.slo:.3f} over its {n} "
                    f"iterations with start-up (a period is at least {floor:.1f} s)")
    return ""


def _least_iteration(job: Job, profile: MemberProfile) -> float:
    """A floor of a synchronous member's iteration in any group: its phases run one after
    the other, so T_solo, or the sum of its phases as profiled here when less (hosted)."""
    return min(job.t_solo, profile.t_roll + profile.t_train)


def _floor_cap(job: Job, least: float | None = None) -> float:
    """The largest period floor F that ``_startup_floor_miss`` lets ``job`` pass:
    n (SLO x T_solo (1 + eps) + slack - least) with ``least`` its iteration's floor
    (T_solo unless given); infinite for a job of unknown length."""
    if job.iterations is None and job.duration_s is None:
        return float("inf")
    least = job.t_solo if least is None else least
    return job.solo_iterations() * (job.slo * job.t_solo * (1 + SLO_EPS) + _TICK_SLACK - least)


def _group_floor(view: GroupView, group: Group) -> tuple[float, float, float] | None:
    """Per group version: (max(t_load, t_cycle) of its members, the smallest ``_floor_cap``
    among them, the least loaded training node's phase seconds); None when a member is
    asynchronous (the floor does not hold for it).

    Group-level form of ``_startup_floor_miss`` (fast path): a newcomer trains on some of
    the group's training nodes, so any group G' it forms has
    max(t_load, t_cycle)(G') >= max(F_G, T_solo_j, min_n load(n) + T_train_j); if that
    exceeds the smallest cap of G' every candidate in the group fails the floor, so the
    group is not expanded. A rejected candidate never changes the choice."""
    if "floor" not in view.memo:
        profiles = view.profiles
        load: dict[str, float] = {}
        for p in profiles:
            for n in p.train_nodes:
                load[n] = load.get(n, 0.0) + p.t_train
        jobs = [m.job for m in group.members]
        view.memo["floor"] = None if any(j.staleness for j in jobs) else (
            max(t_load(profiles), t_cycle(profiles)),
            min(_floor_cap(j, _least_iteration(j, p)) for j, p in zip(jobs, profiles)),
            min(load.get(n, 0.0) for n in group.train_nodes))
    return view.memo["floor"]


def _startup_miss(a: GroupAnalysis, jobs: list[Job]) -> str:
    """Each member's mean iteration over its whole run, transients included.

    Joining mid-rotation, the newcomer's first phase may wait up to one period of the
    group; its admission can in turn hold an existing member back by about one period,
    once. Over n iterations that adds period / n to the mean, so the check is
    steady + period / n <= SLO x T_solo. It matters only for short jobs; a job whose
    length is unknown (no duration or iterations) is taken to be long-running.
    """
    for job in jobs:
        if job.iterations is None and job.duration_s is None:
            continue
        n = job.solo_iterations()
        mean = a.iteration_s[job.job_id] + a.period / n
        if mean > job.slo * job.t_solo * (1 + SLO_EPS):
            return (f"SLO of job {job.job_id}: {mean / job.t_solo:.3f} > {job.slo:.3f} over its {n} iterations "
                    f"with start-up")
    return ""


def _departure_miss(members: list[MemberProfile], slo: dict[str, float], all_starts: bool = False,
                    orders: bool = False) -> str:
    """Check every group that departures could leave behind (the newcomer stays).

    Under first-come-first-served a departure can make the others slower (a member with a
    short phase on its own node may then take the shared node twice per turn of
    another). Every future membership of this group without a new arrival is a subset of
    today's, and each arrival is checked the same way, so checking every subset that
    keeps the newcomer keeps every SLO through any order of departures. With
    ``all_starts`` each subset is checked from every start (``_start_miss``, over every
    order of its members with ``orders``): a departure leaves the others mid-rotation.
    """
    old, new = members[:-1], members[-1]
    for size in range(len(old) - 1, 0, -1):
        for keep in combinations(old, size):
            rest = list(keep) + [new]
            remain = f" if only {', '.join(m.job_id for m in keep)} and {new.job_id} remain"
            miss = _slo_miss(analyze(rest), slo, remain) or (all_starts and _start_miss(rest, slo, remain, orders))
            if miss:
                return miss
    return ""


def _start_miss(members: list[MemberProfile], slo: dict[str, float], remaining: str = "",
                orders: bool = False) -> str:
    """The SLO check from every start of the group (``intra.worst_start``): each member's
    slowest steady iteration over the 2^n starts (and every order of the members with
    ``orders``) must fit its SLO ("Every start")."""
    limit = {m.job_id: slo[m.job_id] * (1 + SLO_EPS) * m.t_solo for m in members}
    worst = worst_start(members, orders, limit)
    for m in members:
        if worst[m.job_id] > limit[m.job_id]:
            return (f"SLO of job {m.job_id}: {worst[m.job_id] / m.t_solo:.3f} > {slo[m.job_id]:.3f} from another "
                    f"start (a schedule the group can settle into){remaining}")
    return ""


def _pair_shape(job: Job, cluster: Cluster) -> tuple:
    """What ``Planner.shared_cost`` reads of a job: its phases, switch seconds, memory and SLO."""
    sw = cluster.switch_cost
    return ((job.t_roll_s, job.t_train_s), (sw.seconds(job.model, ROLLOUT), sw.seconds(job.model, TRAIN)),
            (job.mem(ROLLOUT), job.mem(TRAIN)), job.slo)


def _solo_analysis(state: PlanState, job: Job, placement: Placement) -> GroupAnalysis:
    return analyze([state.profile(Member(job, placement.rollout_nodes, placement.train_nodes))])


def _cost_weighted(state: PlanState, a: GroupAnalysis, n_roll: int, n_train: int) -> float:
    c_r = n_roll * state.cluster.node_price(ROLLOUT)
    c_t = n_train * state.cluster.node_price(TRAIN)
    return (a.utilization[ROLLOUT] * c_r + a.utilization[TRAIN] * c_t) / (c_r + c_t)


def _choices(state: PlanState, view: GroupView, group: Group, pool: str, k: int,
             mem: float) -> list[tuple[tuple[str, ...], float]]:
    """``node_choices`` memoized on the group's version (its view), each choice with the
    largest ``share`` among its nodes (-inf for no node)."""
    key = (pool, k, mem)
    got = view.memo.get(key)
    if got is None:
        share = view.share
        choices, _ = node_choices(state, group, pool, k, mem)
        got = view.memo[key] = [(c, max((share.get(n, 0.0) for n in c), default=-float("inf"))) for c in choices]
    return got


def node_choices(state: PlanState, group: Group, pool: str, k: int, mem: float) -> tuple[list[tuple[str, ...]], str]:
    """Every distinct choice of ``k`` of the group's ``pool`` nodes with room for ``mem`` GB.

    Nodes with the same set of pinned jobs are interchangeable, so choices are multisets
    of such classes. Returns the choices and, when there are none, the residency reason.
    """
    if k == 0:
        return [()], ""
    classes: dict[tuple[str, ...], list[str]] = {}
    full = ""
    for entry in state.view(group.group_id).nodes[pool]:
        if entry.used_gb + mem > entry.capacity_gb:
            full = full or f"node {entry.node}: {entry.used_gb:.1f} + {mem:.1f} > {entry.capacity_gb:.0f} GB"
            continue
        classes.setdefault(entry.members, []).append(entry.node)
    buckets = list(classes.values())
    out: list[tuple[str, ...]] = []

    def pick(i: int, left: int, acc: list[str]) -> None:
        if left == 0:
            out.append(tuple(acc))
            return
        if i == len(buckets):
            return
        for take in range(min(left, len(buckets[i])), -1, -1):
            pick(i + 1, left - take, acc + buckets[i][:take])

    pick(0, k, [])
    if not out and not full:
        full = f"group has {len(group.nodes(pool))} {pool} nodes, job needs {k}"
    return out, full
