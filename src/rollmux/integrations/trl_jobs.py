"""Two TRL GRPO jobs multiplexed by RollMux on a local Ray cluster (``examples/trl/two_jobs.py``).

``run_two_jobs`` does, in order:

1. Starts a local Ray cluster with one rollout node ``R0`` and one training node ``T0``
   (``local_cluster``) and the control plane on 127.0.0.1 over that inventory
   (``rollmux.demo._control_plane``: temporary state file, random admin token).
2. Submits the jobs (``JOBS``: the toy ``shift`` task with shift 0 and 1, see
   ``trl_toy``) without heartbeats from the driver; the planner places both in one
   co-execution group.
3. Starts each job's trainer as a Ray actor pinned to the job's training node
   (``RayJobRunner``; no actor on the rollout node, since TRL generates in the trainer
   process). The actor attaches to its job with the job's token (it heartbeats from
   then on), builds the tiny Qwen2 policy and runs ``RollMuxGRPOTrainer`` for
   ``steps`` optimizer steps (one generation each), then completes the job.
4. Writes ``summary.json``: per job the steps done (TRL's ``global_step``), the reward
   TRL logged before (mean of the first steps) and after (mean of the last steps), every
   logged reward and loss, the phase spans one per node (grant arrival to release, as
   the job's SDK recorded them), the service's view (state, iterations done) and the
   warm switches; plus ``checks`` (``phase_checks``: alternation per job, no overlap on a
   node) and the wall time.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rollmux.integrations.checks import phase_checks
from rollmux.model import TRAIN
from rollmux.runtime.ray_adapter import WorkerInfo
from rollmux.runtime.sdk import JobHandle

DEFAULT_STEPS = 60
QUICK_STEPS = 8
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True, slots=True)
class TRLJob:
    """One toy GRPO job: its id, task shift, seed and batch shape (TRL's names)."""

    job_id: str
    shift: int
    seed: int
    batch: int = 64              # completions per step (per_device_train_batch_size)
    num_generations: int = 8     # completions per prompt (the GRPO group)
    learning_rate: float = 1e-2
    t_roll_s: float = 1.0        # declared phase times for the planner
    t_train_s: float = 1.0
    slo: float = 2.0


JOBS = (TRLJob("trl-copy", shift=0, seed=1), TRLJob("trl-next", shift=1, seed=2))


class TRLJobWorker:
    """Ray actor hosting one job's ``RollMuxGRPOTrainer`` (constructed by ``RayJobRunner``)."""

    def __init__(self, info: WorkerInfo) -> None:
        torch.set_num_threads(1)
        os.environ.update(OFFLINE_ENV)
        self.info = info

    def run(self, url: str, token: str, job: TRLJob, steps: int) -> dict:
        """Attach to ``job`` and train it for ``steps`` steps under RollMux grants; returns what it measured."""
        from rollmux.integrations.trl import logged_series
        from rollmux.runtime.sdk import Client

        client = Client(url)
        handle = client.attach(job.job_id, token)
        try:
            with handle.lifetime(), tempfile.TemporaryDirectory(prefix=f"rollmux-{job.job_id}-") as out:
                trainer = build_trainer(handle, job, steps, out)
                trainer.train()
        finally:
            client.close()
        logs = trainer.state.log_history
        return {"steps_done": trainer.state.global_step, "history": handle.history,
                "rewards": logged_series(logs, "reward"), "losses": logged_series(logs, "loss"),
                "switches": [{"direction": s.direction, "path": s.path, "bytes": s.bytes, "seconds": s.seconds}
                             for s in trainer.switches]}


def build_trainer(handle: JobHandle, job: TRLJob, steps: int, output_dir: str):
    """The toy job's ``RollMuxGRPOTrainer`` (CPU, ``steps`` optimizer steps, one generation each)."""
    from trl import GRPOConfig

    from rollmux.integrations.trl import RollMuxGRPOTrainer
    from rollmux.integrations.trl_toy import COMPLETION_LEN, digit_reward, shift_dataset, tiny_qwen2, toy_tokenizer

    tokenizer = toy_tokenizer()
    config = GRPOConfig(output_dir=output_dir, use_cpu=True, max_steps=steps, seed=job.seed,
                        per_device_train_batch_size=job.batch, num_generations=job.num_generations,
                        max_completion_length=COMPLETION_LEN, learning_rate=job.learning_rate,
                        lr_scheduler_type="constant", beta=0.0, logging_steps=1, save_strategy="no",
                        report_to="none", disable_tqdm=True)
    # --- the user's lines: a TRL GRPOTrainer, run as a RollMux job -------------------------
    return RollMuxGRPOTrainer(job=handle, model=tiny_qwen2(tokenizer, job.seed), reward_funcs=digit_reward,
                              args=config, processing_class=tokenizer,
                              train_dataset=shift_dataset(job.shift, job.batch * steps, job.seed))


def profile_toy(handle: JobHandle, iterations: int) -> None:
    """The first toy job for ``iterations`` steps: ``rollmux profile rollmux.integrations.trl_jobs:profile_toy``."""
    with tempfile.TemporaryDirectory(prefix="rollmux-trl-profile-") as out:
        build_trainer(handle, JOBS[0], iterations, out).train()


def run_two_jobs(out_dir: Path, steps: int = DEFAULT_STEPS, jobs: tuple[TRLJob, ...] = JOBS,
                 log: Callable[[str], None] = print, timeout_s: float = 900.0) -> dict:
    """Run ``jobs`` together for ``steps`` steps each; write and return ``summary.json`` (module docstring)."""
    if steps < 1:
        from rollmux.errors import SpecError

        raise SpecError("steps", steps, "an integer >= 1")
    for key, value in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **OFFLINE_ENV}.items():
        os.environ.setdefault(key, value)
    import ray

    from rollmux.demo import _control_plane
    from rollmux.plan_state import Placement
    from rollmux.runtime.ray_adapter import RayJobRunner, local_cluster
    from rollmux.runtime.sdk import Client

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runners: list[RayJobRunner] = []
    log("starting Ray (R0, T0) and the control plane on 127.0.0.1")
    with local_cluster(["R0"], ["T0"], num_cpus=1), _control_plane(1, 1, out_dir) as (url, admin):
        client = Client(url, token=admin)
        try:
            handles = [client.submit({"job_id": j.job_id, "t_roll_s": j.t_roll_s, "t_train_s": j.t_train_s,
                                      "slo": j.slo, "model": "tiny-qwen2"}, heartbeat=False) for j in jobs]
            placements = [h.wait_placed(timeout_s=60) for h in handles]
            for h, p in zip(handles, placements):
                log(f"{h.job_id}: group {p['group_id']}, rollout {p['rollout_nodes']}, train {p['train_nodes']}")
                plan = Placement(p["group_id"], (), tuple(p["train_nodes"]))
                runners.append(RayJobRunner(h.job_id, plan, TRLJobWorker, TRLJobWorker).start())
            refs = [r.workers(TRAIN)[0].run.remote(url, h.token, j, steps) for r, h, j in zip(runners, handles, jobs)]
            results = dict(zip([j.job_id for j in jobs], ray.get(refs, timeout=timeout_s)))
            views = {j.job_id: client.job(j.job_id) for j in jobs}
        finally:
            for r in runners:
                r.shutdown()
            client.close()
    summary = _summary(jobs, steps, results, views, placements, time.time() - t0)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    for line in summary_lines(summary):
        log(line)
    return summary


def _summary(jobs, steps, results, views, placements, wall_s) -> dict:
    out = {}
    spans_by_job = {}
    for j, placement in zip(jobs, placements):
        r = results[j.job_id]
        spans = [{"pool": pool, "nodes": list(nodes), "iteration": i // 2, "start": start, "end": end}
                 for i, (pool, nodes, _seq, start, end) in enumerate(r["history"])]
        spans_by_job[j.job_id] = spans
        k = max(1, min(5, len(r["rewards"]) // 4))
        loads = [s["seconds"] * 1e3 for s in r["switches"] if s["direction"] == "load"]
        offloads = [s["seconds"] * 1e3 for s in r["switches"] if s["direction"] == "offload"]
        out[j.job_id] = {
            "job": asdict(j), "group": placement["group_id"],
            "steps_done": r["steps_done"], "service_state": views[j.job_id]["state"],
            "service_iterations_done": views[j.job_id]["iterations_done"],
            "reward_before": statistics.fmean(r["rewards"][:k]), "reward_after": statistics.fmean(r["rewards"][-k:]),
            "rewards": r["rewards"], "losses": r["losses"],
            "mean_rollout_s": statistics.fmean(s["end"] - s["start"] for s in spans if s["pool"] == "rollout"),
            "mean_train_s": statistics.fmean(s["end"] - s["start"] for s in spans if s["pool"] == "train"),
            "phase_spans": [{"node": node, "pool": s["pool"], "iteration": s["iteration"],
                             "start": s["start"], "end": s["end"]} for s in spans for node in s["nodes"]],
            "switches": {"count": len(r["switches"]), "paths": sorted({s["path"] for s in r["switches"]}),
                         "bytes_max": max(s["bytes"] for s in r["switches"]),
                         "load_mean_ms": statistics.fmean(loads), "offload_mean_ms": statistics.fmean(offloads)},
        }
    checks = phase_checks(spans_by_job, {j.job_id: steps for j in jobs})
    starts = [s["start"] for spans in spans_by_job.values() for s in spans]
    ends = [s["end"] for spans in spans_by_job.values() for s in spans]
    return {"steps": steps, "wall_s": wall_s, "phases_wall_s": max(ends) - min(starts), "jobs": out, "checks": checks}


def summary_lines(summary: dict) -> list[str]:
    """The human-readable report of a ``summary.json``."""
    lines = [f"{len(summary['jobs'])} TRL GRPO jobs x {summary['steps']} steps: {summary['wall_s']:.0f} s in all, "
             f"{summary['phases_wall_s']:.1f} s from first grant to last release"]
    for job_id, j in summary["jobs"].items():
        lines.append(f"{job_id:<10} group {j['group']}  steps {j['steps_done']} (service: {j['service_state']}, "
                     f"{j['service_iterations_done']} iterations)  reward {j['reward_before']:.3f} -> "
                     f"{j['reward_after']:.3f}  rollout {j['mean_rollout_s']:.3f} s  train {j['mean_train_s']:.3f} s  "
                     f"switches {j['switches']['count']} (load {j['switches']['load_mean_ms']:.2f} ms, "
                     f"offload {j['switches']['offload_mean_ms']:.2f} ms, {j['switches']['bytes_max'] / 1e6:.2f} MB)")
    c = summary["checks"]
    lines.append(f"checks: alternation {c['alternates']}, overlaps on a node {len(c['overlaps'])}, "
                 f"{'ok' if c['ok'] else 'FAILED'}")
    return lines
