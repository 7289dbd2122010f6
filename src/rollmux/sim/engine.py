"""Discrete-event replay of a job trace through one placement policy.

Mechanism only: placement comes from the policy, phase order inside a group from the
execution rule (``rollmux.execution.GroupExecutor``, the same object the live control
plane drives), phase lengths from the duration model.

Events live in a heap keyed ``(time, kind, seq)``: phase ends (kind 0) before arrivals
(kind 1) at the same instant, then insertion order. After every event of an instant
has been applied, each group touched at that instant dispatches once, in group creation
order; so the result is a pure function of (trace, cluster, policy, duration model,
seed).

A job is placed on arrival (or waits, first come first placed, until a departure frees
room), runs ``Job.solo_iterations()`` iterations, and leaves after its last training
phase; its nodes are released at once. The run ends when the last job leaves (an event that
changes nothing, such as a phase end withdrawn by a fast-forward, is dropped before the
clock moves). A job the policy
rejects (it can never fit the inventory) and a job still waiting at the end never ran;
the result lists them with the reason. With a bounded pool, SLOs are judged on the
end-to-end slowdown (wait included; ``rollmux.sim.metrics``), and the queue and the
pools it waited on are recorded. If no job at all could be placed, ``simulate`` raises
CapacityError naming the pools that lacked nodes.

Backfilling by packing (``backfill=True``, the default): a job behind the waiting line's
head, or an arrival while the line is not empty, is placed at once when the policy packs
it into a running group on that group's own nodes (``Placement.packs``): it takes no free
node (the head's own placement is tried first, at every retry, as before), though it may
keep that group's nodes busy for longer, and so delay a head that waits for them. Each
such job counts as ``outcomes["backfilled"]``. With ``backfill=False`` the line is
strictly first come, first placed.

Consolidation (policies with a ``repack`` method): after a departure, each remaining
member of that group is offered a move once, and after an arrival opens a new group
(new room to fill), every running job is; the offer is taken up at the end of the
job's next training phase (an iteration boundary). A move must keep every member of
the target within its SLO over its whole run, given the time each has already spent.
If the policy moves it, the job leaves its group there, its freed nodes stop costing at
once, and it is admitted to the target group ``migration_s`` later (facts: migrating
and restarting a job costs 197-419 s), the pause counting against its own iteration
times.

Regrouping (policies with a ``regroup`` method): after a departure the policy may re-solve
that group with another one; every job of both stops at its next iteration boundary
and the new groups open once all their members have stopped. A policy with
``regroup_on_arrival`` (a placement space beyond the paper's) is also asked after an
arrival opened a group, which undoes a greedy co-location or new group when pairing it
pays. A policy with ``regroup_on_wait`` (``rollmux-hedge``, whose jobs start alone on
their own nodes, and ``rollmux-full-regroup``, which co-locates jobs) is also asked,
whenever the head of the waiting line is refused, for each group that holds one job
(``improve.lone_groups``, in creation order): a lone job gathered with others gives
nodes back to the pool the line waits on. Phase times follow
the kind of group a job is in at the phase's start (``rollmux.colocation.worst_phase``),
so a job moved out of co-location runs its profile.
On a fleet (a ``FleetState``) a regrouping names the view its groups open in
(``RegroupPlan.view``), which may differ from the one the jobs leave.

Long tail (``tail=True``; docs/long_tail.md): every rollout of a synchronous job draws its
``head`` (``DurationModel.head``). A full-rate rollout whose head is below 1 reports its tail
to the execution rule (rule 6 of ``rollmux.execution``) ``head x body`` into its body (event
kind 3, after every other event of the instant), keeping ``Job.tail_gpus()`` GPUs; the next
dispatch may hand the freed GPUs to a queued rollout (``Grant.share`` < 1). A slice's end is
known when it starts: it runs at ``share`` until its donor's rollout end (drawn already),
then at full rate; it reports no tail, so nothing is handed on from it. GPU busy-seconds
count work: a donor's freed GPUs stop counting from its tail report, and a slice counts
its body x its GPUs (the same GPU-seconds at any rate) less its tail's idle GPUs, work for
work as a whole rollout's: (1 - head) x body x the GPUs beyond those it keeps.
``handoff=False`` draws the same figures, heads included (a job's k-th rollout draws its
k-th head, slice or not), and hands nothing off (the tail's freed GPUs idle): the baseline
that compares phase for phase.

Asynchronous jobs (``Job.staleness`` >= 1; rules 10-12 of ``rollmux.execution``): a job's
rollout and training ends are separate events (``live`` and ``phase_of`` are per job and
pool); it is admitted with its remaining iterations as its rollout bound (none under
fixed departures), so its last training ends with no rollout in flight. It reports no
tail, and consolidation and regrouping never move it (it is offered no move and is not
movable): a move at a training end would cut its pipelined rollout. A group with an
asynchronous member is not fast-forwarded (``observe`` skips it), so its phases are all
replayed; its outcome carries ``Job.fill_s`` so that slowdowns compare with
``Job.solo_run_s`` (``rollmux.sim.metrics``).

Accounting (``accounting``, ``rollmux.accounting``): the cluster is first seen through it
(prices, host memory, switch cost). With
``fixed_departures`` (``--accounting paper``) a job does not stop after its iterations:
it leaves at arrival + ``duration_s`` (event kind 4, after every other event of the
instant) whatever its slowdown, in the middle of a phase if need be (the GPU-seconds its
phase still had to run stop counting as busy: after a tail report only the kept GPUs',
for a slice at its share until its donor's end; its recorded span ends there, and its
phase end no longer counts as an event, nor moves the run's end); its outcome counts the
iterations it completed, and its per-iteration slowdown is placement to the end of its
last full iteration over those iterations (the cut one is not charged to it). A job
marked for a regrouping that has not stopped yet leaves its group then, and its new
group opens without it (``open_entry``); a job already stopped for a move
(consolidation, regrouping) leaves as soon as it is admitted to its new group. A job
still queued then never ran. $/h is then over the trace's own span
(``departure_span_s``).

Reward (``Job.reward_s`` > 0; docs/rollart.md): the job scores on a shared, elastic
reward pool billed per use. Scoring streams during the rollout, so the rollout phase
(``t_roll_s``) already includes it and no event models it; the pool is billed for the
iterations each job completed (``rollmux.sim.metrics.bill_reward``), after the run, on
its own line, and costs nothing idle.
"""
from __future__ import annotations

import heapq
import time
from collections import Counter
from typing import Callable

from rollmux.accounting import OURS, CostAccounting, departure_span_s, leave_after_s
from rollmux.colocation import worst_phase
from rollmux.errors import CapacityError
from rollmux.execution import GroupExecutor, Grant
from rollmux.improve import group_order, lone_groups, open_regrouped
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job
from rollmux.plan_state import PlanState
from rollmux.policies.base import Policy
from rollmux.reservation import Reservation, group_need
from rollmux.sim.durations import DurationModel
from rollmux.sim.metrics import (END_TO_END, ITERATION, Accounting, CostShares, JobOutcome, PolicyResult, bill_reward,
                                 finish, owned_cost, solo_span_s)
from rollmux.sim.periodic import Cycle, CycleFinder, signature

_END, _ARRIVE, _MIGRATE, _TAIL, _DEPART = 0, 1, 2, 3, 4
_WAKE = "wake"  # the pool field of a frozen group's wake-up (an _END event named by group id)
MIGRATION_S = 300.0


def simulate(jobs: list[Job], cluster: Cluster, policy: Policy, duration_model: str = "worst", seed: int = 0,
             record_spans: bool = False, progress: Callable[[float], None] | None = None,
             migration_s: float = MIGRATION_S, tail: bool = False, tail_threshold: float = 0.8,
             handoff: bool = True, accounting: CostAccounting = OURS, fast_forward: bool = True,
             on_change: Callable[[float, PlanState], None] | None = None, backfill: bool = True) -> PolicyResult:
    """Replay ``jobs`` (validated, unique ids) under ``policy``; see the module docstring.
    ``policy`` should be made with the same ``accounting`` (``make_policy(..., accounting=)``).
    ``fast_forward=False`` replays every phase even where it could be skipped. ``progress``,
    when given, is called with the jobs arrived plus the jobs finished so far (2 x the jobs
    at the end; both cost a decision, and a run's last part has departures only) whenever
    the plan changes;
    ``on_change`` with the time and the plan itself (read it, do not change it: the plan
    holds until the next call, so its $/h integrates to the node cost). ``backfill``: jobs
    that pack into a running group pass the waiting line (above)."""
    started = time.perf_counter()
    cluster = accounting.apply_cluster(cluster)
    fixed = accounting.fixed_departures
    due: set[str] = set()  # fixed departure reached while being moved: leave once admitted
    last_iter: dict[str, float] = {}  # job -> end of its last full iteration (fixed departures)
    # (job, pool) -> (accounted pool, its body's (from, to, GPUs busy) pieces, its span's index in ``spans`` or None)
    phase_of: dict[tuple[str, str], tuple[str, tuple[tuple[float, float, float], ...], int | None]] = {}
    durations = DurationModel(duration_model, seed, tail, tail_threshold)
    rollout_end: dict[str, float] = {}  # job -> end of its running rollout
    tail_token: dict[str, int] = {}  # job -> seq of its pending tail report
    make_state = getattr(policy, "new_state", None)  # a fleet policy plans on its own state (rollmux.fleet_planner)
    state = make_state() if make_state is not None else PlanState(cluster)
    shares = CostShares()
    kind_of: dict[str, str] = {}  # job -> the placement it runs under (its cost share's kind)
    executors: dict[str, GroupExecutor] = {}
    acct = Accounting()
    heap: list[tuple[float, int, int, str, str]] = []
    seq = 0
    by_id = {j.job_id: j for j in jobs}
    target = {j.job_id: j.solo_iterations() for j in jobs}
    done = dict.fromkeys(by_id, 0)
    placed_at: dict[str, float] = {}
    outcome_of: dict[str, str] = {}
    outcomes: Counter = Counter()
    finished: list[JobOutcome] = []
    waiting: list[str] = []
    rejected: list[str] = []
    reasons: dict[str, str] = {}  # job -> why it was rejected, or why it waits (the head)
    short_of: dict[str, tuple[str, ...]] = {}  # job -> the pools it lacked at its last try
    # a fleet's plan names its own bounded pools (rollmux.fleet_planner.FleetState.bounded_pools)
    bounded = (state.bounded_pools() if make_state is not None
               else tuple(p for p in POOLS if cluster.pool(p).nodes is not None))
    basis = END_TO_END if bounded else ITERATION
    spans: list | None = [] if record_spans else None
    sw = cluster.switch_cost
    gpn = cluster.gpus_per_node
    for j in jobs:
        heap.append((j.arrival_s, _ARRIVE, seq, j.job_id, ""))
        seq += 1
        if fixed:
            heap.append((j.arrival_s + leave_after_s(j), _DEPART, seq, j.job_id, ""))
            seq += 1
    heapq.heapify(heap)
    arrived = 0  # jobs arrived so far: with those finished, what ``progress`` reports
    events = 0
    repack = getattr(policy, "repack", None)
    uses_remaining = getattr(policy, "uses_remaining", False)  # the lifetime objective (rollmux.lifetime)
    regroup = getattr(policy, "regroup", None)
    regroup_on_arrival = regroup is not None and getattr(policy, "regroup_on_arrival", False)
    regroup_on_wait = regroup is not None and getattr(policy, "regroup_on_wait", False)
    live: dict[tuple[str, str], tuple[float, int]] = {}  # (job, pool) -> (end, seq) of its phase's pending end
    # Fast-forward (rollmux.sim.periodic): groups whose schedule repeats skip whole periods.
    skip = (fast_forward and duration_model == "worst" and not tail and spans is None
            and repack is None and regroup is None)
    finders: dict[str, CycleFinder] = {}
    gbusy: dict[str, list[float]] = {}  # group -> busy GPU-seconds so far, per pool in POOLS order
    frozen: dict[str, tuple[Cycle, int | None]] = {}  # group -> its cycle, the seq of its wake-up
    offer: set[str] = set()
    blocked: list[dict] = []  # regrouped groups whose members stopped, short of bounded nodes
    moving: set[str] = set()  # moved, not yet admitted to their new group
    # job -> its regrouping: {"group": solver Group, "waiting": job ids still running, "gone": job ids that left
    # at their fixed departure before they stopped, ...}
    pending: dict[str, dict] = {}
    dirty: dict[str, None] = {}  # groups touched at the current instant, in touch order

    def settle(gid: str | None, now: float) -> None:
        if gid is not None:
            shares.settle(gid, now)

    def track(gid: str, now: float) -> None:
        group = state.groups.get(gid)
        if group is not None:
            shares.track(gid, now, state.group_cost_per_hour(gid), [(m.job.job_id, kind_of[m.job.job_id])
                                                                    for m in group.members])

    def admit(job: Job, now: float) -> None:
        gid = state.job_group[job.job_id]
        ex = executors.get(gid)
        if ex is None:
            ex = executors[gid] = GroupExecutor(gpus_per_node=gpn)
            if skip:
                finders[gid], gbusy[gid] = CycleFinder(), [0.0] * len(POOLS)
        elif skip:
            if gid in frozen:
                thaw(gid, now)
            finders[gid].reset()
        m = state.groups[gid].member(job.job_id)
        own = 0.0 if m.hosted else 1.0  # a hosted member's phases carry their switch (colocation.phase_time)
        ex.admit(job.job_id, m.rollout_nodes, m.train_nodes, now, own * sw.seconds(job.model, ROLLOUT),
                 own * sw.seconds(job.model, TRAIN), job.staleness, None if fixed else target[job.job_id] - done[job.job_id])
        dirty[gid] = None

    def try_move(job: Job, gid: str, now: float) -> bool:
        """Offer ``job`` (at an iteration boundary) a consolidating move; carry it out if taken."""
        nonlocal seq
        left, spare = progress_of(job.job_id, now)
        spare -= migration_s
        decision = repack(state, job.job_id, left, spare, lambda k: progress_of(k, now)) if spare > 0 else None
        if decision is None:
            return False
        ex = executors[gid]
        ex.finish(job.job_id, now, requeue=False)
        ex.remove(job.job_id)
        settle(gid, now)
        settle(decision.placement.group_id, now)
        if state.release(job.job_id).group_closed:
            del executors[gid]
        track(gid, now)
        to = state.apply(job, decision.placement)
        kind_of[job.job_id] = state.placement_kind(job.job_id, "repacked")
        track(to, now)
        place_waiting(now)
        outcomes["repacked"] += 1
        moving.add(job.job_id)
        heapq.heappush(heap, (now + migration_s, _MIGRATE, seq, job.job_id, ""))
        seq += 1
        return True

    def movable(job_id: str, now: float) -> tuple[int, float] | None:
        """``progress_of`` for a job a regrouping may move now: running, not already
        moving, with at least two iterations left (it stops after the current one)."""
        if job_id in moving or job_id in pending or target[job_id] - done[job_id] < 2 or by_id[job_id].staleness:
            return None
        return progress_of(job_id, now)

    def plan_regroup(gid: str, now: float) -> None:
        """After a departure from ``gid``: ask the policy for a regrouping and mark its jobs."""
        def pause(k: str) -> float:  # until k's current iteration ends, then the migration
            return state.analysis(state.job_group[k]).iteration_s[k] + migration_s

        plan = regroup(state, gid, lambda k: movable(k, now), pause)
        if plan is None:
            return
        outcomes["regroupings"] += 1
        held = Reservation.start(state, plan.view, plan.replaced, plan.groups)  # bounded pools only
        for group in plan.groups:
            entry = {"group": group, "view": plan.view, "waiting": {m.job.job_id for m in group.members},
                     "gone": set(), "held": held, "need": group_need(state, plan.view, group)}
            for m in group.members:
                pending[m.job.job_id] = entry

    def stop_for_regroup(job_id: str, gid: str, now: float) -> None:
        """At its iteration boundary a regrouped job leaves its group; once every member of
        its new group has, that group opens on fresh nodes and admits them together (on
        bounded pools: on the nodes its reservation holds, ``open_entry``)."""
        entry = pending.pop(job_id)
        ex = executors[gid]
        ex.finish(job_id, now, requeue=False)
        ex.remove(job_id)
        settle(gid, now)
        released = state.release(job_id)
        if entry["held"] is not None:
            entry["held"].take_released(state, released.released_nodes)
        if released.group_closed:
            del executors[gid]
        else:
            dirty[gid] = None
            track(gid, now)
        moving.add(job_id)
        outcomes["regrouped"] += 1
        entry["waiting"].discard(job_id)
        if not entry["waiting"]:
            open_entry(entry, now)
        place_waiting(now)  # (bounded pools: nodes the reservation does not want)

    def open_entry(entry: dict, now: float) -> None:
        """Open a regrouped group whose members have all stopped or left (``quit_regrouping``),
        or on bounded pools leave it short (``blocked``) until the held and free nodes cover
        it. A member that left is pinned with the others, as the solver placed it, and
        unpinned at once: the group keeps the nodes the rest use, as after a departure; a
        group whose members all left does not open."""
        nonlocal seq
        held = entry["held"]
        gone = entry["gone"]
        stopped = [m.job.job_id for m in entry["group"].members if m.job.job_id not in gone]
        if not stopped:
            if held is not None:
                held.group_done(state)
            return
        if held is not None:
            if not held.covers(state, entry["need"]):
                blocked.append(entry)
                return
            held.hand_over(state, entry["need"])
        gid = open_regrouped(state, entry["group"], entry["view"], by_id)
        for job_id in gone:
            state.release(job_id)
        if held is not None:
            held.group_done(state)
        for job_id in stopped:
            kind_of[job_id] = state.placement_kind(job_id, "regrouped")
        track(gid, now)
        for job_id in stopped:  # same instant, admission order
            heapq.heappush(heap, (now + migration_s, _MIGRATE, seq, job_id, ""))
            seq += 1

    def quit_regrouping(entry: dict, job_id: str, released: tuple[str, ...], now: float) -> None:
        """``job_id``, marked for ``entry``'s regrouping, left its group (``released``: the
        nodes it gave back) at its fixed departure before it stopped: those nodes count for
        the regrouping as a stopped job's do, and the new group opens without it."""
        if entry["held"] is not None:
            entry["held"].take_released(state, released)
        entry["waiting"].discard(job_id)
        entry["gone"].add(job_id)
        if not entry["waiting"]:
            open_entry(entry, now)

    def progress_of(job_id: str, now: float) -> tuple[int, float]:
        """Iterations ``job_id`` has left and the seconds it can still spend within its SLO."""
        job = by_id[job_id]
        return (target[job_id] - done[job_id],
                job.slo * job.t_solo * target[job_id] + job.slo * job.fill_s - (now - placed_at[job_id]))

    def place_waiting(now: float) -> None:
        for entry in blocked[:]:  # a short regrouped group goes before the queue
            blocked.remove(entry)
            open_entry(entry, now)
        while waiting and try_place(by_id[waiting[0]], now):
            waiting.pop(0)
        if backfill:
            for job_id in waiting[1:]:
                if try_place(by_id[job_id], now, packs_only=True):
                    waiting.remove(job_id)

    def remaining_at(now: float) -> Callable[[str], int]:
        """The iterations each job has left at ``now``, as the event-by-event run counts them:
        a frozen group is brought to ``now`` first (``thaw``) when one of its members is read."""
        def remaining(job_id: str) -> int:
            gid = state.job_group.get(job_id)
            if gid in frozen:
                thaw(gid, now)
            return target[job_id] - done[job_id]
        return remaining

    def try_place(job: Job, now: float, packs_only: bool = False) -> bool:
        """Ask the policy for ``job`` and apply its placement; with ``packs_only`` (a job
        behind the line's head) only a placement that packs, and nothing else happens."""
        decision = policy.place(state, job, remaining_at(now)) if uses_remaining else policy.place(state, job)
        if packs_only:
            if decision.placement is None or not decision.placement.packs:
                return False
            outcomes["backfilled"] += 1
        elif decision.outcome in ("wait", "rejected"):
            reasons[job.job_id] = decision.reason
            short_of[job.job_id] = decision.short_pools
        if decision.outcome == "wait":
            if regroup_on_wait:
                for gid in lone_groups(state):
                    plan_regroup(gid, now)
            return False
        if decision.outcome == "rejected":
            rejected.append(job.job_id)
            return True
        settle(decision.placement.group_id, now)
        gid = state.apply(job, decision.placement)
        kind_of[job.job_id] = state.placement_kind(job.job_id, decision.outcome)
        track(gid, now)
        admit(job, now)
        if repack is not None and decision.outcome == "new-group":
            offer.update(j for j in state.job_group if j != job.job_id and not by_id[j].staleness)  # new room
        placed_at[job.job_id] = now
        outcome_of[job.job_id] = decision.outcome
        outcomes[decision.outcome] += 1
        if regroup_on_arrival and decision.placement.group_id is None:
            plan_regroup(state.job_group[job.job_id], now)
        return True

    def leave(job_id: str, gid: str, now: float, regrouping: dict | None = None) -> None:
        """``job_id`` leaves its group at ``now`` (its last iteration, or a fixed departure;
        ``regrouping``: the one it was marked for, ``quit_regrouping``)."""
        ex = executors[gid]
        if not fixed:
            for pool in ex.running_pools(job_id):
                ex.finish(job_id, now, requeue=False, pool=pool)
        ex.remove(job_id)
        settle(gid, now)
        release = state.release(job_id)
        if regrouping is not None:
            quit_regrouping(regrouping, job_id, release.released_nodes, now)
        track(gid, now)
        if release.group_closed:
            del executors[gid]
            if skip:
                del finders[gid], gbusy[gid]
        else:
            dirty[gid] = None
            if skip:
                finders[gid].reset()
            if regroup is not None:
                plan_regroup(gid, now)
            if repack is not None:
                offer.update(m.job.job_id for m in state.groups[gid].members if not m.job.staleness)
        job = by_id[job_id]
        finished.append(JobOutcome(job_id, job.arrival_s, placed_at[job_id], now, done[job_id],
                                   job.t_solo, job.slo, outcome_of[job_id], gid, basis,
                                   last_iter.get(job_id) if fixed else None, job.fill_s, job.staleness))
        place_waiting(now)

    def depart(job_id: str, now: float) -> None:
        """Fixed departure of ``job_id`` at ``now``, wherever it is: from its group (marked for
        a regrouping or not), or once admitted if it is being moved."""
        if job_id in waiting:
            waiting.remove(job_id)
            rejected.append(job_id)
            reasons[job_id] = "left at its recorded departure before it could be placed"
            return
        if job_id in moving:  # (in no group until its new one opens)
            due.add(job_id)
            return
        if job_id not in state.job_group:  # rejected on arrival
            return
        offer.discard(job_id)
        tail_token.pop(job_id, None)  # (its pending tail report and phase ends are stale from now: ``stale``)
        gid = state.job_group[job_id]
        if gid in frozen:
            thaw(gid, now)
        for pool in executors[gid].running_pools(job_id):
            del live[(job_id, pool)]
            accounted, pieces, span = phase_of[(job_id, pool)]
            if pieces[-1][1] > now:
                acct.busy[accounted] -= _to_come(pieces, now)
                if span is not None:  # the phase's span ends here too (its switch, if still under way)
                    g, j, p, nodes, begin, body, _ = spans[span]
                    spans[span] = (g, j, p, nodes, begin, min(body, now), now)
        leave(job_id, gid, now, pending.pop(job_id, None))

    def start(grant: Grant, gid: str, now: float, into: list) -> None:
        """Start ``grant``'s phase at ``now``; its end event goes on the heap ``into``."""
        nonlocal seq
        group = state.groups[gid]
        member = group.member(grant.job_id)
        job = member.job  # as pinned: on a fleet, its times on the group's GPU types
        on_train = group.colocated or member.hosted  # both phases on training nodes
        worst, overhead = worst_phase(job, grant.pool, cluster, on_train)
        body = durations.draw(worst, grant.pool, grant.job_id)
        # every rollout draws its head (rule 12: an asynchronous job has no tail), a slice's too
        head = durations.head(grant.job_id) if tail and grant.pool == ROLLOUT and not job.staleness else 1.0
        begin = now + grant.switch_s + overhead
        end = begin + body
        gpus = len(grant.nodes) * gpn
        pieces: tuple[tuple[float, float, float], ...] = ((begin, end, gpus),)
        idle = 0.0  # GPU-seconds of work its tail leaves idle
        donor = executors[gid].donor_of(grant.job_id) if grant.pool == ROLLOUT else None
        if donor is not None:  # a slice of its donor's tail (share 1 where the donor freed a whole node): no tail
            outcomes["hand-offs"] += 1
            t_e = rollout_end[donor]
            if begin < t_e and grant.share < 1:  # at share until its donor's rollout ends, then full rate
                done_by_t_e = grant.share * (t_e - begin)
                if done_by_t_e >= body:
                    end = begin + body / grant.share
                    pieces = ((begin, end, grant.share * gpus),)
                else:
                    end = t_e + body - done_by_t_e
                    pieces = ((begin, t_e, grant.share * gpus), (t_e, end, gpus))
            if head < 1:  # its tail frees what a whole rollout's does, work for work: they idle
                freed = _freed(job, gpus)
                idle = (1 - head) * body * freed
                pieces = _tail_from(pieces, head * body, gpus, gpus - freed)
        elif head < 1:
            heapq.heappush(heap, (begin + head * body, _TAIL, seq, grant.job_id, ROLLOUT))
            tail_token[grant.job_id] = seq
            seq += 1
        if grant.pool == ROLLOUT:
            rollout_end[grant.job_id] = end
        pool = TRAIN if on_train else grant.pool
        busy = body * gpus - idle
        acct.busy[pool] += busy
        if skip:
            gbusy[gid][_POOL_INDEX[pool]] += busy
        if spans is not None:
            spans.append((gid, grant.job_id, grant.pool, grant.nodes, now, now + grant.switch_s + overhead, end))
        if fixed:
            phase_of[(grant.job_id, grant.pool)] = (pool, pieces, None if spans is None else len(spans) - 1)
        heapq.heappush(into, (end, _END, seq, grant.job_id, grant.pool))
        live[(grant.job_id, grant.pool)] = (end, seq)
        seq += 1

    def observe(gid: str, now: float) -> None:
        """After ``gid``'s dispatch at ``now``: freeze it if its state recurs (periodic.py)."""
        nonlocal seq
        ex = executors[gid]
        members = ex.members()
        ends = {j: (live[(j, ex.running(j))][0], ex.running(j)) for j in members if ex.running(j) is not None}
        cycle = finders[gid].observe(signature(ex, now, {j: e[0] for j, e in ends.items()}), now,
                                     {j: done[j] for j in members}, tuple(gbusy[gid]),
                                     None if fixed else {j: target[j] - done[j] for j in members}, ends)
        if cycle is None:
            return
        for j, (end, pool) in ends.items():
            live[(j, pool)] = (end, -1)  # its pending end event is withdrawn
        wake = cycle.wake_s
        frozen[gid] = (cycle, None if wake is None else seq)
        if wake is not None:
            heapq.heappush(heap, (wake, _END, seq, gid, _WAKE))
            seq += 1

    def thaw(gid: str, now: float) -> None:
        """Bring frozen ``gid`` to instant ``now`` as the event-by-event run has it when an
        arrival or departure at ``now`` is processed: whole periods jumped, the rest of the
        last one replayed, its phase ends at ``now`` applied and its dispatch left for the
        end of the instant."""
        nonlocal seq
        cycle, _ = frozen.pop(gid)
        ex = executors[gid]
        m = cycle.periods_before(now)
        shift = m * cycle.period
        if m:
            for j, gain in cycle.gains.items():
                done[j] += m * gain
                last_iter[j] += shift
            for i, p in enumerate(POOLS):
                acct.busy[p] += m * cycle.busy[i]
                gbusy[gid][i] += m * cycle.busy[i]
            ex.shift(shift)
        local: list = []
        for j, (end, pool) in cycle.ends.items():
            local.append((end + shift, _END, seq, j, pool))
            live[(j, pool)] = (end + shift, seq)
            seq += 1
            if fixed:
                accounted, pieces, span = phase_of[(j, pool)]
                phase_of[(j, pool)] = (accounted, tuple((a + shift, b + shift, g) for a, b, g in pieces), span)
        heapq.heapify(local)
        while local and local[0][0] <= now:
            instant = local[0][0]
            while local and local[0][0] == instant:
                _, _, _, job_id, pool = heapq.heappop(local)
                del live[(job_id, pool)]
                if pool == TRAIN:
                    done[job_id] += 1
                    last_iter[job_id] = instant
                    if not fixed and done[job_id] >= target[job_id]:
                        raise RuntimeError(f"fast-forward of {gid} passed the departure of {job_id}")
                ex.finish(job_id, instant)
            if instant < now:
                for grant in ex.dispatch(instant):
                    start(grant, gid, instant, local)
            else:
                dirty[gid] = None
        for entry in local:
            heapq.heappush(heap, entry)

    def stale(event: tuple[float, int, int, str, str]) -> bool:
        """Whether ``event`` changes nothing: a phase end withdrawn by a freeze or cut short
        by a fixed departure, a wake-up of a group thawed since, or the tail report of a
        rollout cut short. (Once stale, an event stays so.)"""
        _, kind, s, key, pool = event
        if kind == _END and pool == _WAKE:  # key is a frozen group's id
            return key not in frozen or frozen[key][1] != s
        if kind == _END:
            return live.get((key, pool), _NOT_LIVE)[1] != s
        return kind == _TAIL and tail_token.get(key) != s

    while heap:
        if stale(heap[0]):  # (dropped before the clock moves: the run ends at its last event that changes something)
            heapq.heappop(heap)
            continue
        now = heap[0][0]
        acct.advance(now)
        dirty.clear()
        changed = False
        while heap and heap[0][0] == now:
            event = heapq.heappop(heap)
            if stale(event):
                continue
            _, kind, s, job_id, pool = event
            if kind == _END:
                if pool == _WAKE:  # job_id is a frozen group's id
                    thaw(job_id, now)
                    continue
                del live[(job_id, pool)]
            events += 1
            if kind == _ARRIVE:
                arrived += 1
                if waiting and not (backfill and try_place(by_id[job_id], now, packs_only=True)):
                    waiting.append(job_id)
                elif not waiting and not try_place(by_id[job_id], now):
                    waiting.append(job_id)
                changed = True
                continue
            if kind == _MIGRATE:
                moving.discard(job_id)
                admit(by_id[job_id], now)
                if job_id in due:
                    due.discard(job_id)
                    depart(job_id, now)
                    changed = True
                continue
            if kind == _DEPART:
                depart(job_id, now)
                changed = True
                continue
            if kind == _TAIL:
                del tail_token[job_id]
                gid = state.job_group[job_id]
                ex = executors[gid]
                job = by_id[job_id]
                if handoff:  # (the rule may hand its freed GPUs on: they are the slice's work then)
                    ex.tail(job_id, now, job.tail_gpus())
                    dirty[gid] = None
                member = state.groups[gid].member(job_id)
                freed = _freed(job, len(member.rollout_nodes) * gpn)  # (no longer its work, handed on or idle)
                if freed:
                    on_train = state.groups[gid].colocated or member.hosted
                    acct.busy[TRAIN if on_train else ROLLOUT] -= (rollout_end[job_id] - now) * freed
                    if fixed:  # (what a fixed departure still takes off: a full-rate rollout is one piece)
                        accounted, ((begin, end, gpus),), span = phase_of[(job_id, ROLLOUT)]
                        phase_of[(job_id, ROLLOUT)] = (accounted, ((begin, now, gpus), (now, end, gpus - freed)), span)
                continue
            gid = state.job_group[job_id]
            ex = executors[gid]
            if pool == TRAIN:
                done[job_id] += 1
                last_iter[job_id] = now
                if done[job_id] >= target[job_id] and not fixed:
                    leave(job_id, gid, now)
                    changed = True
                    continue
                if job_id in pending:
                    stop_for_regroup(job_id, gid, now)
                    changed = True
                    continue
                if job_id in offer:
                    offer.discard(job_id)
                    if try_move(by_id[job_id], gid, now):
                        dirty.setdefault(gid, None)
                        changed = True
                        continue
            ex.finish(job_id, now, pool=pool)
            dirty[gid] = None
        if changed:
            acct.set_level(now, state.cost_per_hour(), state.gpus_in_use(ROLLOUT), state.gpus_in_use(TRAIN),
                           state.gpus_by_pool())
            acct.set_queue(now, len(waiting), short_of.get(waiting[0], ()) if waiting else ())
            if progress is not None:
                progress(arrived + len(finished))
            if on_change is not None:
                on_change(now, state)
        for gid in sorted(dirty, key=group_order):  # (groups are independent: the order makes runs reproducible)
            ex = executors.get(gid)
            if ex is not None:
                for grant in ex.dispatch(now):
                    start(grant, gid, now, heap)
                if skip and ex.members() and not any(by_id[j].staleness for j in ex.members()):
                    observe(gid, now)
    name = getattr(policy, "name", type(policy).__name__)
    if blocked:  # (rollmux.reservation: every held node comes back once the emptied groups are)
        raise RuntimeError(f"{name}: regrouped jobs stopped for good, their group short of nodes: "
                           f"{sorted(m.job.job_id for e in blocked for m in e['group'].members)}")
    for i, job_id in enumerate(waiting):
        rejected.append(job_id)
        reasons[job_id] = ("still waiting when the run ended: " + reasons.get(job_id, "") if i == 0
                           else f"still waiting when the run ended, queued behind {waiting[0]}")
    if jobs and not finished:
        raise _never_placed(name, cluster, rejected, reasons, short_of)
    finished.sort(key=lambda o: (o.arrival_s, o.job_id))
    result = finish(name, acct, finished, outcomes, events, time.perf_counter() - started, spans, rejected,
                    departure_span_s(jobs) if fixed else solo_span_s(jobs))
    result.accounting = accounting.name
    shares.close(acct.last_t)
    result.cost_by_placement = shares.table()
    if cluster.pricing == "owned":
        result.pricing, result.total_cost = "owned", owned_cost(cluster, result.span_s, result.gpu_seconds)
    result.slo_basis, result.bounded, result.reject_reasons = basis, bounded, {k: reasons[k] for k in rejected}
    result.async_ids = frozenset(j.job_id for j in jobs if j.staleness)
    bill_reward(result, jobs)
    return result


def _never_placed(policy: str, cluster: Cluster, rejected: list[str], reasons: dict[str, str],
                  short_of: dict[str, tuple[str, ...]]) -> CapacityError:
    """The error for a run that placed no job: which pools lacked nodes, and one job's reason."""
    pools = tuple(p for p in POOLS if any(p in short_of.get(k, ()) for k in rejected))
    # (a fleet's views are unbounded clusters: the fleet's state holds the inventory)
    named = " and ".join(f"the {p} pool" + ("" if cluster.pool(p).nodes is None else f" ({p}.nodes = "
                                                                                    f"{cluster.pool(p).nodes})")
                         for p in pools) or "the inventory"
    first = rejected[0]
    reason = f"{first}: {reasons.get(first, 'no reason given')}"
    return CapacityError(policy, pools, f"{policy} could place none of the {len(rejected)} jobs: {named} "
                                        f"cannot host them ({reason})", reason)


def _freed(job: Job, gpus: int) -> int:
    """GPUs a rollout of ``job`` on ``gpus`` GPUs (its pinned nodes') leaves in its tail: all
    but those it keeps (``Job.tail_gpus``, at least 1), as ``GroupExecutor.tail`` frees them."""
    return max(0, gpus - max(1, job.tail_gpus()))


def _tail_from(pieces: tuple[tuple[float, float, float], ...], work: float, gpus: int,
               keep: int) -> tuple[tuple[float, float, float], ...]:
    """A rollout's (from, to, GPUs busy) ``pieces`` on ``gpus`` GPUs once its tail starts
    after ``work`` seconds of it at full rate: from then on, ``keep`` of every ``gpus``."""
    out = []
    for begin, end, busy in pieces:
        here = (end - begin) * busy / gpus  # full-rate seconds of work in this piece
        if work >= here:
            out.append((begin, end, busy))
            work -= here
            continue
        cut = begin + work * gpus / busy
        out += [(begin, cut, busy), (cut, end, busy * keep / gpus)]
        work = 0.0
    return tuple(out)


def _to_come(pieces: tuple[tuple[float, float, float], ...], now: float) -> float:
    """GPU-seconds of a phase's body still to come at ``now``: its (from, to, GPUs busy) pieces."""
    return sum(gpus * (end - max(begin, now)) for begin, end, gpus in pieces if end > now)


_NOT_LIVE = (0.0, -1)
_POOL_INDEX = {p: i for i, p in enumerate(POOLS)}
