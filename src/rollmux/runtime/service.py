"""The control plane as an HTTP+JSON service (FastAPI, OpenAPI at /docs) run by uvicorn.

Concurrency model: every handler is ``async`` and runs on the one event loop, so the
``ControlPlane`` is only ever touched by one thread and needs no lock. A change is
committed to the state file before its reply is sent. Long polls (``acquire`` with
``wait_s``) wait on a change signal that every commit fires.

Authentication: ``Authorization: Bearer <token>``. Calls about a job take that job's
token (returned by submit) or the admin token; ``/status`` and ``/admin/*`` take the
admin token. No token: 401; a wrong one: 403; either way nothing changes. ``/healthz``
and ``/metrics`` are open.

After a restart on the same state file the snapshot is restored (plan, queues,
outstanding grants, tokens) and every live job gets a fresh lease to reconnect in.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from rollmux.errors import SpecError
from rollmux.model import Cluster
from rollmux.runtime.api_models import (AcquireRequest, AcquireResponse, DrainResponse, ErrorBody, GrantView,
                                        HeartbeatRequest, JobView, ProgressRequest, ReleaseRequest, SubmitRequest, SubmitResponse)
from rollmux.runtime.control import ControlError, ControlPlane, JobEnded, JobRecord
from rollmux.runtime.metrics import ServiceMetrics
from rollmux.runtime.store import Store

ADMIN_TOKEN_ENV = "ROLLMUX_ADMIN_TOKEN"


class AuthError(Exception):
    """Missing (401) or wrong (403) bearer token."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Service:
    """A control plane bound to its state file, plus the change signal for long polls."""

    def __init__(self, cluster: Cluster, state_path: str, lease_s: float, admin_token: str) -> None:
        self.store = Store(state_path)
        self.admin_token = admin_token
        snap = self.store.load()
        if snap is None:
            self.control = ControlPlane(cluster, lease_s)
            self.store.commit(self.control.snapshot(), [])
            self.restored = False
        else:
            self.control = ControlPlane.restore(snap, lease_s, ended=self.store.ended())
            self.control.renew_all(time.time())
            self.restored = True
        self.metrics = ServiceMetrics(lambda: self.control)
        self._waiters: dict[str, asyncio.Event] = {}

    def commit(self) -> None:
        """Persist the state and the new events, then wake the long polls of the jobs they name.

        Only a job named by an event (admitted, granted, finished, removed) can see a different
        answer, so only its waiters wake: no thundering herd with many clients.
        """
        events = self.control.take_events()
        self.store.commit(self.control.snapshot(), events, self.control.take_ended())
        for job_id in {e["job_id"] for e in events}:
            waiter = self._waiters.pop(job_id, None)
            if waiter is not None:
                waiter.set()

    def change_signal(self, job_id: str) -> asyncio.Event:
        """An event set at the next commit that concerns ``job_id``."""
        waiter = self._waiters.get(job_id)
        if waiter is None:
            waiter = self._waiters[job_id] = asyncio.Event()
        return waiter

    def check_admin(self, token: str | None) -> None:
        if token is None:
            raise AuthError(401, "admin token required")
        if not secrets.compare_digest(token, self.admin_token):
            raise AuthError(403, "not the admin token")

    def check_job(self, job_id: str, token: str | None) -> JobRecord:
        if token is None:
            raise AuthError(401, f"token of job {job_id!r} required")
        rec = self.control.record(job_id)
        if not (secrets.compare_digest(token, rec.token) or secrets.compare_digest(token, self.admin_token)):
            raise AuthError(403, f"not the token of job {job_id!r}")
        return rec

    async def expire_leases(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            if self.control.expire(time.time()):
                self.commit()


def bearer(authorization: str | None = Header(default=None)) -> str | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def create_app(service: Service) -> FastAPI:
    """The FastAPI application over ``service``; its lifespan runs the lease reaper."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        reaper = asyncio.create_task(service.expire_leases(min(1.0, service.control.lease_s / 4)))
        try:
            yield
        finally:
            reaper.cancel()
            service.store.close()

    app = FastAPI(title="RollMux control plane", version="1", lifespan=lifespan)
    cp = lambda: service.control  # noqa: E731 - the control plane, read at call time
    lease = lambda: service.control.lease_s  # noqa: E731

    @app.exception_handler(ControlError)
    async def _control_error(_r: Request, exc: ControlError) -> JSONResponse:
        state = exc.state if isinstance(exc, JobEnded) else None
        return JSONResponse(ErrorBody(field=exc.field, reason=exc.reason, state=state).model_dump(),
                            status_code=exc.status)

    @app.exception_handler(SpecError)
    async def _spec_error(_r: Request, exc: SpecError) -> JSONResponse:
        body = ErrorBody(field=exc.field, reason=f"{exc.value!r}: expected {exc.expected}")
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _shape_error(_r: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        return JSONResponse(ErrorBody(field=".".join(loc) or "body", reason=first.get("msg", "invalid")).model_dump(),
                            status_code=422)

    @app.exception_handler(AuthError)
    async def _auth_error(_r: Request, exc: AuthError) -> JSONResponse:
        return JSONResponse(ErrorBody(field="authorization", reason=exc.reason).model_dump(), status_code=exc.status)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "restored": service.restored}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/jobs", response_model=SubmitResponse, status_code=201)
    async def submit(body: SubmitRequest) -> SubmitResponse:
        rec = cp().submit(body.spec.to_job(), time.time(), body.request_id)
        service.commit()
        return SubmitResponse(token=rec.token, **JobView.of(rec, lease()).model_dump())

    @app.get("/jobs/{job_id}", response_model=JobView)
    async def get_job(job_id: str, token: str | None = Depends(bearer)) -> JobView:
        return JobView.of(service.check_job(job_id, token), lease())

    @app.post("/jobs/{job_id}/acquire", response_model=AcquireResponse)
    async def acquire(job_id: str, body: AcquireRequest, token: str | None = Depends(bearer)) -> AcquireResponse:
        service.check_job(job_id, token)
        deadline = time.monotonic() + body.wait_s
        while True:
            signal = service.change_signal(job_id)
            grant = cp().acquire(job_id, body.phase, time.time())
            left = deadline - time.monotonic()
            if grant is not None or left <= 0:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(signal.wait(), left)
        rec = cp().record(job_id)
        return AcquireResponse(granted=grant is not None, grant=GrantView.of(grant),
                               job=JobView.of(rec, lease()))

    @app.post("/jobs/{job_id}/release", response_model=JobView)
    async def release(job_id: str, body: ReleaseRequest, token: str | None = Depends(bearer)) -> JobView:
        service.check_job(job_id, token)
        before = cp().record(job_id).last_released_seq
        rec = cp().release(job_id, body.phase, body.grant_seq, body.duration_s, time.time())
        if rec.last_released_seq != before:
            service.metrics.observe_phase(body.phase, body.duration_s)
            service.commit()
        return JobView.of(rec, lease())

    @app.post("/jobs/{job_id}/heartbeat", response_model=JobView)
    async def heartbeat(job_id: str, body: HeartbeatRequest, token: str | None = Depends(bearer)) -> JobView:
        service.check_job(job_id, token)
        rec = cp().heartbeat(job_id, time.time(), body.progress)
        if body.progress is not None:
            service.commit()
        return JobView.of(rec, lease())

    @app.post("/jobs/{job_id}/progress", response_model=JobView)
    async def progress(job_id: str, body: ProgressRequest, token: str | None = Depends(bearer)) -> JobView:
        service.check_job(job_id, token)
        rec = cp().heartbeat(job_id, time.time(), body.fraction)
        service.commit()
        return JobView.of(rec, lease())

    @app.post("/jobs/{job_id}/complete", response_model=JobView)
    async def complete(job_id: str, token: str | None = Depends(bearer)) -> JobView:
        service.check_job(job_id, token)
        rec = cp().complete(job_id, time.time())
        service.commit()
        return JobView.of(rec, lease())

    @app.post("/jobs/{job_id}/cancel", response_model=JobView)
    async def cancel(job_id: str, token: str | None = Depends(bearer)) -> JobView:
        service.check_job(job_id, token)
        by_admin = token is not None and secrets.compare_digest(token, service.admin_token)
        rec = cp().cancel(job_id, time.time(), "cancelled by the admin" if by_admin else "cancelled by the job")
        service.commit()
        return JobView.of(rec, lease())

    @app.get("/status")
    async def status(token: str | None = Depends(bearer)) -> dict:
        service.check_admin(token)
        return cp().status(time.time())

    @app.post("/admin/nodes/{node}/drain", response_model=DrainResponse)
    async def drain(node: str, token: str | None = Depends(bearer)) -> DrainResponse:
        service.check_admin(token)
        jobs = cp().drain(node, time.time())
        service.commit()
        return DrainResponse(node=node, jobs_on_node=jobs)

    @app.get("/admin/tokens")
    async def tokens(token: str | None = Depends(bearer)) -> dict[str, str]:
        service.check_admin(token)
        return {job_id: rec.token for job_id, rec in cp().jobs.items()}

    @app.get("/admin/events")
    async def events(since: int = 0, token: str | None = Depends(bearer)) -> list[dict]:
        service.check_admin(token)
        return service.store.events(since)

    return app


def resolve_admin_token(flag: str | None) -> str:
    """The admin token: the flag, else $ROLLMUX_ADMIN_TOKEN, else a fresh one printed once."""
    token = flag or os.environ.get(ADMIN_TOKEN_ENV)
    if token:
        return token
    token = secrets.token_urlsafe(24)
    print(f"rollmux: no admin token given; this run's admin token is {token}", file=sys.stderr, flush=True)
    return token


def run(cluster: Cluster, state_path: str, host: str = "127.0.0.1", port: int = 8470,
        admin_token: str | None = None, lease_s: float = 30.0) -> None:
    """Serve until interrupted (blocking)."""
    import uvicorn

    service = Service(cluster, state_path, lease_s, resolve_admin_token(admin_token))
    uvicorn.run(create_app(service), host=host, port=port, log_level="warning", access_log=False)
