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
  and answers ``{"rewards": [...]}``.
* ``start_service(...)`` deploys it (``serve.run``) on the connected Ray cluster and
  returns its handle; ``running_service(...)`` is the same as a context manager that
  also starts Ray when needed and always shuts Serve (and the Ray it started) down.
* ``RewardClient(app)``: what every job's rollout worker holds; ``score(items, kind)``
  calls the service through a ``DeploymentHandle`` (``serve.get_app_handle``) and
  records each call's latency in ``latencies_ms``.
* ``ReplicaMonitor``: a background thread polling ``serve.status()`` for the number of
  running replicas; ``summary(latencies_ms, monitor)`` gives the report's
  ``{"calls", "p50_ms", "p99_ms", "replicas_max", "replicas_over_time"}``.

Every listener is on 127.0.0.1; without ``http_port`` no HTTP proxy starts at all.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import numpy as np
import ray
import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from rollmux.reward_model import Item, RewardModel, exact_rewards, model_rewards, train_reward_model
from rollmux.runtime.ray_start import start_ray

APP = "rewards"
DEPLOYMENT = "RewardService"
KINDS = ("exact", "learned")
REPLICA_CPUS = 0.25


@serve.deployment(name=DEPLOYMENT, ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=2)
class RewardService:
    """One replica: the exact verifiers and the learned model (``weights``, a state_dict)."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        torch.set_num_threads(1)
        self.model = RewardModel()
        self.model.load_state_dict(weights)

    def score(self, items: list[Item], kind: str = "exact") -> list[float]:
        """One reward per item, in order; raises ValueError on an unknown ``kind``."""
        if kind == "exact":
            return exact_rewards(items)
        if kind == "learned":
            return model_rewards(self.model, items)
        raise ValueError(f"kind: {kind!r}, expected one of {KINDS}")

    async def __call__(self, request) -> dict:
        body = await request.json()
        return {"rewards": self.score([tuple(i) for i in body["items"]], body.get("kind", "exact"))}


def start_service(max_replicas: int = 4, min_replicas: int = 1, target_ongoing_requests: float = 1.0,
                  upscale_delay_s: float = 1.0, downscale_delay_s: float = 3.0, model_steps: int = 200,
                  seed: int = 0, weights: dict[str, torch.Tensor] | None = None,
                  http_port: int | None = None) -> DeploymentHandle:
    """Deploy the service as the Serve application ``APP`` on the connected cluster and
    return its handle. The learned model has ``weights`` (a ``RewardModel`` state_dict),
    or, when None, is fitted here (``train_reward_model(model_steps, seed)``)."""
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
    return serve.run(app, name=APP, route_prefix=None if http_port is None else "/rewards")


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
    """A job's connection to the service: ``score`` blocks for one batch's rewards.

    Built lazily inside a Ray worker or driver connected to the cluster running ``app``.
    ``latencies_ms`` has one entry per call (round trip as the caller saw it).
    """

    def __init__(self, app: str = APP) -> None:
        self.app = app
        self.handle: DeploymentHandle = serve.get_app_handle(app)
        self.latencies_ms: list[float] = []

    def score(self, items: list[Item], kind: str = "exact") -> list[float]:
        t0 = time.perf_counter()
        rewards = self.handle.score.remote(items, kind).result()
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
    ``start()`` and ``stop()``; ``samples`` holds [seconds since start, replicas]."""

    def __init__(self, app: str = APP, deployment: str = DEPLOYMENT, interval_s: float = 0.25) -> None:
        self.app, self.deployment, self.interval_s = app, deployment, interval_s
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reward-replicas", daemon=True)

    def start(self) -> ReplicaMonitor:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def elapsed(self) -> float:
        """Seconds since ``start()``, on the clock of ``samples``."""
        return time.perf_counter() - self._t0

    def latest(self) -> int:
        return int(self.samples[-1][1]) if self.samples else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            n = running_replicas(self.app, self.deployment)
            self.samples.append([round(self.elapsed(), 3), n])
            self._stop.wait(self.interval_s)


def summary(latencies_ms: list[float], monitor: ReplicaMonitor) -> dict:
    """The ``summary.json["reward_service"]`` record of a run."""
    lat = np.asarray(latencies_ms, dtype=float)
    over_time = monitor.samples
    return {"calls": int(lat.size),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "replicas_max": max((int(n) for _, n in over_time), default=0),
            "replicas_over_time": over_time}
