"""A multi-turn (agentic) variant of the demo task, with environment steps run by CPU
workers, and trajectory-level scheduling of generation (RollArt).

An episode is ``turns`` rounds of: the policy answers the current prompt (the demo's
``generate``, ``answer_len`` tokens), then an ``EnvWorker`` (a Ray actor) checks the answer
and produces the next prompt. The environment step does real work and waits:

* the exact reward of the answer (``Task.answer`` and ``reward`` of ``rollmux.grpo.task``),
  a small arithmetic verification (a digit checksum recomputed ``verify_rounds`` times, a
  few ms of CPU), and a simulated tool / sandbox latency (``asyncio.sleep``) drawn per
  (trajectory, turn) from a seeded heavy-tailed distribution (``base_delay_s`` times
  1 + 4 u^4, u uniform: mostly near the base, sometimes 5x);
* the next prompt, a prompt of the same task made from the answer: its non-digit
  characters replaced by the reference's digits, rotated left by one (``"^1234>"`` answered
  ``"43+1"``: ``"4321"`` -> ``"^3214>"``; an ``add`` answer's three digits make both addends:
  ``"085"`` -> ``"850"`` -> ``"^85+50="``; see ``next_prompt``), so later turns depend on what
  the policy generated.

An ``EnvWorker`` is an async actor (``max_concurrency`` steps at once: the verification
runs one at a time, the waits overlap), as an environment service with I/O would be.

Two schedules for the same episodes (same trajectories, turns, env delays, model):

* ``"turn"`` (no trajectory-level scheduling): every turn generates for all live
  trajectories (batches of ``gen_batch``), then sends all their environment steps and
  waits for every one (a barrier per turn): generation idles while any environment runs.
* ``"trajectory"``: each trajectory goes back to the generation queue as soon as its own
  environment step returns; one generation loop takes whatever is ready (up to
  ``gen_batch``, at least one, waiting at most ``BATCH_WAIT_S`` for more) while other
  trajectories wait on their environments.

Generation runs in one thread of the driver (the only generator, as one rollout GPU
would be); its busy fraction is generation seconds over the rollout's wall time.

Training is the demo's ``TrainWorker.train`` on the flattened turns: row (group g, turn t,
sample s) holds trajectory (g, s)'s turn-t prompt and answer and the trajectory's reward
(the mean of its turns' rewards), so ``group_advantages`` over each (g, t) block is the
trajectory-level advantage shared by all its turns.

Live (``run_agentic_live``): the same episodes as a job of the live control plane. An
``AgenticRolloutWorker`` (the demo's rollout worker, on the job's pinned rollout node)
generates every turn, a ``TrainWorker`` on its pinned training node trains, each inside
its phase's grant with its state switched in and out (``RemoteState``), so the job can
share its nodes with other jobs. With ``reward_app`` the environment workers score each
answer through the shared reward service (``rollmux.reward_service``; the same exact
reward) instead of computing it themselves.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import random
import time
from dataclasses import asdict, dataclass, field

import ray
import torch

from rollmux.grpo.policy import build_policy, generate, task_batch
from rollmux.grpo.profiles import JobProfile
from rollmux.grpo.task import BOS, decode, encode, get_task, reward
from rollmux.grpo.workers import RolloutWorker, TrainWorker
from rollmux.model import TRAIN
from rollmux.runtime.ray_adapter import WorkerInfo

SCHEDULES = ("turn", "trajectory")
#: "trajectory": after the first ready trajectory, wait at most this long for more (up to gen_batch)
BATCH_WAIT_S = 0.01


def next_prompt(prompt: str, completion: str, answer: str) -> str:
    """The environment's next prompt, a prompt of ``prompt``'s task (deterministic): the
    ``completion`` with each non-digit replaced by the reference ``answer``'s digit there,
    rotated left by one (digits r). For ``reverse`` and ``sort`` (4 digits, the prompt ends
    with ``>``): BOS + r + ``>`` (``"^1234>"`` answered ``"43+1"``: ``"4321"`` -> ``"^3214>"``).
    For ``add`` (3 digits, the prompt ends with ``=``): r's first two and last two digits are
    the addends, BOS + r[:2] + ``+`` + r[1:] + ``=`` (``"^37+48="`` answered ``"08+"``:
    ``"085"`` -> ``"850"`` -> ``"^85+50="``)."""
    digits = "".join(c if c.isdigit() else r for c, r in zip(completion, answer))
    rotated = digits[1:] + digits[0]
    if prompt.endswith("="):
        return f"{BOS}{rotated[:2]}+{rotated[1:]}="
    return f"{BOS}{rotated}{prompt[-1]}"


def env_delay_s(seed: int, trajectory: int, turn: int, base_delay_s: float) -> float:
    """The simulated tool latency of one step (deterministic per seed, trajectory and turn)."""
    u = random.Random(seed * 1_000_003 + trajectory * 101 + turn).random()
    return base_delay_s * (1.0 + 4.0 * u**4)


class EnvWorker:
    """One environment server (a Ray async actor): verification on its CPU, then the tool wait.
    With ``reward_app`` each answer is scored by that reward service, waiting at most
    ``reward_timeout_s`` for it."""

    def __init__(self, task: str, base_delay_s: float = 0.03, verify_rounds: int = 300, seed: int = 0,
                 reward_app: str | None = None, reward_timeout_s: float = 30.0) -> None:
        self.task = get_task(task)
        self.base_delay_s = base_delay_s
        self.verify_rounds = verify_rounds
        self.seed = seed
        self.calls = 0
        self.busy_s = 0.0
        self.reward_app = reward_app
        self.reward_timeout_s = reward_timeout_s
        self.reward_latencies_ms: list[float] = []
        self._reward_handle = None

    async def _score(self, prompt: str, completion: str) -> float:
        """The answer's exact reward from the shared reward service (``reward_app``); raises
        ``RewardServiceTimeout`` (the call cancelled) when none comes within ``reward_timeout_s``."""
        from rollmux.reward_service import RewardServiceTimeout

        if self._reward_handle is None:
            from ray import serve

            self._reward_handle = serve.get_app_handle(self.reward_app)
        t0 = time.perf_counter()
        response = self._reward_handle.score.remote([(self.task.name, prompt, completion)], "exact")
        try:
            scores = await asyncio.wait_for(response, self.reward_timeout_s)
        except asyncio.TimeoutError as err:
            response.cancel()
            raise RewardServiceTimeout(f"reward service app {self.reward_app!r}: no reward after "
                                       f"{self.reward_timeout_s:g} s for an environment step") from err
        self.reward_latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        return float(scores[0])

    async def step(self, trajectory: int, turn: int, prompt: str, completion: str) -> dict:
        start = time.perf_counter()
        answer = self.task.answer(prompt)
        score = reward(completion, answer) if self.reward_app is None else None
        checksum = 0
        for r in range(self.verify_rounds):  # the arithmetic check: digit checksum, recomputed
            checksum = (checksum * 31 + sum((int(c) + r) * (i + 1) for i, c in enumerate(answer))) % 1_000_003
        self.busy_s += time.perf_counter() - start
        if score is None:
            score = await self._score(prompt, completion)
        await asyncio.sleep(env_delay_s(self.seed, trajectory, turn, self.base_delay_s))
        self.calls += 1
        return {"reward": score, "next_prompt": next_prompt(prompt, completion, answer), "checksum": checksum}

    def stats(self) -> dict:
        return {"calls": self.calls, "busy_s": self.busy_s, "reward_latencies_ms": list(self.reward_latencies_ms)}


def start_env_workers(task: str, count: int = 3, base_delay_s: float = 0.03, seed: int = 0,
                      max_concurrency: int = 64, reward_app: str | None = None,
                      reward_timeout_s: float = 30.0) -> list:
    """``count`` EnvWorker actors on the connected Ray cluster (no CPU claimed)."""
    cls = ray.remote(num_cpus=0, max_concurrency=max_concurrency)(EnvWorker)
    return [cls.remote(task, base_delay_s, seed=seed, reward_app=reward_app, reward_timeout_s=reward_timeout_s)
            for _ in range(count)]


@dataclass(slots=True)
class Rollout:
    """One iteration's episodes under one schedule."""

    prompts: list[list[str]]        # [trajectory][turn]
    completions: list[list[str]]
    rewards: list[list[float]]
    wall_s: float
    generation_s: float
    generate_calls: int
    env_calls: int

    @property
    def busy_fraction(self) -> float:
        return self.generation_s / self.wall_s if self.wall_s > 0 else 0.0


class _Generator:
    """The single generation thread: the demo's ``generate`` on batches of prompt strings."""

    def __init__(self, model, answer_len: int, seed: int) -> None:
        self.model, self.answer_len, self.seed = model, answer_len, seed
        self.calls, self.busy_s = 0, 0.0
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")

    def __call__(self, prompts: list[str]) -> list[str]:
        start = time.perf_counter()
        ids = torch.tensor([encode(p) for p in prompts])
        out = generate(self.model, ids, self.answer_len, self.seed * 7919 + self.calls)
        self.calls += 1
        self.busy_s += time.perf_counter() - start
        return [decode(c.tolist()) for c in out]


def rollout_episodes(model, profile: JobProfile, step: int, envs: list, turns: int, schedule: str,
                     timeout_s: float = 120.0, batch_wait_s: float = BATCH_WAIT_S) -> Rollout:
    """Run ``prompts x samples`` trajectories of ``turns`` turns with ``schedule``; every wait is bounded.
    A failed environment step (the env actor's or the reward service's exception) is raised
    as soon as it is seen, under either schedule (``"trajectory"``: ``_trajectory_loop``)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: one of {SCHEDULES}")
    task = get_task(profile.task)
    rng = random.Random(profile.seed * 1_000_003 + step)
    first, _ = task_batch(task, rng, profile.prompts)
    n = profile.prompts * profile.samples
    prompts = [[decode(first[i // profile.samples].tolist())] for i in range(n)]
    completions: list[list[str]] = [[] for _ in range(n)]
    rewards: list[list[float]] = [[] for _ in range(n)]
    gen = _Generator(model, task.answer_len, profile.seed + 7 * step)
    env_calls = 0

    def env_step(i: int):
        nonlocal env_calls
        env_calls += 1
        turn = len(completions[i]) - 1
        return envs[i % len(envs)].step.remote(step * 1_000 + i, turn, prompts[i][-1], completions[i][-1])

    def absorb(i: int, out: dict) -> None:
        rewards[i].append(out["reward"])
        if len(completions[i]) < turns:
            prompts[i].append(out["next_prompt"])

    start = time.perf_counter()
    try:
        if schedule == "turn":
            for _ in range(turns):
                for b in range(0, n, profile.gen_batch):
                    idx = range(b, min(n, b + profile.gen_batch))
                    for i, c in zip(idx, gen([prompts[i][-1] for i in idx])):
                        completions[i].append(c)
                refs = [env_step(i) for i in range(n)]
                for i, out in enumerate(ray.get(refs, timeout=timeout_s)):  # the barrier
                    absorb(i, out)
        else:
            asyncio.run(asyncio.wait_for(_trajectory_loop(n, turns, profile.gen_batch, gen, prompts, completions,
                                                          env_step, absorb, batch_wait_s), timeout_s * turns))
    finally:
        gen.pool.shutdown(wait=True)
    wall = time.perf_counter() - start
    if any(len(r) != turns for r in rewards):
        raise RuntimeError("an episode did not complete all its turns")
    return Rollout(prompts, completions, rewards, wall, gen.busy_s, gen.calls, env_calls)


async def _trajectory_loop(n, turns, gen_batch, gen, prompts, completions, env_step, absorb,
                           batch_wait_s: float) -> None:
    """The "trajectory" schedule. Each environment step is awaited by a task of its own; the
    first one to fail ends the loop (at the latest once the generation call under way returns)
    and its exception is raised; on any exit the steps still awaited are cancelled and
    collected, so no task outlives the loop and none has an unretrieved exception."""
    loop = asyncio.get_running_loop()
    # a trajectory ready to generate, or the exception of a failed environment step
    ready: asyncio.Queue[int | BaseException] = asyncio.Queue()
    for i in range(n):
        ready.put_nowait(i)
    waiting: set[asyncio.Task] = set()
    done = 0

    async def wait_env(i: int, ref) -> None:
        absorb(i, await ref)
        if len(completions[i]) < turns:
            ready.put_nowait(i)

    def settled(task: asyncio.Task) -> None:
        waiting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            ready.put_nowait(task.exception())

    def checked(item: int | BaseException) -> int:
        if isinstance(item, BaseException):
            raise item
        return item

    try:
        while done < n * turns:
            batch = [checked(await ready.get())]
            close = loop.time() + batch_wait_s  # a short window for more ready trajectories
            while len(batch) < gen_batch:
                if not ready.empty():
                    batch.append(checked(ready.get_nowait()))
                    continue
                if loop.time() >= close:
                    break
                try:
                    batch.append(checked(await asyncio.wait_for(ready.get(), close - loop.time())))
                except asyncio.TimeoutError:
                    break
            outs = await loop.run_in_executor(gen.pool, gen, [prompts[i][-1] for i in batch])
            for i, c in zip(batch, outs):
                completions[i].append(c)
                task = asyncio.ensure_future(wait_env(i, env_step(i)))
                waiting.add(task)
                task.add_done_callback(settled)
            done += len(batch)
        if waiting:  # the last steps: returns early on a failure
            await asyncio.wait(set(waiting), return_when=asyncio.FIRST_EXCEPTION)
        while not ready.empty():  # only failures are left to queue now
            checked(ready.get_nowait())
    finally:
        pending = list(waiting)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def training_batch(profile: JobProfile, rollout: Rollout) -> dict:
    """Rows ordered (group, turn, sample), each with its trajectory's mean reward (see the module doc)."""
    turns = len(rollout.rewards[0])
    traj_reward = [sum(r) / len(r) for r in rollout.rewards]
    rows = [(g * profile.samples + s, t) for g in range(profile.prompts) for t in range(turns)
            for s in range(profile.samples)]
    return {"prompts": torch.tensor([encode(rollout.prompts[i][t]) for i, t in rows]),
            "completions": torch.tensor([encode(rollout.completions[i][t]) for i, t in rows]),
            "rewards": torch.tensor([traj_reward[i] for i, _ in rows])}


@dataclass(slots=True)
class AgenticRun:
    profile: str
    schedule: str
    iterations: int
    turns: int
    env_workers: int
    per_iteration: list[dict] = field(default_factory=list)
    reward_before: float = 0.0
    reward_after: float = 0.0
    wall_s: float = 0.0
    env_calls_by_worker: list[int] = field(default_factory=list)
    reward_latencies_ms: list[float] = field(default_factory=list)  # live runs through the reward service

    def to_dict(self) -> dict:
        roll = sum(r["rollout_s"] for r in self.per_iteration)
        gen = sum(r["generation_s"] for r in self.per_iteration)
        return {**asdict(self), "wall_per_iteration_s": self.wall_s / self.iterations,
                "rollout_s": roll, "generation_s": gen,
                "generation_busy_fraction": gen / roll if roll else 0.0,
                "rewards": [r["reward"] for r in self.per_iteration]}


def run_agentic(profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor], schedule: str,
                turns: int = 3, env_workers: int = 3, base_delay_s: float = 0.03, timeout_s: float = 120.0,
                eval_step: int = 1_000_000) -> AgenticRun:
    """``iterations`` of multi-turn rollout (``schedule``) then the demo's training step, on the
    connected Ray cluster. reward_before / after: a held-out iteration's episodes (``eval_step``)
    under the starting and the final weights, with the "turn" schedule."""
    torch.set_num_threads(1)
    envs = start_env_workers(profile.task, env_workers, base_delay_s, seed=profile.seed)
    run = AgenticRun(profile.name, schedule, iterations, turns, env_workers)
    try:
        model = build_policy(profile.model, profile.seed)
        model.load_state_dict(weights)
        trainer = TrainWorker(WorkerInfo(f"{profile.name}-{schedule}", TRAIN, "local", 0))
        trainer.setup(profile, weights)
        trainer.switch_in()

        def mean_reward(r: Rollout) -> float:
            return sum(map(sum, r.rewards)) / (len(r.rewards) * turns)

        run.reward_before = mean_reward(rollout_episodes(model, profile, eval_step, envs, turns, "turn", timeout_s))
        t0 = time.perf_counter()
        for step in range(iterations):
            r = rollout_episodes(model, profile, step, envs, turns, schedule, timeout_s)
            t1 = time.perf_counter()
            new_weights, stats = trainer.train(training_batch(profile, r))
            model.load_state_dict(new_weights)
            run.per_iteration.append({"reward": mean_reward(r), "rollout_s": r.wall_s, "generation_s": r.generation_s,
                                      "busy_fraction": r.busy_fraction, "generate_calls": r.generate_calls,
                                      "env_calls": r.env_calls, "train_s": time.perf_counter() - t1,
                                      "clip_frac": stats["clip_frac"]})
        run.wall_s = time.perf_counter() - t0
        run.reward_after = mean_reward(rollout_episodes(model, profile, eval_step, envs, turns, "turn", timeout_s))
        run.env_calls_by_worker = [s["calls"] for s in ray.get([e.stats.remote() for e in envs], timeout=timeout_s)]
    finally:
        for e in envs:
            ray.kill(e)
    return run


class AgenticRolloutWorker(RolloutWorker):
    """The multi-turn job's rollout worker (a Ray actor on its pinned rollout node): its
    policy generates every turn of the episodes; environment steps go to ``envs``."""

    def episodes(self, step: int, weights: dict[str, torch.Tensor] | None, envs: list, turns: int,
                 schedule: str, timeout_s: float = 120.0) -> tuple[dict, dict]:
        """One iteration's episodes (``rollout_episodes``) with ``weights`` loaded first when
        given; returns (the training batch, stats)."""
        p = self._configured()
        if weights is not None:
            self.policy.load_state_dict(weights)
        r = rollout_episodes(self.policy, p, step, envs, turns, schedule, timeout_s)
        stats = {"reward": sum(map(sum, r.rewards)) / (len(r.rewards) * turns), "rollout_s": r.wall_s,
                 "generation_s": r.generation_s, "busy_fraction": r.busy_fraction,
                 "generate_calls": r.generate_calls, "env_calls": r.env_calls}
        return training_batch(p, r), stats


def run_agentic_live(job, profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor],
                     schedule: str = "trajectory", turns: int = 3, env_workers: int = 3, base_delay_s: float = 0.03,
                     reward_app: str | None = None, timeout_s: float = 120.0,
                     switches: list | None = None) -> AgenticRun:
    """``iterations`` multi-turn iterations of ``job`` (an SDK handle) under the live control
    plane: each rollout (every turn of every episode) inside a rollout grant on its pinned
    rollout node, each training inside a training grant on its pinned training node, their
    states switched in and out around the phase (``switches`` collects the records). The
    job completes (or, if anything raises, is cancelled); its actors stop."""
    from rollmux.grpo.driver import RemoteState
    from rollmux.model import ROLLOUT
    from rollmux.plan_state import Placement
    from rollmux.runtime.ray_adapter import RayJobRunner

    switches = [] if switches is None else switches
    run = AgenticRun(profile.name, schedule, iterations, turns, env_workers)
    envs = start_env_workers(profile.task, env_workers, base_delay_s, seed=profile.seed, reward_app=reward_app,
                             reward_timeout_s=timeout_s)
    runner = None
    try:
        with job.lifetime():
            where = job.wait_placed(timeout_s=timeout_s)
            plan = Placement(where["group_id"], tuple(where["rollout_nodes"]), tuple(where["train_nodes"]))
            runner = RayJobRunner(job.job_id, plan, AgenticRolloutWorker, TrainWorker, timeout_s=timeout_s).start()
            roller, trainer = runner.workers(ROLLOUT)[0], runner.workers(TRAIN)[0]
            ray.get([roller.setup.remote(profile, weights), trainer.setup.remote(profile, weights)], timeout=timeout_s)
            states = {pool: RemoteState(actor, job.job_id, pool, switches)
                      for pool, actor in ((ROLLOUT, roller), (TRAIN, trainer))}
            latest = None
            t0 = time.perf_counter()
            for step in range(iterations):
                with job.phase(ROLLOUT, state=states[ROLLOUT], device="cpu"):
                    batch, stats = roller.episodes.options(num_returns=2).remote(step, latest, envs, turns, schedule,
                                                                                 timeout_s)
                    stats = ray.get(stats, timeout=timeout_s * turns)
                t1 = time.perf_counter()
                with job.phase(TRAIN, state=states[TRAIN], device="cpu"):
                    latest, tstats = trainer.train.options(num_returns=2).remote(batch)
                    tstats = ray.get(tstats, timeout=timeout_s)
                run.per_iteration.append({**stats, "train_s": time.perf_counter() - t1,
                                          "clip_frac": tstats["clip_frac"]})
            run.wall_s = time.perf_counter() - t0
        env_stats = ray.get([e.stats.remote() for e in envs], timeout=timeout_s)
        run.env_calls_by_worker = [st["calls"] for st in env_stats]
        run.reward_latencies_ms = [x for st in env_stats for x in st["reward_latencies_ms"]]
    finally:
        if runner is not None:
            runner.shutdown()
        for e in envs:
            ray.kill(e)
    return run
