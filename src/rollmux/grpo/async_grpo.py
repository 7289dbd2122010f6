"""Asynchronous GRPO with bounded staleness k (RollArt's trajectory-level asynchrony), on the
demo's real job: the same model, task, sampling, rewards and clipped loss, run by two Ray
actors, one generating and one training, at the same time.

Rule: rollout ``i`` is generated with policy version ``v`` (the number of finished training
steps when it starts) and may start only when ``i - v <= k``. ``k = 0`` is the synchronous
demo loop (rollout i waits for training i-1); with ``k = 1`` rollout i+1 runs while training
i does, with the weights of version i.

* A generator thread drives the ``AsyncRolloutWorker`` actor and puts trajectory batches
  (Ray object refs) into a bounded queue (``maxsize = max(k, 1)``); it blocks on a condition
  until the staleness rule lets the next rollout start and passes the newest weights
  (an object ref the training actor returned, never copied through the driver).
* The trainer (the calling thread) takes the batches in order and runs
  ``AsyncTrainWorker.train_batch`` on each: ``TrainWorker.train`` unchanged, except that the
  batch carries the behaviour policy's token log-probs (``behaviour_logp``, computed by the
  rollout actor right after sampling, under the weights that sampled). ``grpo_loss`` then
  uses rho = exp(logp_current - logp_behaviour), clipped to [1 - 0.2, 1 + 0.2] as in PPO:
  the off-policy correction. Before training, the actor also measures the importance ratio
  of the whole batch under the current policy (``ratio_mean``, ``ratio_out_of_clip``), which
  is exactly 1 for k = 0 (up to float noise) and not for stale batches.

Each batch records its step, the policy version that generated it and the staleness used
(``step - version``, never above k), and wall-clock spans of its generation and training,
from which ``overlap_s`` (time both actors were busy at once) follows.

``reward_before`` / ``reward_after``: the mean exact reward of a fixed evaluation rollout
(steps ``EVAL_STEPS``, never trained on) under the starting and the final weights, the same
for every k.

``run_async_live`` runs the same loop as a job of the live control plane: its two actors
pinned to the job's placement (``RayJobRunner``), each generation inside a rollout grant
and each training inside a training grant, from the two threads (the SDK waits for the
staleness rule, the service grants rollout i+1 while training i runs).
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ContextManager

import ray
import torch

from rollmux.grpo.policy import completion_logprobs
from rollmux.grpo.profiles import JobProfile
from rollmux.grpo.workers import RolloutWorker, TrainWorker
from rollmux.model import ROLLOUT, TRAIN
from rollmux.runtime.ray_adapter import WorkerInfo

EVAL_STEPS = (1_000_000, 1_000_001)


class AsyncRolloutWorker(RolloutWorker):
    """The demo's rollout worker, kept resident, that also returns behaviour log-probs."""

    def setup(self, profile: JobProfile, weights: dict[str, torch.Tensor]) -> int:
        params = super().setup(profile, weights)
        self.switch_in()  # resident for the whole run: no switching in this experiment
        return params

    def generate_batch(self, step: int, weights: dict | None, version: int) -> tuple[dict, dict]:
        """``rollout(step, weights)`` plus the sampling policy's token log-probs; returns (batch, stats)."""
        start = time.time()
        batch, stats = self.rollout(step, weights)
        with torch.no_grad():
            self.policy.eval()
            batch["behaviour_logp"] = completion_logprobs(self.policy, batch["prompts"], batch["completions"])
        stats.update(step=step, version=version, gen_start=start, gen_end=time.time())
        return batch, stats

    def evaluate(self, weights: dict, steps: tuple[int, ...] = EVAL_STEPS) -> float:
        """Mean reward of held-out rollouts under ``weights`` (they stay loaded)."""
        return sum(self.rollout(s, weights)[1]["reward"] for s in steps) / len(steps)

    def reward_latencies(self) -> list[float]:
        """The reward service client's per-call latencies (ms); [] without a service."""
        if self.profile is None or self.profile.reward_service is None or "_reward_client" not in self.__dict__:
            return []
        return list(self._reward_client.latencies_ms)


class AsyncTrainWorker(TrainWorker):
    """The demo's training worker, kept resident, with importance-ratio measurements."""

    def setup(self, profile: JobProfile, weights: dict[str, torch.Tensor]) -> int:
        params = super().setup(profile, weights)
        self.switch_in()
        return params

    def train_batch(self, batch: dict) -> tuple[dict, dict]:
        """``train(batch)`` (clipped ratio against ``behaviour_logp``); returns (weights, stats)."""
        start = time.time()
        clip = self._configured().clip
        with torch.no_grad():
            logp = completion_logprobs(self.policy, batch["prompts"], batch["completions"])
            ratio = torch.exp(logp - batch["behaviour_logp"])
        weights, stats = self.train(batch)
        stats.update(ratio_mean=float(ratio.mean()), ratio_max_dev=float((ratio - 1).abs().max()),
                     ratio_out_of_clip=float(((ratio - 1).abs() > clip).float().mean()),
                     train_start=start, train_end=time.time())
        return weights, stats


@dataclass(slots=True)
class AsyncRun:
    """One asynchronous (or, k = 0, synchronous) run and what it measured."""

    profile: str
    staleness_bound: int
    iterations: int
    batches: list[dict] = field(default_factory=list)   # per iteration: generation and training stats
    reward_before: float = 0.0
    reward_after: float = 0.0
    wall_s: float = 0.0
    reward_latencies_ms: list[float] = field(default_factory=list)

    @property
    def wall_per_iteration_s(self) -> float:
        return self.wall_s / self.iterations

    @property
    def staleness_used(self) -> list[int]:
        return [b["step"] - b["version"] for b in self.batches]

    @property
    def overlap_s(self) -> float:
        """Seconds during which a generation and a training ran at the same time."""
        gens = [(b["gen_start"], b["gen_end"]) for b in self.batches]
        trains = [(b["train_start"], b["train_end"]) for b in self.batches]
        return sum(max(0.0, min(ge, te) - max(gs, ts)) for gs, ge in gens for ts, te in trains)

    def to_dict(self) -> dict:
        gen = sum(b["gen_end"] - b["gen_start"] for b in self.batches)
        train = sum(b["train_end"] - b["train_start"] for b in self.batches)
        d = asdict(self)
        d.pop("reward_latencies_ms")
        return {**d, "wall_per_iteration_s": self.wall_per_iteration_s, "staleness_used": self.staleness_used,
                "max_staleness": max(self.staleness_used, default=0), "overlap_s": self.overlap_s,
                "generation_s": gen, "training_s": train, "rewards": [b["reward"] for b in self.batches]}


def run_async(profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor], staleness: int,
              timeout_s: float = 300.0) -> AsyncRun:
    """Run ``iterations`` GRPO iterations with staleness bound ``staleness`` on the connected Ray
    cluster (two actors claiming no CPU); every wait is bounded by ``timeout_s``."""
    if staleness < 0 or iterations < 1:
        raise ValueError(f"staleness {staleness} must be >= 0 and iterations {iterations} >= 1")
    tag = f"{profile.name}-k{staleness}"
    roller = ray.remote(num_cpus=0)(AsyncRolloutWorker).remote(WorkerInfo(tag, ROLLOUT, "local", 0))
    trainer = ray.remote(num_cpus=0)(AsyncTrainWorker).remote(WorkerInfo(tag, TRAIN, "local", 0))
    run = AsyncRun(profile.name, staleness, iterations)
    try:
        weights_ref = ray.put(weights)
        ray.get([roller.setup.remote(profile, weights_ref), trainer.setup.remote(profile, weights_ref)],
                timeout=timeout_s)
        run.reward_before = ray.get(roller.evaluate.remote(weights_ref), timeout=timeout_s)
        # one untimed generation first: the actor's first generate call pays one-off costs
        ray.get(roller.generate_batch.remote(-1, weights_ref, 0), timeout=timeout_s)
        final = _loop(run, roller, trainer, weights_ref, staleness, timeout_s)
        run.reward_after = ray.get(roller.evaluate.remote(final), timeout=timeout_s)
        run.reward_latencies_ms = ray.get(roller.reward_latencies.remote(), timeout=timeout_s)
    finally:
        for actor in (roller, trainer):
            ray.kill(actor)
    return run


def run_async_live(job: Any, profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor],
                   timeout_s: float = 300.0) -> AsyncRun:
    """``iterations`` asynchronous GRPO iterations of ``job`` (an SDK handle of a job submitted
    with staleness k >= 1) under the live control plane, its actors on its pinned nodes; the
    job completes (or, if anything raises, is cancelled) and its actors stop."""
    from rollmux.plan_state import Placement
    from rollmux.runtime.ray_adapter import RayJobRunner

    run = AsyncRun(profile.name, job.staleness, iterations)
    with job.lifetime():
        where = job.wait_placed(timeout_s=timeout_s)
        plan = Placement(where["group_id"], tuple(where["rollout_nodes"]), tuple(where["train_nodes"]))
        runner = RayJobRunner(job.job_id, plan, AsyncRolloutWorker, AsyncTrainWorker, timeout_s=timeout_s).start()
        try:
            roller, trainer = runner.workers(ROLLOUT)[0], runner.workers(TRAIN)[0]
            weights_ref = ray.put(weights)
            ray.get([roller.setup.remote(profile, weights_ref), trainer.setup.remote(profile, weights_ref)],
                    timeout=timeout_s)
            _loop(run, roller, trainer, weights_ref, job.staleness, timeout_s,
                  phase=lambda pool: job.phase(pool, timeout_s=timeout_s))
            run.reward_latencies_ms = ray.get(roller.reward_latencies.remote(), timeout=timeout_s)
        finally:
            runner.shutdown()
    return run


def _loop(run: AsyncRun, roller, trainer, weights_ref, k: int, timeout_s: float,
          phase: Callable[[str], ContextManager] | None = None):
    """The generator thread and the trainer loop; returns the final weights' object ref.
    ``phase(pool)``, when given, wraps each generation (``ROLLOUT``) and each training
    (``TRAIN``, up to the new weights' publication): the live job's grants."""
    phase = phase or (lambda _pool: contextlib.nullcontext())
    n = run.iterations
    cond = threading.Condition()
    state = {"version": 0, "weights": {0: weights_ref}, "stop": False, "error": None}
    batches: queue.Queue = queue.Queue(maxsize=max(k, 1))
    deadline = time.monotonic() + timeout_s * n

    def generator() -> None:
        sent = 0  # the version the rollout actor holds (it was set up with version 0)
        try:
            for step in range(n):
                with phase(ROLLOUT):
                    with cond:
                        if not cond.wait_for(lambda: state["stop"] or step - state["version"] <= k,
                                             timeout=max(0.0, deadline - time.monotonic())):
                            raise TimeoutError(f"rollout {step}: staleness rule not met in time")
                        if state["stop"]:
                            return
                        version = state["version"]
                        ref = state["weights"][version]
                    batch, stats = roller.generate_batch.options(num_returns=2).remote(
                        step, ref if version != sent else None, version)
                    sent = version
                    stats = ray.get(stats, timeout=timeout_s)
                while not state["stop"]:
                    try:
                        batches.put((batch, stats), timeout=0.5)
                        break
                    except queue.Full:
                        if time.monotonic() > deadline:
                            raise TimeoutError("trainer did not take a batch in time") from None
        except BaseException as exc:  # surfaced by the trainer loop
            state["error"] = exc

    thread = threading.Thread(target=generator, name=f"rollout-{run.profile}-k{k}", daemon=True)
    t0 = time.time()
    thread.start()
    try:
        for i in range(n):
            while True:
                if state["error"] is not None:
                    raise state["error"]
                try:
                    batch, gstats = batches.get(timeout=0.5)
                    break
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"batch {i} not generated in time") from None
            if gstats["step"] != i or i - gstats["version"] > k:
                raise RuntimeError(f"batch {gstats['step']} of version {gstats['version']} at iteration {i} (k={k})")
            with phase(TRAIN):
                new_weights, tstats = trainer.train_batch.options(num_returns=2).remote(batch)
                tstats = ray.get(tstats, timeout=timeout_s)
                with cond:  # published before the grant goes back: the next rollout may use it
                    state["version"] = i + 1
                    state["weights"][i + 1] = new_weights
                    state["weights"].pop(i - k - 1, None)  # no rollout can use it any more
                    cond.notify_all()
            run.batches.append({**gstats, **tstats, "trained_at_version": i})
        run.wall_s = time.time() - t0
        return state["weights"][n]
    finally:
        with cond:
            state["stop"] = True
            cond.notify_all()
        thread.join(timeout=timeout_s)
