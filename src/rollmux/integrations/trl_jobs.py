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
   then on), builds the policy (``policy``: a name in ``trl_toy.POLICIES``) and runs
   ``RollMuxGRPOTrainer`` on ``device`` (``cpu``, or ``cuda``: the actor's first GPU)
   for ``steps`` optimizer steps (one generation each), then completes the job.
4. Writes ``summary.json``: per job the steps done (TRL's ``global_step``), the reward
   TRL logged before (mean of the first steps) and after (mean of the last steps), every
   logged reward and loss, the phase spans one per node (grant arrival to release, as
   the job's SDK recorded them), the service's view (state, iterations done), the warm
   switches and, on ``cuda``, the device memory around them (``DeviceMemoryCache``);
   plus ``checks`` (``phase_checks``: alternation per job, no overlap on a node) and the
   wall time. Beside it ``gantt.png`` (the measured phases per node) and ``rewards.png``
   (``write_plots``).

On a one-GPU machine both trainers use the same GPU, which stands for both nodes: one
job's generation (rollout grant) may run on it while the other job's update (train
grant) does. Between its phases a job's state is parked in host memory.
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

from rollmux.errors import SpecError
from rollmux.integrations.checks import (history_spans, phase_checks, phases_wall, seconds_text,
                                         span_report)
from rollmux.model import TRAIN
from rollmux.runtime.ray_adapter import WorkerInfo
from rollmux.runtime.sdk import JobHandle
from rollmux.runtime.state_cache import SwitchRecord, StateCache

DEFAULT_STEPS = 60
QUICK_STEPS = 8
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True, slots=True)
class TRLJob:
    """One toy GRPO job: its id, task shift, seed and batch shape (TRL's names); the policy sets the learning rate."""

    job_id: str
    shift: int
    seed: int
    batch: int = 64              # completions per step (per_device_train_batch_size)
    num_generations: int = 8     # completions per prompt (the GRPO group)
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

    def run(self, url: str, token: str, job: TRLJob, steps: int, device: str, policy: str) -> dict:
        """Attach to ``job`` and train it for ``steps`` steps under RollMux grants; returns what it measured."""
        from rollmux.integrations.trl import CACHE_BUDGET_BYTES, logged_series
        from rollmux.runtime.sdk import Client

        cache = DeviceMemoryCache(CACHE_BUDGET_BYTES)
        client = Client(url)
        handle = client.attach(job.job_id, token)
        try:
            with handle.lifetime(), tempfile.TemporaryDirectory(prefix=f"rollmux-{job.job_id}-") as out:
                trainer = build_trainer(handle, job, steps, out, device=device, policy=policy, cache=cache)
                trainer.train()
        finally:
            client.close()
        logs = trainer.state.log_history
        return {"steps_done": trainer.state.global_step, "history": handle.history,
                "rewards": logged_series(logs, "reward"), "losses": logged_series(logs, "loss"),
                "parameters": sum(p.numel() for p in trainer.model.parameters()),
                "switches": [{"direction": s.direction, "path": s.path, "bytes": s.bytes, "seconds": s.seconds}
                             for s in trainer.switches],
                "device_memory": cache.summary()}


class DeviceMemoryCache(StateCache):
    """A ``StateCache`` that notes the CUDA allocator's bytes right after each warm switch.

    ``after[direction]``: ``torch.cuda.memory_allocated`` (bytes in live tensors) and
    ``memory_reserved`` (bytes the allocator holds from the driver) after each ``load``
    or ``offload`` to or from a CUDA device; nothing is noted for a CPU device. After an
    offload, what is left is everything of the process that is not the parked state.
    """

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(budget_bytes)
        self.after: dict[str, list[tuple[int, int]]] = {"load": [], "offload": []}

    def load(self, key, device) -> SwitchRecord:
        record = super().load(key, device)
        self._note("load", torch.device(device))
        return record

    def offload(self, key) -> SwitchRecord:
        device = self._entry(key).device
        record = super().offload(key)
        self._note("offload", device)
        return record

    def _note(self, direction: str, device: torch.device) -> None:
        if device.type == "cuda":
            self.after[direction].append((torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)))

    def summary(self) -> dict | None:
        """None without CUDA switches; else the GPU's name, the peak allocated and the ranges after each direction."""
        if not self.after["offload"]:
            return None
        out: dict = {"gpu": torch.cuda.get_device_name(), "peak_allocated": torch.cuda.max_memory_allocated()}
        for direction, notes in self.after.items():
            out[direction] = {"count": len(notes),
                              "allocated_min": min(a for a, _ in notes), "allocated_max": max(a for a, _ in notes),
                              "reserved_min": min(r for _, r in notes), "reserved_max": max(r for _, r in notes)}
        return out


def build_trainer(handle: JobHandle, job: TRLJob, steps: int, output_dir: str, *, device: str = "cpu",
                  policy: str = "tiny-qwen2", cache: StateCache | None = None):
    """The toy job's ``RollMuxGRPOTrainer`` on ``device`` with ``policy`` (``steps`` optimizer steps, one generation each)."""
    from trl import GRPOConfig

    from rollmux.integrations.trl import RollMuxGRPOTrainer
    from rollmux.integrations.trl_toy import COMPLETION_LEN, digit_reward, shift_dataset, toy_tokenizer

    chosen = _policy(policy)
    _check_device(device)
    tokenizer = toy_tokenizer()
    config = GRPOConfig(output_dir=output_dir, use_cpu=device == "cpu", max_steps=steps, seed=job.seed,
                        per_device_train_batch_size=job.batch, num_generations=job.num_generations,
                        max_completion_length=COMPLETION_LEN, learning_rate=chosen.learning_rate,
                        lr_scheduler_type="constant", beta=0.0, logging_steps=1, save_strategy="no",
                        report_to="none", disable_tqdm=True)
    # --- the user's lines: a TRL GRPOTrainer, run as a RollMux job -------------------------
    return RollMuxGRPOTrainer(job=handle, model=chosen.build(tokenizer, job.seed), reward_funcs=digit_reward,
                              args=config, processing_class=tokenizer, cache=cache,
                              train_dataset=shift_dataset(job.shift, job.batch * steps, job.seed))


def _policy(name: str):
    from rollmux.integrations.trl_toy import POLICIES

    if not isinstance(name, str) or name not in POLICIES:
        raise SpecError("policy", name, f"one of {sorted(POLICIES)}")
    return POLICIES[name]


def _check_device(device: str) -> None:
    if device not in DEVICES:
        raise SpecError("device", device, f"one of {list(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device", device, "a machine where torch sees a CUDA device (torch.cuda.is_available())")


def profile_toy(handle: JobHandle, iterations: int) -> None:
    """The first toy job for ``iterations`` steps: ``rollmux profile rollmux.integrations.trl_jobs:profile_toy``."""
    with tempfile.TemporaryDirectory(prefix="rollmux-trl-profile-") as out:
        build_trainer(handle, JOBS[0], iterations, out).train()


def run_two_jobs(out_dir: Path, steps: int = DEFAULT_STEPS, jobs: tuple[TRLJob, ...] = JOBS,
                 log: Callable[[str], None] = print, timeout_s: float = 900.0, *, device: str = "cpu",
                 policy: str = "tiny-qwen2") -> dict:
    """Run ``jobs`` together for ``steps`` steps each; write and return ``summary.json`` (module docstring).

    Bad arguments (``steps`` < 1, an unknown ``policy`` or ``device``, ``cuda`` where
    torch sees no GPU) raise ``SpecError`` before anything starts.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # (2.5 ran 12 s, then failed)
        raise SpecError("steps", steps, "an integer >= 1")
    _policy(policy)
    _check_device(device)
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
                                      "slo": j.slo, "model": policy}, heartbeat=False) for j in jobs]
            placements = [h.wait_placed(timeout_s=60) for h in handles]
            for h, p in zip(handles, placements):
                log(f"{h.job_id}: group {p['group_id']}, rollout {p['rollout_nodes']}, train {p['train_nodes']}")
                plan = Placement(p["group_id"], (), tuple(p["train_nodes"]))
                runners.append(RayJobRunner(h.job_id, plan, TRLJobWorker, TRLJobWorker).start())
            refs = [r.workers(TRAIN)[0].run.remote(url, h.token, j, steps, device, policy)
                    for r, h, j in zip(runners, handles, jobs)]
            results = dict(zip([j.job_id for j in jobs], ray.get(refs, timeout=timeout_s)))
            views = {j.job_id: client.job(j.job_id) for j in jobs}
        finally:
            for r in runners:
                r.shutdown()
            client.close()
    summary = _summary(jobs, steps, results, views, placements, time.time() - t0)
    summary.update(device=device, policy=policy)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    write_plots(summary, out_dir)
    for line in summary_lines(summary):
        log(line)
    return summary


def _summary(jobs, steps, results, views, placements, wall_s) -> dict:
    out = {}
    spans_by_job = {}
    for j, placement in zip(jobs, placements):
        r = results[j.job_id]
        spans = spans_by_job[j.job_id] = history_spans(r["history"])
        k = max(1, min(5, len(r["rewards"]) // 4))
        loads = [s["seconds"] * 1e3 for s in r["switches"] if s["direction"] == "load"]
        offloads = [s["seconds"] * 1e3 for s in r["switches"] if s["direction"] == "offload"]
        out[j.job_id] = {
            "job": asdict(j), "group": placement["group_id"],
            "steps_done": r["steps_done"], "service_state": views[j.job_id]["state"],
            "service_iterations_done": views[j.job_id]["iterations_done"],
            "reward_before": statistics.fmean(r["rewards"][:k]), "reward_after": statistics.fmean(r["rewards"][-k:]),
            "rewards": r["rewards"], "losses": r["losses"],
            **span_report(spans),
            "switches": {"count": len(r["switches"]), "paths": sorted({s["path"] for s in r["switches"]}),
                         "bytes_max": max(s["bytes"] for s in r["switches"]),
                         "load_mean_ms": statistics.fmean(loads), "offload_mean_ms": statistics.fmean(offloads)},
            "parameters": r["parameters"], "device_memory": r["device_memory"],
        }
    checks = phase_checks(spans_by_job, {j.job_id: steps for j in jobs})
    return {"steps": steps, "wall_s": wall_s, "phases_wall_s": phases_wall(spans_by_job), "jobs": out,
            "checks": checks}


def summary_lines(summary: dict) -> list[str]:
    """The human-readable report of a ``summary.json``."""
    params = max(j["parameters"] for j in summary["jobs"].values())
    lines = [f"{_jobs_label(summary)} x {summary['steps']} steps ({summary['policy']}, "
             f"{params / 1e6:.2f}M parameters, {summary['device']}): {summary['wall_s']:.0f} s in all, "
             f"{summary['phases_wall_s']:.1f} s from first grant to last release"]
    for job_id, j in summary["jobs"].items():
        lines.append(f"{job_id:<10} group {j['group']}  steps {j['steps_done']} (service: {j['service_state']}, "
                     f"{j['service_iterations_done']} iterations)  reward {j['reward_before']:.3f} -> "
                     f"{j['reward_after']:.3f}  rollout {seconds_text(j['mean_rollout_s'], '.3f')}  "
                     f"train {seconds_text(j['mean_train_s'], '.3f')}  "
                     f"switches {j['switches']['count']} (load {j['switches']['load_mean_ms']:.2f} ms, "
                     f"offload {j['switches']['offload_mean_ms']:.2f} ms, {j['switches']['bytes_max'] / 1e6:.2f} MB)")
        memory = j["device_memory"]
        if memory:
            lines.append(f"{'':<10} {memory['gpu']}: allocated after each load {memory['load']['allocated_min'] / 1e9:.2f}-"
                         f"{memory['load']['allocated_max'] / 1e9:.2f} GB, after each offload "
                         f"{memory['offload']['allocated_min'] / 1e9:.2f}-{memory['offload']['allocated_max'] / 1e9:.2f} GB "
                         f"(reserved {memory['offload']['reserved_max'] / 1e9:.2f} GB at most), "
                         f"peak {memory['peak_allocated'] / 1e9:.2f} GB")
    c = summary["checks"]
    lines.append(f"checks: alternation {c['alternates']}, overlaps on a node {len(c['overlaps'])}, "
                 f"{'ok' if c['ok'] else 'FAILED'}")
    return lines


def _jobs_label(summary: dict, kind: str = "TRL GRPO") -> str:
    n = len(summary["jobs"])
    return f"{n} {kind} job{'s' if n > 1 else ''}"


def write_plots(summary: dict, out_dir: Path, window: tuple[float, float] | None = None,
                alone: list[dict] | None = None, reward_title: str = "TRL GRPO reward per step",
                reward_axis: str = "reward logged by TRL (mean over the step's completions)",
                kind: str = "TRL GRPO") -> list[Path]:
    """``gantt.png`` and ``rewards.png`` of a ``summary.json`` in ``out_dir``; returns their paths.

    The Gantt chart has one lane per node and one bar per phase (grant arrival to
    release); with ``window`` (a, b), only the phases that start between a and b seconds
    after the first grant. The reward chart has each
    job's logged reward per step; with ``alone`` (summaries of the jobs' runs alone), those
    too, dashed. ``reward_title`` and ``reward_axis`` label the reward chart, ``kind`` the jobs.
    """
    from rollmux.report.demo_plots import measured_gantt, reward_curves

    spans = [{"job_id": job_id, "pool": s["pool"], "nodes": [s["node"]], "start": s["start"], "end": s["end"]}
             for job_id, j in summary["jobs"].items() for s in j["phase_spans"]]
    first = min(s["start"] for s in spans)
    if window is not None:
        spans = [s for s in spans if first + window[0] <= s["start"] < first + window[1]]
        if not spans:
            raise SpecError("window", window, "seconds after the first grant in which some phase starts")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    policy = f"{summary['policy']} on {summary['device']}"
    shown = (f", the phases started {window[0]:g}-{window[1]:g} s after the first grant (axis: from the first "
             "of them)" if window is not None else "")
    gantt = measured_gantt(spans, out_dir / "gantt.png",
                           f"{_jobs_label(summary, kind)} ({policy}): phases per node{shown}\n"
                           "solid: rollout, hatched: train")
    solo = {k: j["rewards"] for a in alone or () for k, j in a["jobs"].items()}
    curves = {k: {"multiplexed": j["rewards"], "solo": solo.get(k, [])} for k, j in summary["jobs"].items()}
    return [gantt, reward_curves(curves, out_dir / "rewards.png", reward_title, reward_axis, "step")]


def compare_alone(together: dict, alone: list[dict]) -> dict:
    """Compare a run of jobs together with runs of each alone (``summary.json`` dicts of the same steps).

    ``together_s``: first grant to last release of the run together; ``alone_s``: the
    same summed over the runs alone, i.e. the jobs one after the other; ``speedup``:
    ``alone_s / together_s``. ``same_rewards`` / ``same_losses``: per job, whether the
    series TRL logged together equal those it logged alone, value for value (switching
    the state in and out between phases should change nothing a job computes).
    """
    alone_jobs = {job_id: j for summary in alone for job_id, j in summary["jobs"].items()}
    if set(alone_jobs) != set(together["jobs"]) or any(s["steps"] != together["steps"] for s in alone):
        raise SpecError("alone", sorted(alone_jobs), f"one run alone of each job of {sorted(together['jobs'])}, "
                        f"{together['steps']} steps each")
    together_s = together["phases_wall_s"]
    alone_s = sum(s["phases_wall_s"] for s in alone)
    return {"together_s": together_s, "alone_s": alone_s, "speedup": alone_s / together_s,
            "same_rewards": {k: j["rewards"] == alone_jobs[k]["rewards"] for k, j in together["jobs"].items()},
            "same_losses": {k: j["losses"] == alone_jobs[k]["losses"] for k, j in together["jobs"].items()}}
