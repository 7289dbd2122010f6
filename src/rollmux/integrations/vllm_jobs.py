"""Two GRPO jobs whose rollouts run in vLLM engines that share one GPU under RollMux.

``run_two_jobs`` (``examples/vllm/two_jobs.py``) does, in order:

1. Writes each job's initial policy (``trl_toy.POLICIES``, e.g. ``smollm2-135m``: 106M
   parameters over the toy vocabulary) as a Hugging Face folder in shared memory.
2. Starts one vLLM engine per job (``enable_sleep_mode=True``, ``gpu_memory_utilization``
   each, eager mode, token ids in and out) and puts it to sleep at once
   (``VllmEngineState.park``) before the next starts: with two reservations of 0.55 the
   engines could not be awake together, which is the point: they are multiplexed.
3. Starts the control plane on 127.0.0.1 over one rollout node ``R0`` and one training
   node ``T0`` (both the machine's GPU), submits the jobs (one co-execution group) and
   runs each job in a thread of this process:

   * rollout grant: the engine wakes at level 2 (its pages mapped again, the trainer's
     latest weights loaded from its folder with vLLM's ``reload_weights``, the KV cache
     mapped), samples ``num_generations`` completions for each of ``prompts`` prompts
     with their log-probabilities, and goes back to sleep before the grant is released;
   * train grant: the policy and its AdamW state come from host memory
     (``StateCache``), one GRPO step (advantage = reward minus the prompt group's mean,
     over its standard deviation; loss = minus the mean advantage-weighted log-probability
     per token), the new weights are written to the job's folder (bf16 safetensors) and
     the state goes back to the host.

4. Writes ``summary.json``: per job the rewards, losses, the **log-probability gap**
   (mean absolute difference per token between what the engine reported for its samples
   and what the trainer computes for the same tokens before its update: near zero only
   if the engine sampled with the trainer's weights, i.e. the job is on-policy), the
   engine's and the trainer's switch times, the phase spans and ``phase_checks``; and
   the GPU's total memory and the engines' reservations. ``gantt.png`` and
   ``rewards.png`` beside it.

Needs a CUDA GPU and vLLM (``DeviceUnavailableError`` otherwise); the learner alone
(:class:`GRPOLearner`) runs anywhere.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rollmux.errors import DeviceUnavailableError, SpecError
from rollmux.integrations.checks import (history_spans, phase_checks, phases_wall, seconds_text,
                                         span_report)
from rollmux.integrations.trl_toy import COMPLETION_LEN, POLICIES, toy_tokenizer
from rollmux.runtime.state_cache import StateCache

CACHE_BUDGET_BYTES = 4 * 1024**3
DEFAULT_ITERATIONS = 30
DEFAULT_UTILIZATION = 0.55


@dataclass(frozen=True, slots=True)
class VllmJob:
    """One toy GRPO job: id, task shift, seed, batch shape; declared phase times for the planner."""

    job_id: str
    shift: int
    seed: int
    prompts: int = 8
    num_generations: int = 8
    t_roll_s: float = 1.0
    t_train_s: float = 1.0
    slo: float = 2.0

    @property
    def name(self) -> str:
        """The job id (``rollmux.grpo.driver.run_together`` keys results by ``name``)."""
        return self.job_id


JOBS = (VllmJob("vllm-copy", shift=0, seed=1), VllmJob("vllm-next", shift=1, seed=2))


class GRPOLearner:
    """The training half of a toy GRPO job: policy, optimizer and the task, on ``device``."""

    def __init__(self, job: VllmJob, policy: str = "smollm2-135m", device: str = "cpu") -> None:
        if policy not in POLICIES:
            raise SpecError("policy", policy, f"one of {sorted(POLICIES)}")
        self.job = job
        self.tokenizer = toy_tokenizer()
        self.model = POLICIES[policy].build(self.tokenizer, job.seed).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=POLICIES[policy].learning_rate)
        self.device = torch.device(device)
        self._rng = random.Random(job.seed)
        self._digits = {str(d): self.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}

    def batch(self) -> tuple[list[list[int]], list[int]]:
        """``prompts`` prompts ``"d>"`` as token ids, and each one's target digit's token id."""
        prompts, targets = [], []
        for _ in range(self.job.prompts):
            d = self._rng.randrange(10)
            prompts.append(self.tokenizer.encode(f"{d}>", add_special_tokens=False))
            targets.append(self._digits[str((d + self.job.shift) % 10)])
        return prompts, targets

    def rewards(self, completions: list[list[int]], target: int) -> list[float]:
        """Per completion: the fraction of its first ``COMPLETION_LEN`` tokens equal to ``target``."""
        return [sum(t == target for t in c[:COMPLETION_LEN]) / COMPLETION_LEN for c in completions]

    def token_logprobs(self, prompts: list[list[int]], completions: list[list[list[int]]]) -> tuple:
        """Log-probability of every completion token under the current policy, and the mask of real tokens."""
        rows = [(p, c) for p, group in zip(prompts, completions) for c in group]
        width = max(len(p) + len(c) for p, c in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width - 1))
        for i, (p, c) in enumerate(rows):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            mask[i, len(p) - 1:len(p) + len(c) - 1] = 1.0
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return logp * mask, mask

    def step(self, prompts: list[list[int]], targets: list[int], completions: list[list[list[int]]],
             engine_logprobs: list[list[float]] | None = None) -> dict:
        """One GRPO update on the sampled ``completions`` (one group per prompt); returns
        ``reward`` (mean), ``loss`` and, given the engine's summed log-probability per
        completion, ``logprob_gap`` (mean |engine - trainer| per token, before the update)."""
        self.model.train()
        rewards = [self.rewards(group, t) for group, t in zip(completions, targets)]
        advantages = []
        for group in rewards:
            mean, std = statistics.fmean(group), statistics.pstdev(group)
            advantages.extend((r - mean) / (std + 1e-4) for r in group)
        logp, mask = self.token_logprobs(prompts, completions)
        per_seq = logp.sum(dim=1)
        lengths = mask.sum(dim=1).clamp(min=1)
        adv = torch.tensor(advantages, device=self.device)
        loss = -(adv * per_seq / lengths).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        out = {"reward": statistics.fmean(r for group in rewards for r in group), "loss": float(loss.detach())}
        if engine_logprobs is not None:
            engine = torch.tensor([x for group in engine_logprobs for x in group], device=self.device)
            out["logprob_gap"] = float(((engine - per_seq.detach()).abs() / lengths).mean())
        return out

    def export(self, folder: Path) -> None:
        """Write the policy to ``folder`` as vLLM loads it: ``config.json`` and bf16 safetensors
        (the tied output head left out: the loader ties it)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "config.json").exists():
            self.model.config.architectures = [type(self.model).__name__]
            self.model.config.save_pretrained(folder)
        tied = self.model.config.tie_word_embeddings
        weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in self.model.state_dict().items()
                   if not (tied and k == "lm_head.weight")}
        tmp = folder / "model.safetensors.tmp"
        save_file(weights, str(tmp))
        tmp.replace(folder / "model.safetensors")


def _check_machine() -> None:
    if not torch.cuda.is_available():
        raise DeviceUnavailableError("two vLLM jobs on one GPU", "a CUDA device")
    if importlib.util.find_spec("vllm") is None:
        raise DeviceUnavailableError("two vLLM jobs on one GPU", "the vllm package")


def start_engine(folder: Path, job: VllmJob, utilization: float):
    """A ``vllm.LLM`` over ``folder`` with sleep mode on, eager, token ids in and out."""
    from vllm import LLM

    return LLM(model=str(folder), dtype="bfloat16", enable_sleep_mode=True, gpu_memory_utilization=utilization,
               enforce_eager=True, skip_tokenizer_init=True, max_model_len=32, seed=job.seed)


def sample(llm, prompts: list[list[int]], n: int) -> tuple[list[list[list[int]]], list[list[float]]]:
    """``n`` completions of ``COMPLETION_LEN`` tokens per prompt (temperature 1) and each one's summed log-probability."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(n=n, temperature=1.0, max_tokens=COMPLETION_LEN, logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    completions = [[list(c.token_ids) for c in o.outputs] for o in outputs]
    logprobs = [[_summed_logprob(c) for c in o.outputs] for o in outputs]
    return completions, logprobs


def _summed_logprob(completion) -> float:
    """A vLLM ``CompletionOutput``'s summed log-probability of its tokens: its cumulative
    figure, else (a version that leaves it unset) the sum of the per-token entries."""
    if completion.cumulative_logprob is not None:
        return float(completion.cumulative_logprob)
    return float(sum(step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)))


def _run_job(handle, job: VllmJob, learner: GRPOLearner, engine, folder: Path, iterations: int) -> dict:
    cache = StateCache(CACHE_BUDGET_BYTES)
    key = f"{job.job_id}/train"
    cache.register(key, learner.model, learner.optimizer)
    cache.offload(key)
    steps = []
    with handle.lifetime():
        for _ in range(iterations):
            prompts, targets = learner.batch()
            with handle.phase("rollout", state=engine):
                completions, logprobs = sample(engine.llm, prompts, job.num_generations)
            with handle.phase("train", state=cache, key=key, device=learner.device):
                steps.append(learner.step(prompts, targets, completions, logprobs))
                learner.export(folder)
    return {"steps": steps, "history": handle.history, "engine": engine.summary(),
            "engine_records": [asdict(r) for r in engine.records],
            "trainer_switches": [{"direction": r.direction, "bytes": r.bytes, "seconds": r.seconds}
                                 for r in cache.records]}


def run_two_jobs(out_dir: Path, iterations: int = DEFAULT_ITERATIONS, jobs: tuple[VllmJob, ...] = JOBS,
                 utilization: float = DEFAULT_UTILIZATION, policy: str = "smollm2-135m",
                 log: Callable[[str], None] = print, trainer_device: str = "cuda") -> dict:
    """Run ``jobs`` together for ``iterations`` steps each; write and return ``summary.json`` (module docstring).

    The engines run on the GPU; ``trainer_device`` is where the trainers do (the GPU by default)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise SpecError("iterations", iterations, "an integer >= 1")
    if not 0.05 <= utilization < 1.0:
        raise SpecError("utilization", utilization, "a fraction of the GPU in [0.05, 1)")
    if policy not in POLICIES:
        raise SpecError("policy", policy, f"one of {sorted(POLICIES)}")
    _check_machine()
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from rollmux.demo import _control_plane
    from rollmux.grpo.driver import run_together
    from rollmux.integrations.vllm_engine import VllmEngineState
    from rollmux.runtime.sdk import Client

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        weights_root = stack.enter_context(tempfile.TemporaryDirectory(prefix="rollmux-vllm-", dir=shm))
        learners, folders, engines, startup = [], [], [], {}
        for job in jobs:
            learner = GRPOLearner(job, policy, trainer_device)
            folder = Path(weights_root) / job.job_id
            learner.export(folder)
            learners.append(learner)
            folders.append(folder)
        for job, folder in zip(jobs, folders):
            log(f"{job.job_id}: starting its vLLM engine ({utilization:.2f} of the GPU), then parking it")
            t_start = time.perf_counter()
            llm = start_engine(folder, job, utilization)
            stack.callback(llm.llm_engine.engine_core.shutdown)  # also when a later step fails
            startup[job.job_id] = time.perf_counter() - t_start

            def load(llm, folder=folder):
                llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            engine = VllmEngineState(llm, level=2, load_weights=load)
            engine.park()
            engines.append(engine)
        free, total = torch.cuda.mem_get_info()
        log(f"engines asleep: {free / 1e9:.1f} of {total / 1e9:.1f} GB free")
        with _control_plane(1, 1, out_dir) as (url, admin):
            client = Client(url, token=admin)
            try:
                handles = [client.submit({"job_id": j.job_id, "t_roll_s": j.t_roll_s, "t_train_s": j.t_train_s,
                                          "slo": j.slo, "model": policy}) for j in jobs]
                placements = [h.wait_placed(timeout_s=60) for h in handles]
                for h, p in zip(handles, placements):
                    log(f"{h.job_id}: group {p['group_id']}, rollout {p['rollout_nodes']}, train {p['train_nodes']}")
                parts = {j.job_id: (learner, engine, folder) for j, learner, engine, folder
                         in zip(jobs, learners, engines, folders)}
                results = run_together(list(jobs), handles,
                                       lambda job, h: _run_job(h, job, *parts[job.job_id], iterations))
                views = {j.job_id: client.job(j.job_id) for j in jobs}
            finally:
                client.close()
    summary = _summary(jobs, iterations, results, views, placements, startup, time.time() - t0)
    summary.update(policy=policy, device=f"vLLM on cuda, trainers on {trainer_device}", gpu=torch.cuda.get_device_name(), gpu_total_gb=total / 1e9,
                   utilization=utilization, reserved_fraction=utilization * len(jobs))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    from rollmux.integrations.trl_jobs import write_plots
    write_plots(summary, out_dir, reward_title="GRPO reward per step (vLLM rollouts)",
                reward_axis="mean reward of the step's completions", kind="GRPO")
    for line in summary_lines(summary):
        log(line)
    return summary


def _summary(jobs, iterations, results, views, placements, startup, wall_s) -> dict:
    out, spans_by_job = {}, {}
    for job, placement in zip(jobs, placements):
        r = results[job.job_id]
        spans = spans_by_job[job.job_id] = history_spans(r["history"])
        rewards = [s["reward"] for s in r["steps"]]
        gaps = [s["logprob_gap"] for s in r["steps"]]
        k = max(1, min(5, len(rewards) // 4))
        loads = [s["seconds"] for s in r["trainer_switches"] if s["direction"] == "load"]
        out[job.job_id] = {
            "job": asdict(job), "group": placement["group_id"], "service_state": views[job.job_id]["state"],
            "service_iterations_done": views[job.job_id]["iterations_done"],
            "reward_before": statistics.fmean(rewards[:k]), "reward_after": statistics.fmean(rewards[-k:]),
            "rewards": rewards, "losses": [s["loss"] for s in r["steps"]], "logprob_gap": gaps,
            "logprob_gap_max": max(gaps),
            **span_report(spans),
            "engine_start_s": startup[job.job_id], "engine": r["engine"], "engine_records": r["engine_records"],
            "trainer_load_median_s": statistics.median(loads) if loads else None,
        }
    checks = phase_checks(spans_by_job, {j.job_id: iterations for j in jobs})
    return {"steps": iterations, "wall_s": wall_s, "phases_wall_s": phases_wall(spans_by_job), "jobs": out,
            "checks": checks, "engines_awake_together": engines_overlap(out)}


def engines_overlap(jobs: dict) -> list[dict]:
    """Pairs of engine wake-to-sleep intervals of different jobs that overlap in time (should be none)."""
    intervals = []
    for job_id, j in jobs.items():
        awake = None
        for r in j["engine_records"]:
            if r["direction"] == "wake":
                awake = r["at"]
            elif awake is not None:
                intervals.append((awake, r["at"] + r["seconds"], job_id))
                awake = None
    intervals.sort()
    return [{"jobs": [a[2], b[2]], "at": b[0]} for i, a in enumerate(intervals) for b in intervals[i + 1:]
            if b[0] < a[1] and b[2] != a[2]]


def summary_lines(summary: dict) -> list[str]:
    """The run's summary as printed lines."""
    lines = [f"{summary['gpu']}: {summary['gpu_total_gb']:.0f} GB; each engine reserves {summary['utilization']:.2f} "
             f"of it ({summary['reserved_fraction']:.2f} together)"]
    for job_id, j in summary["jobs"].items():
        e = j["engine"]
        lines.append(f"{job_id}: {j['service_state']} after {j['service_iterations_done']} iterations; reward "
                     f"{j['reward_before']:.3f} -> {j['reward_after']:.3f}; log-prob gap per token max "
                     f"{j['logprob_gap_max']:.4f}; engine start {j['engine_start_s']:.1f} s, sleep "
                     f"{e['sleep']['median_s'] * 1e3:.0f} ms ({e['sleep']['device_gb_median'] or 0:.1f} GB back), wake "
                     f"{e['wake']['median_s'] * 1e3:.0f} ms (of which weight load {e['wake']['load_s_median'] * 1e3:.0f}"
                     f" ms); phases: rollout {seconds_text(j['mean_rollout_s'], '.2f')}, "
                     f"train {seconds_text(j['mean_train_s'], '.2f')}")
    c = summary["checks"]
    lines.append(f"phases alternate: {all(c['alternates'].values())}; overlaps on a node: {len(c['overlaps'])}; "
                 f"engines awake together: {len(summary['engines_awake_together'])}; phases {summary['phases_wall_s']:.1f} s "
                 f"(wall {summary['wall_s']:.1f} s)")
    return lines
