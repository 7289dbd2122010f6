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

Moves (``movable=True``, a consolidating control plane): the handle's ``on_move``
is ``_Workers.move``. At the iteration boundary where the service moved the job, the
old workers export their parked state (the StateCache host buffers, the optimizer's
non-tensor state and the update counter) into the Ray object store, a new
``RayJobRunner`` starts the workers on the directive's nodes, they import that state,
and the old workers go. The next phase is granted on the new nodes and the run goes
on where it left off; ``JobRun.moves`` records each hand-off and its duration.
``replay_job`` runs the same job in this process without Ray or the control plane,
for checking that a moved run is bit for bit the run without the move.

``warm_start_weights`` runs the supervised warm-up once, in the calling process, so
that every run of a profile (solo or multiplexed) starts from the same weights.
Everything measured comes back in a ``JobRun``: phase spans as the SDK saw them
(grant arrival to release, wall-clock), per-iteration rewards and training stats,
and the cache's switch records.
"""
from __future__ import annotations

import contextlib
import time
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
    moves: list[dict] = field(default_factory=list)
    iterations_done: int = 0

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


class _Workers:
    """A job's two worker actors and the runner that placed them; ``move`` re-places them.

    The driver reaches its workers only through this object, so a move between two
    phases swaps them for every later phase.
    """

    def __init__(self, job_id: str, profile: JobProfile, placement: dict, weights: dict[str, torch.Tensor],
                 timeout_s: float = 120.0) -> None:
        self.job_id = job_id
        self.profile = profile
        self.timeout_s = timeout_s
        self.runner: RayJobRunner | None = None
        self.where = (tuple(placement["rollout_nodes"]), tuple(placement["train_nodes"]))
        self._start(placement["group_id"])
        self.params, _ = ray.get([self.roll.setup.remote(profile, weights), self.train.setup.remote(profile, weights)])
        self.moves: list[dict] = []

    def _start(self, group_id: str) -> None:
        plan = Placement(group_id, *self.where)
        self.runner = RayJobRunner(self.job_id, plan, RolloutWorker, TrainWorker, timeout_s=self.timeout_s).start()
        self.roll, self.train = self.runner.workers(ROLLOUT)[0], self.runner.workers(TRAIN)[0]

    def actor(self, pool: str) -> Any:
        return self.roll if pool == ROLLOUT else self.train

    def move(self, directive: dict) -> None:
        """``on_move``: hand the job's parked state to new workers on the directive's nodes.

        The exports are objects in the Ray object store, owned by this driver, so they
        outlive the old actors; the old runner goes first (its reservation bears the
        job's name), then the new one starts and its workers import the state.
        """
        t0, wall0 = time.perf_counter(), time.time()
        exports = [self.roll.export_state.remote(), self.train.export_state.remote()]
        ray.wait(exports, num_returns=2, timeout=self.timeout_s, fetch_local=False)
        sizes = ray.get([self.roll.__ray_call__.remote(_state_bytes, exports[0]),
                         self.train.__ray_call__.remote(_state_bytes, exports[1])])
        old = self.where
        self.runner.shutdown()
        self.where = (tuple(directive["rollout_nodes"]), tuple(directive["train_nodes"]))
        self._start(directive["to_group"])
        ray.get([self.roll.import_state.remote(self.profile, exports[0]),
                 self.train.import_state.remote(self.profile, exports[1])], timeout=self.timeout_s)
        self.moves.append({"job_id": self.job_id, "from_group": directive["from_group"],
                           "to_group": directive["to_group"], "from_nodes": list(old[0] + old[1]),
                           "to_nodes": list(self.where[0] + self.where[1]), "state_bytes": sum(sizes),
                           "at": wall0, "handoff_s": time.perf_counter() - t0})

    def export_train_state(self) -> dict:
        return ray.get(self.train.export_state.remote())

    def shutdown(self) -> None:
        if self.runner is not None:
            self.runner.shutdown()


def _state_bytes(_actor: Any, state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state["slots"].values())


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
        self.actor = actor  # an actor handle, or a ``_Workers`` (the job's current worker of ``pool``)
        self.job_id = job_id
        self.pool = pool
        self.log = log

    @contextlib.contextmanager
    def resident(self, key: str, device: str) -> Iterator[None]:
        actor = self.actor.actor(self.pool) if isinstance(self.actor, _Workers) else self.actor
        self._note(ray.get(actor.switch_in.remote()))
        try:
            yield
        finally:
            self._note(ray.get(actor.switch_out.remote()))

    def _note(self, record: Any) -> None:
        self.log.append(Switch(self.job_id, self.pool, record.direction, record.path, record.bytes, record.seconds))


def job_spec(job_id: str, profile: JobProfile, t_roll_s: float, t_train_s: float,
             iterations: int | None = None) -> dict:
    """The control-plane spec of a job (one node per pool; the demo's nodes stand for 8-GPU machines).

    ``iterations``: the job's target, which the service counts (it departs the job after
    its last iteration) and which the whole-run SLO check of a move needs.
    """
    spec = {"job_id": job_id, "t_roll_s": t_roll_s, "t_train_s": t_train_s, "slo": profile.slo,
            "model": profile.name}
    if iterations is not None:
        spec["iterations"] = iterations
    return spec


def run_job(job: JobHandle, profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor],
            placed_timeout_s: float = 300.0, on_iteration: Any = None, movable: bool = False,
            final_state: dict | None = None) -> JobRun:
    """Run a submitted job to completion (``Client.submit`` made ``job``); returns its measurements.

    ``on_iteration(job_id, iteration, reward)``, if given, is called after every train phase.
    ``movable``: the handle's ``on_move`` hands the workers and their state to the nodes
    of a move directive (``_Workers.move``). ``final_state``, if given, receives the
    training worker's exported state after the last iteration (key ``job_id``).
    The job is cancelled (and its workers stopped) if anything raises.
    """
    job_id = job.job_id
    workers = None
    try:
        placement = job.wait_placed(timeout_s=placed_timeout_s)
        workers = _Workers(job_id, profile, placement, weights)
        if movable:
            job.on_move = workers.move
        run = JobRun(job_id, profile.name, iterations, placement, workers.params, moves=workers.moves)
        states = {pool: RemoteState(workers, job_id, pool, run.switches) for pool in (ROLLOUT, TRAIN)}
        latest = None
        for step in range(iterations):
            with job.phase(ROLLOUT, state=states[ROLLOUT], device="cpu"):
                batch, stats_ref = workers.roll.rollout.options(num_returns=2).remote(step, latest)
                stats = ray.get(stats_ref)
            with job.phase(TRAIN, state=states[TRAIN], device="cpu"):
                latest, train_ref = workers.train.train.options(num_returns=2).remote(batch)
                run.train_stats.append(ray.get(train_ref))
            run.rewards.append(stats["reward"])
            run.exact.append(stats["exact"])
            run.iterations_done = step + 1
            if on_iteration is not None:
                on_iteration(job_id, step, stats["reward"])
        if final_state is not None:
            final_state[job_id] = workers.export_train_state()
        job.complete()
    except BaseException:
        with contextlib.suppress(Exception):
            job.cancel()
        raise
    finally:
        job.close()
        if workers is not None:
            workers.shutdown()
    run.spans = [PhaseSpan(job_id, name, nodes, i // 2, start, end)
                 for i, (name, nodes, _seq, start, end) in enumerate(job.history)]
    return run


def replay_job(profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor]) -> tuple[list[float], dict]:
    """The same job run in this process: no Ray, no control plane, no move.

    Same workers, seeds, data order and number of updates, with the same warm switch
    around every phase, one torch thread. Returns (reward per iteration, the training
    worker's exported state after the last iteration).
    """
    from rollmux.runtime.ray_adapter import WorkerInfo

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        roll = RolloutWorker(WorkerInfo(profile.name, ROLLOUT, "replay", 0))
        train = TrainWorker(WorkerInfo(profile.name, TRAIN, "replay", 0))
        roll.setup(profile, weights)
        train.setup(profile, weights)
        rewards, latest = [], None
        for step in range(iterations):
            roll.switch_in()
            batch, stats = roll.rollout(step, latest)
            roll.switch_out()
            train.switch_in()
            latest, _ = train.train(batch)
            train.switch_out()
            rewards.append(stats["reward"])
        return rewards, train.export_state()
    finally:
        torch.set_num_threads(threads)
