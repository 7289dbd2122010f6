"""Job SDK: register a job with the control plane and wrap its phases. Framework-neutral.

::

    job = Client("http://127.0.0.1:8470").submit(spec)   # spec: trace columns
    job.wait_placed()
    for step in range(iterations):
        with job.phase("rollout"):
            generate()
        with job.phase("train"):
            update()
    job.complete()

An asynchronous job (spec ``staleness`` = k >= 1) runs its phases from two threads, one
looping over rollouts and one over trainings; rollout i+1 overlaps training i::

    def rollouts():
        for i in range(iterations):
            with job.phase("rollout"):
                batches.put(generate())
    threading.Thread(target=rollouts).start()
    for i in range(iterations):
        with job.phase("train"):
            update(batches.get())

Contract
--------
* Entering a phase blocks until the group scheduler grants it (long polls); leaving it
  reports the measured duration and frees the nodes for the next phase in the group.
  A phase body that raises still releases its grant, as failed: the service counts
  nothing (no iteration, no measured time) and the job is due for the same phase again,
  so a retry (``train()`` called again) starts where the job stopped. The exception
  propagates (a release that fails then is logged and noted on it, never raised in its
  place).
* ``phase(..., state=obj)`` enters ``obj.resident(key, device)`` once the grant is held
  and leaves it before the grant is released (load on the device, offload to host); any
  object with such a context-manager method works. If entering it fails (a CUDA out of
  memory), the grant is released at once and the error raised: the group's other jobs
  never wait on a phase that did not start.
* A synchronous job runs one phase at a time: a phase entered while another thread holds
  one raises ``PhaseBusy`` at once (an asynchronous job's threads wait for their turn).
* Heartbeats run on their own timer: one is sent every quarter of the lease, at fixed
  times, each on its own short-lived thread, so a slow answer (or a long poll, or a
  long phase body) never delays the next one; the service measures the lease from
  when it receives each call, and tolerates its documented grace on top. The lease is
  the service's latest word: every answer that states it (a heartbeat's, any job view)
  re-derives the period and the beat's timeout (lease + grace) when it changed, so a
  service restarted with a shorter ``--lease-s`` is followed from its first answer.
  Once a beat goes unanswered (refused, timed out, 5xx) one is sent at least every
  ``RECONNECT_S`` (0.5 s) until one is answered, so a service that comes back hears from
  the job within about half a second. They never give up on a service that does not answer
  (a warning is logged after ``give_up_s``): a service restarted after any outage renews
  every live job's lease, and the job's first call or answered heartbeat keeps it if it
  arrives within the new lease + grace. (A restart so quick that no beat saw it goes
  unnoticed until the next beat, a quarter of the old lease later: a new lease + grace
  shorter than that can expire a job that makes no other call meanwhile.) Only an
  answer that ends or refuses the job is raised by its next call (``LeaseLost`` if the
  outage outlasted the lease without a restart).
* A server that does not answer (connection refused, reset, no answer in time, 5xx) is
  retried with exponential backoff until ``give_up_s`` has passed since the call began,
  so a restarted server is reconnected transparently; no attempt outlasts it (each
  waits at most ``timeout_s`` and the time left, at least ``MIN_ATTEMPT_S``; a long
  poll asks the service to answer within it), so ``ServerUnavailable`` comes by then,
  its message naming the seconds waited and what the last attempt got. Every retried
  call is idempotent (submit carries a request id and the job's own token, chosen
  here, so no answer ever needs to carry it; release carries the grant's sequence
  number). A request that is not valid HTTP is never sent again (``ClientError``), and
  no message shows a header's value (the token).
* Asynchronous jobs: entering a phase first waits, in the handle, until the staleness
  rule lets it begin (a rollout while ``rollouts started - trainings done <= k``, a
  training once a rollout was released for it, one phase per pool at a time), so the
  service never sees a request it would refuse; a synchronous job's phases are entered
  exactly as before. ``Phase(timeout_s=...)`` bounds that wait (``TimeoutError``).
* Clear failures, each its own class: ``JobCancelled``, ``LeaseLost``, ``JobDone``,
  ``ServerUnavailable``, ``PhaseBusy``, ``RequestRejected`` (a 4xx naming field and reason),
  ``UntrustedServer`` (an https server whose certificate does not verify: raised at
  once, never retried), ``WrongScheme`` (an https url to a plain http service) and
  ``NotRollMux`` (an answer RollMux never gives: a redirect, a page that is not JSON, JSON
  of another shape, e.g. from a proxy or another service at the url). A departed job's
  calls raise its end, also once the service holds it in its state file only
  (``--keep-ended``), and a lost answer's retry of its last release or of ``complete``
  gets that call's answer. A failure seen by the heartbeat thread is raised by the
  job's next call; ``wait_placed`` raises the
  job's end (``JobCancelled``, ``LeaseLost``, ``JobDone``) as soon as it reads that the
  job departed. Arguments the service could never take (a url without http:// or
  https:// or without a host, a token that is not one word of printable ASCII, seconds
  out of range or NaN, a fraction outside 0 to 1, a spec field that is NaN, an
  ``on_move`` that is not callable) raise ``ValueError`` or ``TypeError`` naming the
  argument (never showing a token), before any request; numpy scalars are taken as the
  Python values they hold.
* TLS: an ``https://`` url is verified against the system's trust store, or against
  ``ca_file`` (else ``$ROLLMUX_CA_FILE``): the certificate, or the CA that signed it, of
  a service started with ``rollmux serve --tls-cert/--tls-key``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import numbers
import os
import re
import secrets
import ssl
import threading
import time
import uuid
from typing import Any, Callable

import httpx

from rollmux.errors import RollMuxError
from rollmux.model import JOB_ID_PATTERN, Job

log = logging.getLogger(__name__)

#: the fields of a ``rollmux.model.Job`` that a submit carries: those the API's job spec takes too
SPEC_FIELDS = ("job_id", "rollout_gpus", "train_gpus", "t_roll_s", "t_train_s", "mem_roll_gb", "mem_train_gb",
               "slo", "model", "iterations", "tail_workers", "staleness", "reward_s", "reward_price_per_hour",
               "reward_mem_gb", "colocate")


class ClientError(RollMuxError):
    """Base of the SDK's errors."""


class ServerUnavailable(ClientError):
    """The control plane did not answer for ``give_up_s`` seconds."""


class UntrustedServer(ClientError):
    """An https server whose certificate does not verify against the trusted CAs."""


class WrongScheme(ClientError):
    """An ``https://`` url to a service that speaks plain http."""


class RequestRejected(ClientError):
    """The control plane refused a request (4xx); ``field`` and ``reason`` say why, and
    ``code`` which refusal it is where a client may act on it (``move_undone``)."""

    def __init__(self, status: int, field: str, reason: str, code: str | None = None) -> None:
        self.status = status
        self.field = field
        self.reason = reason
        self.code = code
        super().__init__(f"HTTP {status}: {field}: {reason}")


class NotRollMux(ClientError):
    """The url answered what RollMux's API never does (a redirect, a proxy's or another
    service's page, JSON of another shape): ``status`` is the answer's HTTP status; the
    message names the url, the status, the content type and the answer's first bytes."""

    def __init__(self, r: httpx.Response, what: str) -> None:
        self.status = r.status_code
        moved = f" to {r.headers['location']}" if "location" in r.headers else ""
        super().__init__(f"{r.request.method} {r.request.url}: the answer is not RollMux's API ({what}): "
                         f"HTTP {r.status_code}{moved}, {r.headers.get('content-type', 'no content type')}, "
                         f"begins {r.content[:60]!r}; is the url the control plane's?")


class PhaseBusy(ClientError):
    """A synchronous job's phase entered while the handle holds one (two threads on one
    handle): nothing was asked of the service."""


class JobEnded(ClientError):
    """The job has left the control plane; ``state`` and ``reason`` say how."""

    def __init__(self, job_id: str, state: str, reason: str) -> None:
        self.job_id = job_id
        self.state = state
        self.reason = reason
        super().__init__(f"job {job_id!r} {state}: {reason}")


class JobCancelled(JobEnded):
    """The job was cancelled (by itself or by an admin)."""


class LeaseLost(JobEnded):
    """The job stopped heartbeating for longer than the lease and lost its nodes."""


class JobDone(JobEnded):
    """The job already completed (its iterations or ``complete()``)."""


_ENDED = {"cancelled": JobCancelled, "expired": LeaseLost, "done": JobDone}
API = "/v1"
JOB_VIEW = ("job_id", "state")  # what every answer describing a job holds (the SDK reads them)
MAX_BEATS_IN_FLIGHT = 4
MAX_POLL_S = 30.0  # the longest long poll the service takes (api_models.MAX_WAIT_S)
MIN_ATTEMPT_S = 0.1  # the shortest wait for an answer, however little of give_up_s is left
RECONNECT_S = 0.5  # while heartbeats go unanswered, one at least this often: a restarted service hears at once
DAY_S = 86_400.0


class Client:
    """A connection to the control plane at ``url``. ``token`` is the credential for
    submitting (the admin token or a tenant's token) and for the admin calls. ``ca_file``
    (else ``$ROLLMUX_CA_FILE``; else the system's trust store): the PEM file that an
    https service's certificate is verified against."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0, give_up_s: float = 30.0,
                 poll_s: float = 10.0, ca_file: str | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or not _host(url):
            raise ValueError(f"url={url!r}: expected the service's address, http://HOST:PORT or https://HOST:PORT")
        _check_seconds("timeout_s", timeout_s, 1e-3, DAY_S)
        _check_seconds("give_up_s", give_up_s, 0.0, DAY_S)
        _check_seconds("poll_s", poll_s, 0.0, MAX_POLL_S)
        if token is not None:
            _check_token(token, ", or None")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self.poll_s = poll_s
        self.ca_file = ca_file or os.environ.get("ROLLMUX_CA_FILE") or None
        self.tls = self._tls_context()
        self._http = self.http(timeout_s)

    def _tls_context(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise ClientError(f"ca_file {self.ca_file!r} (or $ROLLMUX_CA_FILE): not a readable PEM file of "
                              f"certificates ({err})") from None

    def http(self, timeout_s: float) -> httpx.Client:
        """A new HTTP client to the service (its TLS trust included)."""
        return httpx.Client(base_url=self.url, timeout=timeout_s, verify=self.tls)

    # --- jobs ---------------------------------------------------------------------------
    def submit(self, spec: dict | Job, heartbeat: bool = True,
               on_move: Callable[[dict], None] | None = None) -> "JobHandle":
        """Register a job; returns its handle (placed, or waiting for nodes). ``spec``: a dict of
        the API's job spec fields, or a ``rollmux.model.Job``, of which every field the spec
        takes is sent (``SPEC_FIELDS``).

        ``heartbeat=False`` registers without keeping the lease (an operator submitting
        for a job process that will ``attach`` within the lease). ``on_move(directive)``
        is called when the service moves the job (see ``JobHandle``); a spec with
        ``movable: false`` is never moved.
        """
        _check_on_move(on_move)
        job_token = secrets.token_urlsafe(32)
        body = {"spec": _spec_dict(spec), "request_id": uuid.uuid4().hex, "token": job_token}
        view = self.call("POST", "/jobs", token=self.token, json=body, keys=JOB_VIEW)
        return JobHandle(self, view["job_id"], job_token, view, heartbeat, on_move)

    def attach(self, job_id: str, token: str, on_move: Callable[[dict], None] | None = None) -> "JobHandle":
        """A handle on an already registered job (another process, or after a client restart);
        ``token`` is the job's (one line: a token file's newline is not part of it)."""
        _check_on_move(on_move)
        _check_token(token)
        view = self.call("GET", f"/jobs/{_segment('job_id', job_id)}", token=token, keys=JOB_VIEW)
        return JobHandle(self, job_id, token, view, on_move=on_move)

    # --- operator calls (admin token) ---------------------------------------------------------
    def status(self) -> dict:
        return self.call("GET", "/status", token=self.token)

    def jobs(self, state: str | None = None, group: str | None = None, tenant: str | None = None,
             limit: int = 1000, offset: int = 0) -> list[dict]:
        """The jobs that match, in submission order (departed ones first): at most ``limit``,
        after the first ``offset`` (page with ``offset`` += ``limit`` until fewer come)."""
        params = {k: v for k, v in (("state", state), ("group", group), ("tenant", tenant)) if v is not None}
        params["limit"], params["offset"] = limit, offset
        return self.call("GET", "/jobs", token=self.token, params=params, shape=list)

    def job(self, job_id: str) -> dict:
        return self.call("GET", f"/jobs/{_segment('job_id', job_id)}", token=self.token, keys=JOB_VIEW)

    def events(self, since: int = 0, limit: int = 10000) -> list[dict]:
        return self.call("GET", "/events", token=self.token, params={"since": since, "limit": limit}, shape=list)

    def cancel(self, job_id: str) -> dict:
        return self.call("POST", f"/jobs/{_segment('job_id', job_id)}/cancel", token=self.token, keys=JOB_VIEW)

    def drain(self, node: str) -> dict:
        return self.call("POST", f"/admin/nodes/{_segment('node', node)}/drain", token=self.token)

    def undrain(self, node: str) -> dict:
        return self.call("POST", f"/admin/nodes/{_segment('node', node)}/undrain", token=self.token)

    def add_node(self, pool: str, node_id: str = "", host_mem_gb: float | None = None) -> dict:
        """Add a node to a bounded pool; one request id for all its retries, so a retry
        after a lost answer adds no second node."""
        return self.call("POST", "/admin/nodes", token=self.token,
                         json={"pool": pool, "node_id": node_id, "host_mem_gb": host_mem_gb,
                               "request_id": uuid.uuid4().hex})

    def close(self) -> None:
        self._http.close()

    # --- transport ---------------------------------------------------------------------
    def call(self, method: str, path: str, token: str | None = None, json: Any = None,
             params: dict | None = None, shape: type = dict, keys: tuple[str, ...] = (),
             poll_s: float | None = None) -> Any:
        """One request to ``/v1`` + ``path``, retried with backoff while the server is unreachable, 5xx, or
        did not get the body in time (408: the same request again, as after a lost connection), until
        ``give_up_s`` has passed since the call began: each attempt waits at most ``timeout_s`` and the
        time left (but at least ``MIN_ATTEMPT_S``), so the call ends by then. ``poll_s``: the request is
        a long poll (``json`` gets ``wait_s``): the service is asked to answer within ``poll_s`` and
        within the time left, less the time its answer needs to come back.

        Returns the answer's JSON, a ``shape`` (``dict``: an object; ``list``) holding ``keys``.
        Raises ``ServerUnavailable`` once ``give_up_s`` has passed with no answer but retried ones (5xx,
        408; the message says after how long, and what the last attempt got), a ``JobEnded`` subclass for a 410,
        ``RequestRejected`` for any other 4xx, ``NotRollMux`` for an answer RollMux never gives (a
        redirect, a body that is not JSON or not of that shape), ``ClientError`` for a request that
        cannot be sent (not valid HTTP: never retried; the message shows no header value).
        """
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        start, delay = time.monotonic(), 0.05
        while True:
            left = max(0.0, self.give_up_s - (time.monotonic() - start))
            timeout, body = min(self.timeout_s, left), json
            if poll_s is not None:  # the service answers by ``wait_s``; ``allow`` is for the answer's way back
                allow = min(self.timeout_s, left / 2)
                wait = max(0.0, min(poll_s, left - allow))
                timeout, body = wait + allow, {**json, "wait_s": round(wait, 3)}
            try:
                r = self._http.request(method, API + path, json=body, headers=headers, params=params,
                                       timeout=max(timeout, MIN_ATTEMPT_S))
                if not _retriable(r.status_code):
                    return _answer(r, shape, keys)
                problem, answered = f"HTTP {r.status_code} {r.reason_phrase}".rstrip(), True
            except httpx.LocalProtocolError:  # (its text may show a header value: the token)
                raise ClientError(f"{method} {self.url}{API}{path}: the request cannot be sent: a header or the "
                                  f"url is not valid HTTP (header values are not shown)") from None
            except httpx.TransportError as exc:
                _raise_if_permanent(exc, self.url)
                problem, answered = f"{type(exc).__name__}: {exc}", False
            elapsed = time.monotonic() - start
            if elapsed >= self.give_up_s:
                raise ServerUnavailable(self._gave_up(method, path, elapsed, problem, answered))
            time.sleep(min(delay, self.give_up_s - elapsed))
            delay = min(delay * 2, 1.0)

    def _gave_up(self, method: str, path: str, elapsed: float, problem: str, answered: bool) -> str:
        """Why a call gave up after ``elapsed`` seconds: its last attempt's ``problem``, an
        ``answered`` 5xx or 408, else no answer at all (refused, reset, timed out)."""
        if answered:
            what = f"gave up after {elapsed:.1f}s, the last attempt answered {problem}"
        else:
            hint = ("; an https server answers a plain http request so (is it https://?)"
                    if self.url.startswith("http:") and "disconnected" in problem.lower() else "")
            what = f"no answer within {elapsed:.1f}s ({problem}){hint}"
        return f"{self.url}{API}{path}: {what}; a {method} that reached a slow service may still be applied"


class JobHandle:
    """One job as its own process sees it: placement, phases, progress, departure.

    ``history`` lists every phase this handle ran as (pool, nodes, grant seq, start,
    end) in wall-clock seconds, measured from the grant's arrival to the release.

    Moves: when the service moves the job (a consolidating policy, at an iteration
    boundary), entering the next phase receives a move directive instead of a grant:
    ``{"from_group", "to_group", "rollout_nodes", "train_nodes", "decided_at", "seq"}``. The
    handle calls ``on_move(directive)``, which brings the job's state and workers to
    the new nodes (e.g. ``RayJobRunner`` re-created there, the state cache's host
    buffers shipped through the object store), then acknowledges; the job is admitted
    to its new group and the phase is granted there. If ``on_move`` raises, the handle
    reports the failure and the service places the job afresh or queues it. ``moves``
    lists the directives carried out. If ``on_move`` takes longer than the service's
    ``--move-timeout-s``, the service has undone the move by the time it is acknowledged
    (placed the job afresh): the handle logs a warning, lists the directive in
    ``undone_moves`` and goes on from the job's current placement.
    """

    def __init__(self, client: Client, job_id: str, token: str, view: dict, heartbeat: bool = True,
                 on_move: Callable[[dict], None] | None = None) -> None:
        self.client = client
        self.on_move = on_move
        self.moves: list[dict] = []
        self.undone_moves: list[dict] = []
        self.job_id = job_id
        self.token = token
        self._lease = (30.0, 0.0)  # the service's (lease_s, grace_s), as its latest answer stating them said
        self._wake = threading.Event()  # wakes the heartbeat timer: a new lease, a beat unanswered, the end
        self._unanswered = False  # the latest beat that ended got no answer (or a 5xx)
        self.view = view
        self.history: list[tuple[str, tuple[str, ...], int, float, float]] = []
        self._failure: ClientError | None = None
        pipe = view.get("pipeline") or {}
        self._turn = threading.Condition()  # an asynchronous job's two phase threads wait on it
        self._started = self._rolled = pipe.get("rollouts_done", 0)  # a held rollout is acquired again
        self._trained = pipe.get("trainings_done", 0)
        self._in_flight: set[str] = set()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if heartbeat and view["state"] in ("waiting", "placed"):
            self._beat = threading.Thread(target=self._heartbeat, name=f"rollmux-heartbeat-{job_id}", daemon=True)
            self._beat.start()

    @property
    def view(self) -> dict:
        """The job as the service last described it (its ``JobView``)."""
        return self._view

    @view.setter
    def view(self, view: dict) -> None:
        self._view = view
        self._follow_lease(view)

    @property
    def staleness(self) -> int:
        """The job's staleness bound k (0: synchronous)."""
        return int(self.view.get("staleness", 0) or 0)

    @property
    def placement(self) -> dict | None:
        """{"group_id", "rollout_nodes", "train_nodes"} once placed, else None."""
        return self.view.get("placement")

    def wait_placed(self, timeout_s: float | None = None) -> dict:
        """Block until the job is placed (it may wait for nodes to free up); returns the placement.
        A job that has departed (cancelled, expired, done) raises its ``JobEnded`` subclass, a
        job not placed within ``timeout_s`` (None: no bound) ``TimeoutError``."""
        if timeout_s is not None:
            _check_seconds("timeout_s", timeout_s, 0.0, DAY_S)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.05
        while True:
            self._raise_failure()
            state = self.view["state"]
            if state in _ENDED:
                raise _ENDED[state](self.job_id, state, self.view.get("reason", ""))
            if self.placement is not None:
                return self.placement
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id!r} not placed within {timeout_s}s")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            self.view = self._call("GET", f"/jobs/{self.job_id}")

    def phase(self, name: str, state: Any = None, key: str | None = None, device: Any = "cuda",
              timeout_s: float | None = None, restart_on_failure: bool = False) -> "Phase":
        """A context manager (and decorator) holding the grant of phase ``name``. ``timeout_s``
        bounds an asynchronous job's wait for its turn (see the module docstring).
        ``restart_on_failure`` (a ``train`` phase): when the body raises, a synchronous job's
        next phase is its rollout, not this phase again (its update cannot be redone, e.g.
        its batch is gone); an asynchronous job's pipeline keeps its rollouts, so it is
        due for the same phase again, as without the flag."""
        if restart_on_failure and name != "train":
            raise ValueError(f"restart_on_failure with phase={name!r}: only a train phase restarts its iteration")
        return Phase(self, name, state, key or f"{self.job_id}/{name}", device, timeout_s, restart_on_failure)

    def progress(self, fraction: float) -> None:
        """Report the fraction of the job's work done, 0 to 1."""
        self.view = self._call("POST", f"/jobs/{self.job_id}/progress", json={"fraction": _fraction(fraction)})

    def complete(self) -> None:
        """Depart: the job's nodes go back. Stops the heartbeat."""
        self.view = self._call("POST", f"/jobs/{self.job_id}/complete")
        self.close()

    def cancel(self) -> None:
        self.view = self._call("POST", f"/jobs/{self.job_id}/cancel")
        self.close()

    def close(self) -> None:
        """Stop heartbeating (the server will expire the job if it is still live)."""
        self._stop.set()
        self._wake.set()

    @contextlib.contextmanager
    def lifetime(self):
        """The job's run: on a normal exit it completes (its nodes go back), on an exception
        it is cancelled (best effort) and the exception goes on; heartbeats stop either way."""
        try:
            yield self
            self.complete()
        except BaseException:
            with contextlib.suppress(Exception):
                self.cancel()
            raise
        finally:
            self.close()

    # --- internals ----------------------------------------------------------------------
    def _call(self, method: str, path: str, json: Any = None, poll_s: float | None = None) -> Any:
        self._raise_failure()
        return self.client.call(method, path, token=self.token, json=json, poll_s=poll_s)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _acquire(self, name: str) -> dict:
        while True:
            answer = self._call("POST", f"/jobs/{self.job_id}/acquire", json={"phase": name},
                                poll_s=self.client.poll_s)
            self.view = answer["job"]
            if answer["granted"]:
                return answer["grant"]
            if answer.get("move"):
                self._move(answer["move"])

    def _await_turn(self, name: str, timeout_s: float | None) -> None:
        """An asynchronous job: wait until the staleness rule lets phase ``name`` begin."""
        k, total = self.staleness, self.view.get("iterations")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def ready() -> bool:
            if name in self._in_flight:
                return False
            if name == "rollout":  # no rollouts left: the service answers that (409)
                return self._started - self._trained <= k or (total is not None and self._started >= total)
            return self._rolled > self._trained

        with self._turn:
            while not ready():
                self._raise_failure()
                if self._stop.is_set():
                    raise ClientError(f"job {self.job_id!r}: the handle was closed while phase {name!r} waited")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"job {self.job_id!r}: phase {name!r} not its turn within {timeout_s}s "
                                       f"({self._started} rollouts started, {self._rolled} done, "
                                       f"{self._trained} trainings done, staleness {k})")
                self._turn.wait(0.5 if left is None else min(0.5, left))
            self._in_flight.add(name)

    def _enter_alone(self, name: str) -> None:
        """A synchronous job: phase ``name`` may begin only while no phase of the handle is held."""
        with self._turn:
            if self._in_flight:
                raise PhaseBusy(f"job {self.job_id!r}: phase {name!r} entered while phase "
                                f"{next(iter(self._in_flight))!r} is held (another thread?); a synchronous job "
                                f"runs one phase at a time, one after the other")
            self._in_flight.add(name)

    def _end_turn(self, name: str, entered: bool, released: bool) -> None:
        with self._turn:
            self._in_flight.discard(name)
            if not self.staleness:
                return
            if released:
                if name == "rollout":
                    self._rolled += 1
                else:
                    self._trained += 1
            elif entered and name == "rollout":
                self._started -= 1  # not released: it will be acquired again
            self._turn.notify_all()

    def _move(self, directive: dict) -> None:
        ok, reason = True, ""
        try:
            if self.on_move is not None:
                self.on_move(directive)
        except Exception as exc:  # reported to the service, which places the job afresh
            ok, reason = False, f"{type(exc).__name__}: {exc}"[:500]
        try:
            self.view = self._call("POST", f"/jobs/{self.job_id}/moved",
                                   json={"ok": ok, "reason": reason, "seq": directive.get("seq")})
        except RequestRejected as err:
            if err.code != "move_undone":
                raise
            # on_move took longer than the service's --move-timeout-s: it undid the move and
            # placed the job afresh; the job goes on from there (its next grant says where)
            log.warning("job %s: move to %s undone by the service: %s", self.job_id, directive.get("to_group"),
                        err.reason)
            self.undone_moves.append(directive)
            self.view = self._call("GET", f"/jobs/{self.job_id}")
            return
        if ok:
            self.moves.append(directive)

    def _release(self, name: str, grant: dict, duration_s: float, failed: bool = False,
                 restart: bool = False) -> None:
        body = {"phase": name, "grant_seq": grant["seq"], "duration_s": duration_s}
        if failed:  # (only then: a service older than the field takes every other release)
            body["failed"] = True
        if restart:
            body["restart"] = True
        self.view = self._call("POST", f"/jobs/{self.job_id}/release", json=body)

    def _follow_lease(self, answer: dict) -> None:
        """Take the lease and grace that ``answer`` states (a heartbeat's answer, any job view):
        a change re-derives the heartbeat period and the beat's timeout at once."""
        lease, grace = answer.get("lease_s"), answer.get("grace_s", 0.0)
        if _is_seconds(lease) and lease > 0 and _is_seconds(grace) and (lease, grace) != self._lease:
            self._lease = (float(lease), float(grace))
            self._wake.set()

    def _beat_period(self) -> float:
        period = max(0.05, self._lease[0] / 4)
        return min(period, RECONNECT_S) if self._unanswered else period

    def _heartbeat(self) -> None:
        """Fixed-rate beats every lease/4, each on its own thread (see the module docstring)."""
        http = self.client.http(self.client.timeout_s)  # (each beat sets its own timeout)
        in_flight = threading.Semaphore(MAX_BEATS_IN_FLIGHT)
        last_answer = [time.monotonic()]
        slot = time.monotonic()  # when the latest beat was due (the first: a period after the view's answer)
        warned = False
        try:
            while True:
                self._wake.wait(max(0.0, slot + self._beat_period() - time.monotonic()))
                self._wake.clear()  # (everything it announces is read below, after this)
                if self._stop.is_set() or self._failure is not None:
                    return
                now, period = time.monotonic(), self._beat_period()
                if now < slot + period:
                    continue  # woken early: the period changed; wait for the new time
                slot = slot + period if now - slot < 2 * period else now  # fixed times, no burst to catch up
                silent = now - last_answer[0]
                if silent > self.client.give_up_s and not warned:  # (said once per outage)
                    log.warning("job %s: no heartbeat answered for %.0fs by %s; still beating (a restarted "
                                "service renews the job's lease at once)", self.job_id, silent, self.client.url)
                warned = silent > self.client.give_up_s
                if in_flight.acquire(blocking=False):
                    threading.Thread(target=self._beat_once, args=(http, in_flight, last_answer),
                                     name=f"rollmux-beat-{self.job_id}", daemon=True).start()
        finally:
            self._stop.set()
            for _ in range(MAX_BEATS_IN_FLIGHT):  # let beats in flight finish before closing their client
                in_flight.acquire(timeout=max(sum(self._lease), 1.0))
            http.close()

    def _beat_once(self, http: httpx.Client, in_flight: threading.Semaphore, last_answer: list[float]) -> None:
        try:
            r = http.post(f"{API}/jobs/{self.job_id}/heartbeat", json={}, timeout=max(sum(self._lease), 1.0),
                          headers={"Authorization": f"Bearer {self.token}"})
            answered = not _retriable(r.status_code)
            if answered:
                last_answer[0] = time.monotonic()
                self._unanswered = False
                self._follow_lease(_answer(r))
        except JobDone:
            self.close()
        except ClientError as exc:
            self._failure = exc
            self.close()
        except httpx.TransportError:
            answered = False  # the next beat tries again; give_up_s bounds how long
        finally:
            in_flight.release()
        if not answered and not self._unanswered:  # beat more often until the service answers again
            self._unanswered = True
            self._wake.set()


class Phase(contextlib.ContextDecorator):
    """Holds one phase's grant for the duration of a ``with`` block or a decorated call."""

    def __init__(self, job: JobHandle, name: str, state: Any, key: str, device: Any,
                 timeout_s: float | None = None, restart_on_failure: bool = False) -> None:
        if name not in ("rollout", "train"):
            raise ValueError(f"phase={name!r}: expected 'rollout' or 'train'")
        if timeout_s is not None:
            _check_seconds("timeout_s", timeout_s, 0.0, DAY_S)
        self.job = job
        self.restart_on_failure = restart_on_failure
        self.timeout_s = timeout_s
        self.name = name
        self.state = state
        self.key = key
        self.device = device
        self._grant: dict | None = None
        self._resident: Any = None
        self._t0 = 0.0
        self._wall0 = 0.0

    @property
    def grant(self) -> dict | None:
        """The grant held inside the block: {"seq", "pool", "nodes", "granted_at", "switch_s",
        "share"} (``share`` < 1: the phase runs in a slice of another job's long tail, on that
        fraction of its nodes' GPUs, until that job's rollout ends)."""
        return self._grant

    def tail(self, done_fraction: float) -> int:
        """Report the rollout's fraction of responses done; returns the GPUs it should keep.

        From the service's threshold (0.8 by default) on, the rollout keeps the job's
        ``tail_workers`` GPUs (else an eighth of its rollout GPUs) and the others may start
        the next queued rollout of the group at once: shrink to the returned number of
        workers. Below the threshold every GPU is kept."""
        if self.name != "rollout" or self._grant is None:
            raise ValueError("tail() is for a rollout phase, inside its block")
        answer = self.job._call("POST", f"/jobs/{self.job.job_id}/tail",
                                json={"fraction": _fraction(done_fraction, "done_fraction")})
        self.job.view = answer["job"]
        return answer["keep_gpus"]

    def __enter__(self) -> "Phase":
        if self.job.staleness > 0:
            self.job._await_turn(self.name, self.timeout_s)
            try:
                self._grant = self.job._acquire(self.name)
            except BaseException:
                self.job._end_turn(self.name, False, False)
                raise
            if self.name == "rollout":
                with self.job._turn:
                    self.job._started += 1
        else:
            self.job._enter_alone(self.name)
            try:
                self._grant = self.job._acquire(self.name)
            except BaseException:
                self.job._end_turn(self.name, False, False)
                raise
        self._wall0 = time.time()
        self._t0 = time.monotonic()
        if self.state is not None:
            try:  # making the hook's context may fail too (a hook that checks its arguments first)
                resident = self.state.resident(self.key, self.device)
                resident.__enter__()
            except BaseException as exc:  # (e.g. CUDA out of memory): the grant goes back at once
                self._give_back(exc)
                raise
            self._resident = resident
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        failure = None
        if self._resident is not None:
            resident, self._resident = self._resident, None
            try:
                resident.__exit__(exc_type, exc, tb)
            except BaseException as err:
                failure = err
        self._give_back(failure or exc)
        if failure is not None:
            raise failure
        return False

    def _give_back(self, pending: BaseException | None) -> None:
        """Release the grant held. A release that fails while ``pending`` (the body's or the
        state hook's exception) propagates is logged and noted on it, and ``pending`` goes on."""
        duration = time.monotonic() - self._t0
        grant, self._grant = self._grant, None
        self.job.history.append((self.name, tuple(grant["nodes"]), grant["seq"], self._wall0, time.time()))
        released = False
        try:
            self.job._release(self.name, grant, duration, failed=pending is not None,
                              restart=pending is not None and self.restart_on_failure and not self.job.staleness)
            released = pending is None  # a failed phase is due again: it counts as not begun
        except Exception as err:
            if pending is None:
                raise
            log.warning("job %s: releasing the %s grant failed after %s: %s: %s", self.job.job_id, self.name,
                        type(pending).__name__, type(err).__name__, err)
            pending.add_note(f"rollmux: releasing the {self.name} grant failed too: {type(err).__name__}: {err}")
        finally:
            self.job._end_turn(self.name, True, released)


def _spec_dict(spec: dict | Job) -> dict:
    """The spec as JSON-ready values: numpy scalars as Python numbers; a number that JSON
    cannot carry (NaN, infinity) refused naming its field (the service checks the rest)."""
    if isinstance(spec, Job):
        d = dataclasses.asdict(spec)
        spec = {k: d[k] for k in SPEC_FIELDS}
    elif not isinstance(spec, dict):
        raise TypeError(f"spec: expected a dict of job fields or a rollmux.model.Job, got {type(spec).__name__}")
    out = {}
    for key, value in spec.items():
        if not isinstance(value, (str, int, float)) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()  # numpy scalars (numpy.bool_ too) and 0-d arrays or tensors
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"spec.{key}={value!r}: expected a finite number")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"spec.{key}={value!r}: expected a number, a string, true/false or null, not a "
                            f"{type(value).__name__}")
        out[key] = value
    return out


def _segment(name: str, value: Any) -> str:
    """A job id or node name for a URL path: refused unless it is one (``../victim``, or
    ``victim?x``, would name another job; ``ValueError`` naming ``name``, nothing sent)."""
    if not isinstance(value, str) or not re.fullmatch(JOB_ID_PATTERN, value):
        raise ValueError(f"{name}={value!r}: expected 1-128 of A-Z a-z 0-9 . _ -, starting alphanumeric")
    return value


def _kind(token: Any) -> str:
    """What a refused token is, without showing it."""
    if not isinstance(token, str):
        return type(token).__name__
    return f"a string of {len(token)} characters" + (" with a space or line break" if re.search(r"\s", token)
                                                     else " with other than printable ASCII")


#: what a bearer token is: one word of printable ASCII (a second line of a token file is not part of it)
TOKEN_PATTERN = re.compile(r"[\x21-\x7e]+")


def leave(stack: contextlib.ExitStack, failure: BaseException | None) -> None:
    """Close ``stack`` holding an adapter's phase: with ``failure`` (what its trainer
    raised) the phase is left as the ``with`` block it stands for would be, so it is
    released as failed."""
    if failure is None:
        stack.close()
    else:
        stack.__exit__(type(failure), failure, failure.__traceback__)


def _host(url: str) -> str:
    """The host ``url`` names ("" for none, as in ``http://``, or for a url that is not one)."""
    try:
        return httpx.URL(url).host
    except httpx.InvalidURL:
        return ""


def _check_token(token: Any, or_none: str = "") -> None:
    """Refuse (``ValueError`` naming ``token``, never showing it) what no bearer token is."""
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        raise ValueError("token: expected one word of printable ASCII (no spaces or line breaks; a token file "
                         f"holds one line){or_none}; got {_kind(token)}")


def _is_seconds(value: Any, low: float = 0.0, high: float = DAY_S) -> bool:
    """Whether ``value`` is a number of seconds from ``low`` to ``high`` (not NaN, not a bool)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and low <= value <= high


def _fraction(value: Any, name: str = "fraction") -> float:
    """``value`` as a float from 0 to 1 (a numpy scalar too); else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"{name}={value!r}: expected a number from 0 to 1")
    return float(value)


def _check_seconds(name: str, value: Any, low: float, high: float) -> None:
    if not _is_seconds(value, low, high):
        raise ValueError(f"{name}={value!r}: expected seconds from {low:g} to {high:g}")


def _check_on_move(on_move: Any) -> None:
    if on_move is not None and not callable(on_move):
        raise TypeError(f"on_move={on_move!r}: expected a callable taking the move directive, or None")


def _raise_if_permanent(exc: httpx.TransportError, url: str) -> None:
    """What a retry cannot fix, raised now: a certificate that does not verify
    (``UntrustedServer``), or an https url to a server that speaks plain http."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
        raise UntrustedServer(f"{url}: the server's TLS certificate is not trusted ({exc}); if it is self-signed "
                              f"or from a private CA, pass ca_file= (or set $ROLLMUX_CA_FILE) to the PEM file of it "
                              f"or of that CA; if it has expired or names another host, the service needs a new "
                              f"one") from None
    if "WRONG_VERSION_NUMBER" in str(exc) and url.startswith("https:"):
        raise WrongScheme(f"{url}: the server does not speak TLS there ({exc}); is it http://?") from None


def _retriable(status: int) -> bool:
    """A status the SDK asks again for: the server failed (5xx) or timed out on the body (408)."""
    return status >= 500 or status == 408


def _answer(r: httpx.Response, shape: type = dict, keys: tuple[str, ...] = ()) -> Any:
    """The JSON of a 2xx answer: a ``shape`` (a JSON object, or a list) holding ``keys``. A 4xx
    is raised: a ``JobEnded`` subclass for a 410 naming how the job ended, else ``RequestRejected``.
    Anything else (another status, a body that is not JSON, JSON of another shape, a refusal
    that is not RollMux's JSON object) raises ``NotRollMux``."""
    if 300 <= r.status_code < 400:
        raise NotRollMux(r, "a redirect")
    try:
        body = r.json()
    except ValueError:
        raise NotRollMux(r, "not JSON") from None
    if r.status_code < 300:
        if not isinstance(body, shape):
            raise NotRollMux(r, f"expected a JSON {'object' if shape is dict else 'list'}")
        missing = [key for key in keys if key not in body]
        if missing:
            raise NotRollMux(r, f"without {', '.join(missing)}")
        return body
    if not isinstance(body, dict):
        raise NotRollMux(r, "a refusal that is not a JSON object")
    state, path = body.get("state"), r.request.url.path.split("/")  # a job's call: /v1/jobs/ID[/...]
    if r.status_code == 410 and isinstance(state, str) and state in _ENDED and path[2:3] == ["jobs"] and len(path) > 3:
        raise _ENDED[state](path[3], state, body.get("reason", ""))
    raise RequestRejected(r.status_code, body.get("field", "body"), body.get("reason", r.text), body.get("code"))
