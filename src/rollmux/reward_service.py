"""A shared, autoscaling reward service on Ray Serve (the RollArt idea: stateless
reward computation moved out of every job's rollout workers into one elastic service).

* ``RewardService``: a Serve deployment scoring a batch of ``(task, prompt,
  completion)`` items, ``kind`` per request: ``"exact"`` (the demo tasks' verifiers,
  ``rollmux.reward_model.exact_rewards``, bit for bit what a worker computes itself) or
  ``"learned"`` (a tiny ``RewardModel`` fitted at service start-up; scores in (0, 1)).
  Replicas claim ``REPLICA_CPUS`` CPUs each and autoscale between ``min_replicas`` and
  ``max_replicas`` on ongoing requests, with delays of seconds, so a burst scales the
  service up and its end scales it back down. Over HTTP (when started with a port) it
  takes ``POST /rewards`` with ``{"items": [[task, prompt, completion], ...], "kind": ...}``
  (``RewardRequest``) and answers ``{"rewards": [...]}``, or 422 with
  ``{"error": ..., "field": ...}`` naming the bad field (invalid JSON, a missing or
  mistyped ``items``, an unknown ``kind`` or task, a prompt not of its task's form, a
  completion with a character outside the tasks' vocabulary).
  Through a handle, the same misuse raises ``SpecError`` naming the field
  (``rollmux.reward_model.check_items``).
* ``start_service(...)`` deploys it on the connected Ray cluster, waits at most
  ``ready_timeout_s`` for a replica to run, and returns its handle; when none is ready
  by then (e.g. no CPU to place one) it deletes the app and raises
  ``RewardServiceTimeout``. ``running_service(...)`` is the same as a context manager
  that also starts Ray when needed and always shuts Serve (and the Ray it started) down.
* ``RewardClient(app, timeout_s)``: what every job's rollout worker holds;
  ``score(items, kind)`` calls the service through a ``DeploymentHandle``
  (``serve.get_app_handle``), raises ``RewardServiceTimeout`` when no rewards come
  within ``timeout_s``, and records each call's latency in ``latencies_ms``.
* ``ReplicaMonitor``: a background thread polling ``serve.status()`` for the number of
  running replicas (stop it before ``serve.shutdown()``: a poll after Ray is down would
  start a new local Ray); ``summary(latencies_ms, monitor)`` gives the report's
  ``{"calls", "p50_ms", "p99_ms", "replicas_max", "replicas_over_time"}``.

Every listener is on 127.0.0.1; without ``http_port`` no HTTP proxy starts at all.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Literal

import numpy as np
import ray
import torch
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.schema import ApplicationStatus
from starlette.responses import JSONResponse

from rollmux.errors import RollMuxError, SpecError
from rollmux.reward_model import Item, RewardModel, check_items, exact_rewards, model_rewards, train_reward_model
from rollmux.runtime.ray_start import start_ray

APP = "rewards"
DEPLOYMENT = "RewardService"
KINDS = ("exact", "learned")
REPLICA_CPUS = 0.25
# A replica being stopped drains its calls (milliseconds each) for at most this long; it also
# bounds deleting a replica that was never placed (Serve waits the whole drain for it).
REPLICA_DRAIN_S = 2.0


class RewardServiceTimeout(RollMuxError, TimeoutError):
    """The reward service did not answer in time: no replica was ready within
    ``start_service``'s ``ready_timeout_s`` (the app has been deleted), or a call got no
    rewards within ``RewardClient``'s ``timeout_s`` (the call has been cancelled). The
    message names the app, the timeout and why."""


class RewardRequest(BaseModel):
    """The body of ``POST /rewards``: ``[task, prompt, completion]`` strings and the reward
    kind; any other key is refused (a misspelt ``kind`` would otherwise score as ``exact``)."""

    model_config = ConfigDict(extra="forbid")
    items: list[tuple[StrictStr, StrictStr, StrictStr]]
    kind: Literal["exact", "learned"] = "exact"


def _check_seconds(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise SpecError(field, value, "a positive, finite number of seconds")


def _check_scaling(min_replicas: object, max_replicas: object, target_ongoing_requests: object) -> None:
    """Raises ``SpecError`` unless 0 <= ``min_replicas`` <= ``max_replicas``, ``max_replicas`` >= 1
    (integers) and ``target_ongoing_requests`` is a positive, finite number."""
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise SpecError("min_replicas", min_replicas, "an integer >= 0")
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < max(1, min_replicas):
        raise SpecError("max_replicas", max_replicas, f"an integer >= 1 and >= min_replicas ({min_replicas})")
    if isinstance(target_ongoing_requests, bool) or not isinstance(target_ongoing_requests, (int, float)) \
            or not (math.isfinite(target_ongoing_requests) and target_ongoing_requests > 0):
        raise SpecError("target_ongoing_requests", target_ongoing_requests, "a positive, finite number")


@serve.deployment(name=DEPLOYMENT, ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=2,
                  graceful_shutdown_timeout_s=REPLICA_DRAIN_S)
class RewardService:
    """One replica: the exact verifiers and the learned model (``weights``, a state_dict)."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        torch.set_num_threads(1)
        self.model = RewardModel()
        self.model.load_state_dict(weights)

    def score(self, items: list[Item], kind: str = "exact") -> list[float]:
        """One reward per item, in order ([] for none); raises ``SpecError`` naming the field
        on an unknown ``kind`` or a bad item (``check_items``)."""
        if kind not in KINDS:
            raise SpecError("kind", kind, f"one of {KINDS}")
        check_items(items)
        return exact_rewards(items) if kind == "exact" else model_rewards(self.model, items)

    async def __call__(self, request) -> dict | JSONResponse:
        """``POST /rewards`` (a ``RewardRequest``): ``{"rewards": [...]}``, or 422 with
        ``{"error": ..., "field": ...}`` naming the first bad field (``body`` for invalid
        JSON or a body that is not an object, else e.g. ``items``, ``items[0].prompt``)."""
        try:
            body = RewardRequest.model_validate_json(await request.body())
            return {"rewards": self.score(body.items, body.kind)}
        except ValidationError as err:
            first = err.errors()[0]
            field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".") or "body"
            return JSONResponse({"error": f"{field}: {first['msg']}", "field": field}, status_code=422)
        except SpecError as err:
            return JSONResponse({"error": str(err), "field": err.field}, status_code=422)


def start_service(max_replicas: int = 4, min_replicas: int = 1, target_ongoing_requests: float = 1.0,
                  upscale_delay_s: float = 1.0, downscale_delay_s: float = 3.0, model_steps: int = 200,
                  seed: int = 0, weights: dict[str, torch.Tensor] | None = None,
                  http_port: int | None = None, ready_timeout_s: float = 60.0) -> DeploymentHandle:
    """Deploy the service as the Serve application ``APP`` on the connected cluster and
    return its handle once a replica runs. The learned model has ``weights`` (a
    ``RewardModel`` state_dict), or, when None, is fitted here (``train_reward_model(model_steps, seed)``).

    Raises ``SpecError`` (before anything starts, the model fit included) on a ``ready_timeout_s``
    that is not a positive, finite number of seconds, on ``min_replicas`` / ``max_replicas`` not
    integers with 0 <= min <= max and max >= 1, or on a ``target_ongoing_requests`` that is not a
    positive, finite number; and ``RewardServiceTimeout`` when no replica runs
    within it (e.g. no ``REPLICA_CPUS`` CPUs free to place one); the app is then deleted
    (Serve itself stays up, as ``running_service`` shuts it down).
    """
    _check_seconds("ready_timeout_s", ready_timeout_s)
    _check_scaling(min_replicas, max_replicas, target_ongoing_requests)
    if weights is None:
        model, _ = train_reward_model(model_steps, seed)
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    autoscaling = {"min_replicas": min_replicas, "initial_replicas": max(min_replicas, 1),
                   "max_replicas": max_replicas, "target_ongoing_requests": target_ongoing_requests,
                   "upscale_delay_s": upscale_delay_s, "downscale_delay_s": downscale_delay_s,
                   "downscale_to_zero_delay_s": downscale_delay_s, "look_back_period_s": 2.0,
                   # Deprecated in Ray 2.60 but still the metrics push interval (default 10 s).
                   "metrics_interval_s": 0.5}
    if http_port is None:
        serve.start(proxy_location="Disabled")
    else:
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": http_port})
    app = RewardService.options(autoscaling_config=autoscaling).bind(weights)
    target = serve.RunTarget(app, name=APP, route_prefix=None if http_port is None else "/rewards")
    handle = serve.run_many([target], wait_for_applications_running=False)[0]
    deadline = time.monotonic() + ready_timeout_s
    while (status := serve.status().applications[APP]).status != ApplicationStatus.RUNNING:
        if status.status == ApplicationStatus.DEPLOY_FAILED:
            serve.delete(APP)
            raise RuntimeError(f"deploying the reward service app {APP!r} failed: {status.message}")
        if time.monotonic() >= deadline:
            free, total = ray.available_resources().get("CPU", 0.0), ray.cluster_resources().get("CPU", 0.0)
            why = "no resources to place a replica: " if free < REPLICA_CPUS else "replicas still starting: "
            serve.delete(APP)
            raise RewardServiceTimeout(
                f"reward service app {APP!r}: no replica ready after {ready_timeout_s:g} s ({why}each claims "
                f"{REPLICA_CPUS:g} CPU, the cluster has {free:g} of {total:g} CPUs free); app deleted")
        time.sleep(0.2)
    return handle


@contextlib.contextmanager
def running_service(num_cpus: int = 2, **options) -> Iterator[DeploymentHandle]:
    """``start_service(**options)`` for the body of a ``with``; starts a local Ray (on
    127.0.0.1, ``num_cpus`` CPUs) if none is connected. Serve, and the Ray started
    here, are shut down on exit even if the body raised."""
    started = not ray.is_initialized()
    if started:
        start_ray(lambda: ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                                   log_to_driver=False, _node_ip_address="127.0.0.1"))
    try:
        yield start_service(**options)
    finally:
        try:
            serve.shutdown()
        finally:
            if started:
                ray.shutdown()


class RewardClient:
    """A job's connection to the service: ``score`` blocks for one batch's rewards, at
    most ``timeout_s`` (a positive, finite number of seconds, else ``SpecError``).

    Built lazily inside a Ray worker or driver connected to the cluster running ``app``.
    ``latencies_ms`` has one entry per answered call (round trip as the caller saw it).
    """

    def __init__(self, app: str = APP, timeout_s: float = 30.0) -> None:
        _check_seconds("timeout_s", timeout_s)
        self.app = app
        self.timeout_s = timeout_s
        self.handle: DeploymentHandle = serve.get_app_handle(app)
        self.latencies_ms: list[float] = []

    def score(self, items: list[Item], kind: str = "exact") -> list[float]:
        """The service's rewards of ``items`` (``RewardService.score``; its ``SpecError``
        on a bad ``kind`` or item propagates); raises ``RewardServiceTimeout`` and cancels the
        call when they do not come within ``timeout_s`` (e.g. no replica of the app can run)."""
        t0 = time.perf_counter()
        response = self.handle.score.remote(items, kind)
        try:
            rewards = response.result(timeout_s=self.timeout_s)
        except TimeoutError as err:
            response.cancel()
            raise RewardServiceTimeout(f"reward service app {self.app!r}: no rewards after {self.timeout_s:g} s "
                                       "(the app is overloaded, has no running replica, or is gone)") from err
        self.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        return rewards


def running_replicas(app: str = APP, deployment: str = DEPLOYMENT) -> int:
    """Replicas of ``deployment`` in state RUNNING (0 while the app is not deployed)."""
    application = serve.status().applications.get(app)
    if application is None or deployment not in application.deployments:
        return 0
    return int(application.deployments[deployment].replica_states.get("RUNNING", 0))


class ReplicaMonitor:
    """Polls ``running_replicas`` every ``interval_s`` in a daemon thread between
    ``start()`` and ``stop()``; ``samples`` holds [seconds since start, replicas].

    Stop it before ``serve.shutdown()`` / ``ray.shutdown()`` (in a ``finally``): a poll after
    Ray is down would start a new local Ray. A poll that raises ends the thread quietly
    (``samples`` keeps what it had). ``stop()`` returns ``samples`` and may be called any
    number of times, also before ``start()`` (nothing to stop); ``elapsed()`` is 0.0 before
    ``start()``."""

    def __init__(self, app: str = APP, deployment: str = DEPLOYMENT, interval_s: float = 0.25) -> None:
        self.app, self.deployment, self.interval_s = app, deployment, interval_s
        self.samples: list[list[float]] = []
        self._t0: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reward-replicas", daemon=True)

    def start(self) -> ReplicaMonitor:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> list[list[float]]:
        self._stop.set()
        if self._t0 is not None:
            self._thread.join()
        return self.samples

    def elapsed(self) -> float:
        """Seconds since ``start()``, on the clock of ``samples`` (0.0 before ``start()``)."""
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    def latest(self) -> int:
        return int(self.samples[-1][1]) if self.samples else 0

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                n = running_replicas(self.app, self.deployment)
                self.samples.append([round(self.elapsed(), 3), n])
                self._stop.wait(self.interval_s)
        except Exception:  # Serve or Ray went away under the poll: stop sampling, quietly
            return


def summary(latencies_ms: list[float], monitor: ReplicaMonitor) -> dict:
    """The ``summary.json["reward_service"]`` record of a run."""
    lat = np.asarray(latencies_ms, dtype=float)
    over_time = monitor.samples
    return {"calls": int(lat.size),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "replicas_max": max((int(n) for _, n in over_time), default=0),
            "replicas_over_time": over_time}
