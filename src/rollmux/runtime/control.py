"""The live control plane's logic: jobs, per-group executors, leases, departures.

``ControlPlane`` is the body that drives the shared brain in real time. It owns one
``PlanState`` (placed by ``Planner``, exactly as the simulator does) and one
``GroupExecutor`` per group (the execution rule). It holds no clock, no leases and does
no I/O: every method takes ``now`` (seconds on the service's clock, which never runs
backwards, also across restarts) and the caller persists ``take_changes()`` (the rows
that changed, the new events and the departed jobs' records) before acknowledging a
change. Leases live in the service: it calls ``expire`` with the jobs it found silent.

Contract
--------
* Submit: the planner decides. A placed job is pinned (``PlanState.apply``), admitted
  to its group's executor (ready for rollout at ``now``) and the group is dispatched.
  A job that must wait, or that arrives while others wait, joins the back of the
  waiting line, which is served first come, first placed as in the simulator: its
  head is retried whenever nodes may have freed, and only a job that packs into a
  running group on that group's own nodes passes it (``backfill``, the default: it
  takes no free node, though it may keep its group's nodes busy for longer; its
  explanation says so), as an arrival or at any retry of the line after the head is
  refused (a waiting job that a shrunk inventory can never host blocks nobody). A job
  that can never fit the inventory raises ``NeverFits`` and changes nothing.
* Grants: ``GroupExecutor.dispatch`` decides who runs. A grant is the job's until the
  job releases that phase (``release``), departs or loses its lease. The execution rule
  guarantees that no two grants of a group share a node.
* Phases alternate rollout, train, rollout, ... per job. Ending a train phase counts an
  iteration; a job with ``iterations`` set departs after its last one.
* Asynchronous jobs (``Job.staleness`` = k >= 1, at most ``rollmux.model.MAX_STALENESS``; rules 10-12 of
  the execution rule): such a job may hold one grant per pool at once (``JobRecord.grants``:
  its rollout r+1 on its rollout nodes while its training r runs on its training nodes);
  each release names its pool. A rollout is in order while ``r - t <= k`` (r rollouts
  started, t trainings released) and rollouts are left (``iterations``); a training while
  a released rollout waits for it (f > t). Anything else is a ``PhaseOrderError`` (409) and
  changes nothing. An asynchronous job reports no tail and is never moved or regrouped (as
  in the simulator: at its iteration boundary its next rollout may be running); the
  planner keeps it in a group of its own. Its executor counters (r, f, t, pools running
  and queued) are persisted in its group's row (``pipe``) and restored with it.
* Job ids of departed jobs may be submitted again (a new run of the same job); the
  departed record stays in the history (``take_changes().ended``) and in ``counts``
  (every run counts), but leaves ``jobs``. With ``keep_ended`` = n, only the n latest
  departed records stay in ``jobs`` (what ``status`` lists); an older one leaves memory
  (it stays in the history) and ``counts`` still counts it.
* Moves (policy ``rollmux-consolidate``, as in the simulator): after a departure the
  remaining members of that group, and after a new group opens every placed job, are
  offered a move once. At the offered job's next iteration boundary (the release of a
  train phase) ``Planner.repack`` may move it into another group where it frees nodes.
  The move is one state change: the job leaves its old group's executor and plan, is
  pinned to its new nodes and carries ``move`` (from, to, when) until the job
  acknowledges with ``moved`` (its state now lives on the new nodes); only then is it
  admitted to the new group's executor. A failed or timed-out move is undone by
  placing the job afresh (the planner may put it back where it was) or queueing it:
  it is never lost, never in two groups, and its nodes are never granted twice. The
  pause a move costs is learned per model size from the moves acknowledged so far
  (the largest seen; ``migration_s`` until one is).
* Regrouping (policy ``rollmux-regroup``, as in the simulator): after a departure,
  ``improve.plan_regroup`` may re-solve the group with one other group. Each job of the
  two stops at its next iteration boundary and waits outside any group; once every
  member of a new group has stopped, the group opens on fresh nodes and each member
  gets its move directive; the group admits them together, in the solver's order, once
  all have acknowledged. A member that departs or fails its move leaves the new group
  (the solver checked every subset of it), the others carry on. On bounded pools a
  regrouping holds the nodes its new groups will take (``rollmux.reservation``, as in
  the simulator): free ones at the decision, then those its jobs' old groups give back;
  while it waits for such nodes no arrival joins a group it empties, and a new group
  opens only when the held and free nodes cover it (retried ahead of the waiting line).
  The holds are part of the state; a drained node leaves a hold, which takes another.
  A regrouping that a policy asks for after an arrival that opens a group
  (``rollmux-hedge``, ``rollmux-full-regroup``) is decided after the submit's answer
  (``gather``; pending ones are part of the state), before any other change and as at
  the arrival: the same decision as the simulator's, off the arrival's answer. A policy
  with ``regroup_on_wait`` (``rollmux-hedge``, ``rollmux-full-regroup``) is also asked,
  whenever the head of the waiting line is refused (a submit that waits, a retry of the
  line), for each group that holds one job (``improve.lone_groups``), as the simulator
  asks it: a submit's are gathered after its answer too. With ``decide_apart`` (what
  ``rollmux serve`` runs) every regrouping asked for is only recorded (once per group);
  the caller decides them on a copy of the plan off its lock (``regroup_ticket``) and
  hands the decisions back (``apply_regroups``), which carries out those whose check
  still holds (``rollmux.runtime.regroup_ticket``). Meanwhile the waiting line waits
  for them, as it waits for them under the lock: so with nothing in between it is the
  same decision for decision as the simulator, on bounded pools too.
* The placement space beyond the paper (policies ``rollmux-full`` and
  ``rollmux-full-regroup``, as in the simulator; ``make_policy`` builds every live
  policy): a job may also get training nodes of its own next to a group's, or run
  co-located on its training nodes, whose phases are judged against their co-located
  times (``profile_s``, over-profile flags). ``rollmux-full-regroup`` also regroups a
  group that an arrival opened, and a regrouping's co-located group stays co-located
  while it waits for its members. Hosting (``rollmux-host``, ``rollmux-host-regroup``):
  a job may run both phases on some of a group's training nodes (``Member.hosted``),
  judged against its co-located times too; snapshots and pending regroupings keep the
  flag.
* Fleets (``ControlPlane(fleet, profiles=...)``, policies ``FLEET_LIVE_POLICIES``, as
  ``rollmux fleet simulate`` runs them): the fleet planner chooses each job's pair of GPU
  types and group; the plan is a ``FleetState`` whose nodes are the fleet pools' own
  (``<pool>-<i>``), shared by every view, so grants, drains and status name physical
  nodes and pools by their fleet names. A phase is judged against its time on its
  group's types. The fleet and its profiles are part of the state and fixed while it
  runs (``reconcile`` refuses another; no nodes are added live). On a fleet,
  ``rollmux-regroup`` and ``rollmux-full-regroup`` regroup as the fleet simulator does
  (``fleet_exact.plan_fleet_regroup``: within a view, or a lone job to another view);
  each pending regrouping keeps the view its group opens in. No consolidating moves.
* The lifetime objective (policies ``rollmux-lifetime``, ``rollmux-full-lifetime``, and the
  same on a fleet): the planner reads each job's remaining iterations, its ``iterations``
  less those it has finished (None without a set count: ``rollmux.lifetime``).
* Long tail (the execution rule's rules 6-9): a job holding a rollout grant reports its
  fraction of responses done (``tail``); at ``tail_threshold`` or more it keeps
  ``Job.tail_gpus()`` GPUs and the freed GPUs of its nodes may go to the next queued
  rollout of its group, as a grant with ``share`` < 1; when the donor's rollout ends,
  the recipient owns its nodes (its grant's share becomes 1).
* Departures (completion, cancellation, lease expiry) remove the member from its
  executor, release its pins in the plan (nodes that nobody uses any more go back to
  the pool), dispatch the group again, then retry the waiting line in order.
* Every method validates before it mutates: an error means no state changed.
* Every executor step is recorded as an event (admit, finish, remove, grant) with the
  ``now`` it ran at, so a fresh ``GroupExecutor`` fed the same steps reproduces the
  same grants (tests do exactly that).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from dataclasses import asdict, dataclass, field

from rollmux.cluster_file import cluster_from_dict, cluster_to_dict
from rollmux.colocation import worst_phase
from rollmux.errors import RollMuxError, SpecError
from rollmux.execution import Grant, GroupExecutor
from rollmux.fleet import Fleet, Profiles, fleet_of
from rollmux.fleet_file import fleet_from_dict, fleet_to_dict, profiles_from_rows, profiles_to_rows
from rollmux.fleet_planner import FleetDecision, FleetPlanner, FleetState
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Group, Job, Member, NodeSpec, PoolSpec
from rollmux.improve import lone_groups, open_regrouped
from rollmux.model import model_size_column
from rollmux.plan_state import PlanState
from rollmux.planner import Planner
from rollmux.policies import FLEET_BACKED, make_policy
from rollmux.policies.fleet import FLEET_ROLLMUX, fleet_rollmux
from rollmux.reservation import Reservation, fits, group_need
from rollmux.runtime.logs import LOGGER
from rollmux.runtime.regroup_ticket import MAX_TRIES, Decided, RegroupTicket, still_holds
from rollmux.runtime.restore_check import check_restored
from rollmux.runtime.store import Changes, hash_token

log = logging.getLogger(LOGGER)

WAITING, PLACED, DONE, CANCELLED, EXPIRED = "waiting", "placed", "done", "cancelled", "expired"
LIVE_STATES = (WAITING, PLACED)
JOB_STATES = (WAITING, PLACED, DONE, CANCELLED, EXPIRED)
SNAPSHOT_VERSION = 3
EXPLAIN_LINES = 25  # candidates kept in a job's explanation: the chosen one first, then the rest in the planner's order
LIVE_POLICIES = ("rollmux", "rollmux-consolidate", "rollmux-regroup", "rollmux-full", "rollmux-full-regroup",
                 "rollmux-host", "rollmux-host-regroup", "rollmux-lifetime", "rollmux-full-lifetime",
                 "rollmux-hedge")
FLEET_LIVE_POLICIES = tuple(FLEET_ROLLMUX)  # on a fleet of several GPU types (rollmux.fleet_planner)
#: A released phase longer than its profile by more than this share is flagged: the planner's
#: SLO guarantees rest on worst-case profiles, so such a job's group may miss them.
PROFILE_TOLERANCE = 0.10
OPEN_ENDED = 10**9  # iterations assumed for a job without a target (its whole-run check is then per iteration)
NODE_ADDS_KEPT = 1024  # request ids of node adds remembered, newest last (``ControlPlane.add_node``)


def check_live_policy(policy: str, fleet: bool) -> None:
    """A ``ControlError`` on ``policy`` unless the live plane runs it (on a fleet:
    ``FLEET_LIVE_POLICIES``, else ``LIVE_POLICIES``)."""
    if fleet and policy not in FLEET_LIVE_POLICIES:
        raise ControlError("policy", f"{policy!r}: on a fleet of GPU types the live service runs "
                                     f"{', '.join(FLEET_LIVE_POLICIES)}")
    if not fleet and policy not in LIVE_POLICIES:
        raise ControlError("policy", f"{policy!r}: the live service runs {', '.join(LIVE_POLICIES)}")


def _check_restart_policy(policy: str, fleet: bool) -> None:
    """A ``ControlError`` on ``policy`` when a saved state cannot run under it: a two-pool
    state under a policy that plans as a fleet, or a fleet's state under a two-pool one."""
    if not fleet and policy in FLEET_BACKED:
        raise ControlError("policy", f"{policy!r} plans a two-pool cluster as a fleet of one pair of GPU types, and "
                                     f"this state file was saved by a two-pool policy: restart with one of "
                                     f"{', '.join(p for p in LIVE_POLICIES if p not in FLEET_BACKED)}, or give "
                                     f"{policy} a new state file")
    if fleet and policy not in FLEET_LIVE_POLICIES:
        raise ControlError("policy", f"{policy!r}: this state file was saved as a fleet of GPU types (a fleet file, "
                                     f"or {', '.join(FLEET_BACKED)} on a two-pool cluster); on it the live service "
                                     f"runs {', '.join(FLEET_LIVE_POLICIES)}")


class ControlError(RollMuxError):
    """A request the control plane refuses; names the field and why. Nothing changed."""

    status = 400

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class UnknownJob(ControlError):
    status = 404


class UnknownNode(ControlError):
    status = 404


class DuplicateJob(ControlError):
    status = 409


class RequestReused(ControlError):
    """A submit that repeats the ``request_id`` and token of an earlier one with another
    spec, or a node add that repeats an earlier one's ``request_id`` for another node."""

    status = 409


class PhaseOrderError(ControlError):
    """A phase asked for or ended out of the rollout/train alternation, or without a grant."""

    status = 409


class MoveUndone(ControlError):
    """A move reported done after the service had undone it (not acknowledged within
    ``--move-timeout-s``): the job was placed afresh and carries on from there. Its
    problem document has ``code: move_undone``."""

    status = 409
    code = "move_undone"


class ClusterConflict(ControlError):
    """A cluster change that would strand pinned jobs (a removed node in use, less memory than used)."""

    status = 409


class JobEnded(ControlError):
    """The job has departed (done, cancelled or expired); ``state`` says which."""

    status = 410

    def __init__(self, field: str, reason: str, state: str) -> None:
        super().__init__(field, reason)
        self.state = state


class NeverFits(ControlError):
    status = 422


class SpecRejected(ControlError):
    """A job spec the live service does not take (``Job.validate`` refuses it, e.g. staleness
    above ``rollmux.model.MAX_STALENESS``)."""

    status = 422


@dataclass(slots=True)
class GrantRecord:
    """A grant the job holds: event ``seq`` started ``pool`` on ``nodes`` at ``granted_at``."""

    seq: int
    pool: str
    nodes: tuple[str, ...]
    granted_at: float
    switch_s: float
    share: float = 1.0  # < 1: a slice of a donor's freed GPUs (long-tail hand-off)


@dataclass(slots=True)
class JobRecord:
    """Everything the control plane knows about one job (``token_hash``: SHA-256 of its token)."""

    job: Job
    token_hash: str
    state: str
    submitted_at: float
    ord: int = 0
    tenant: str = ""
    request_id: str | None = None
    outcome: str = ""
    explanation: list[str] = field(default_factory=list)
    group_id: str | None = None
    rollout_nodes: tuple[str, ...] = ()
    train_nodes: tuple[str, ...] = ()
    next_phase: str = ROLLOUT
    grant: GrantRecord | None = None
    last_released_seq: int | None = None
    last_released_phase: str | None = None
    iterations_done: int = 0
    progress: float = 0.0
    iter_mark: float | None = None
    iter_time_sum: float = 0.0
    ready_at: float | None = None
    ended_at: float | None = None
    end_reason: str = ""
    placed_at: float | None = None
    movable: bool = True
    move: dict | None = None
    moves: int = 0
    # how the latest move ended: {"seq": its directive's, "outcome": "done" | "undone", "reason"}
    last_move: dict | None = None
    phase_max_s: dict[str, float] = field(default_factory=dict)  # pool -> longest phase body released
    over_profile: int = 0  # phases released longer than the profile x (1 + PROFILE_TOLERANCE)
    # An asynchronous job's second grant (the other pool than ``grant``'s), held at the same
    # time; None for a synchronous job. ``grants`` / ``held`` read both.
    other_grant: GrantRecord | None = None
    rollouts_started: int = 0  # rollout grants received (r of the execution rule)
    rollouts_done: int = 0  # rollouts released (f); trainings released are ``iterations_done`` (t)
    last_released_in: dict[str, int] = field(default_factory=dict)  # pool -> grant seq last released there

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def asynchronous(self) -> bool:
        return self.job.staleness > 0

    @property
    def grants(self) -> list[GrantRecord]:
        """Every grant the job holds (two only for an asynchronous job, one per pool)."""
        return [g for g in (self.grant, self.other_grant) if g is not None]

    def held(self, pool: str) -> GrantRecord | None:
        """The grant the job holds in ``pool``, or None."""
        for g in (self.grant, self.other_grant):
            if g is not None and g.pool == pool:
                return g
        return None

    def pipeline(self) -> dict | None:
        """An asynchronous job's counters: staleness k, rollouts started (r) and released (f),
        trainings released (t); None for a synchronous job."""
        if not self.asynchronous:
            return None
        return {"staleness": self.job.staleness, "rollouts_started": self.rollouts_started,
                "rollouts_done": self.rollouts_done, "trainings_done": self.iterations_done}

    def measured_slowdown(self) -> float | None:
        """The measured time of the iterations done over their time alone (``Job.solo_run_s``:
        an asynchronous job's first iteration also fills its pipeline), as the simulator
        measures it."""
        if self.iterations_done == 0:
            return None
        return self.iter_time_sum / self.job.solo_run_s(self.iterations_done)


class ControlPlane:
    """Jobs, plan and executors of the live service (see the module docstring)."""

    def __init__(self, cluster: Cluster | Fleet, planner: Planner | FleetPlanner | None = None,
                 policy: str = "rollmux", migration_s: float = 300.0, tail_threshold: float = 0.8,
                 profiles: Profiles | None = None, backfill: bool = True, keep_ended: int | None = None,
                 decide_apart: bool = False) -> None:
        """``cluster``: a two-pool ``Cluster``, or a ``Fleet`` of GPU types (with its
        measured ``profiles``): then each job's pair of types and group come from the
        fleet planner, nodes are the fleet's (``FleetState``), the plane runs the policies
        in ``FLEET_LIVE_POLICIES`` and the fleet is fixed while it runs (``reconcile``).
        A fleet-backed policy (``rollmux-hedge``) on a two-pool cluster runs it as a fleet
        of one view (``fleet.fleet_of``), as ``rollmux simulate`` does. ``backfill``: a
        job that packs into a running group passes the waiting line, as in the
        simulator (``simulate(backfill=)``); False: strictly first come, first placed.
        ``decide_apart``: regroupings are only asked for here and decided by the caller
        off its lock (``regroup_ticket``, ``apply_regroups``; ``rollmux.runtime.regroup_ticket``);
        False: each is decided in the change that asks for it, as in the simulator."""
        cluster.validate()
        if isinstance(cluster, Cluster) and policy in FLEET_BACKED:
            cluster = fleet_of(cluster)
        self.fleet = cluster if isinstance(cluster, Fleet) else None
        self.profiles = profiles if profiles is not None else Profiles()
        check_live_policy(policy, self.fleet is not None)
        if self.fleet is not None:
            self.policy = fleet_rollmux(self.fleet, self.profiles, policy)
            # the knobs every view shares (GPUs per node, switch cost, group size): read, never pooled
            self.cluster = self.fleet.views()[0].cluster
        else:
            if profiles is not None:
                raise ControlError("profiles", "per-type phase profiles apply to a fleet, not a two-pool cluster")
            self.cluster = cluster
            self.policy = make_policy(policy)
        if planner is not None:
            self.policy.planner = planner
        self.planner = self.policy.planner
        self._repack = getattr(self.policy, "repack", None)
        self._regroup = getattr(self.policy, "regroup", None)
        self._regroup_on_arrival = getattr(self.policy, "regroup_on_arrival", False)
        self._regroup_on_wait = self._regroup is not None and getattr(self.policy, "regroup_on_wait", False)
        self.regroups: dict[str, dict] = {}  # id -> {"group": solver group, "waiting": [...], "acked": [...]}
        self._next_regroup = 0
        # regrouping -> the nodes held for its new groups on bounded pools (rollmux.reservation)
        self.holds: dict[str, Reservation] = {}
        # regroupings asked for by a submit, run after it is answered: [group, job, time] (``gather``);
        # with ``decide_apart`` every regrouping asked for, [group, job, time(, tries)] (``regroup_ticket``)
        self._gathers: list[list] = []
        self.decide_apart = decide_apart
        self._in_ticket = 0  # the first asks of ``_gathers``, out on a ticket (``regroup_ticket``)
        # the waiting line's retry left for after the asks made so far ("after"): ``_retry_waiting``
        self._line_due: dict | None = None  # {"kind": "retry" | "backfill", "head": job or None, "after": n}
        self._asks_made = 0  # asks ever recorded; ``_gathers`` holds the last ones, in order
        self.node_adds: dict[str, dict] = {}  # request_id -> the first answer to that add (``add_node``)
        # nodes ``add_node`` added and no cluster file has named since: id -> GB, per pool (``with_live_nodes``)
        self.added_live: dict[str, dict[str, float]] = {ROLLOUT: {}, TRAIN: {}}
        self.migration_s = migration_s
        self.tail_threshold = tail_threshold
        self.backfill = backfill
        self.move_s: dict[str, float] = {}  # model size column -> largest measured move (s)
        self.offer: set[str] = set()
        self.plan = FleetState(self.fleet, self.profiles) if self.fleet is not None else PlanState(cluster)
        self.executors: dict[str, GroupExecutor] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.waiting: list[str] = []
        self.drained: set[str] = set()
        self.grants_total = 0
        self.busy_s = {p: 0.0 for p in POOLS}
        self.provisioned_s = {p: 0.0 for p in POOLS}
        self._clock: float | None = None
        self._seq = 0
        self._ord = 0
        self._events: list[dict] = []
        self._ended: list[JobRecord] = []
        # departed records in ``jobs``, oldest first, and the departed runs no longer in
        # ``jobs`` by state (``keep_ended``, or replaced by a new run; module docstring)
        self.keep_ended = keep_ended
        self._departed: deque[JobRecord] = deque()
        self.evicted: dict[str, int] = {}
        self._dirty_jobs: set[str] = set()
        self._dirty_groups: set[str] = set()
        self._cluster_dirty = True

    @property
    def last_seq(self) -> int:
        """Sequence number of the latest event (grants, admits, moves, ...)."""
        return self._seq

    @property
    def clock(self) -> float | None:
        """The latest ``now`` this plane has seen (the service never lets its clock fall below it)."""
        return self._clock

    # --- job calls ------------------------------------------------------------------
    def submit(self, job: Job, now: float, token_hash: str, request_id: str | None = None,
               tenant: str = "", movable: bool = True) -> JobRecord:
        """Register ``job``; place it now or put it in the waiting line.

        The regrouping a policy asks for after an arrival that opens a group is left to
        ``gather``, which runs before any other change: the answer does not wait for it.
        A repeated submit with the same ``request_id``, token and spec returns the first
        answer (a client retrying after a lost reply; with another spec it is a
        ``RequestReused``); any other submit of a live job's id is a ``DuplicateJob``. The
        id of a departed job may be used again. A spec the cluster cannot take
        (``Job.validate``: memory above a node's, ...) is a ``SpecRejected`` on
        ``spec.<field>``, refused before any change.
        """
        known = self.jobs.get(job.job_id)
        if known is not None:
            if self.is_retry(known, request_id, token_hash):
                return self.first_answer(known, job)
            if known.live:
                raise DuplicateJob("job_id", f"{job.job_id!r} is already registered")
        try:
            job.validate(self.cluster)
        except SpecError as err:
            raise SpecRejected(f"spec.{err.field}", f"{err.value!r}: expected {err.expected}") from None
        self.gather()
        if job.staleness:
            movable = False  # never moved (see the module docstring)
        decision = self._decide(job, lambda k: job.iterations if k == job.job_id else self._remaining(k))
        if decision.outcome == "rejected":
            raise NeverFits(self._never_fits_field(job), decision.reason)
        self._advance(now)
        self._ord += 1
        behind = bool(self.waiting) and decision.placement is not None  # first come, first placed (as simulated)
        outcome, explanation = decision.outcome, _explain(decision)
        if behind and self._passes(decision):
            behind = False
            explanation = [self._passed_text(), *explanation]
        if behind:
            outcome = "wait"
            explanation = [f"behind the waiting line ({len(self.waiting)} jobs, first {self.waiting[0]}); "
                           f"it would be {decision.outcome} now", *explanation]
        rec = JobRecord(job, token_hash, WAITING, now, self._ord, tenant, request_id, outcome, explanation,
                        movable=movable)
        replaced = self.jobs.pop(job.job_id, None)
        if replaced is not None:  # a departed run of this id (a live one is refused above)
            self._count_out(replaced)
        self.jobs[job.job_id] = rec
        self._dirty_jobs.add(job.job_id)
        if decision.placement is None or behind:
            rec.end_reason = f"behind the waiting line, first {self.waiting[0]}" if behind else decision.reason
            if not self.waiting:  # it heads the line, refused: after the answer (``gather``)
                for gid, job_id, at in self._on_wait(now):
                    self._ask(gid, job_id, at)
            self.waiting.append(job.job_id)
        else:
            self._place(rec, decision, now, defer=True)
        return rec

    @property
    def gathers_pending(self) -> bool:
        """Whether a submit's regroupings wait for ``gather``."""
        return bool(self._gathers) and not self.decide_apart

    @property
    def regroups_asked(self) -> bool:
        """With ``decide_apart``: whether regroupings wait to be decided (``regroup_ticket``)."""
        return self.decide_apart and bool(self._gathers)

    def gather(self) -> int:
        """Run the regroupings a submit asked for: after an arrival that opened a group, or
        for the groups of one job when the submit waits at the head of the line
        (``regroup_on_wait``). ``submit`` answers with the placement and leaves its
        regroupings here: the job starts at once, and a move it leads to happens at its
        first iteration's end at the earliest. Each runs as at its submit, on the same
        state, since every other change runs this first (the service also runs it right
        after answering the submit). Returns how many were asked for. With
        ``decide_apart`` it leaves them to the caller (``regroup_ticket``). Either way it
        then runs a retry of the waiting line left for after them whose asks are decided
        (``_run_line_due``: after a restart that changed ``decide_apart`` or the policy)."""
        pending = []
        if not self.decide_apart:
            pending, self._gathers = self._gathers, []
            for gid, job_id, at, *_ in pending:
                if gid in self.plan.groups and self.plan.job_group.get(job_id) == gid:
                    self._plan_regroup(gid, at)
        if self._line_due is not None and self._clock is not None:
            self._run_line_due(self._clock)
        return len(pending)

    def acquire(self, job_id: str, phase: str) -> GrantRecord | None:
        """The job's grant for ``phase`` if it holds one, else None (not yet its turn). Changes nothing."""
        rec = self._live(job_id)
        self._check_phase(phase)
        if rec.asynchronous:
            held = rec.held(phase)
            if held is None:
                self._check_async_order(rec, phase)
            return held
        if phase != rec.next_phase:
            raise PhaseOrderError("phase", f"{phase!r} out of order: job {job_id!r} is due for {rec.next_phase!r}")
        if rec.grant is not None and rec.grant.pool == phase:
            return rec.grant
        return None

    @staticmethod
    def _check_async_order(rec: JobRecord, phase: str) -> None:
        """Rules 10 and 12 for an asynchronous job's ``phase`` not held now: refuse what the
        staleness bound or the pipeline forbids (the job would wait for itself)."""
        r, f, t, k = rec.rollouts_started, rec.rollouts_done, rec.iterations_done, rec.job.staleness
        if phase == ROLLOUT:
            if rec.job.iterations is not None and r >= rec.job.iterations:
                raise PhaseOrderError("phase", f"job {rec.job_id!r} has started all its {r} rollouts")
            if r - t > k:
                raise PhaseOrderError("phase", f"rollout {r + 1} would be {r - t} policy versions stale, more than "
                                               f"the job's staleness {k}: release training {t + 1} first")
        elif f <= t:
            raise PhaseOrderError("phase", f"training {t + 1} needs rollout {t + 1} released first "
                                           f"({f} released)")

    def is_repeat_release(self, job_id: str, phase: str, grant_seq: int) -> bool:
        """True when a release of ``phase`` under ``grant_seq`` repeats the job's last one
        (``repeats_release``): ``release`` answers it without applying it again."""
        rec = self.jobs.get(job_id)
        return rec is not None and self.repeats_release(rec, phase, grant_seq)

    @staticmethod
    def repeats_release(rec: JobRecord, phase: str, grant_seq: int | None) -> bool:
        """True when a release of ``phase`` under ``grant_seq`` repeats ``rec``'s last one (of
        that pool, for an asynchronous job, whose other pool may have released since)."""
        return grant_seq is not None and ((rec.last_released_seq == grant_seq and rec.last_released_phase == phase)
                                          or (rec.asynchronous and rec.last_released_in.get(phase) == grant_seq))

    def release(self, job_id: str, phase: str, grant_seq: int, duration_s: float, now: float,
                failed: bool = False, restart: bool = False) -> JobRecord:
        """End the granted ``phase``; a repeat of the last release (same grant and phase) is
        answered, not re-applied. ``failed``: the job's code raised in the phase, which did
        not complete: its nodes go back and the job is due for the same phase again, with
        nothing counted (no iteration, no measured time, no move at that boundary).
        ``restart`` (only with ``failed``, for a synchronous job's training phase): the job
        is due for its rollout instead, its iteration starting again (a framework that
        cannot redo an update, its batch gone with the failure, e.g. a TRL re-run)."""
        self.gather()
        if self.is_repeat_release(job_id, phase, grant_seq):
            return self.jobs[job_id]
        rec = self._live(job_id)
        self._check_phase(phase)
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise ControlError("duration_s", f"{duration_s!r} is not a finite duration >= 0 seconds")
        if restart and not (failed and phase == TRAIN and not rec.asynchronous):
            raise ControlError("restart", "only a synchronous job's failed training phase restarts its iteration "
                                          "(with failed: true)")
        if rec.asynchronous:
            return self._release_async(rec, phase, grant_seq, duration_s, now, failed)
        if rec.grant is None:
            raise PhaseOrderError("phase", f"job {job_id!r} holds no grant to release")
        if rec.grant.pool != phase:
            raise PhaseOrderError("phase", f"{phase!r} does not match the held grant ({rec.grant.pool!r})")
        if rec.grant.seq != grant_seq:
            raise PhaseOrderError("grant_seq", f"{grant_seq} is not the held grant ({rec.grant.seq})")
        self._advance(now)
        if failed:
            self._fail_phase(rec, phase, grant_seq, now)
            if restart:
                rec.next_phase = ROLLOUT
            self.executors[rec.group_id].finish(job_id, now, failed=True, restart=restart)
            self._dispatch(rec.group_id, now)
            return rec
        last = phase == TRAIN and rec.job.iterations is not None and rec.iterations_done + 1 >= rec.job.iterations
        rec.next_phase = TRAIN if phase == ROLLOUT else ROLLOUT
        self._count_release(rec, phase, grant_seq, duration_s, now)
        move = None
        stop = phase == TRAIN and not last and self._pending_regroup(job_id) is not None
        if stop:
            pass  # the regrouping comes first, as in the simulator; the offer stays
        elif phase == TRAIN and not last and job_id in self.offer:  # an iteration boundary: the offer is taken up
            self.offer.discard(job_id)
            move = self._move_decision(rec, now)
        self._end_grant(rec, now)
        requeue = not last and move is None and not stop
        takers = self.executors[rec.group_id].recipients(job_id)
        self.executors[rec.group_id].finish(job_id, now, requeue=requeue)
        for taker in takers:  # the donor's rollout ended: its recipients own their nodes (rule 8)
            other = self.jobs[taker]
            if other.grant is not None and other.grant.share < 1.0:
                other.grant.share = 1.0
                self._dirty_jobs.add(taker)
        self._log(now, "finish", rec.group_id, job_id, phase, (), requeue=requeue)
        self._dirty_jobs.add(job_id)
        self._dirty_groups.add(rec.group_id)
        if last:
            self._depart(rec, DONE, now, "completed its iterations")
        elif stop:
            self._stop_for_regroup(rec, now)
        elif move is not None:
            self._start_move(rec, move, now)
        else:
            self._dispatch(rec.group_id, now)
        return rec

    def _phase_profile(self, rec: JobRecord, phase: str) -> float:
        """Seconds ``rec``'s ``phase`` takes at worst where it is placed: its profile, or in a
        co-located group (or hosted) its co-located time with the switch (``colocation``)."""
        group = self.plan.groups.get(rec.group_id)
        member = group.member(rec.job_id) if group is not None else None
        on_train = member is not None and (group.colocated or member.hosted)
        if self.fleet is not None and member is not None:  # its times on its group's GPU types
            return sum(worst_phase(member.job, phase, self.plan.views[self.plan.job_view[rec.job_id]][0].cluster,
                                   on_train))
        return sum(worst_phase(rec.job, phase, self.cluster, on_train))

    def _count_release(self, rec: JobRecord, phase: str, grant_seq: int, duration_s: float, now: float) -> None:
        """The bookkeeping of a release, synchronous or not: counters, measured times."""
        self._mark_released(rec, phase, grant_seq, now)
        rec.phase_max_s[phase] = max(rec.phase_max_s.get(phase, 0.0), duration_s)
        profiled = self._phase_profile(rec, phase)
        if duration_s > profiled * (1 + PROFILE_TOLERANCE):
            rec.over_profile += 1
            self._log(now, "over-profile", rec.group_id, rec.job_id, phase, (), duration_s=duration_s,
                      profile_s=profiled)
        if phase == TRAIN:
            rec.iterations_done += 1
            rec.iter_time_sum += now - (rec.iter_mark if rec.iter_mark is not None else rec.submitted_at)
            rec.iter_mark = now
        else:
            rec.rollouts_done += 1

    @staticmethod
    def _mark_released(rec: JobRecord, phase: str, grant_seq: int, now: float) -> None:
        """What every release records, failed or not: which grant it ended (``is_repeat_release``)
        and when the job became ready again."""
        rec.last_released_seq = grant_seq
        rec.last_released_phase = phase
        rec.last_released_in[phase] = grant_seq
        rec.ready_at = now

    def _fail_phase(self, rec: JobRecord, phase: str, grant_seq: int, now: float) -> None:
        """The bookkeeping of a failed release: its grant ends and a retry of the same
        release is recognised; no counter moves."""
        self._mark_released(rec, phase, grant_seq, now)
        self._end_grant(rec, now, phase)
        self._log(now, "finish", rec.group_id, rec.job_id, phase, (), requeue=True, failed=True)
        self._dirty_jobs.add(rec.job_id)
        self._dirty_groups.add(rec.group_id)

    def _release_async(self, rec: JobRecord, phase: str, grant_seq: int, duration_s: float,
                       now: float, failed: bool = False) -> JobRecord:
        """Release one of an asynchronous job's (up to two) grants: the executor finishes
        that pool's phase (rule 11) and queues what rules 10 and 12 allow."""
        job_id = rec.job_id
        held = rec.held(phase)
        if held is None:
            pools = [g.pool for g in rec.grants]
            raise PhaseOrderError("phase", f"job {job_id!r} holds no {phase} grant to release (holds: "
                                           f"{', '.join(pools) or 'none'})")
        if held.seq != grant_seq:
            raise PhaseOrderError("grant_seq", f"{grant_seq} is not the held {phase} grant ({held.seq})")
        self._advance(now)
        if failed:
            self._fail_phase(rec, phase, grant_seq, now)
            if phase == ROLLOUT:
                rec.rollouts_started -= 1
            self.executors[rec.group_id].finish(job_id, now, pool=phase, failed=True)
            rec.next_phase = self._async_due(rec)
            self._dispatch(rec.group_id, now)
            return rec
        last = phase == TRAIN and rec.job.iterations is not None and rec.iterations_done + 1 >= rec.job.iterations
        self._count_release(rec, phase, grant_seq, duration_s, now)
        self._end_grant(rec, now, phase)
        self.executors[rec.group_id].finish(job_id, now, requeue=not last, pool=phase)
        rec.next_phase = self._async_due(rec)
        self._log(now, "finish", rec.group_id, job_id, phase, (), requeue=not last)
        self._dirty_jobs.add(job_id)
        self._dirty_groups.add(rec.group_id)
        if last:
            self._depart(rec, DONE, now, "completed its iterations")
        else:
            self._dispatch(rec.group_id, now)
        return rec

    @staticmethod
    def _async_due(rec: JobRecord) -> str:
        """``next_phase`` of an asynchronous job (a summary; ``pipeline`` is exact): training
        when a released rollout waits for it and none runs, else rollout."""
        return TRAIN if rec.rollouts_done > rec.iterations_done and rec.held(TRAIN) is None else ROLLOUT

    @staticmethod
    def is_retry(known: JobRecord, request_id: str | None, token_hash: str) -> bool:
        """True when a submit with ``request_id`` and ``token_hash`` repeats the one that
        registered ``known`` (a client retrying after a lost reply)."""
        return request_id is not None and known.request_id == request_id and known.token_hash == token_hash

    @staticmethod
    def first_answer(known: JobRecord, job: Job) -> JobRecord:
        """``known``, the run a retried submit of ``job`` registered; ``RequestReused`` when
        the retry carries another spec (a client bug: the same request id for two jobs)."""
        if known.job != job:
            raise RequestReused("request_id", f"{known.request_id!r} was sent with job {known.job_id!r}'s first "
                                              f"spec; this one differs (send a new request_id for a new submit)")
        return known

    def pending_move(self, job_id: str) -> dict | None:
        """The job's move directive ({"from_group", "to_group", "rollout_nodes",
        "train_nodes", "decided_at", "seq"}), or None (also while a regrouped job waits
        for the other members of its new group to stop)."""
        move = self._live(job_id).move
        if move is None or "to_group" not in move or move.get("acked"):
            return None  # an acknowledged regroup member waits for the others without a directive
        return move

    def moved(self, job_id: str, now: float, ok: bool = True, reason: str = "", seq: int | None = None) -> JobRecord:
        """The job reports its move done (``ok``: its state is on the new nodes; it is
        admitted to its new group) or failed (it is placed afresh or queued). ``seq``, the
        directive's, says which move (without it: the one in progress, else the latest).
        A repeat of a report is answered, not re-applied; a move reported done after the
        service undid it is a ``MoveUndone``."""
        self.gather()
        rec = self._live(job_id)
        if rec.move is not None and rec.move.get("acked"):  # a regrouped member waiting for the others
            if ok and seq in (None, rec.move.get("seq")):
                return rec  # a repeat of its acknowledgement
            if ok:
                return self._past_move(rec, ok, seq)
            raise PhaseOrderError("move", f"job {job_id!r} has already reported its move done; its new group "
                                          f"waits for the other members")
        if rec.move is None or "to_group" not in rec.move or seq not in (None, rec.move.get("seq")):
            return self._past_move(rec, ok, seq)
        self._advance(now)
        if ok:
            rec.last_move = {"seq": rec.move.get("seq"), "outcome": "done", "reason": ""}
            seconds = now - rec.move["decided_at"]
            column = str(model_size_column(rec.job.model))
            self.move_s[column] = max(self.move_s.get(column, 0.0), seconds)
            self._log(now, "moved", rec.group_id, job_id, "", (), from_group=rec.move["from_group"],
                      seconds=seconds)
            rid = rec.move.get("regroup")
            if rid is None:
                rec.move = None
                rec.moves += 1
                self._admit(rec, now)
            else:
                rec.move["acked"] = True
                self._admit_regrouped(rid, now)
        else:
            self._abort_move(rec, now, reason or "the job could not move")
        self._dirty_jobs.add(job_id)
        return rec

    def _past_move(self, rec: JobRecord, ok: bool, seq: int | None) -> JobRecord:
        """A report about a move that is not in progress: a repeat of how the latest one
        ended is answered; one reported done after it was undone is a ``MoveUndone``."""
        last = rec.last_move
        if last is not None and seq in (None, last["seq"]):
            if (last["outcome"] == "done") == ok:
                return rec  # a repeat
            if ok:
                raise MoveUndone("move", f"job {rec.job_id!r}: its move (directive seq {last['seq']}) was undone "
                                         f"before this report ({last['reason']}); it was placed afresh: go on "
                                         f"from its current placement")
        elif last is None and seq is None and rec.move is None and rec.state == PLACED and rec.moves > 0 and ok:
            return rec  # (a record saved before moves' outcomes were kept: the latest move was done)
        which = f" with directive seq {seq}" if seq is not None else ""
        raise PhaseOrderError("move", f"job {rec.job_id!r} has no move{which} in progress")

    def abort_stale_moves(self, now: float, timeout_s: float) -> list[str]:
        """Undo every move not acknowledged within ``timeout_s``; returns those jobs."""
        self.gather()
        stale = [r for r in self.jobs.values() if r.live and r.move is not None and "to_group" in r.move
                 and not r.move.get("acked") and now - r.move["decided_at"] > timeout_s]
        for rec in stale:
            self._advance(now)
            self._abort_move(rec, now, f"not acknowledged within {timeout_s:g}s")
            self._dirty_jobs.add(rec.job_id)
        return [r.job_id for r in stale]

    def report_progress(self, job_id: str, fraction: float) -> JobRecord:
        """Record the job's progress fraction in [0, 1]."""
        self.gather()
        rec = self._live(job_id)
        if not (0.0 <= fraction <= 1.0):
            raise ControlError("fraction", f"{fraction!r} is not a fraction in [0, 1]")
        rec.progress = fraction
        self._dirty_jobs.add(job_id)
        return rec

    def tail(self, job_id: str, fraction: float, now: float) -> int:
        """The job's running rollout has ``fraction`` of its responses done. From
        ``tail_threshold`` on, it keeps ``Job.tail_gpus()`` GPUs and the freed ones may be
        handed to the next queued rollout of its group at once. Returns the GPUs the job
        keeps (all of them while below the threshold, or when nothing is freed)."""
        self.gather()
        rec = self._live(job_id)
        if not (0.0 <= fraction <= 1.0):
            raise ControlError("fraction", f"{fraction!r} is not a fraction in [0, 1]")
        held = rec.held(ROLLOUT)
        if held is None:
            raise PhaseOrderError("phase", f"job {job_id!r} holds no rollout grant to report a tail for")
        gpus = rec.job.rollout_gpus
        if fraction < self.tail_threshold:
            return gpus
        ex = self.executors[rec.group_id]
        keep = rec.job.tail_gpus()
        if not ex.tail(job_id, now, keep):
            return keep if ex.in_tail(job_id) else gpus
        self._advance(now)
        self._log(now, "tail", rec.group_id, job_id, ROLLOUT, held.nodes, fraction=fraction, keep_gpus=keep)
        self._dirty_jobs.add(job_id)
        self._dispatch(rec.group_id, now)
        return keep

    def complete(self, job_id: str, now: float) -> JobRecord:
        """The job is finished: it departs and its nodes go back. Idempotent once done."""
        self.gather()
        rec = self._record(job_id)
        if rec.state == DONE:
            return rec
        self._live(job_id)
        self._depart(rec, DONE, now, "completed by the job")
        return rec

    def cancel(self, job_id: str, now: float, reason: str = "cancelled") -> JobRecord:
        """Cancel a live job (its own call or an admin's). Idempotent once cancelled."""
        self.gather()
        rec = self._record(job_id)
        if rec.state == CANCELLED:
            return rec
        self._live(job_id)
        self._depart(rec, CANCELLED, now, reason)
        return rec

    def expire(self, job_ids: list[str], now: float, reason: str) -> list[str]:
        """Depart each of ``job_ids`` that is still live (its lease ran out); returns those departed."""
        self.gather()
        gone = [self.jobs[j] for j in job_ids if j in self.jobs and self.jobs[j].live]
        for rec in gone:
            self._depart(rec, EXPIRED, now, reason)
        return [r.job_id for r in gone]

    # --- admin calls ------------------------------------------------------------------
    def drain(self, node: str, now: float) -> list[str]:
        """Make ``node`` unschedulable: no new job is pinned to it; current pins stay
        until their jobs depart, then the node is withheld. Returns the jobs still on it."""
        self.gather()
        pool = self._pool_of(node)
        self._advance(now)
        self.drained.add(node)
        for held in self.holds.values():  # a held node leaves its hold, which takes another
            if held.drop(pool, node):
                held.take_free(self.plan, pool)
        self._withhold_drained()
        return self._jobs_on(node, pool)

    def undrain(self, node: str, now: float) -> list[str]:
        """Put a drained node back in service; waiting jobs may be placed on it. Returns the
        jobs placed by this."""
        self.gather()
        pool = self._pool_of(node)
        self._advance(now)
        if node not in self.drained:
            return []
        self.drained.discard(node)
        if self.plan.bounded(pool) and not self._jobs_on(node, pool):
            self.plan.reinstate(pool, node)
        return self._retry_waiting(now)

    def add_node(self, pool: str, node_id: str, host_mem_gb: float | None, now: float,
                 request_id: str | None = None) -> tuple[str, list[str]]:
        """Add a node to a bounded pool (a listed pool gets ``node_id``; a counted pool its
        next generated id, which must be ``node_id`` if given). Returns the new node's id
        and the jobs placed by it. An add that repeats an earlier one's ``request_id`` (a
        client's retry after a lost answer: a counted pool would add a second node) gets
        the first answer and adds nothing; with another pool, node or memory it is refused
        (``RequestReused``). The last ``NODE_ADDS_KEPT`` ids are kept, across restarts."""
        if request_id is not None and request_id in self.node_adds:
            first = self.node_adds[request_id]
            if (first["pool"], first["host_mem_gb"]) != (pool, host_mem_gb) or node_id not in ("", first["node"]):
                raise RequestReused("request_id", f"{request_id!r} added node {first['node']!r} to the "
                                                  f"{first['pool']} pool; this add differs (send a new request_id "
                                                  f"for a new node)")
            return first["node"], list(first["placed"])
        self.gather()
        if self.fleet is not None:
            raise ControlError("pool", "a fleet of GPU types keeps the pools it started with: adding nodes live "
                                       "is for a two-pool cluster")
        if pool not in POOLS:
            raise ControlError("pool", f"{pool!r} is not one of {POOLS}")
        spec = self.cluster.pool(pool)
        if spec.nodes is None:
            raise ControlError("pool", f"the {pool} pool is unbounded: nodes are provisioned on demand")
        mem = spec.host_mem_gb if host_mem_gb is None else host_mem_gb
        if spec.node_list:
            if not node_id:
                raise ControlError("node_id", "the pool lists its nodes: give the new node's id")
            if self.plan.pool_of(node_id) is not None:
                raise ControlError("node_id", f"{node_id!r} is already a node of this cluster")
            other = self.cluster.counted_pool_of(node_id)
            if other is not None:
                raise ControlError("node_id", f"{node_id!r} is a name the {other} pool gives its nodes by count; "
                                              f"choose another")
            new = dataclasses.replace(spec, nodes=spec.nodes + 1,
                                      node_list=(*spec.node_list, NodeSpec(node_id, mem)),
                                      host_mem_gb=max(spec.host_mem_gb, mem))
        else:
            expected = f"{'R' if pool == ROLLOUT else 'T'}{spec.nodes}"
            if node_id and self.plan.pool_of(node_id) is not None:
                raise ControlError("node_id", f"{node_id!r} is already a node of this cluster")
            if node_id and node_id != expected:
                raise ControlError("node_id", f"{node_id!r}: the {pool} pool names its nodes by count; the next "
                                              f"is {expected!r}")
            if host_mem_gb is not None and host_mem_gb != spec.host_mem_gb:
                raise ControlError("host_mem_gb", f"{host_mem_gb!r}: a counted pool's nodes all have "
                                                  f"{spec.host_mem_gb} GB; list the nodes to vary it")
            new = dataclasses.replace(spec, nodes=spec.nodes + 1)
            node_id = expected
        cluster = dataclasses.replace(self.cluster, **{pool: new})
        placed = self.reconcile(cluster, now)["placed"]
        self.added_live[pool][node_id] = mem
        if request_id is not None:
            self.node_adds[request_id] = {"pool": pool, "node": node_id, "host_mem_gb": host_mem_gb, "placed": placed}
            for old in list(self.node_adds)[:-NODE_ADDS_KEPT]:
                del self.node_adds[old]
        return node_id, placed

    def with_live_nodes(self, cluster: Cluster | Fleet) -> tuple[Cluster | Fleet, list[str]]:
        """``cluster`` (a cluster file given on restart) with the nodes ``add_node`` added
        since no cluster file named them, and their ids: a restart with the file that the
        service started from keeps them (it dropped a free one silently, and refused to
        start over one in use). A listed pool gets them appended; a counted pool a count
        one past the highest. Once a file names a node it is the file's: a later file
        without it removes it. A pool the file makes unbounded, or whose naming (listed or
        counted) it changes, takes the file as it is."""
        if isinstance(cluster, Fleet) or self.fleet is not None:
            return cluster, []
        kept: list[str] = []
        for pool in POOLS:
            spec, added = cluster.pool(pool), self.added_live[pool]
            if spec.nodes is None or not added:
                continue
            named = _pool_nodes(spec, pool)
            for node in [n for n in added if n in named]:
                del added[node]  # the file names it now
            if spec.node_list:
                extra = [NodeSpec(n, gb) for n, gb in added.items() if cluster.counted_pool_of(n) is None]
                if extra:
                    spec = dataclasses.replace(spec, nodes=spec.nodes + len(extra),
                                               node_list=(*spec.node_list, *extra),
                                               host_mem_gb=max(spec.host_mem_gb, *(n.host_mem_gb for n in extra)))
                    kept += [n.node_id for n in extra]
            else:
                counted = [n for n in added if cluster.counted_pool_of(n) == pool]
                if counted:
                    spec = dataclasses.replace(spec, nodes=max(spec.nodes, 1 + max(int(n[1:]) for n in counted)))
                    kept += counted
            cluster = dataclasses.replace(cluster, **{pool: spec})
        return cluster, kept

    def reconcile(self, cluster: Cluster | Fleet, now: float, profiles: Profiles | None = None) -> dict:
        """Move to ``cluster`` (the cluster file changed, or a node was added live).

        Added nodes join their pool's free nodes; removed free nodes leave it; a node
        held for a pending regrouping stays held, and the groups it empties stay closed
        (the same cluster changes nothing). A removed node that a job is pinned to or that
        a regrouping holds, a node whose new memory is below what its jobs use,
        a different ``gpus_per_node`` or a pool switching between bounded and unbounded
        while it has groups raises ``ClusterConflict`` and changes nothing. Prices and
        switch costs apply from now on. Waiting jobs are retried. Returns
        ``{"added", "removed", "changed", "placed"}``. A fleet (and its ``profiles``, when
        given) must be the one the plane holds (``_reconcile_fleet``).
        """
        self.gather()
        cluster.validate()
        if self.fleet is not None or isinstance(cluster, Fleet) or profiles is not None:
            return self._reconcile_fleet(cluster, profiles)
        old = self.cluster
        if cluster.gpus_per_node != old.gpus_per_node:
            raise ClusterConflict("gpus_per_node", f"{cluster.gpus_per_node}: this state file's cluster has "
                                                   f"{old.gpus_per_node} GPUs per node; it cannot change")
        free, minted, added, removed = {}, {}, [], []
        held = {n for h in self.holds.values() for ns in h.held.values() for n in ns}
        for pool in POOLS:
            spec, before = cluster.pool(pool), old.pool(pool)
            used: dict[str, float] = {}
            for g in self.plan.groups.values():
                for n in g.nodes(pool):
                    used[n] = used.get(n, 0.0) + g.mem_used(n, pool)
            if (spec.nodes is None) != (before.nodes is None):
                if used:
                    raise ClusterConflict(f"{pool}.nodes", f"the {pool} pool cannot switch between bounded and "
                                                           f"unbounded while jobs use it ({', '.join(sorted(used))})")
            if spec.nodes is None:
                minted[pool] = self.plan.inventory()["minted"][pool] if before.nodes is None else 0
                continue
            ids = _pool_nodes(spec, pool)
            for n, gb in used.items():
                if n not in ids:
                    raise ClusterConflict(f"{pool}.nodes", f"node {n!r} is pinned by job(s) "
                                                           f"{', '.join(self._jobs_on(n, pool))}; drain it and "
                                                           f"let them finish before removing it")
                if gb > ids[n] + 1e-9:
                    raise ClusterConflict(f"{pool}.nodes", f"node {n!r}: {ids[n]:g} GB of host memory is less "
                                                           f"than the {gb:g} GB its jobs hold")
            old_ids = _pool_nodes(before, pool) if before.nodes is not None else {}
            for n in old_ids:
                if n not in ids and n in held:
                    raise ClusterConflict(f"{pool}.nodes", f"node {n!r} is held for a regrouping that has not "
                                                           f"opened its groups yet; remove it once that is done")
            added += [n for n in ids if n not in old_ids]
            removed += [n for n in old_ids if n not in ids]
            # a node held for a pending regrouping stays held, not free (rollmux.reservation)
            free[pool] = [n for n in ids if n not in used and n not in self.drained and n not in held]
            minted[pool] = len(ids)
        changed = [f"{pool}: {k} {getattr(old.pool(pool), k)} -> {getattr(cluster.pool(pool), k)}"
                   for pool in POOLS for k in ("gpu", "price_per_gpu_hour")
                   if getattr(old.pool(pool), k) != getattr(cluster.pool(pool), k)]
        if cluster.switch_cost != old.switch_cost:
            changed.append("switch cost")
        if cluster.max_group_size != old.max_group_size:
            changed.append(f"max_group_size {old.max_group_size} -> {cluster.max_group_size}")
        self._advance(now)
        groups = list(self.plan.groups.values())
        plan = PlanState(cluster)
        plan.restore(groups, {"free": free, "minted": minted, "next_group": self.plan.inventory()["next_group"]})
        for gid in self.plan.closing_groups():  # still emptied by a pending regrouping
            plan.close_group(gid)
        self.plan = plan
        self.cluster = cluster
        self.drained = {n for n in self.drained if plan.pool_of(n) is not None}
        self.added_live = {p: {n: gb for n, gb in nodes.items() if plan.pool_of(n) == p}
                           for p, nodes in self.added_live.items()}
        self._cluster_dirty = True
        placed = self._retry_waiting(now) if (added or changed) else []
        return {"added": added, "removed": removed, "changed": changed, "placed": placed}

    def _reconcile_fleet(self, target: Cluster | Fleet, profiles: Profiles | None) -> dict:
        """A fleet is fixed while the service keeps its state: the same fleet (and the same
        profiles, when given) changes nothing; anything else is a ``ClusterConflict``. A
        two-pool cluster served as a fleet of one view (``rollmux-hedge``) is compared as
        that fleet."""
        if self.fleet is not None and isinstance(target, Cluster) and len(self.fleet.views()) == 1:
            target = fleet_of(target)
        if self.fleet is None and not isinstance(target, Fleet):
            raise ClusterConflict("profiles", "per-type phase profiles apply to a fleet; this state file holds a "
                                              "two-pool cluster")
        if self.fleet is None or not isinstance(target, Fleet):
            have, got = ("a two-pool cluster", "a fleet") if self.fleet is None else ("a fleet", "a two-pool cluster")
            raise ClusterConflict("cluster", f"this state file holds {have}; it cannot become {got}")
        if target != self.fleet:
            raise ClusterConflict("pools", "this state file's fleet differs from the file given; a fleet is fixed "
                                           "while the service keeps its state (start a new state file to change it)")
        if profiles is not None and profiles != self.profiles:
            raise ClusterConflict("profiles", "this state file's phase profiles differ from the file given; they "
                                              "are fixed while the service keeps its state")
        return {"added": [], "removed": [], "changed": [], "placed": []}

    def pool_nodes(self) -> dict[str, int | None]:
        """Each pool's node count (None: unbounded), by name: ``rollout`` and ``train`` on a
        two-pool cluster, the fleet's pool names on a fleet."""
        if self.fleet is not None:
            return {p.name: p.nodes for p in self.fleet.pools}
        return {p: self.cluster.pool(p).nodes for p in POOLS}

    def role_nodes(self, role: str) -> int | None:
        """The most nodes one job's ``role`` (rollout or train) side can get: its pool's count,
        on a fleet the largest pool that plays the role (None: some pool is unbounded)."""
        if self.fleet is None:
            return self.cluster.pool(role).nodes
        counts = [p.nodes for p in self.fleet.pools if role in p.roles]
        return None if None in counts else max(counts)

    # --- reads --------------------------------------------------------------------------
    def record(self, job_id: str) -> JobRecord:
        return self._record(job_id)

    def list_jobs(self, state: str | None = None, group_id: str | None = None, tenant: str | None = None,
                  limit: int = 1000, offset: int = 0) -> list[JobRecord]:
        """Jobs in submission order (departed ones first), filtered; at most ``limit`` of
        them, after the first ``offset`` that match (a page)."""
        out = []
        for rec in self.jobs.values():
            if ((state is None or rec.state == state) and (group_id is None or rec.group_id == group_id)
                    and (tenant is None or rec.tenant == tenant)):
                if offset:
                    offset -= 1
                    continue
                out.append(rec)
                if len(out) >= limit:
                    break
        return out

    def status(self, now: float) -> dict:
        """Groups, pinning, node holders, queue order and measured slowdowns (plain data)."""
        groups = []
        for gid, group in self.plan.groups.items():
            ex = self.executors[gid]
            analysis = self.plan.analysis(gid)
            groups.append({
                "group_id": gid,
                **({"view": gid.split(":", 1)[0]} if self.fleet is not None else {}),
                "rollout_nodes": list(group.rollout_nodes),
                "train_nodes": list(group.train_nodes),
                "members": [{"job_id": m.job.job_id, "rollout_nodes": list(m.rollout_nodes),
                             "train_nodes": list(m.train_nodes)} for m in group.members],
                "holders": ex.busy_nodes(),
                "queues": {p: ex.queued(p) for p in POOLS},
                "planned_slowdown": analysis.slowdown,
                "cost_per_hour": self.plan.group_cost_per_hour(gid),
            })
        jobs = [{"job_id": r.job_id, "state": r.state, "tenant": r.tenant, "group_id": r.group_id,
                 "iterations_done": r.iterations_done, "iterations": r.job.iterations,
                 "progress": r.progress, "slo": r.job.slo, "measured_slowdown": r.measured_slowdown(),
                 "profile_s": {p: self._phase_profile(r, p) for p in POOLS}, "measured_max_s": r.phase_max_s,
                 "over_profile": r.over_profile,
                 "grant": asdict(r.grant) if r.grant else None, "reason": r.end_reason,
                 **({"grants": [asdict(g) for g in r.grants], "pipeline": r.pipeline()} if r.asynchronous else {})}
                for r in self.jobs.values()]
        nodes = {p: {"free": self.plan.free_count(p)} for p in self.pool_nodes()}
        # pending regroupings: who still has to stop, who has, and the nodes held for them
        regroupings = [{"regroup": rid, "members": [m["job_id"] for m in e["group"]["members"]],
                        "waiting": list(e["waiting"]), "stopped": list(e["stopped"]),
                        "opened": e.get("opened"),
                        "held": self.holds[e["hold"]].held if e.get("hold") in self.holds else {}}
                       for rid, e in self.regroups.items()]
        return {"now": now, "groups": groups, "waiting": list(self.waiting),
                "queue": "backfill" if self.backfill else "fifo", "jobs": jobs,
                "drained": sorted(self.drained), "nodes": nodes, "regroupings": regroupings,
                "held": sorted(n for h in self.holds.values() for ns in h.held.values() for n in ns),
                "overdue": self.overdue(now), "cost_per_hour": self.plan.cost_per_hour()}

    def counts(self) -> dict[str, int]:
        """Jobs by state: the records in ``jobs`` and the departed ones dropped from memory."""
        out = {s: self.evicted.get(s, 0) for s in JOB_STATES}
        for rec in self.jobs.values():
            out[rec.state] += 1
        return out

    def outstanding_grants(self) -> int:
        return sum(len(r.grants) for r in self.jobs.values())

    def node_seconds(self, now: float) -> tuple[dict[str, float], dict[str, float]]:
        """(busy, provisioned) node-seconds per pool up to ``now``: ``busy_s`` and
        ``provisioned_s`` with the time since the last change added, phases still held
        counted as busy until ``now``. Read at any ``now`` after the last change, neither
        ever decreases (a phase's end moves its seconds from held to ended, unchanged), nor
        does provisioned less busy (a pool's busy nodes are some of its nodes in use)."""
        busy, provisioned = dict(self.busy_s), self._provisioned_at(now)
        for rec in list(self.jobs.values()):  # (a copy: a scrape may read while a change runs in its thread)
            for g in rec.grants:
                busy[_busy_pool(rec, g)] += max(0.0, now - g.granted_at) * len(g.nodes) * g.share
        return busy, provisioned

    def overdue(self, now: float) -> list[dict]:
        """The phases held at ``now`` for longer than their profile allows: beyond the
        worst-case phase time x (1 + ``PROFILE_TOLERANCE``) plus the grant's switch. A
        phase that never ends (a hung worker whose process still heartbeats) shows here;
        ``over_profile`` counts a phase only once it is released. Each entry: job_id,
        pool, seq, nodes, held_s, allowed_s."""
        out = []
        for rec in list(self.jobs.values()):  # (a copy, as in node_seconds)
            for g in rec.grants:
                allowed = self._phase_profile(rec, g.pool) * (1 + PROFILE_TOLERANCE) + g.switch_s
                if now - g.granted_at > allowed:
                    out.append({"job_id": rec.job_id, "pool": g.pool, "seq": g.seq, "nodes": list(g.nodes),
                                "held_s": now - g.granted_at, "allowed_s": allowed})
        return out

    # --- persistence ------------------------------------------------------------------
    def take_changes(self) -> Changes:
        """What changed since the last call: rows to write or delete, new events, departed
        records. The caller persists it; its size follows the change, not the state."""
        changes = Changes(self._globals(), events=self._events,
                          ended=[_record_to_dict(r) for r in self._ended],
                          cluster=self._topology() if self._cluster_dirty else None)
        for job_id in self._dirty_jobs:
            rec = self.jobs.get(job_id)
            if rec is not None and rec.live:
                changes.jobs[job_id] = (rec.ord, _record_to_dict(rec))
            else:
                changes.jobs_deleted.append(job_id)
        for gid in self._dirty_groups:
            if gid in self.plan.groups:
                changes.groups[gid] = (_group_ord(gid), self._group_row(gid))
            else:
                changes.groups_deleted.append(gid)
        self._events, self._ended = [], []
        self._dirty_jobs, self._dirty_groups = set(), set()
        self._cluster_dirty = False
        return changes

    def snapshot(self) -> dict:
        """The whole state as JSON-ready data, in the shape ``Store.load`` returns;
        ``ControlPlane.restore`` inverts it."""
        return {"cluster": self._topology(), "globals": self._globals(),
                "jobs": {r.job_id: _record_to_dict(r) for r in self.jobs.values() if r.live},
                "groups": {gid: self._group_row(gid) for gid in self.plan.groups}}

    def _topology(self) -> dict:
        """The cluster as the state file keeps it: a cluster file's mapping, or on a fleet
        ``{"fleet": <fleet file's mapping>, "profiles": <rows>}``."""
        if self.fleet is not None:
            return {"fleet": fleet_to_dict(self.fleet), "profiles": profiles_to_rows(self.profiles)}
        return cluster_to_dict(self.cluster)

    @classmethod
    def restore(cls, snap: dict, ended: list[dict] = (), planner: Planner | None = None, policy: str = "rollmux",
                migration_s: float = 300.0, tail_threshold: float = 0.8, backfill: bool = True,
                keep_ended: int | None = None, evicted: dict[str, int] | None = None,
                decide_apart: bool = False) -> "ControlPlane":
        """Rebuild from ``snapshot()`` and the departed records (every one, or the latest
        ones in departure order with ``evicted``, the count by state of those left out):
        same plan, same queues, same outstanding grants, and the departed jobs' final
        records (at most ``keep_ended`` of them). A state that contradicts itself (a node in
        two groups, a job in two groups, ...) raises ``StateInconsistent``
        (``rollmux.runtime.restore_check``)."""
        glob = snap["globals"]
        if glob.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version={glob.get('version')!r}: expected {SNAPSHOT_VERSION}")
        topology = snap["cluster"]
        _check_restart_policy(policy, "fleet" in topology)
        if "fleet" in topology:
            cp = cls(fleet_from_dict(topology["fleet"]), planner, policy, migration_s, tail_threshold,
                     profiles_from_rows(topology["profiles"]), backfill, keep_ended, decide_apart)
        else:
            cp = cls(cluster_from_dict(topology), planner, policy, migration_s, tail_threshold, backfill=backfill,
                     keep_ended=keep_ended, decide_apart=decide_apart)
        live = sorted(snap["jobs"].values(), key=lambda d: d["ord"])
        cp.evicted = dict(evicted or {})
        for d in [*ended, *live]:
            rec = record_from_dict(d)
            old = cp.jobs.pop(rec.job_id, None)
            if old is not None:  # a departed run followed by another run of its id
                cp._count_out(old)
            cp.jobs[rec.job_id] = rec
        cp._departed.extend(r for r in cp.jobs.values() if not r.live)
        cp._evict()
        groups = []
        rows = sorted(snap["groups"].items(), key=lambda kv: kv[1]["ord"])
        for gid, g in rows:
            hosted = set(g.get("hosted", ()))  # (absent before hosting ran live: none)
            members = [Member(cp.jobs[j].job, cp.jobs[j].rollout_nodes, cp.jobs[j].train_nodes, j in hosted)
                       for j in g["members"]]
            groups.append(Group(gid, list(g["rollout_nodes"]), list(g["train_nodes"]), members, g["colocated"]))
        cp.plan.restore(groups, glob["inventory"])
        for gid, g in rows:
            ex = GroupExecutor(gpus_per_node=cp.cluster.gpus_per_node)
            for m in g["executor"]:
                ex.restore(m["job_id"], m["order"], tuple(m["rollout_nodes"]), tuple(m["train_nodes"]),
                           m["switch"][0], m["switch"][1], tuple(m["queued"]) if m["queued"] else None,
                           m["running"], tuple(m.get("last_on", ())))  # (a snapshot from before "last")
                if "pipe" in m:
                    ex.restore_pipe(m["job_id"], m["pipe"])
            ex.restore_last(g.get("last", {}))
            if "tails" in g:
                ex.restore_tail_state(g["tails"])
            cp.executors[gid] = ex
        cp.waiting = list(glob["waiting"])
        cp.drained = set(glob["drained"])
        cp.grants_total = glob["grants_total"]
        cp.busy_s = dict(glob["busy_s"])
        cp.provisioned_s = dict(glob["provisioned_s"])
        cp._clock = glob["clock"]
        cp._seq = glob["seq"]
        cp._ord = glob["ord"]
        # what a policy that moves jobs left pending: kept for one that does, dropped otherwise
        # (a restart may change --policy); decided moves and regroupings go on either way
        cp.offer = set(glob.get("offer", ())) if cp._repack is not None else set()
        cp.move_s = dict(glob.get("move_s", {}))
        cp.regroups = glob.get("regroups", {})
        cp._next_regroup = glob.get("next_regroup", 0)
        cp.holds = {k: Reservation.from_dict(v) for k, v in glob.get("holds", {}).items()}
        cp._gathers = [list(g) for g in glob.get("gathers", ())] if cp._regroup is not None else []
        cp._asks_made = glob.get("asks_made", len(cp._gathers))
        cp._line_due = glob.get("line_due")  # (run by the first change, whichever way it decides: ``gather``)
        cp.node_adds = dict(glob.get("node_adds", {}))
        cp.added_live = {p: dict(glob.get("added_live", {}).get(p, {})) for p in POOLS}  # (none before they were kept)
        if "closing" in glob:  # the groups a regrouping empties, marked until they are gone
            for gid in glob["closing"]:
                cp.plan.close_group(gid)
        else:  # (a snapshot from before they were kept: those its holds still wait for)
            for held in cp.holds.values():
                held.mark_closing(cp.plan)
        cp._cluster_dirty = False
        cp._dirty_groups = set(cp.executors)  # the next commit writes every group in this version's form
        check_restored(cp, snap)
        return cp

    def _globals(self) -> dict:
        return {"version": SNAPSHOT_VERSION, "waiting": list(self.waiting), "drained": sorted(self.drained),
                "grants_total": self.grants_total, "busy_s": dict(self.busy_s),
                "provisioned_s": dict(self.provisioned_s), "clock": self._clock, "seq": self._seq,
                "ord": self._ord, "inventory": self.plan.inventory(), "offer": sorted(self.offer),
                "move_s": dict(self.move_s), "regroups": self.regroups, "next_regroup": self._next_regroup,
                "holds": {k: held.to_dict() for k, held in self.holds.items()}, "gathers": self._gathers,
                "line_due": self._line_due, "asks_made": self._asks_made, "node_adds": self.node_adds,
                "added_live": self.added_live, "closing": sorted(self.plan.closing_groups())}

    def _group_row(self, gid: str) -> dict:
        g = self.plan.groups[gid]
        ex = self.executors[gid]
        queued = {}
        for pool in POOLS:
            for ready, order, job_id in ex.queue_entries(pool):
                queued[job_id] = [pool, ready] if order == ex.order_of(job_id) else [pool, ready, order]
        last = ex.last_jobs()
        members = []
        sw = self.cluster.switch_cost
        for job_id in ex.members():
            m = g.member(job_id)
            row = {"job_id": job_id, "order": ex.order_of(job_id),
                   "rollout_nodes": list(m.rollout_nodes), "train_nodes": list(m.train_nodes),
                   "switch": [sw.seconds(m.job.model, ROLLOUT), sw.seconds(m.job.model, TRAIN)],
                   "queued": queued.get(job_id), "running": ex.running(job_id)}
            if m.job.staleness:
                row["queued"] = None
                row["pipe"] = ex.pipe_state(m.job.job_id)
            members.append(row)
        row = {"ord": _group_ord(gid), "rollout_nodes": list(g.rollout_nodes), "train_nodes": list(g.train_nodes),
               "colocated": g.colocated, "members": [m.job.job_id for m in g.members], "executor": members,
               "last": dict(sorted(last.items()))}
        if g.hosts:
            row["hosted"] = [m.job.job_id for m in g.members if m.hosted]
        tails = ex.tail_state()
        if tails["tails"] or tails["donor"]:
            row["tails"] = tails
        return row

    # --- internals --------------------------------------------------------------------
    def _place(self, rec: JobRecord, decision, now: float, defer: bool = False) -> None:
        job = rec.job
        placement = decision.placement
        gid = self.plan.apply(job, placement)
        if rec.placed_at is None:
            rec.placed_at = now
        if self._repack is not None and decision.outcome == "new-group":  # new room to fill
            self.offer.update(j for j in self.plan.job_group if j != job.job_id)
        rec.state = PLACED
        rec.group_id = gid
        member = self.plan.groups[gid].member(job.job_id)  # as pinned (on a fleet: the physical nodes)
        rec.rollout_nodes = tuple(member.rollout_nodes)
        rec.train_nodes = tuple(member.train_nodes)
        rec.iter_mark = now
        rec.ready_at = now
        rec.end_reason = ""
        self._dirty_jobs.add(job.job_id)
        self._admit(rec, now)
        if self._regroup_on_arrival and placement.group_id is None:  # a new group: regroup it too
            if defer:  # after the answer (``gather``)
                self._ask(gid, rec.job_id, now)
            else:
                self._plan_regroup(gid, now)

    def _admit(self, rec: JobRecord, now: float) -> None:
        """Admit a placed job to its group's executor (ready for rollout) and dispatch."""
        job, gid = rec.job, rec.group_id
        ex = self.executors.get(gid)
        if ex is None:
            ex = self.executors[gid] = GroupExecutor(gpus_per_node=self.cluster.gpus_per_node)
        sw = self.cluster.switch_cost
        pipe = {}
        if job.staleness:  # rule 12: no rollout past its last training (admitted once: it never moves)
            pipe = {"staleness": job.staleness, "rollouts": job.iterations}
        ex.admit(job.job_id, rec.rollout_nodes, rec.train_nodes, now,
                 sw.seconds(job.model, ROLLOUT), sw.seconds(job.model, TRAIN), **pipe)
        rec.ready_at = now
        self._log(now, "admit", gid, job.job_id, "", rec.rollout_nodes + rec.train_nodes,
                  rollout_nodes=list(rec.rollout_nodes), train_nodes=list(rec.train_nodes),
                  switch=[sw.seconds(job.model, ROLLOUT), sw.seconds(job.model, TRAIN)], **pipe)
        self._dispatch(gid, now)

    def _progress(self, rec: JobRecord, now: float) -> tuple[int, float]:
        """Iterations ``rec`` has left and the seconds it may still spend within its SLO
        over its whole run (the simulator's ``progress_of``)."""
        target = rec.job.iterations if rec.job.iterations is not None else OPEN_ENDED
        elapsed = now - (rec.placed_at if rec.placed_at is not None else rec.submitted_at)
        return target - rec.iterations_done, rec.job.slo * rec.job.t_solo * target - elapsed

    def migration_seconds(self, job: Job) -> float:
        """The pause a move of ``job`` is planned with: the largest measured for its model
        size, else ``migration_s``."""
        return self.move_s.get(str(model_size_column(job.model)), self.migration_s)

    def _move_decision(self, rec: JobRecord, now: float):
        """``Planner.repack`` for ``rec`` at its iteration boundary, or None (as the simulator's ``try_move``)."""
        if not rec.movable or rec.move is not None or rec.asynchronous:
            return None
        left, spare = self._progress(rec, now)
        spare -= self.migration_seconds(rec.job)
        if spare <= 0:
            return None
        return self._repack(self.plan, rec.job_id, left, spare, lambda k: self._progress(self.jobs[k], now))

    def _start_move(self, rec: JobRecord, decision, now: float) -> None:
        """The job leaves its group (its nodes there may go back) and is pinned to its new
        place, where it is admitted once it acknowledges (``moved``)."""
        job_id, old = rec.job_id, rec.group_id
        self.executors[old].remove(job_id)
        self._log(now, "remove", old, job_id, "", (), reason="moving")
        released = self.plan.release(job_id)
        self._withhold_drained()
        self._dirty_groups.add(old)
        if released.group_closed:
            del self.executors[old]
        else:
            self._dispatch(old, now)
        gid = self.plan.apply(rec.job, decision.placement)
        rec.group_id = gid
        rec.rollout_nodes = tuple(decision.placement.rollout_nodes)
        rec.train_nodes = tuple(decision.placement.train_nodes)
        rec.move = {"from_group": old, "to_group": gid, "rollout_nodes": list(rec.rollout_nodes),
                    "train_nodes": list(rec.train_nodes), "decided_at": now, "seq": self._seq + 1}
        rec.outcome = "repacked"
        self._dirty_groups.add(gid)
        self._log(now, "move", gid, job_id, "", rec.rollout_nodes + rec.train_nodes, from_group=old,
                  rollout_nodes=list(rec.rollout_nodes), train_nodes=list(rec.train_nodes))
        self._retry_waiting(now)

    # --- regrouping (the simulator's plan_regroup / stop_for_regroup, live) ---------------
    def _pending_regroup(self, job_id: str) -> str | None:
        """The regrouping that waits for ``job_id`` to stop, if any."""
        for rid, entry in self.regroups.items():
            if job_id in entry["waiting"]:
                return rid
        return None

    def _movable(self, job_id: str, now: float) -> tuple[int, float] | None:
        rec = self.jobs[job_id]
        if (not rec.movable or rec.move is not None or rec.asynchronous
                or self._pending_regroup(job_id) is not None):
            return None
        left, spare = self._progress(rec, now)
        return None if left < 2 else (left, spare)

    def _pause(self, k: str) -> float:
        """The seconds a move stops job ``k``: until its current iteration ends, then the migration."""
        return self.plan.analysis(self.plan.job_group[k]).iteration_s[k] + self.migration_seconds(self.jobs[k].job)

    def _plan_regroup(self, gid: str, now: float) -> None:
        """After a departure from ``gid``: ask the policy for a regrouping and mark its jobs
        (with ``decide_apart``: record the ask, ``regroup_ticket``).

        A regrouping only lowers the cost of jobs that already run, so a policy that fails
        to decide one (a bug) is logged (``regroup_failed``, ERROR, with the traceback) and
        no regrouping is made: the change that asked for it goes on. Raised instead, it
        failed that change, and a pending gathering (``gather``, which every change runs
        first) failed every change after it, for good."""
        if self.decide_apart:
            self._ask(gid, self.plan.groups[gid].members[0].job.job_id, now)
            return
        try:
            plan = self._regroup(self.plan, gid, lambda k: self._movable(k, now), self._pause)
        except Exception:  # noqa: BLE001 - see the docstring; the traceback goes to the log
            log.exception("regroup_failed", extra={"group_id": gid,
                                                   "jobs": [m.job.job_id for m in self.plan.groups[gid].members]})
            return
        if plan is None or (self.drained and not fits(self.plan, plan.view, plan.replaced, plan.groups,
                                                      self.drained)):
            return  # (a drained node of the groups it empties will not come back for it)
        self._mark_regroup(plan, now)

    def regroup_ticket(self, now: float) -> RegroupTicket | None:
        """With ``decide_apart``: the regroupings asked for so far and what deciding them
        reads, as of ``now`` (``rollmux.runtime.regroup_ticket``, step 1); None when none
        is asked for. One ticket at a time: until ``apply_regroups`` takes its asks off,
        a group asked for again is asked for again after them."""
        if not self.regroups_asked:
            return None
        jobs = list(self.plan.job_group)
        self._in_ticket = len(self._gathers)
        return RegroupTicket.take(self, self._gathers, self.plan, {k: self._movable(k, now) for k in jobs},
                                  {k: self.migration_seconds(self.jobs[k].job) for k in jobs}, self.drained,
                                  self._regroup, (self.fleet, self.profiles, self.cluster))

    def decide_locked(self) -> None:
        """From now on decide each regrouping in the change that asks for it (the asks
        recorded so far are decided by the next change's ``gather``)."""
        self.decide_apart = False
        self._in_ticket = 0

    def apply_regroups(self, ticket: RegroupTicket, decided: list[Decided], now: float) -> int:
        """Carry out the regroupings ``ticket.decide`` returned whose check still holds
        (``regroup_ticket.still_holds``) as ``_plan_regroup`` would have; take the ticket's
        asks off, and ask again, while ``MAX_TRIES`` allows, for each stale one whose group
        is still there. A ticket of another plane (the service reloaded its state since)
        changes nothing. Returns how many were carried out."""
        if ticket.owner is not self:
            return 0
        del self._gathers[:len(ticket.asks)]
        self._in_ticket = 0
        tries = {a[0]: (a[3] if len(a) > 3 else 0) + 1 for a in ticket.asks}
        done = 0
        for d in decided:
            if still_holds(self.plan, d, lambda k: self._movable(k, now), self._pause, self.drained):
                self._mark_regroup(d.plan, now)
                done += 1
                continue
            group = self.plan.groups.get(d.group_id)
            again = group is not None and tries[d.group_id] < MAX_TRIES
            log.info("regroup_stale", extra={"group_id": d.group_id, "replaced": list(d.plan.replaced),
                                             "tries": tries[d.group_id], "asked_again": again})
            if again:
                self._ask(d.group_id, group.members[0].job.job_id, now, tries[d.group_id])
        self._run_line_due(now)
        return done

    def _ask(self, gid: str, job_id: str, now: float, tries: int = 0) -> None:
        """Ask for a regrouping of ``gid`` (holding ``job_id``) later: ``gather``, or with
        ``decide_apart`` ``regroup_ticket``; once per group while it waits."""
        if not any(a[0] == gid for a in self._gathers[self._in_ticket:]):
            self._gathers.append([gid, job_id, now, tries] if tries else [gid, job_id, now])
            self._asks_made += 1

    def _mark_regroup(self, plan, now: float) -> None:
        """Mark the jobs of a regrouping decided now (``_plan_regroup``, ``apply_regroups``):
        each stops at its next iteration boundary (``_stop_for_regroup``)."""
        held = Reservation.start(self.plan, plan.view, plan.replaced, plan.groups)
        hold = None
        if held is not None:
            hold = f"h{self._next_regroup}"
            self.holds[hold] = held
        for group in plan.groups:
            rid = f"r{self._next_regroup}"
            self._next_regroup += 1
            members = [m.job.job_id for m in group.members]
            self.regroups[rid] = {"group": _group_to_dict(group), "waiting": members, "stopped": [],
                                  "decided_at": now, "view": plan.view}
            if hold is not None:
                self.regroups[rid]["hold"] = hold
                self.regroups[rid]["need"] = group_need(self.plan, plan.view, group)
            self._log(now, "regroup", "", ",".join(members), "", (), regroup=rid, replaced=list(plan.replaced),
                      cost_before=plan.cost_before, cost_after=plan.cost_after, waste_before=plan.waste_before,
                      waste_after=plan.waste_after)

    def _stop_for_regroup(self, rec: JobRecord, now: float) -> None:
        """At its iteration boundary a regrouped job leaves its group; once every member of
        its new group has, that group opens on fresh nodes and each member gets its move."""
        rid = self._pending_regroup(rec.job_id)
        entry = self.regroups[rid]
        gid = rec.group_id
        self.executors[gid].remove(rec.job_id)
        self._log(now, "remove", gid, rec.job_id, "", (), reason="regrouping")
        released = self.plan.release(rec.job_id)
        held = self.holds.get(entry.get("hold", ""))
        if held is not None:
            held.take_released(self.plan, [n for n in released.released_nodes if n not in self.drained])
        self._withhold_drained()
        if released.group_closed:
            del self.executors[gid]
        else:
            self._dispatch(gid, now)
        self._dirty_groups.add(gid)
        rec.group_id, rec.rollout_nodes, rec.train_nodes = None, (), ()
        rec.move = {"regroup": rid, "from_group": gid, "stopped_at": now}
        entry["waiting"].remove(rec.job_id)
        entry["stopped"].append(rec.job_id)
        self._open_regrouped(rid, now)
        self._retry_waiting(now)  # (bounded pools: nodes that no hold wanted)

    def _open_regrouped(self, rid: str, now: float) -> None:
        """Open the regrouped group once nobody is left to stop; every member gets its directive."""
        entry = self.regroups[rid]
        if entry["waiting"] or "opened" in entry:
            return
        held = self.holds.get(entry.get("hold", ""))
        if not entry["stopped"]:
            del self.regroups[rid]
            self._group_done(entry)
            return
        if held is not None:
            if not held.covers(self.plan, entry["need"]):
                if not any(gid in self.plan.groups for gid in held.replaced):
                    self._undo_regroup(rid, now)  # no emptied group is left to give it a node
                # else short of bounded nodes: retried ahead of the waiting line
                return
            held.hand_over(self.plan, entry["need"])
        group = _group_from_dict(entry["group"], self.jobs)
        # (a regrouping saved before fleets regrouped has no view)
        gid = open_regrouped(self.plan, group, entry.get("view", ""), {m.job.job_id: m.job for m in group.members})
        self.executors[gid] = GroupExecutor(gpus_per_node=self.cluster.gpus_per_node)
        self._dirty_groups.add(gid)
        for m in self.plan.groups[gid].members:
            rec = self.jobs[m.job.job_id]
            rec.group_id, rec.rollout_nodes, rec.train_nodes = gid, m.rollout_nodes, m.train_nodes
            rec.outcome = "regrouped"
            rec.move = {"from_group": rec.move["from_group"], "to_group": gid, "rollout_nodes": list(m.rollout_nodes),
                        "train_nodes": list(m.train_nodes), "decided_at": now, "seq": self._seq + 1, "regroup": rid}
            self._dirty_jobs.add(rec.job_id)
            self._log(now, "move", gid, rec.job_id, "", m.rollout_nodes + m.train_nodes, from_group=rec.move["from_group"],
                      rollout_nodes=list(m.rollout_nodes), train_nodes=list(m.train_nodes), regroup=rid)
        entry["opened"] = gid
        self._group_done(entry)

    def _undo_regroup(self, rid: str, now: float) -> None:
        """A regrouped group whose members have all stopped, short of bounded nodes with no
        emptied group left to give it one (a member left, so the nodes it would have given
        back went elsewhere; or a node the regrouping held was drained): waiting would keep
        its members out of any group until some unrelated job departed, for ever beside an
        open-ended one. Its share of the reservation is done (``_group_done``), and each
        member is placed afresh, or waits first in line, as after a failed move."""
        entry = self.regroups.pop(rid)
        self._group_done(entry)
        reason = "its regrouped group could not open: short of nodes"
        for job_id in reversed(entry["stopped"]):  # (each goes first in line: they keep their order)
            rec = self.jobs[job_id]
            self._log(now, "move_aborted", "", job_id, "", (), reason=reason, from_group=rec.move["from_group"])
            rec.last_move = {"seq": None, "outcome": "undone", "reason": reason}
            rec.move = None
            rec.state = WAITING
            self._dirty_jobs.add(job_id)
            decision = self._decide(rec.job)
            rec.outcome, rec.explanation = decision.outcome, _explain(decision)
            if decision.placement is None:
                rec.end_reason = f"{reason}; waiting: {decision.reason}"
                self.waiting.insert(0, job_id)
            else:
                self._place(rec, decision, now)

    def _group_done(self, entry: dict) -> None:
        """One new group of a regrouping opened (or will never open): once none is left,
        its hold gives back every node it still holds."""
        key = entry.get("hold", "")
        held = self.holds.get(key)
        if held is not None and held.group_done(self.plan):
            del self.holds[key]
            self._withhold_drained()

    def _open_blocked(self, now: float) -> None:
        """Open the regrouped groups whose members have all stopped and that were short of
        bounded nodes (``_open_regrouped``), in the order they were decided."""
        for rid in [r for r, e in self.regroups.items() if not e["waiting"] and e["stopped"] and "opened" not in e]:
            self._open_regrouped(rid, now)

    def _admit_regrouped(self, rid: str, now: float) -> None:
        """Admit the members of an opened regrouped group together, in the solver's order,
        once every one of them has acknowledged its move. (A job placed into the group
        meanwhile, by an arrival, is admitted on its own: it is not waited for.)"""
        entry = self.regroups.get(rid)
        if entry is None or "opened" not in entry:
            return
        gid = entry["opened"]
        moving = {m["job_id"] for m in entry["group"]["members"]}
        members = [self.jobs[m.job.job_id] for m in self.plan.groups[gid].members
                   if m.job.job_id in moving] if gid in self.plan.groups else []
        if any(not r.move or not r.move.get("acked") for r in members):
            return
        del self.regroups[rid]
        for rec in members:
            rec.move = None
            rec.moves += 1
            self._dirty_jobs.add(rec.job_id)
        for rec in members:
            self._admit(rec, now)

    def _leave_regroup(self, rid: str, job_id: str, now: float) -> None:
        """``job_id`` leaves regrouping ``rid`` (departed, or its move failed): the others go on."""
        entry = self.regroups.get(rid)
        if entry is None:
            return
        for key in ("waiting", "stopped"):
            if job_id in entry[key]:
                entry[key].remove(job_id)
        entry["group"]["members"] = [m for m in entry["group"]["members"] if m["job_id"] != job_id]
        if "opened" in entry:
            self._admit_regrouped(rid, now)
        else:
            self._open_regrouped(rid, now)

    def _abort_move(self, rec: JobRecord, now: float, reason: str) -> None:
        """Undo a move: unpin the job from its target and place it afresh, or queue it."""
        gid = rec.group_id
        self._log(now, "move_aborted", gid, rec.job_id, "", (), reason=reason, from_group=rec.move["from_group"])
        rid = rec.move.get("regroup")
        rec.last_move = {"seq": rec.move.get("seq"), "outcome": "undone", "reason": reason}
        released = self.plan.release(rec.job_id)
        self._withhold_drained()
        self._dirty_groups.add(gid)
        if released.group_closed:
            self.executors.pop(gid, None)
        rec.move = None
        rec.state, rec.group_id, rec.rollout_nodes, rec.train_nodes = WAITING, None, (), ()
        decision = self._decide(rec.job)
        rec.outcome, rec.explanation = decision.outcome, _explain(decision)
        if decision.placement is None:
            rec.end_reason = f"move failed ({reason}); waiting: {decision.reason}"
            self.waiting.append(rec.job_id)
        else:
            self._place(rec, decision, now)
        if rid is not None:
            self._leave_regroup(rid, rec.job_id, now)
        self._retry_waiting(now)

    def _dispatch(self, gid: str, now: float) -> list[Grant]:
        self._dirty_groups.add(gid)
        grants = self.executors[gid].dispatch(now)
        for g in grants:
            self._seq += 1
            self.grants_total += 1
            rec = self.jobs[g.job_id]
            record = GrantRecord(self._seq, g.pool, g.nodes, now, g.switch_s, g.share)
            if rec.grant is not None and rec.asynchronous:  # its other pool's phase runs: it holds both
                rec.other_grant = record
            else:
                rec.grant = record
            if g.pool == ROLLOUT:
                rec.rollouts_started += 1
            if rec.asynchronous:
                rec.next_phase = self._async_due(rec)
            self._dirty_jobs.add(g.job_id)
            wait = now - rec.ready_at if rec.ready_at is not None else 0.0
            detail = {"switch_s": g.switch_s, "wait_s": wait}
            if g.share < 1.0:
                detail["share"] = g.share
            self._events.append({"seq": self._seq, "at": now, "kind": "grant", "group_id": gid,
                                 "job_id": g.job_id, "pool": g.pool, "nodes": list(g.nodes), "detail": detail})
        return grants

    def _end_grant(self, rec: JobRecord, now: float, pool: str | None = None) -> None:
        """End the job's grant in ``pool`` (None: its grant, or every grant it holds)."""
        for g in rec.grants:
            if pool is not None and g.pool != pool:
                continue
            self.busy_s[_busy_pool(rec, g)] += (now - g.granted_at) * len(g.nodes) * g.share
            if g is rec.grant:
                rec.grant, rec.other_grant = rec.other_grant, None
            else:
                rec.other_grant = None

    def _depart(self, rec: JobRecord, state: str, now: float, reason: str) -> None:
        self._advance(now)
        job_id = rec.job_id
        self._dirty_jobs.add(job_id)
        rid = self._pending_regroup(job_id) or (rec.move or {}).get("regroup")
        if rec.state == WAITING:
            self.waiting.remove(job_id)
        elif rec.group_id is None:  # stopped for a regrouping: in no group until it opens
            rec.move = None
        else:
            gid = rec.group_id
            if rec.grants:
                self._end_grant(rec, now)
            if rec.move is None:  # a moving job is pinned to its target but not yet admitted there
                self.executors[gid].remove(job_id)
            rec.move = None
            self._log(now, "remove", gid, job_id, "", (), reason=reason)
            released = self.plan.release(job_id)
            self._withhold_drained()
            self._dirty_groups.add(gid)
            if released.group_closed:
                self.executors.pop(gid, None)
            else:
                self._dispatch(gid, now)
                if self._regroup is not None and rid is None:
                    self._plan_regroup(gid, now)
                if self._repack is not None:
                    self.offer.update(m.job.job_id for m in self.plan.groups[gid].members)
        self.offer.discard(job_id)
        if rid is not None:
            self._leave_regroup(rid, job_id, now)
        rec.state = state
        rec.ended_at = now
        rec.end_reason = reason
        self._ended.append(rec)
        self._departed.append(rec)
        self._evict()
        self._retry_waiting(now)

    def _evict(self) -> None:
        """Drop the oldest departed records from ``jobs`` beyond ``keep_ended`` (a record
        already replaced by a new run of its id was counted then)."""
        while self.keep_ended is not None and len(self._departed) > self.keep_ended:
            old = self._departed.popleft()
            if self.jobs.get(old.job_id) is old:
                del self.jobs[old.job_id]
                self._count_out(old)

    def _count_out(self, rec: JobRecord) -> None:
        """``rec``, a departed run, leaves ``jobs``: ``counts`` keeps counting it."""
        self.evicted[rec.state] = self.evicted.get(rec.state, 0) + 1

    def _retry_waiting(self, now: float, covered: bool = False) -> list[str]:
        """Place the waiting line's jobs in order until its head must still wait; each job
        placed leaves it. Returns those placed. Regrouped groups short of bounded nodes go
        first (``_open_blocked``). With ``decide_apart`` the line waits for the regroupings
        asked for, as it waits for them under the lock: while any is asked for, the retry
        (or the rest of it: the backfill after the head's refusal, the jobs after one whose
        placement asked for one) is left to ``apply_regroups`` (``_line_due``), which runs
        it once the asks made until then are decided (``covered``: they are)."""
        made = self._asks_made
        if self.decide_apart and self._gathers and not covered:
            self._defer_line("retry")
            return []
        if self.holds:
            self._open_blocked(now)
        placed = []
        for job_id in list(self.waiting):
            rec = self.jobs[job_id]
            decision = self._decide(rec.job)
            if decision.placement is None:
                if decision.outcome == "rejected":  # the inventory shrank under it: it blocks nobody
                    rec.end_reason = f"never fits the inventory now: {decision.reason}"
                    self._dirty_jobs.add(job_id)
                    continue
                for gid, job, at in self._on_wait(now):
                    self._plan_regroup(gid, at)
                if self.decide_apart and self._asks_made > made:
                    self._defer_line("backfill", job_id)
                    break
                placed += self._backfill(job_id, now)
                break  # the head waits; only a job that packs passes it (the simulator's line)
            self.waiting.remove(job_id)
            rec.outcome = decision.outcome
            rec.explanation = _explain(decision)
            self._place(rec, decision, now)
            placed.append(job_id)
            if self.decide_apart and self._asks_made > made:
                self._defer_line("retry")
                break
        return placed

    def _defer_line(self, kind: str, head: str | None = None) -> None:
        """Leave the line's retry (or the backfill behind ``head``) for after the asks made
        so far; a retry already left keeps its place, so the line never waits for more
        than the asks of the change that deferred it first (``_run_line_due``)."""
        if self._line_due is None:
            self._line_due = {"kind": kind, "head": head, "after": self._asks_made}
        elif kind == "retry":
            self._line_due.update(kind="retry", head=None)

    def _asks_decided(self) -> int:
        """How many of the asks made so far are decided (``_gathers`` holds the others)."""
        return self._asks_made - len(self._gathers)

    def _run_line_due(self, now: float) -> None:
        """What ``_retry_waiting`` left for after the regroupings, once the asks it waits
        for are decided."""
        due = self._line_due
        if due is None or self._asks_decided() < due["after"]:
            return
        self._line_due = None
        if due["kind"] == "retry":
            self._retry_waiting(now, covered=True)
        elif due["head"] in self.waiting:
            self._backfill(due["head"], now)

    def _passes(self, decision) -> bool:
        """Whether a job behind the line's head may be placed now: with ``backfill``, when
        it packs into a running group on that group's own nodes (no free node taken)."""
        return self.backfill and decision.placement is not None and decision.placement.packs

    def _passed_text(self) -> str:
        return (f"passed the waiting line (first {self.waiting[0]}, {len(self.waiting)} waiting): it packs into a "
                f"running group and takes no free node")

    def _backfill(self, head: str, now: float) -> list[str]:
        """The jobs behind ``head`` (refused) that pass the line, in order (``_passes``)."""
        if not self.backfill:
            return []
        placed = []
        for job_id in self.waiting[self.waiting.index(head) + 1:]:
            rec = self.jobs[job_id]
            decision = self._decide(rec.job)
            if not self._passes(decision):
                continue
            rec.outcome, rec.explanation = decision.outcome, [self._passed_text(), *_explain(decision)]
            self.waiting.remove(job_id)
            self._place(rec, decision, now)
            placed.append(job_id)
        return placed

    def _on_wait(self, now: float) -> list[list]:
        """The regroupings to ask for when the waiting line's head is refused, as ``gather``
        entries: each group of one job (``improve.lone_groups``) under a policy with
        ``regroup_on_wait``, none otherwise."""
        if not self._regroup_on_wait:
            return []
        return [[gid, self.plan.groups[gid].members[0].job.job_id, now] for gid in lone_groups(self.plan)]

    def _decide(self, job: Job, remaining=None):
        """The planner's decision for ``job`` with every candidate explained; a policy with
        the lifetime objective also reads the iterations each job has left."""
        if getattr(self.policy, "uses_remaining", False):
            return self.planner.decide(self.plan, job, explain=True, remaining=remaining or self._remaining)
        return self.planner.decide(self.plan, job, explain=True)

    def _remaining(self, job_id: str) -> int | None:
        """Iterations ``job_id`` has left (None: it runs without a set count)."""
        rec = self.jobs[job_id]
        return None if rec.job.iterations is None else rec.job.iterations - rec.iterations_done

    def _withhold_drained(self) -> None:
        for node in self.drained:
            pool = self.plan.pool_of(node)
            if pool is not None:
                self.plan.withhold(pool, node)

    def _jobs_on(self, node: str, pool: str) -> list[str]:
        """Jobs pinned to ``node`` of ``pool`` (node ids are unique across pools: on a fleet a
        pool's node may serve either side of a group)."""
        return [m.job.job_id for g in self.plan.groups.values() for m in g.members
                if node in m.rollout_nodes or node in m.train_nodes]

    def _pool_of(self, node: str) -> str:
        pool = self.plan.pool_of(node)
        if pool is None:
            raise UnknownNode("node", f"{node!r} is not a node of this cluster")
        return pool

    def _advance(self, now: float) -> None:
        """Integrate provisioned node-seconds per pool up to ``now``."""
        self.provisioned_s = self._provisioned_at(now)
        if self._clock is None or now > self._clock:
            self._clock = now

    def _provisioned_at(self, now: float) -> dict[str, float]:
        """``provisioned_s`` with the nodes in use since the last change integrated to ``now``."""
        provisioned = dict(self.provisioned_s)
        if self._clock is not None and now > self._clock:
            for pool in POOLS:
                provisioned[pool] += (now - self._clock) * self.plan.gpus_in_use(pool) / self.cluster.gpus_per_node
        return provisioned

    def _log(self, now: float, kind: str, gid: str, job_id: str, pool: str, nodes: tuple[str, ...],
             **detail) -> None:
        self._seq += 1
        self._events.append({"seq": self._seq, "at": now, "kind": kind, "group_id": gid, "job_id": job_id,
                             "pool": pool, "nodes": list(nodes), "detail": detail})

    def _record(self, job_id: str) -> JobRecord:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob("job_id", f"{job_id!r} is not registered")
        return rec

    def _live(self, job_id: str) -> JobRecord:
        rec = self._record(job_id)
        if not rec.live:
            raise departed(rec)
        return rec

    @staticmethod
    def _check_phase(phase: str) -> None:
        if phase not in POOLS:
            raise ControlError("phase", f"{phase!r} is not one of {POOLS}")

    def _never_fits_field(self, job: Job) -> str:
        for role, name in ((ROLLOUT, "rollout_gpus"), (TRAIN, "train_gpus")):
            total = self.role_nodes(role)
            if total is not None and job.nodes(role, self.cluster.gpus_per_node) > total:
                return name
        return "slo" if self.fleet is not None else "train_gpus"  # on a fleet: no pair of types meets its SLO


def departed(rec: JobRecord) -> JobEnded:
    """The refusal (410, naming how it ended) of a call that would act on ``rec``, a departed run."""
    return JobEnded("job_id", f"{rec.job_id!r} has departed ({rec.state}: {rec.end_reason})", rec.state)


def _explain(decision) -> list[str]:
    """The decision's candidates as text: the chosen one first, at most ``EXPLAIN_LINES``.
    On a fleet, each view's verdict first, then the chosen view's candidates."""
    if isinstance(decision, FleetDecision):
        views = [f"view {v.view}: " + ("" if v.effective_cost is None else f"+${v.effective_cost:.2f}/h (effective) ")
                 + ("chosen" if v.view == decision.view else v.reason) for v in decision.verdicts]
        return views + (_explain(decision.decision) if decision.decision is not None else [])
    cands = sorted(decision.candidates, key=lambda c: c.verdict != "chosen")
    lines = [c.describe() for c in cands[:EXPLAIN_LINES]]
    if len(cands) > EXPLAIN_LINES:
        lines.append(f"... and {len(cands) - EXPLAIN_LINES} more candidates")
    return lines


def _group_to_dict(group: Group) -> dict:
    return {"rollout_nodes": list(group.rollout_nodes), "train_nodes": list(group.train_nodes),
            "colocated": group.colocated,
            "members": [{"job_id": m.job.job_id, "rollout_nodes": list(m.rollout_nodes),
                         "train_nodes": list(m.train_nodes), "hosted": m.hosted} for m in group.members]}


def _group_from_dict(d: dict, jobs: dict[str, JobRecord]) -> Group:
    """A solver group without the members that left it (nodes only they used go too)."""
    members = [Member(jobs[m["job_id"]].job, tuple(m["rollout_nodes"]), tuple(m["train_nodes"]),
                      m.get("hosted", False)) for m in d["members"]]
    used = {n for m in members for n in (*m.rollout_nodes, *m.train_nodes)}
    return Group("solver", [n for n in d["rollout_nodes"] if n in used], [n for n in d["train_nodes"] if n in used],
                 members, d.get("colocated", False))  # (a snapshot from before the full space has no flag)


def _group_ord(gid: str) -> int:
    return int(gid[1:]) if gid[1:].isdigit() else 0


def _busy_pool(rec: JobRecord, g: GrantRecord) -> str:
    """The side whose node-seconds a grant's phase spends: a rollout on nodes the job
    trains on (co-located, or hosted in a group) is training-side time, as the simulator
    books it; any other phase its own pool's."""
    if g.pool == ROLLOUT and g.nodes and set(g.nodes) <= set(rec.train_nodes):
        return TRAIN
    return g.pool


def _pool_nodes(spec: PoolSpec, pool: str) -> dict[str, float]:
    """Node id -> host memory of a bounded pool, in inventory order."""
    if spec.node_list:
        return {n.node_id: n.host_mem_gb for n in spec.node_list}
    prefix = "R" if pool == ROLLOUT else "T"
    return {f"{prefix}{i}": spec.host_mem_gb for i in range(spec.nodes)}


def _record_to_dict(rec: JobRecord) -> dict:
    d = asdict(rec)
    d["rollout_nodes"] = list(rec.rollout_nodes)
    d["train_nodes"] = list(rec.train_nodes)
    if d["grant"] is not None:
        d["grant"]["nodes"] = list(rec.grant.nodes)
    if d["other_grant"] is not None:
        d["other_grant"]["nodes"] = list(rec.other_grant.nodes)
    return d


def record_from_dict(d: dict) -> JobRecord:
    """A job record from its persisted form (``take_changes().ended``, a snapshot's job)."""
    d = dict(d)
    d["job"] = Job(**d["job"])
    g = d["grant"]
    d["grant"] = GrantRecord(g["seq"], g["pool"], tuple(g["nodes"]), g["granted_at"], g["switch_s"],
                             g.get("share", 1.0)) if g else None
    o = d.get("other_grant")
    d["other_grant"] = GrantRecord(o["seq"], o["pool"], tuple(o["nodes"]), o["granted_at"], o["switch_s"],
                                   o.get("share", 1.0)) if o else None
    d["rollout_nodes"] = tuple(d["rollout_nodes"])
    d["train_nodes"] = tuple(d["train_nodes"])
    return JobRecord(**d)


def snapshot_from_v2(snap: dict, ended: list[dict]) -> tuple[dict, list[dict]]:
    """A version-2 snapshot and departed records in today's shape (tokens hashed, leases dropped)."""
    def record(d: dict, ord_: int) -> dict:
        d = dict(d)
        d["job"] = asdict(Job(**d["job"]))  # every field of today's model, defaults for the new ones
        if d["grant"] is not None:
            d["grant"] = {**d["grant"], "share": 1.0}
        d["token_hash"] = hash_token(d.pop("token"))
        d.pop("lease_until", None)
        d.update(ord=ord_, tenant="", last_released_phase=None, ready_at=None, movable=True, move=None, moves=0,
                 placed_at=d["submitted_at"] if d["group_id"] is not None else None)
        if d["last_released_seq"] is not None:
            d["last_released_phase"] = TRAIN if d["next_phase"] == ROLLOUT else ROLLOUT
        return _record_to_dict(record_from_dict(d))  # every field of today's record, defaults for the new ones

    jobs = {d["job"]["job_id"]: record(d, i + 1) for i, d in enumerate(snap["jobs"])}
    groups = {g["group_id"]: {"ord": _group_ord(g["group_id"]), "rollout_nodes": g["rollout_nodes"],
                              "train_nodes": g["train_nodes"], "colocated": g["colocated"], "members": g["members"],
                              "executor": snap["executors"][g["group_id"]]} for g in snap["plan"]["groups"]}
    inventory = {k: snap["plan"][k] for k in ("free", "minted", "next_group")}
    glob = {"version": SNAPSHOT_VERSION, "waiting": snap["waiting"], "drained": snap["drained"],
            "grants_total": snap["grants_total"], "busy_s": snap["busy_s"], "provisioned_s": snap["provisioned_s"],
            "clock": snap["clock"], "seq": snap["seq"], "ord": len(jobs), "inventory": inventory, "offer": [],
            "move_s": {}}
    return ({"cluster": snap["cluster"], "globals": glob, "jobs": jobs, "groups": groups},
            [record(d, 0) for d in ended])
