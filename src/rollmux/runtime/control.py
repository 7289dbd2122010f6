"""The live control plane's logic: jobs, per-group executors, leases, departures.

``ControlPlane`` is the body that drives the shared brain in real time. It owns one
``PlanState`` (placed by ``Planner``, exactly as the simulator does) and one
``GroupExecutor`` per group (the execution rule). It holds no clock and does no I/O:
every method takes ``now`` (seconds; the service passes wall-clock epoch seconds so
times survive a restart) and the caller persists ``snapshot()`` (live state), plus
``take_events()`` and ``take_ended()`` (appended once each), before acknowledging a change.

Contract
--------
* Submit: the planner decides. A placed job is pinned (``PlanState.apply``), admitted
  to its group's executor (ready for rollout at ``now``) and the group is dispatched.
  A job that must wait joins the back of the waiting line; a job that can never fit
  the inventory raises ``NeverFits`` and changes nothing.
* Grants: ``GroupExecutor.dispatch`` decides who runs. A grant is the job's until the
  job releases that phase (``release``), departs or loses its lease. The execution rule
  guarantees that no two grants of a group share a node.
* Phases alternate rollout, train, rollout, ... per job. Ending a train phase counts an
  iteration; a job with ``iterations`` set departs after its last one.
* Departures (completion, cancellation, lease expiry) remove the member from its
  executor, release its pins in the plan (nodes that nobody uses any more go back to
  the pool), dispatch the group again, then retry the waiting line in order.
* Every method validates before it mutates: an error means no state changed.
* Every executor step is recorded as an event (admit, finish, remove, grant) with the
  ``now`` it ran at, so a fresh ``GroupExecutor`` fed the same steps reproduces the
  same grants (tests do exactly that).
"""
from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field

from rollmux.cluster_file import cluster_from_dict, cluster_to_dict
from rollmux.errors import RollMuxError
from rollmux.execution import Grant, GroupExecutor
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Group, Job, Member
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import Planner

WAITING, PLACED, DONE, CANCELLED, EXPIRED = "waiting", "placed", "done", "cancelled", "expired"
LIVE_STATES = (WAITING, PLACED)
JOB_STATES = (WAITING, PLACED, DONE, CANCELLED, EXPIRED)
SNAPSHOT_VERSION = 2


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


class PhaseOrderError(ControlError):
    """A phase asked for or ended out of the rollout/train alternation, or without a grant."""

    status = 409


class JobEnded(ControlError):
    """The job has departed (done, cancelled or expired); ``state`` says which."""

    status = 410

    def __init__(self, field: str, reason: str, state: str) -> None:
        super().__init__(field, reason)
        self.state = state


class NeverFits(ControlError):
    status = 422


@dataclass(slots=True)
class GrantRecord:
    """A grant the job holds: event ``seq`` started ``pool`` on ``nodes`` at ``granted_at``."""

    seq: int
    pool: str
    nodes: tuple[str, ...]
    granted_at: float
    switch_s: float


@dataclass(slots=True)
class JobRecord:
    """Everything the control plane knows about one job."""

    job: Job
    token: str
    state: str
    submitted_at: float
    lease_until: float
    request_id: str | None = None
    outcome: str = ""
    explanation: list[str] = field(default_factory=list)
    group_id: str | None = None
    rollout_nodes: tuple[str, ...] = ()
    train_nodes: tuple[str, ...] = ()
    next_phase: str = ROLLOUT
    grant: GrantRecord | None = None
    last_released_seq: int | None = None
    iterations_done: int = 0
    progress: float = 0.0
    iter_mark: float | None = None
    iter_time_sum: float = 0.0
    ended_at: float | None = None
    end_reason: str = ""

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def measured_slowdown(self) -> float | None:
        """Mean measured iteration time over the solo iteration time of the spec."""
        if self.iterations_done == 0:
            return None
        return self.iter_time_sum / self.iterations_done / self.job.t_solo


class ControlPlane:
    """Jobs, plan, executors and leases of the live service (see the module docstring)."""

    def __init__(self, cluster: Cluster, lease_s: float = 30.0, planner: Planner | None = None) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s={lease_s!r}: expected seconds > 0")
        cluster.validate()
        self.cluster = cluster
        self.lease_s = lease_s
        self.planner = planner or Planner()
        self.plan = PlanState(cluster)
        self.executors: dict[str, GroupExecutor] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.waiting: list[str] = []
        self.drained: set[str] = set()
        self.grants_total = 0
        self.busy_s = {p: 0.0 for p in POOLS}
        self.provisioned_s = {p: 0.0 for p in POOLS}
        self._clock: float | None = None
        self._seq = 0
        self._events: list[dict] = []
        self._ended: list[str] = []

    # --- job calls ------------------------------------------------------------------
    def submit(self, job: Job, now: float, request_id: str | None = None) -> JobRecord:
        """Register ``job``; place it now or put it in the waiting line.

        A repeated submit with the same ``request_id`` returns the first answer (a client
        retrying after a lost reply); any other repeat of a job id is a ``DuplicateJob``.
        """
        known = self.jobs.get(job.job_id)
        if known is not None:
            if request_id is not None and known.request_id == request_id:
                return known
            raise DuplicateJob("job_id", f"{job.job_id!r} is already registered")
        job.validate(self.cluster)
        decision = self.planner.decide(self.plan, job, explain=True)
        if decision.outcome == "rejected":
            raise NeverFits(self._never_fits_field(job), decision.reason)
        self._advance(now)
        rec = JobRecord(job, secrets.token_urlsafe(24), WAITING, now, now + self.lease_s, request_id,
                        decision.outcome, [c.describe() for c in decision.candidates])
        self.jobs[job.job_id] = rec
        if decision.placement is None:
            rec.end_reason = decision.reason
            self.waiting.append(job.job_id)
        else:
            self._place(rec, decision.placement, now)
        return rec

    def acquire(self, job_id: str, phase: str, now: float) -> GrantRecord | None:
        """The job's grant for ``phase`` if it holds one, else None (not yet its turn)."""
        rec = self._live(job_id)
        self._check_phase(phase)
        if phase != rec.next_phase:
            raise PhaseOrderError("phase", f"{phase!r} out of order: job {job_id!r} is due for {rec.next_phase!r}")
        rec.lease_until = now + self.lease_s
        if rec.grant is not None and rec.grant.pool == phase:
            return rec.grant
        return None

    def release(self, job_id: str, phase: str, grant_seq: int, duration_s: float, now: float) -> JobRecord:
        """End the granted ``phase``; a repeat of the last release is answered, not re-applied."""
        rec = self.jobs.get(job_id)
        if rec is not None and rec.last_released_seq == grant_seq and grant_seq is not None:
            return rec
        rec = self._live(job_id)
        self._check_phase(phase)
        if not (duration_s >= 0):
            raise ControlError("duration_s", f"{duration_s!r} is not a duration >= 0 seconds")
        if rec.grant is None:
            raise PhaseOrderError("phase", f"job {job_id!r} holds no grant to release")
        if rec.grant.pool != phase:
            raise PhaseOrderError("phase", f"{phase!r} does not match the held grant ({rec.grant.pool!r})")
        if rec.grant.seq != grant_seq:
            raise PhaseOrderError("grant_seq", f"{grant_seq} is not the held grant ({rec.grant.seq})")
        self._advance(now)
        rec.lease_until = now + self.lease_s
        last = phase == TRAIN and rec.job.iterations is not None and rec.iterations_done + 1 >= rec.job.iterations
        self._end_grant(rec, now)
        self.executors[rec.group_id].finish(job_id, now, requeue=not last)
        self._log(now, "finish", rec.group_id, job_id, phase, (), requeue=not last)
        rec.last_released_seq = grant_seq
        rec.next_phase = TRAIN if phase == ROLLOUT else ROLLOUT
        if phase == TRAIN:
            rec.iterations_done += 1
            rec.iter_time_sum += now - (rec.iter_mark if rec.iter_mark is not None else rec.submitted_at)
            rec.iter_mark = now
        if last:
            self._depart(rec, DONE, now, "completed its iterations")
        else:
            self._dispatch(rec.group_id, now)
        return rec

    def heartbeat(self, job_id: str, now: float, progress: float | None = None) -> JobRecord:
        """Extend the job's lease; optionally record its progress fraction in [0, 1]."""
        rec = self._live(job_id)
        if progress is not None:
            self._check_progress(progress)
            rec.progress = progress
        rec.lease_until = now + self.lease_s
        return rec

    def complete(self, job_id: str, now: float) -> JobRecord:
        """The job is finished: it departs and its nodes go back. Idempotent once done."""
        rec = self._record(job_id)
        if rec.state == DONE:
            return rec
        self._live(job_id)
        self._depart(rec, DONE, now, "completed by the job")
        return rec

    def cancel(self, job_id: str, now: float, reason: str = "cancelled") -> JobRecord:
        """Cancel a live job (its own call or an admin's). Idempotent once cancelled."""
        rec = self._record(job_id)
        if rec.state == CANCELLED:
            return rec
        self._live(job_id)
        self._depart(rec, CANCELLED, now, reason)
        return rec

    def expire(self, now: float) -> list[str]:
        """Depart every live job whose lease ran out before ``now``; returns their ids."""
        gone = [r for r in self.jobs.values() if r.state in LIVE_STATES and r.lease_until < now]
        for rec in gone:
            self._depart(rec, EXPIRED, now, f"no heartbeat for {self.lease_s:g}s")
        return [r.job_id for r in gone]

    def renew_all(self, now: float) -> None:
        """Give every live job a fresh lease (after a restart, so clients can reconnect)."""
        for rec in self.jobs.values():
            if rec.state in LIVE_STATES:
                rec.lease_until = now + self.lease_s

    # --- admin calls ------------------------------------------------------------------
    def drain(self, node: str, now: float) -> list[str]:
        """Make ``node`` unschedulable: no new job is pinned to it; current pins stay
        until their jobs depart, then the node is withheld. Returns the jobs still on it."""
        pool = self.plan.pool_of(node)
        if pool is None:
            raise UnknownNode("node", f"{node!r} is not a node of this cluster")
        self._advance(now)
        self.drained.add(node)
        self._withhold_drained()
        return [m.job.job_id for g in self.plan.groups.values() for m in g.members if node in m.nodes(pool)]

    # --- reads --------------------------------------------------------------------------
    def record(self, job_id: str) -> JobRecord:
        return self._record(job_id)

    def status(self, now: float) -> dict:
        """Groups, pinning, node holders, queue order and measured slowdowns (plain data)."""
        groups = []
        for gid, group in self.plan.groups.items():
            ex = self.executors[gid]
            analysis = self.plan.analysis(gid)
            groups.append({
                "group_id": gid,
                "rollout_nodes": list(group.rollout_nodes),
                "train_nodes": list(group.train_nodes),
                "members": [{"job_id": m.job.job_id, "rollout_nodes": list(m.rollout_nodes),
                             "train_nodes": list(m.train_nodes)} for m in group.members],
                "holders": ex.busy_nodes(),
                "queues": {p: ex.queued(p) for p in POOLS},
                "planned_slowdown": analysis.slowdown,
                "cost_per_hour": group.cost_per_hour(self.cluster),
            })
        jobs = [{"job_id": r.job_id, "state": r.state, "group_id": r.group_id,
                 "iterations_done": r.iterations_done, "iterations": r.job.iterations,
                 "progress": r.progress, "slo": r.job.slo, "measured_slowdown": r.measured_slowdown(),
                 "grant": asdict(r.grant) if r.grant else None, "reason": r.end_reason}
                for r in self.jobs.values()]
        return {"now": now, "groups": groups, "waiting": list(self.waiting), "jobs": jobs,
                "drained": sorted(self.drained), "cost_per_hour": self.plan.cost_per_hour()}

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in JOB_STATES}
        for rec in self.jobs.values():
            out[rec.state] += 1
        return out

    def outstanding_grants(self) -> int:
        return sum(1 for r in self.jobs.values() if r.grant is not None)

    def take_events(self) -> list[dict]:
        """Events recorded since the last call, oldest first (the caller persists them)."""
        out, self._events = self._events, []
        return out

    def take_ended(self) -> list[dict]:
        """Records of jobs that departed since the last call (the caller persists them once;
        ``snapshot`` carries live jobs only, so it does not grow with the service's history)."""
        out = [_record_to_dict(self.jobs[j]) for j in self._ended]
        self._ended = []
        return out

    # --- persistence ------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The whole state as JSON-ready data; ``ControlPlane.restore`` inverts it."""
        plan = self.plan
        executors = {}
        for gid, ex in self.executors.items():
            queued = {}
            for pool in POOLS:
                for ready, _order, job_id in ex.queue_entries(pool):
                    queued[job_id] = [pool, ready]
            last = ex.last_jobs()
            members = []
            for job_id in ex.members():
                m = plan.groups[gid].member(job_id)
                sw = self.cluster.switch_cost
                members.append({"job_id": job_id, "order": ex.order_of(job_id),
                                "rollout_nodes": list(m.rollout_nodes), "train_nodes": list(m.train_nodes),
                                "switch": [sw.seconds(m.job.model, ROLLOUT), sw.seconds(m.job.model, TRAIN)],
                                "queued": queued.get(job_id), "running": ex.running(job_id),
                                "last_on": sorted(n for n, j in last.items() if j == job_id)})
            executors[gid] = members
        return {
            "version": SNAPSHOT_VERSION,
            "cluster": cluster_to_dict(self.cluster),
            "lease_s": self.lease_s,
            "plan": {"groups": [{"group_id": g.group_id, "rollout_nodes": g.rollout_nodes,
                                 "train_nodes": g.train_nodes, "colocated": g.colocated,
                                 "members": [m.job.job_id for m in g.members]} for g in plan.groups.values()],
                     **plan.inventory()},
            "executors": executors,
            "jobs": [_record_to_dict(r) for r in self.jobs.values() if r.state in LIVE_STATES],
            "waiting": list(self.waiting),
            "drained": sorted(self.drained),
            "grants_total": self.grants_total,
            "busy_s": dict(self.busy_s),
            "provisioned_s": dict(self.provisioned_s),
            "clock": self._clock,
            "seq": self._seq,
        }

    @classmethod
    def restore(cls, snap: dict, lease_s: float | None = None, planner: Planner | None = None,
                ended: list[dict] = ()) -> "ControlPlane":
        """Rebuild from ``snapshot()`` and every ``take_ended()`` record: same plan, same queues,
        same outstanding grants, and the departed jobs' final records."""
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version={snap.get('version')!r}: expected {SNAPSHOT_VERSION}")
        cp = cls(cluster_from_dict(snap["cluster"]), lease_s or snap["lease_s"], planner)
        for d in [*ended, *snap["jobs"]]:
            rec = _record_from_dict(d)
            cp.jobs[rec.job_id] = rec
        groups = []
        for g in snap["plan"]["groups"]:
            members = [Member(cp.jobs[j].job, cp.jobs[j].rollout_nodes, cp.jobs[j].train_nodes) for j in g["members"]]
            groups.append(Group(g["group_id"], list(g["rollout_nodes"]), list(g["train_nodes"]), members,
                                g["colocated"]))
        cp.plan.restore(groups, snap["plan"])
        for gid, members in snap["executors"].items():
            ex = GroupExecutor()
            for m in members:
                ex.restore(m["job_id"], m["order"], tuple(m["rollout_nodes"]), tuple(m["train_nodes"]),
                           m["switch"][0], m["switch"][1], tuple(m["queued"]) if m["queued"] else None,
                           m["running"], tuple(m["last_on"]))
            cp.executors[gid] = ex
        cp.waiting = list(snap["waiting"])
        cp.drained = set(snap["drained"])
        cp.grants_total = snap["grants_total"]
        cp.busy_s = dict(snap["busy_s"])
        cp.provisioned_s = dict(snap["provisioned_s"])
        cp._clock = snap["clock"]
        cp._seq = snap["seq"]
        return cp

    # --- internals --------------------------------------------------------------------
    def _place(self, rec: JobRecord, placement: Placement, now: float) -> None:
        job = rec.job
        gid = self.plan.apply(job, placement)
        rec.state = PLACED
        rec.group_id = gid
        rec.rollout_nodes = tuple(placement.rollout_nodes)
        rec.train_nodes = tuple(placement.train_nodes)
        rec.iter_mark = now
        rec.end_reason = ""
        ex = self.executors.setdefault(gid, GroupExecutor())
        sw = self.cluster.switch_cost
        ex.admit(job.job_id, rec.rollout_nodes, rec.train_nodes, now,
                 sw.seconds(job.model, ROLLOUT), sw.seconds(job.model, TRAIN))
        self._log(now, "admit", gid, job.job_id, "", rec.rollout_nodes + rec.train_nodes,
                  rollout_nodes=list(rec.rollout_nodes), train_nodes=list(rec.train_nodes),
                  switch=[sw.seconds(job.model, ROLLOUT), sw.seconds(job.model, TRAIN)])
        self._dispatch(gid, now)

    def _dispatch(self, gid: str, now: float) -> list[Grant]:
        grants = self.executors[gid].dispatch(now)
        for g in grants:
            self._seq += 1
            self.grants_total += 1
            rec = self.jobs[g.job_id]
            rec.grant = GrantRecord(self._seq, g.pool, g.nodes, now, g.switch_s)
            self._events.append({"seq": self._seq, "at": now, "kind": "grant", "group_id": gid,
                                 "job_id": g.job_id, "pool": g.pool, "nodes": list(g.nodes),
                                 "detail": {"switch_s": g.switch_s}})
        return grants

    def _end_grant(self, rec: JobRecord, now: float) -> None:
        g = rec.grant
        self.busy_s[g.pool] += (now - g.granted_at) * len(g.nodes)
        rec.grant = None

    def _depart(self, rec: JobRecord, state: str, now: float, reason: str) -> None:
        self._advance(now)
        job_id = rec.job_id
        if rec.state == WAITING:
            self.waiting.remove(job_id)
        else:
            gid = rec.group_id
            if rec.grant is not None:
                self._end_grant(rec, now)
            self.executors[gid].remove(job_id)
            self._log(now, "remove", gid, job_id, "", ())
            released = self.plan.release(job_id)
            self._withhold_drained()
            if released.group_closed:
                del self.executors[gid]
            else:
                self._dispatch(gid, now)
        rec.state = state
        rec.ended_at = now
        self._ended.append(job_id)
        rec.end_reason = reason
        self._retry_waiting(now)

    def _retry_waiting(self, now: float) -> None:
        """Try the waiting line in order; each job placed now leaves it."""
        for job_id in list(self.waiting):
            rec = self.jobs[job_id]
            decision = self.planner.decide(self.plan, rec.job, explain=True)
            if decision.placement is None:
                continue
            self.waiting.remove(job_id)
            rec.outcome = decision.outcome
            rec.explanation = [c.describe() for c in decision.candidates]
            self._place(rec, decision.placement, now)

    def _withhold_drained(self) -> None:
        for node in self.drained:
            pool = self.plan.pool_of(node)
            if pool is not None:
                self.plan.withhold(pool, node)

    def _advance(self, now: float) -> None:
        """Integrate provisioned node-seconds per pool up to ``now``."""
        if self._clock is not None and now > self._clock:
            dt = now - self._clock
            for pool in POOLS:
                self.provisioned_s[pool] += dt * sum(len(g.nodes(pool)) for g in self.plan.groups.values())
        if self._clock is None or now > self._clock:
            self._clock = now

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
        if rec.state not in LIVE_STATES:
            raise JobEnded("job_id", f"{job_id!r} has departed ({rec.state}: {rec.end_reason})", rec.state)
        return rec

    @staticmethod
    def _check_phase(phase: str) -> None:
        if phase not in POOLS:
            raise ControlError("phase", f"{phase!r} is not one of {POOLS}")

    @staticmethod
    def _check_progress(progress: float) -> None:
        if not (0.0 <= progress <= 1.0):
            raise ControlError("progress", f"{progress!r} is not a fraction in [0, 1]")

    def _never_fits_field(self, job: Job) -> str:
        total = self.cluster.rollout.nodes
        if total is not None and job.nodes(ROLLOUT, self.cluster.gpus_per_node) > total:
            return "rollout_gpus"
        return "train_gpus"


def _record_to_dict(rec: JobRecord) -> dict:
    d = asdict(rec)
    d["rollout_nodes"] = list(rec.rollout_nodes)
    d["train_nodes"] = list(rec.train_nodes)
    return d


def _record_from_dict(d: dict) -> JobRecord:
    d = dict(d)
    d["job"] = Job(**d["job"])
    g = d["grant"]
    d["grant"] = GrantRecord(g["seq"], g["pool"], tuple(g["nodes"]), g["granted_at"], g["switch_s"]) if g else None
    d["rollout_nodes"] = tuple(d["rollout_nodes"])
    d["train_nodes"] = tuple(d["train_nodes"])
    return JobRecord(**d)
