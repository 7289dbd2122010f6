"""The control plane as an HTTP+JSON service (FastAPI, OpenAPI at /docs) run by uvicorn.

Concurrency model
-----------------
Handlers are ``async`` on one event loop. Every change runs through ``Service.mutate``:
under one asyncio lock, in a worker thread, the ``ControlPlane`` method runs, the rows it
changed are committed to the state file, and only then is the change published (long
polls woken, leases started or dropped, logs and metrics written) on the loop. Reads take
the same lock, so they never see a half-made change. The event loop itself never plans
or writes: a heartbeat is answered while a heavy submit is being planned. Regroupings
are decided off the lock (``ServiceConfig.decide_apart``, ``regroup_apart``): a copy of
the plan is taken under it, the policy decides on the copy in a worker thread while other
changes go on, and the decisions are checked and carried out under it again
(``rollmux.runtime.regroup_ticket``). If a commit
fails (disk full, I/O error) the in-memory state is reloaded from the state file, so
memory and disk never disagree, and the caller gets a 503.

Time: ``ServiceClock`` (never runs backwards) for every timestamp, the monotonic clock
for leases (``Leases``): wall-clock jumps neither expire live jobs nor keep dead ones.

Authentication: ``Authorization: Bearer <token>``. Submitting takes the admin token or a
tenant's token; calls about a job take that job's token or the admin token; listing,
``/v1/status``, ``/v1/events`` and ``/v1/admin/*`` take the admin token. No token: 401.
A wrong token on a job call: 404, exactly as for an unknown job, so job ids cannot be
probed. A departed run's own token gets its end (410 naming the state, or the first
answer to a repeat of its last release, ``complete`` or ``cancel``), also once the run
has left memory (``--keep-ended``) or another run has taken its id. ``/healthz`` and
``/metrics`` are open. Errors are RFC 9457 problem details naming the field.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Literal

import uvicorn
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollmux.errors import SpecError, TLSConfigError
from rollmux.fleet import Fleet, Profiles
from rollmux.model import ROLLOUT, Cluster
from rollmux.runtime import auth
from rollmux.runtime.api_models import (MAX_BODY_BYTES, AcquireRequest, AcquireResponse, AddNodeRequest,
                                        GrantView, HeartbeatRequest, HeartbeatResponse, JobView, MovedRequest, MoveView,
                                        NodeResponse,
                                        ProgressRequest, ReleaseRequest, SubmitRequest, SubmitResponse, TailRequest,
                                        TailResponse)
from rollmux.runtime.clock import ServiceClock
from rollmux.runtime.header_deadline import DeadlineServer, header_deadline_protocol
from rollmux.runtime.control import (CANCELLED, DONE, JOB_STATES, ControlError, ControlPlane, JobEnded, JobRecord,
                                     UnknownJob, departed, record_from_dict)
from rollmux.runtime.leases import Leases
from rollmux.runtime.logs import LOGGER
from rollmux.runtime.metrics import ServiceMetrics
from rollmux.runtime.store import Changes, CommitFailed, StateDamaged, Store, StoreError, hash_token

log = logging.getLogger(LOGGER)
_NO_SUCH_JOB = "not found, or the token is not this job's"


@dataclass(slots=True)
class ServiceConfig:
    """Operator settings (``rollmux serve`` options)."""

    lease_s: float = 30.0
    grace_s: float = 10.0
    max_job_gpus: int = 256        # per pool and job, on unbounded pools
    max_live_jobs: int = 5000      # the planner's work per request grows with the groups
    per_job_metrics: int = 500     # per-job metric labels while at most this many jobs are live
    policy: str = "rollmux"        # or rollmux-consolidate: live moves (see ControlPlane)
    migration_s: float = 300.0     # planned pause of a move until moves of that model size are measured
    move_timeout_s: float = 600.0  # a move not acknowledged by then is undone
    tail_threshold: float = 0.8    # fraction of responses done from which a rollout's tail may hand off GPUs
    backfill: bool = True          # a job that packs into a running group passes the waiting line
    decide_apart: bool = True      # regroupings decided off the lock (``rollmux.runtime.regroup_ticket``)
    keep_ended: int = 10_000       # departed records kept in memory (status, lists); all stay in the file
    keep_events: int | None = 1_000_000  # the event log's latest events kept in the file (None: all)
    body_timeout_s: float = 10.0   # a request body not in whole by then is answered 408 (``BodyLimit``)
    header_timeout_s: float = 10.0  # a request's headers not in whole by then: 408, closed (``header_deadline``)
    tenants: dict[str, str] = field(default_factory=dict)  # tenant -> token sha256
    quotas: dict[str, auth.Quota] = field(default_factory=dict)  # tenant -> what its live jobs may hold


class LimitReached(ControlError):
    """A submit beyond ``--max-live-jobs`` or its tenant's quota (429): nothing changed."""

    status = 429


class AuthError(Exception):
    """Missing (401) or wrong (403) bearer token."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Refused(Exception):
    """A request the service refuses before any work (limits): ``status``, field, reason."""

    def __init__(self, status: int, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.status = status
        self.field = field
        self.reason = reason


class Service:
    """A control plane bound to its state file, with leases, credentials and metrics."""

    def __init__(self, cluster: Cluster | Fleet | None, state_path: str, admin_token: str,
                 config: ServiceConfig | None = None, clock: ServiceClock | None = None,
                 new_state: bool = False, profiles: Profiles | None = None) -> None:
        self.config = config or ServiceConfig()
        self.credentials = auth.Credentials(hash_token(admin_token), dict(self.config.tenants))
        self.store = Store.open(state_path, new_state=new_state, keep_events=self.config.keep_events)
        try:
            self.control, self.restored, self.reconciled = self._open(cluster, profiles)
        except BaseException:
            self.store.close()
            raise
        self.clock = clock or ServiceClock(floor=self.control.clock)
        self.leases = Leases(self.config.lease_s, self.config.grace_s, self.clock.monotonic)
        self.leases.ensure(r.job_id for r in self.control.jobs.values() if r.live)
        self.metrics = ServiceMetrics(lambda: self.control, self.leases.age, self.config.per_job_metrics,
                                      self.tenant_usage, self.clock.now)
        self._lock = asyncio.Lock()
        self._follow_ups: set[asyncio.Task] = set()  # background changes (``follow_up``), kept until done
        self._waiters: dict[str, asyncio.Event] = {}
        self._queue: list[tuple[Callable[[ControlPlane, float], Any], asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self._regrouper: asyncio.Task | None = None  # regroupings decided off the lock (``regroup_apart``)
        self.published_seq = self.control.last_seq  # everything restored is committed

    def _open(self, cluster: Cluster | Fleet | None, profiles: Profiles | None) -> tuple[ControlPlane, bool, dict | None]:
        snap = self.store.load()
        if snap is None:
            control = ControlPlane(cluster or Cluster(), policy=self.config.policy,
                                   migration_s=self.config.migration_s, tail_threshold=self.config.tail_threshold,
                                   profiles=profiles, backfill=self.config.backfill,
                                   keep_ended=self.config.keep_ended, decide_apart=self.config.decide_apart)
            self.store.commit(control.take_changes())
            return control, False, None
        control = self._restore()
        reconciled = None
        if cluster is not None or profiles is not None:
            target, kept = control.with_live_nodes(cluster) if cluster is not None else (
                control.fleet or control.cluster, [])
            reconciled = control.reconcile(target, max(time.time(), control.clock or 0.0), profiles)
            reconciled["kept_live"] = kept
            self.store.commit(control.take_changes())
        return control, True, reconciled

    def _restore(self) -> ControlPlane:
        """The control plane as committed: the live state and the ``keep_ended`` latest
        departed records (the older ones counted by state, for ``counts``)."""
        keep = self.config.keep_ended
        try:
            control = ControlPlane.restore(self.store.load(), self.store.ended(keep), policy=self.config.policy,
                                           migration_s=self.config.migration_s,
                                           tail_threshold=self.config.tail_threshold, backfill=self.config.backfill,
                                           keep_ended=keep, evicted=self.store.ended_counts(keep),
                                           decide_apart=self.config.decide_apart)
            logged = self.store.last_event_seq()
            if logged > control.last_seq:
                raise ValueError(f"globals.seq={control.last_seq} is below the event log's last seq {logged}")
            return control
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise StateDamaged(f"{self.store.path}: the state does not restore ({type(exc).__name__}: "
                               f"{str(exc)[:500]}); start with --new-state to begin empty, or restore a "
                               f"backup") from exc

    # --- changes -----------------------------------------------------------------------
    async def mutate(self, fn: Callable[[ControlPlane, float], Any]) -> Any:
        """Run ``fn(control, now)`` in a worker thread, commit what it changed, publish it.

        Changes queued while a batch is in the worker run together in the next batch,
        in arrival order, with one commit (group commit): a busy service pays one thread
        hop and one transaction per batch, not per request. Each caller gets its own
        result or error: a change that raises anything but a ``ControlError`` (a refusal
        made before it changed anything) is undone with the whole batch (memory reloaded
        from the file), and the batch runs again without it, so one bad change never
        fails another's. A failed commit fails every change of its batch (nothing of it
        was written, and memory is reloaded from the file).
        """
        done = asyncio.get_running_loop().create_future()
        self._queue.append((fn, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await done

    def follow_up(self, fn: Callable[[ControlPlane, float], Any]) -> None:
        """``mutate(fn)`` in the background: a change nobody waits for (a failure is logged;
        what it would have changed is left to the next change, which runs it first)."""
        async def run() -> None:
            try:
                await self.mutate(fn)
            except Exception as exc:  # (ControlError cannot come from gather; a commit failure is logged there)
                log.error("follow_up_failed", extra={"reason": f"{type(exc).__name__}: {exc}"})

        task = asyncio.get_running_loop().create_task(run())
        self._follow_ups.add(task)
        task.add_done_callback(self._follow_ups.discard)

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            async with self._lock:
                try:
                    outcomes, changes = await asyncio.to_thread(self._apply, [fn for fn, _ in batch])
                except BaseException as exc:  # the whole batch failed (commit, or a bug): nothing changed
                    outcomes, changes = [(None, exc)] * len(batch), None
            if changes is not None:
                self._publish(changes)
            self.kick_regroups()
            for (_, done), (result, error) in zip(batch, outcomes):
                if done.cancelled():
                    continue
                if error is not None:
                    done.set_exception(error)
                else:
                    done.set_result(result)

    def kick_regroups(self) -> None:
        """Start ``regroup_apart`` when regroupings wait to be decided and it is not running;
        when it ends with none asked for, asks made meanwhile (in the batch that found none)
        start it again."""
        if self.control.regroups_asked and (self._regrouper is None or self._regrouper.done()):
            self._regrouper = asyncio.get_running_loop().create_task(self.regroup_apart())
            self._regrouper.add_done_callback(self._round_over)

    def _round_over(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.result():
            self.kick_regroups()

    async def regroup_apart(self) -> bool:
        """Decide the regroupings asked for off the lock, round after round, until none is
        asked for (``rollmux.runtime.regroup_ticket``): the ticket under the lock (a copy of
        the plan), the decisions in a worker thread while other changes go on, the check
        and the marks under the lock again, committed as any change. One runs at a time.
        Returns True when none is left asked for. A failed commit ends it (the next change
        starts it again); any other failure is a bug: logged, and the service goes on
        deciding regroupings under the lock (``--regroup-decisions locked``)."""
        try:
            while True:
                tq = time.perf_counter()
                ticket = await self.mutate(lambda c, now: c.regroup_ticket(now))
                if ticket is None:
                    return True
                t0 = time.perf_counter()
                decided = await asyncio.to_thread(ticket.decide)
                t1 = time.perf_counter()
                self.metrics.regroup_decide_seconds.observe(t1 - t0)
                done = await self.mutate(lambda c, now: c.apply_regroups(ticket, decided, now))
                self.metrics.regroups_stale.inc(len(decided) - done)
                log.debug("regroup_round", extra={"asks": len(ticket.asks), "jobs": len(ticket.progress),
                                                  "ticket_s": t0 - tq, "decide_s": t1 - t0,
                                                  "apply_s": time.perf_counter() - t1, "decided": len(decided),
                                                  "done": done})
        except asyncio.CancelledError:
            raise
        except CommitFailed:  # (logged where it happened; nothing of the round was written)
            return False
        except Exception as exc:  # noqa: BLE001 - a bug: the traceback goes to the log
            log.exception("regroup_apart_failed", extra={"reason": f"{type(exc).__name__}: {exc}",
                                                         "decisions": "under the lock from now on"})
            self.config.decide_apart = False  # (a state reloaded later decides under the lock too)
            self.follow_up(lambda c, now: c.decide_locked())
            return False

    def _apply(self, fns: list[Callable[[ControlPlane, float], Any]]) -> tuple[list, Changes | None]:
        failed: dict[int, Exception] = {}  # changes that raised: undone, and left out of the rerun
        while True:
            outcomes: list[tuple[Any, BaseException | None]] = []
            for i, fn in enumerate(fns):
                if i in failed:
                    outcomes.append((None, failed[i]))
                    continue
                try:
                    outcomes.append((fn(self.control, self.clock.now()), None))
                except ControlError as exc:
                    outcomes.append((None, exc))  # validated before any change: nothing changed
                except Exception as exc:  # it may have changed memory half-way: undo the batch, rerun the rest
                    self.control = self._restore()
                    failed[i] = exc
                    break
                except BaseException:
                    self.control = self._restore()
                    raise
            else:
                break
        t0 = time.perf_counter()
        try:
            changes = self.control.take_changes()
            if changes.empty():
                return outcomes, None
            self.store.commit(changes)
        except Exception as exc:  # nothing of the batch was written: memory goes back to the file
            self.control = self._restore()
            self.metrics.commit_failures.inc()
            log.error("commit_failed", extra={"reason": f"{type(exc).__name__}: {exc}"[:1000]})
            raise
        self.metrics.commit_seconds.observe(time.perf_counter() - t0)
        return outcomes, changes

    def _publish(self, changes: Changes) -> None:
        """After a commit: leases, waiters, logs and metrics of what changed."""
        self.leases.ensure(changes.jobs)
        self.leases.drop(changes.jobs_deleted)
        if changes.events:
            self.published_seq = max(self.published_seq, changes.events[-1]["seq"])
        woken = set(changes.jobs_deleted)
        for e in changes.events:
            woken.add(e["job_id"])
            kind = e["kind"]
            extra = {"job_id": e["job_id"], "group_id": e["group_id"], "seq": e["seq"]}
            if kind == "grant":
                self.metrics.grant_wait.labels(e["pool"]).observe(max(0.0, e["detail"]["wait_s"]))
                log.info("grant", extra={**extra, "pool": e["pool"], "nodes": e["nodes"],
                                         "wait_s": round(e["detail"]["wait_s"], 6)})
            elif kind == "finish":
                log.info("finish", extra={**extra, "pool": e["pool"], **({"failed": True} if e["detail"].get("failed")
                                                                         else {})})
            elif kind == "admit":
                log.info("admit", extra={**extra, "nodes": e["nodes"]})
            elif kind == "remove":
                log.info("depart", extra={**extra, "reason": e["detail"].get("reason", "")})
            elif kind in ("move", "moved", "move_aborted", "tail", "regroup"):
                log.info(kind, extra={**extra, **e["detail"]})
        for rec in changes.ended:
            if rec["state"] == "expired":
                self.metrics.expiries.inc()
                log.warning("expire", extra={"job_id": rec["job"]["job_id"], "group_id": rec["group_id"],
                                             "reason": rec["end_reason"]})
        for job_id in woken:
            waiter = self._waiters.pop(job_id, None)
            if waiter is not None:
                waiter.set()

    def change_signal(self, job_id: str) -> asyncio.Event:
        """An event set at the next commit that concerns ``job_id``."""
        waiter = self._waiters.get(job_id)
        if waiter is None:
            waiter = self._waiters[job_id] = asyncio.Event()
        return waiter

    # --- credentials -------------------------------------------------------------------
    def check_admin(self, token: str | None) -> None:
        if token is None:
            raise AuthError(401, "the admin token is required")
        if not self.credentials.is_admin(token):
            raise AuthError(403, "not the admin token")

    def check_submitter(self, token: str | None) -> str:
        if token is None:
            raise AuthError(401, "submitting needs the admin token or a tenant's token")
        who = self.credentials.submitter(token)
        if who is None:
            raise AuthError(403, "not the admin token nor a tenant's token")
        return who

    def check_job(self, job_id: str, token: str | None, archived: bool = False) -> tuple[JobRecord, bool]:
        """The job's record and whether the caller is the admin; touches the job's lease
        when the caller is the job. A wrong token looks exactly like an unknown job.
        ``archived`` (the caller holds the lock): a departed run no longer in memory
        (``keep_ended``) is read from the state file."""
        if token is None:
            raise AuthError(401, f"the token of job {job_id!r} (or the admin token) is required")
        rec = self.control.jobs.get(job_id)
        if archived and (rec is None or not (auth.same(token, rec.token_hash) or self.credentials.is_admin(token))):
            # a departed run out of memory, or one whose id a later run took: the caller's own
            old = self.store.ended_record(job_id, None if rec is None else
                                          lambda r: auth.same(token, r["token_hash"]))
            rec = rec if old is None else record_from_dict(old)
        own = auth.same(token, rec.token_hash if rec is not None else "0" * 64)
        if rec is not None and own:
            if rec.live:
                self.leases.touch(job_id)
            return rec, False
        if self.credentials.is_admin(token):
            if rec is None:
                raise UnknownJob("job_id", f"{job_id!r} is not registered")
            return rec, True
        raise _unknown(job_id)

    async def check_call(self, job_id: str, token: str | None,
                         repeats: Callable[[JobRecord], bool] = lambda _rec: False) -> tuple[JobRecord, bool]:
        """``check_job`` for a call that acts on the job: its record and whether the caller is
        the admin. A run no longer in memory (``keep_ended``), or whose id a later run took, is
        read from the state file for its own token (and the admin's), under the lock, on that
        path only. A departed run, in memory or not, is answered here as the control plane
        answers one it holds: ``JobEnded`` (410, naming its state), unless ``repeats(record)``
        (the call repeats one it applied: its last release, ``complete`` of a done run,
        ``cancel`` of a cancelled one), when its record is returned: the answer, never to be
        applied again (nor to the id's current run)."""
        try:
            rec, by_admin = self.check_job(job_id, token)
        except UnknownJob:
            async with self._lock:
                rec, by_admin = self.check_job(job_id, token, archived=True)
        if not rec.live and not repeats(rec):
            raise departed(rec)
        return rec, by_admin

    async def change(self, job_id: str, token: str | None, fn: Callable[[ControlPlane, float], Any],
                     repeats: Callable[[JobRecord], bool] = lambda _rec: False) -> Any:
        """``mutate(fn)`` for a call of job ``job_id`` that ``check_call`` let through (the job
        was live): if the job departed and left memory before ``fn`` ran (``keep_ended``), the
        call is answered as ``check_call`` answers a departed run (its record for a repeat)."""
        try:
            return await self.mutate(fn)
        except UnknownJob:
            rec, _ = await self.check_call(job_id, token, repeats)
            if rec.live:  # (another run of the id, the admin's call: not this call's job)
                raise
            return rec

    def view(self, rec: JobRecord) -> JobView:
        return JobView.of(rec, self.config.lease_s, self.config.grace_s)

    # --- limits --------------------------------------------------------------------------
    def check_limits(self, body: SubmitRequest) -> None:
        """Refuse, before any planning, a job wider than its pool (or than ``--max-job-gpus``
        on an unbounded one); the live-job limits are ``check_room``'s, inside the change."""
        spec = body.spec
        cp = self.control
        for pool, name in ((ROLLOUT, "rollout_gpus"), ("train", "train_gpus")):
            gpus = getattr(spec, name)
            nodes = cp.role_nodes(pool)
            limit = self.config.max_job_gpus if nodes is None else nodes * cp.cluster.gpus_per_node
            if gpus > limit:
                what = ("--max-job-gpus on this unbounded pool" if nodes is None
                        else f"the {pool} pool's {nodes} nodes x {cp.cluster.gpus_per_node} GPUs" if cp.fleet is None
                        else f"the largest {pool} pool's {nodes} nodes x {cp.cluster.gpus_per_node} GPUs")
                raise Refused(422, f"spec.{name}", f"{gpus} GPUs is more than {limit} ({what})")

    def unlisted_tenants(self) -> dict[str, int]:
        """Tenants with live jobs that the tenants file no longer lists (it changed between
        runs), and how many: the jobs run on, outside every quota and the per-tenant
        gauges; their tenant can no longer submit."""
        out: dict[str, int] = {}
        for rec in list(self.control.jobs.values()):
            if rec.live and rec.tenant not in (auth.ADMIN, "", *self.config.tenants):
                out[rec.tenant] = out.get(rec.tenant, 0) + 1
        return dict(sorted(out.items()))

    def tenant_usage(self, cp: ControlPlane | None = None) -> dict[str, dict]:
        """Per tenant: its live jobs, the GPUs (rollout + training) they ask for, and its
        quota (None: no bound); of ``cp``, by default the service's plane."""
        usage = {name: {"live_jobs": 0, "gpus": 0} for name in sorted(self.config.tenants)}
        for rec in (cp or self.control).jobs.values():
            if rec.live and rec.tenant in usage:
                usage[rec.tenant]["live_jobs"] += 1
                usage[rec.tenant]["gpus"] += rec.job.rollout_gpus + rec.job.train_gpus
        for name, row in usage.items():
            quota = self.config.quotas.get(name, auth.Quota())
            row.update(max_live_jobs=quota.max_live_jobs, max_gpus=quota.max_gpus)
        return usage

    def archived_retry(self, cp: ControlPlane, body: SubmitRequest, job_token: str) -> JobRecord | None:
        """The first answer to a retried submit (same ``request_id`` and token) whose run has
        departed and left memory (``keep_ended``), or whose id a later run has taken (another
        tenant may reuse a departed job's id): its record, read from the state file, so that
        the retry never starts the job again, nor is refused as a duplicate of the later run."""
        digest = hash_token(job_token)
        known = cp.jobs.get(body.spec.job_id)
        if body.request_id is None or (known is not None and ControlPlane.is_retry(known, body.request_id, digest)):
            return None  # (the plane answers a retry of the run it holds)
        old = self.store.ended_record(body.spec.job_id, lambda r: ControlPlane.is_retry(record_from_dict(r),
                                                                                        body.request_id, digest))
        return None if old is None else ControlPlane.first_answer(record_from_dict(old), body.spec.to_job())

    def check_room(self, cp: ControlPlane, body: SubmitRequest, tenant: str, job_token: str) -> None:
        """Refuse (``LimitReached``) a submit that would take the service past
        ``--max-live-jobs`` or its tenant past its quota (``auth.Quota``); run inside the
        change, so that concurrent submits are counted one after the other. Exempt: a
        submit the plane answers without a new job (a live job's id: refused as a
        duplicate; a retry of the submit that registered it: its first answer)."""
        known = cp.jobs.get(body.spec.job_id)
        if known is not None and (known.live or ControlPlane.is_retry(known, body.request_id, hash_token(job_token))):
            return
        live = sum(1 for r in cp.jobs.values() if r.live)
        if live >= self.config.max_live_jobs:
            raise LimitReached("spec", f"the service holds {live} live jobs and --max-live-jobs is "
                                       f"{self.config.max_live_jobs}; retry later")
        quota = self.config.quotas.get(tenant)
        if quota is None:
            return
        mine = self.tenant_usage(cp)[tenant]
        if quota.max_live_jobs is not None and mine["live_jobs"] >= quota.max_live_jobs:
            raise LimitReached("tenant", f"tenant {tenant}: live jobs {mine['live_jobs']}, max_live_jobs "
                                         f"{quota.max_live_jobs}; retry when one has ended")
        asked, held = body.spec.rollout_gpus + body.spec.train_gpus, mine["gpus"]
        if quota.max_gpus is not None and held + asked > quota.max_gpus:
            raise LimitReached("tenant", f"tenant {tenant}: live jobs ask for {held} GPUs, this one for {asked} "
                                         f"more, max_gpus {quota.max_gpus}; retry when one has ended")

    # --- background tasks -------------------------------------------------------------------
    async def expire_leases(self, period_s: float) -> None:
        """Every ``period_s``: undo moves past their timeout, expire silent jobs."""
        limit = self.config.lease_s + self.config.grace_s
        reason = (f"no call received for {limit:g}s (lease {self.config.lease_s:g}s + grace "
                  f"{self.config.grace_s:g}s)")

        def abort(cp: ControlPlane, now: float) -> list[str]:
            return cp.abort_stale_moves(now, self.config.move_timeout_s)

        def expire(cp: ControlPlane, now: float) -> list[str]:
            return cp.expire([j for j in self.leases.silent() if self.leases.is_silent(j)], now, reason)

        while True:
            await asyncio.sleep(period_s)
            with contextlib.suppress(StoreError):  # logged; retried at the next period
                if any(r.move is not None for r in list(self.control.jobs.values())):
                    await self.mutate(abort)
                if self.leases.silent():
                    await self.mutate(expire)

    async def watch_loop_lag(self, period_s: float = 0.1) -> None:
        window: list[tuple[float, float]] = []
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(period_s)
            lag = max(0.0, time.monotonic() - t0 - period_s)
            self.metrics.loop_lag.observe(lag)
            now = time.monotonic()
            window = [(t, v) for t, v in window if now - t < 10.0] + [(now, lag)]
            self.metrics.loop_lag_max.set(max(v for _, v in window))

    def refused(self, status: int, field: str, reason: str) -> None:
        """Count and log a request refused (by a check, the body's or the headers' deadline)."""
        self.metrics.http_errors.labels(str(status)).inc()
        level = logging.ERROR if status >= 500 else logging.INFO
        log.log(level, "refused", extra={"status": status, "field": field, "reason": reason})

    def close(self) -> None:
        self.store.close()


def _unknown(job_id: str) -> ControlError:
    return UnknownJob("job_id", f"{job_id!r}: {_NO_SUCH_JOB}")


async def bearer(authorization: str | None = Header(default=None)) -> str | None:
    # async: a plain ``def`` dependency would be run in a worker thread for every request
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def problem(status: int, field: str, reason: str, state: str | None = None, code: str | None = None) -> JSONResponse:
    """An RFC 9457 problem-details answer naming ``field`` (with the job's ``state`` for a
    departed job, and a ``code`` where a client acts on which refusal it is)."""
    title = HTTPStatus(status).phrase
    body = {"type": f"urn:rollmux:problem:{title.lower().replace(' ', '-')}", "title": title, "status": status,
            "detail": f"{field}: {reason}", "field": field, "reason": reason}
    if state is not None:
        body["state"] = state
    if code is not None:
        body["code"] = code
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


class BodyLimit:
    """ASGI middleware: every request body is read here first and handed on whole. One over
    ``limit`` bytes is answered 413 (``body``) before it is parsed: by its Content-Length
    when it has one (the server reads no more than it says), else (chunked) once more than
    ``limit`` bytes came in. One not in whole within ``timeout_s`` seconds of the request
    (a client that sends less than it announced, or trickles it) is answered 408 (``body``)
    and its connection closed, so a slow client holds no connection and no worker. A JSON
    body that gives a key twice in one object is answered 400 (``body``), where a parser
    would keep the last value silently. ``refused(status, field, reason)`` is told of each
    refusal (metrics and log)."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES, timeout_s: float = 10.0,
                 refused: Callable[[int, str, str], None] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.refused = refused

    def _problem(self, status: int, reason: str) -> JSONResponse:
        """The refusal, with ``Connection: close``: the rest of the body is never read, so
        the connection cannot carry another request."""
        if self.refused is not None:
            self.refused(status, "body", reason)
        answer = problem(status, "body", reason)
        answer.headers["connection"] = "close"
        return answer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._problem(413, f"more than {self.limit} bytes")(scope, receive, send)
        chunks, seen = [], 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None  # the client went away before its body was in
                    chunks.append(message.get("body", b""))
                    seen += len(chunks[-1])
                    if seen > self.limit:
                        return await self._problem(413, f"more than {self.limit} bytes")(scope, receive, send)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            late = self._problem(408, f"not received whole within {self.timeout_s:g}s ({seen} bytes came)")
            return await late(scope, receive, send)
        body = b"".join(chunks)
        twice = _key_given_twice(body)
        if twice is not None:
            if self.refused is not None:
                self.refused(400, "body", twice)
            return await problem(400, "body", twice)(scope, receive, send)
        handed = False

        async def replay():
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


class _KeyGivenTwice(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _KeyGivenTwice(key)
        seen[key] = value
    return seen


def _key_given_twice(body: bytes) -> str | None:
    """Why a JSON body that gives one key twice in an object is refused (JSON parsers keep
    the last one silently: ``{"spec": A, "spec": B}`` would submit B), else None; a body
    that is not JSON at all is left to the request's own checks."""
    if not body:
        return None
    try:
        json.loads(body, object_pairs_hook=_unique_keys)
    except _KeyGivenTwice as err:
        return f"the key {str(err)[:100]!r} given twice in one object"
    except (ValueError, RecursionError):
        return None
    return None


def create_app(service: Service) -> FastAPI:
    """The FastAPI application over ``service``; its lifespan runs the lease reaper and
    the event-loop watch, and closes the state file at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        tasks = [asyncio.create_task(service.expire_leases(min(0.5, service.config.lease_s / 4))),
                 asyncio.create_task(service.watch_loop_lag())]
        service.kick_regroups()  # asks restored from the state file
        service.follow_up(lambda c, _now: c.gather())  # and what a restored state left for its next change
        try:
            yield
        finally:
            for t in (*tasks, service._regrouper):
                if t is not None:
                    t.cancel()
            if service._drainer is not None and not service._drainer.done():  # changes already queued commit
                await asyncio.wait({service._drainer}, timeout=30)
            service.close()

    app = FastAPI(title="RollMux control plane", version="1", lifespan=lifespan)
    cp = lambda: service.control  # noqa: E731 - the control plane, read at call time
    lock = service._lock

    refused = service.refused

    def answer(status: int, field: str, reason: str, state: str | None = None,
               code: str | None = None) -> JSONResponse:
        refused(status, field, reason)
        return problem(status, field, reason, state, code)

    app.add_middleware(BodyLimit, timeout_s=service.config.body_timeout_s, refused=refused)

    @app.exception_handler(ControlError)
    async def _control_error(_r: Request, exc: ControlError) -> JSONResponse:
        return answer(exc.status, exc.field, exc.reason, exc.state if isinstance(exc, JobEnded) else None,
                      getattr(exc, "code", None))

    @app.exception_handler(SpecError)
    async def _spec_error(_r: Request, exc: SpecError) -> JSONResponse:
        return answer(422, f"spec.{exc.field}", f"{exc.value!r}: expected {exc.expected}")

    @app.exception_handler(RequestValidationError)
    async def _shape_error(_r: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        if first.get("type") == "json_invalid":
            loc = []  # the position in the text, not a field
        return answer(422, ".".join(loc) or "body", first.get("msg", "invalid"))

    @app.exception_handler(AuthError)
    async def _auth_error(_r: Request, exc: AuthError) -> JSONResponse:
        return answer(exc.status, "authorization", exc.reason)

    @app.exception_handler(Refused)
    async def _refused(_r: Request, exc: Refused) -> JSONResponse:
        return answer(exc.status, exc.field, exc.reason)

    @app.exception_handler(CommitFailed)
    async def _commit_failed(_r: Request, exc: CommitFailed) -> JSONResponse:
        return answer(503, "state", f"the change could not be saved, nothing changed ({exc})")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 400: FastAPI could not read the body as JSON (not UTF-8, nested too deep); else the path
        return answer(exc.status_code, "body" if exc.status_code == 400 else "path", str(exc.detail))

    @app.exception_handler(Exception)
    async def _bug(_r: Request, exc: Exception) -> JSONResponse:
        log.exception("error", extra={"reason": repr(exc)})
        return answer(500, "server", f"internal error ({type(exc).__name__}); see the service log")

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "restored": service.restored}

    @app.get("/metrics")
    async def metrics() -> Response:
        async with lock:  # the gauges read the control plane: not while a change is being made
            body = service.metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.post("/v1/jobs", response_model=SubmitResponse, status_code=201)
    async def submit(body: SubmitRequest, token: str | None = Depends(bearer)) -> SubmitResponse:
        tenant = service.check_submitter(token)
        service.check_limits(body)
        job_token = body.token or auth.new_token()
        job = body.spec.to_job()

        def run(c: ControlPlane, now: float) -> JobRecord:
            retried = service.archived_retry(c, body, job_token)
            if retried is not None:
                return retried
            service.check_room(c, body, tenant, job_token)
            return c.submit(job, now, hash_token(job_token), body.request_id, tenant, body.spec.movable)

        rec = await service.mutate(run)
        if cp().gathers_pending:  # the arrival's regrouping, once this answer is on its way
            service.follow_up(lambda c, now: c.gather())
        service.leases.touch(rec.job_id)
        first = body.token is None  # the service made the token: this first answer is the only one with it
        log.info("decision", extra={"job_id": rec.job_id, "tenant": tenant, "outcome": rec.outcome,
                                    "group_id": rec.group_id, "rollout_nodes": list(rec.rollout_nodes),
                                    "train_nodes": list(rec.train_nodes)})
        return SubmitResponse(token=job_token if first else None, **service.view(rec).model_dump())

    @app.get("/v1/jobs", response_model=list[JobView])
    async def list_jobs(state: str | None = Query(None, max_length=16), group: str | None = Query(None, max_length=32),
                        tenant: str | None = Query(None, max_length=64), limit: int = Query(1000, ge=1, le=10000),
                        offset: int = Query(0, ge=0, le=2**62), token: str | None = Depends(bearer)) -> list[JobView]:
        service.check_admin(token)
        if state is not None and state not in JOB_STATES:
            raise Refused(422, "state", f"{state!r} is not one of {', '.join(JOB_STATES)}")
        async with lock:
            return [service.view(r) for r in cp().list_jobs(state, group, tenant, limit, offset)]

    @app.get("/v1/jobs/{job_id}", response_model=JobView)
    async def get_job(job_id: str, token: str | None = Depends(bearer)) -> JobView:
        async with lock:
            rec, _ = service.check_job(job_id, token, archived=True)
            return service.view(rec)

    @app.post("/v1/jobs/{job_id}/acquire", response_model=AcquireResponse)
    async def acquire(job_id: str, body: AcquireRequest, token: str | None = Depends(bearer)) -> AcquireResponse:
        await service.check_call(job_id, token)
        deadline = time.monotonic() + body.wait_s
        try:
            while True:  # without the lock: only what is committed and published is handed out
                signal = service.change_signal(job_id)
                move = cp().pending_move(job_id)
                if move is not None and move["seq"] > service.published_seq:
                    move = None
                grant = cp().acquire(job_id, body.phase) if move is None else None
                if grant is not None and grant.seq > service.published_seq:
                    grant = None
                left = deadline - time.monotonic()
                if grant is not None or move is not None or left <= 0:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(signal.wait(), left)
            view = service.view(cp().record(job_id))
        except UnknownJob:  # it departed during the poll and left memory (keep_ended): its end, as for any
            await service.check_call(job_id, token)
            raise
        published = [g for g in view.grants if g.seq <= service.published_seq]  # (an async job may hold two)
        return AcquireResponse(granted=grant is not None, grant=GrantView.of(grant), move=MoveView(**move) if move
                               else None, job=view.model_copy(update={"grant": GrantView.of(grant) if grant else
                                                                      view.grant, "grants": published}))

    @app.post("/v1/jobs/{job_id}/moved", response_model=JobView)
    async def moved(job_id: str, body: MovedRequest, token: str | None = Depends(bearer)) -> JobView:
        await service.check_call(job_id, token)
        rec = await service.change(job_id, token, lambda c, now: c.moved(job_id, now, body.ok, body.reason, body.seq))
        return service.view(rec)

    @app.post("/v1/jobs/{job_id}/release", response_model=JobView)
    async def release(job_id: str, body: ReleaseRequest, token: str | None = Depends(bearer)) -> JobView:
        def repeats(rec: JobRecord) -> bool:
            return ControlPlane.repeats_release(rec, body.phase, body.grant_seq)

        rec, _ = await service.check_call(job_id, token, repeats)
        if not rec.live:
            return service.view(rec)  # a departed run's last release, repeated
        applied: list[bool] = []  # (said by the change that applied it: a repeat is answered, not counted again)

        def run(c: ControlPlane, now: float) -> JobRecord:
            repeat = c.is_repeat_release(job_id, body.phase, body.grant_seq)
            rec = c.release(job_id, body.phase, body.grant_seq, body.duration_s, now, body.failed, body.restart)
            applied[:] = [not repeat]
            return rec

        rec = await service.change(job_id, token, run, repeats)
        if applied == [True] and not body.failed:
            service.metrics.phase_seconds.labels(body.phase).observe(body.duration_s)
        return service.view(rec)

    @app.post("/v1/jobs/{job_id}/heartbeat", response_model=HeartbeatResponse)
    async def heartbeat(job_id: str, body: HeartbeatRequest, token: str | None = Depends(bearer)) -> HeartbeatResponse:
        rec, _ = await service.check_call(job_id, token)
        if body.progress is not None:
            rec = await service.change(job_id, token, lambda c, _now: c.report_progress(job_id, body.progress))
        return HeartbeatResponse(job_id=job_id, state=rec.state, lease_s=service.config.lease_s,
                                 grace_s=service.config.grace_s)

    @app.post("/v1/jobs/{job_id}/progress", response_model=JobView)
    async def progress(job_id: str, body: ProgressRequest, token: str | None = Depends(bearer)) -> JobView:
        await service.check_call(job_id, token)
        return service.view(await service.change(job_id, token,
                                                 lambda c, _now: c.report_progress(job_id, body.fraction)))

    @app.post("/v1/jobs/{job_id}/tail", response_model=TailResponse)
    async def tail(job_id: str, body: TailRequest, token: str | None = Depends(bearer)) -> TailResponse:
        await service.check_call(job_id, token)
        keep, rec = await service.change(job_id, token,
                                         lambda c, now: (c.tail(job_id, body.fraction, now), c.record(job_id)))
        return TailResponse(keep_gpus=keep, job=service.view(rec))

    @app.post("/v1/jobs/{job_id}/complete", response_model=JobView)
    async def complete(job_id: str, token: str | None = Depends(bearer)) -> JobView:
        def repeats(rec: JobRecord) -> bool:
            return rec.state == DONE

        rec, _ = await service.check_call(job_id, token, repeats)
        if rec.live:
            rec = await service.change(job_id, token, lambda c, now: c.complete(job_id, now), repeats)
        return service.view(rec)

    @app.post("/v1/jobs/{job_id}/cancel", response_model=JobView)
    async def cancel(job_id: str, token: str | None = Depends(bearer)) -> JobView:
        def repeats(rec: JobRecord) -> bool:
            return rec.state == CANCELLED

        rec, by_admin = await service.check_call(job_id, token, repeats)
        if rec.live:
            reason = "cancelled by the admin" if by_admin else "cancelled by the job"
            rec = await service.change(job_id, token, lambda c, now: c.cancel(job_id, now, reason), repeats)
        return service.view(rec)

    @app.get("/v1/status")
    async def status(token: str | None = Depends(bearer)) -> dict:
        service.check_admin(token)
        async with lock:
            return {**cp().status(service.clock.now()), "tenants": service.tenant_usage()}

    @app.get("/v1/events")
    async def events(since: int = Query(0, ge=0, le=2**62), limit: int = Query(10000, ge=1, le=100000),
                     token: str | None = Depends(bearer)) -> list[dict]:
        service.check_admin(token)
        async with lock:
            return service.store.events(since, limit)

    @app.post("/v1/admin/nodes", response_model=NodeResponse, status_code=201)
    async def add_node(body: AddNodeRequest, token: str | None = Depends(bearer)) -> NodeResponse:
        service.check_admin(token)

        node, placed = await service.mutate(
            lambda c, now: c.add_node(body.pool, body.node_id, body.host_mem_gb, now, body.request_id))
        log.info("node", extra={"action": "add", "pool": body.pool, "node": node, "placed": placed})
        return NodeResponse(node=node, placed=placed)

    @app.post("/v1/admin/nodes/{node}/{action}", response_model=NodeResponse)
    async def drain_or_undrain(node: str, action: Literal["drain", "undrain"],
                               token: str | None = Depends(bearer)) -> NodeResponse:
        """drain: no new pins on the node (returns the jobs still on it); undrain: back in
        service (returns the waiting jobs placed on it)."""
        service.check_admin(token)
        jobs = await service.mutate(lambda c, now: getattr(c, action)(node, now))
        log.info("node", extra={"action": action, "node": node, "jobs": jobs})
        if action == "drain":
            return NodeResponse(node=node, jobs_on_node=jobs)
        return NodeResponse(node=node, placed=jobs)

    return app


def check_tls(cert: str | None, key: str | None) -> None:
    """Refuse (``TLSConfigError`` naming the option) a TLS pair that is half given, not
    readable PEM of the right kind, an encrypted key (nobody could type its passphrase), or
    a key that does not match its certificate, before anything is served or written."""
    if (cert is None) != (key is None):
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise TLSConfigError(f"{given} needs {missing} too")
    if cert is None:
        return
    texts = {}
    for option, path, marker in (("--tls-cert", cert, "CERTIFICATE-----"), ("--tls-key", key, "PRIVATE KEY-----")):
        if not path:
            raise TLSConfigError(f"{option}: an empty path")
        if not Path(path).is_file():
            raise TLSConfigError(f"{option} {path}: " + ("a directory, not a file" if Path(path).is_dir()
                                                          else "no such file" if not Path(path).exists()
                                                          else "not a regular file"))
        try:
            texts[option] = Path(path).read_text(encoding="ascii", errors="replace")
        except OSError as err:
            raise TLSConfigError(f"{option} {path}: cannot be read ({err.strerror})") from None
        if marker not in texts[option]:
            raise TLSConfigError(f"{option} {path}: no PEM {marker.rstrip('-').lower()} in it")
    if "ENCRYPTED" in texts["--tls-key"]:
        raise TLSConfigError(f"--tls-key {key}: the key is encrypted; give an unencrypted key (readable by the "
                             f"service's user only): the service cannot ask for a passphrase")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key, password=b"")
    except (OSError, ssl.SSLError) as err:
        raise TLSConfigError(f"--tls-key {key} is not the private key of --tls-cert {cert}, or one of them is "
                             f"damaged ({err})") from None


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` names (as asyncio's ``create_server`` binds
    them: ``SO_REUSEADDR``, IPv6 sockets IPv6-only), not yet listening. ``OSError`` naming
    the address when one cannot be bound (in use, not this machine's, a privileged port),
    with none left open. Bound before the state file is opened, so a taken port writes
    nothing."""
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
                socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as err:
                raise OSError(err.errno, f"cannot listen on {address[0]} port {address[1]}: "
                                         f"{err.strerror or err}") from None
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def run(cluster: Cluster | Fleet | None, state_path: str, admin_token: str, config: ServiceConfig,
        host: str = "127.0.0.1", port: int = 8470, new_state: bool = False, profiles: Profiles | None = None,
        tls_cert: str | None = None, tls_key: str | None = None,
        sockets: list[socket.socket] | None = None) -> None:
    """Serve until interrupted (blocking); https with ``tls_cert`` and ``tls_key`` (``check_tls``),
    on ``sockets`` (``listen(host, port)``: bound before the state file is opened; by default
    here, first)."""
    check_tls(tls_cert, tls_key)
    sockets = listen(host, port) if sockets is None else sockets
    sys.setswitchinterval(0.001)  # the loop thread gets the GIL back quickly while a worker plans
    service = Service(cluster, state_path, admin_token, config, new_state=new_state, profiles=profiles)
    log.info("start", extra={"state": state_path, "restored": service.restored, "host": host, "port": port,
                             "tls": tls_cert is not None, "reconciled": service.reconciled,
                             "pools": service.control.pool_nodes()})
    unlisted = service.unlisted_tenants()
    if unlisted:
        log.warning("unlisted_tenants", extra={"live_jobs": unlisted, "reason": "tenants with live jobs that the "
                                               "tenants file no longer lists: their jobs run on, outside any quota"})
    DeadlineServer(server_config(service, host, port, tls_cert, tls_key),
                   service.config.header_timeout_s).run(sockets=sockets)


def server_config(service: Service, host: str, port: int, tls_cert: str | None = None,
                  tls_key: str | None = None) -> uvicorn.Config:
    """uvicorn's settings for ``service`` (also what tests and the demo serve with): its
    application, the header deadline (``rollmux.runtime.header_deadline``), no access log,
    uvicorn's own logging left to ``rollmux.runtime.logs``."""
    protocol = header_deadline_protocol(service.config.header_timeout_s, service.refused, problem)
    return uvicorn.Config(create_app(service), host=host, port=port, log_level="warning", access_log=False,
                          log_config=None,  # its loggers write JSON lines through rollmux.runtime.logs
                          http=protocol, ssl_certfile=tls_cert, ssl_keyfile=tls_key)
