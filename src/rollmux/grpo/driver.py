"""One GRPO job's driver: register with the control plane, start the pinned Ray
workers, run the phases under RollMux grants, and record what happened.

``run_job`` is the whole life of a job::

    Client.submit(job_spec(...)) -> wait_placed -> RayJobRunner(placement).start() -> setup workers
    repeat `iterations` times:
        with job.phase("rollout", state=RemoteState(rollout worker)):   # grant, then load
            batch = rollout(step, latest weights)                         # then offload
        with job.phase("train", state=RemoteState(train worker)):
            weights = train(batch)                                        # moves to the rollout worker
    job.complete(); workers shut down

``warm_start_weights`` runs the supervised warm-up once, in the calling process, so
that every run of a profile (solo or multiplexed) starts from the same weights.
Everything measured comes back in a ``JobRun``: phase spans as the SDK saw them
(grant arrival to release, wall-clock), per-iteration rewards and training stats,
and the cache's switch records.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import ray
import torch

from rollmux.grpo.policy import build_policy, warm_up
from rollmux.grpo.profiles import JobProfile
from rollmux.grpo.task import get_task
from rollmux.grpo.workers import RolloutWorker, TrainWorker
from rollmux.model import ROLLOUT, TRAIN
from rollmux.plan_state import Placement
from rollmux.runtime.ray_adapter import RayJobRunner
from rollmux.runtime.sdk import JobHandle


@dataclass(slots=True)
class PhaseSpan:
    """One granted phase as the job's SDK measured it (wall-clock seconds)."""

    job_id: str
    pool: str
    nodes: tuple[str, ...]
    iteration: int
    start: float
    end: float


@dataclass(slots=True)
class Switch:
    """One warm switch of a worker's state (a StateCache SwitchRecord, flattened)."""

    job_id: str
    pool: str
    direction: str
    path: str
    bytes: int
    seconds: float


@dataclass(slots=True)
class JobRun:
    """Everything one run of one job measured."""

    job_id: str
    profile: str
    iterations: int
    placement: dict
    params: int
    spans: list[PhaseSpan] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    exact: list[float] = field(default_factory=list)
    train_stats: list[dict] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.spans[0].start

    @property
    def end(self) -> float:
        return self.spans[-1].end

    @property
    def mean_iteration_s(self) -> float:
        """Wall time from the first grant to the last release, per iteration (waits included)."""
        return (self.end - self.start) / self.iterations

    def phase_seconds(self, pool: str) -> float:
        """Node-seconds this job held in ``pool``."""
        return sum((s.end - s.start) * len(s.nodes) for s in self.spans if s.pool == pool)

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_iteration_s": self.mean_iteration_s}


def warm_start_weights(profile: JobProfile) -> dict[str, torch.Tensor]:
    """The policy after the profile's supervised warm-up (deterministic for a profile)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_policy(profile.model, profile.seed)
        warm_up(model, get_task(profile.task), profile.warmup_steps, 64, profile.warmup_lr, profile.seed)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


class RemoteState:
    """The SDK's ``state=`` object for a worker actor: ``resident`` loads the actor's
    cached state when the phase is granted and offloads it before the grant goes back,
    recording both switches."""

    def __init__(self, actor: Any, job_id: str, pool: str, log: list[Switch]) -> None:
        self.actor = actor
        self.job_id = job_id
        self.pool = pool
        self.log = log

    @contextlib.contextmanager
    def resident(self, key: str, device: str) -> Iterator[None]:
        self._note(ray.get(self.actor.switch_in.remote()))
        try:
            yield
        finally:
            self._note(ray.get(self.actor.switch_out.remote()))

    def _note(self, record: Any) -> None:
        self.log.append(Switch(self.job_id, self.pool, record.direction, record.path, record.bytes, record.seconds))


def job_spec(job_id: str, profile: JobProfile, t_roll_s: float, t_train_s: float) -> dict:
    """The control-plane spec of a job (one node per pool; the demo's nodes stand for 8-GPU machines)."""
    return {"job_id": job_id, "t_roll_s": t_roll_s, "t_train_s": t_train_s, "slo": profile.slo,
            "model": profile.name}


def run_job(job: JobHandle, profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor],
            placed_timeout_s: float = 300.0, on_iteration: Any = None) -> JobRun:
    """Run a submitted job to completion (``Client.submit`` made ``job``); returns its measurements.

    ``on_iteration(job_id, iteration, reward)``, if given, is called after every train phase.
    The job is cancelled (and its workers stopped) if anything raises.
    """
    job_id = job.job_id
    runner = None
    try:
        placement = job.wait_placed(timeout_s=placed_timeout_s)
        plan = Placement(placement["group_id"], tuple(placement["rollout_nodes"]), tuple(placement["train_nodes"]))
        runner = RayJobRunner(job_id, plan, RolloutWorker, TrainWorker, timeout_s=120).start()
        roll, train = runner.workers(ROLLOUT)[0], runner.workers(TRAIN)[0]
        params, _ = ray.get([roll.setup.remote(profile, weights), train.setup.remote(profile, weights)])
        run = JobRun(job_id, profile.name, iterations, placement, params)
        states = {pool: RemoteState(actor, job_id, pool, run.switches) for pool, actor in ((ROLLOUT, roll), (TRAIN, train))}
        latest = None
        for step in range(iterations):
            with job.phase(ROLLOUT, state=states[ROLLOUT], device="cpu"):
                batch, stats_ref = roll.rollout.options(num_returns=2).remote(step, latest)
                stats = ray.get(stats_ref)
            with job.phase(TRAIN, state=states[TRAIN], device="cpu"):
                latest, train_ref = train.train.options(num_returns=2).remote(batch)
                run.train_stats.append(ray.get(train_ref))
            run.rewards.append(stats["reward"])
            run.exact.append(stats["exact"])
            if on_iteration is not None:
                on_iteration(job_id, step, stats["reward"])
        job.complete()
    except BaseException:
        with contextlib.suppress(Exception):
            job.cancel()
        raise
    finally:
        job.close()
        if runner is not None:
            runner.shutdown()
    run.spans = [PhaseSpan(job_id, name, nodes, i // 2, start, end)
                 for i, (name, nodes, _seq, start, end) in enumerate(job.history)]
    return run
