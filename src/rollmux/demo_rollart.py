"""``rollmux rollart-demo``: RollArt's trajectory-level asynchrony measured on the demo's real
GRPO job (CPU, a local Ray).

Runs, on the same task and budget (same iterations, trajectories and optimizer steps):

* ``sync`` (k = 0), ``async-k1``, ``async-k2``: ``rollmux.grpo.async_grpo.run_async`` on
  ``ASYNC_PROFILE`` (the demo's reverse job with 2 PPO epochs, so its training is not
  negligible next to its rollout);
* ``agentic-turn`` and ``agentic-trajectory``: ``rollmux.grpo.agentic.run_agentic`` on
  ``AGENTIC_PROFILE`` (3-turn episodes, 3 ``EnvWorker`` actors) without and with
  trajectory-level scheduling.

Writes ``summary.json`` (per run: iterations, wall time per iteration, reward before /
after, ``async_speedup`` = the synchronous counterpart's wall time per iteration over this
run's, staleness used; with ``--reward-service`` the ``reward_service`` record of
``rollmux.reward_service.summary``), ``rewards.png`` (reward per iteration, sync vs async)
and, with the service, ``replicas.png``.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rollmux.grpo.profiles import ROLLOUT_HEAVY

ASYNC_PROFILE = replace(ROLLOUT_HEAVY, name="reverse-async", epochs=2, minibatch=384)
AGENTIC_PROFILE = replace(ROLLOUT_HEAVY, name="reverse-agent", prompts=8, samples=8, gen_batch=8, minibatch=192)


def run_rollart(out: Path, iterations: int = 8, staleness: tuple[int, ...] = (1, 2), agentic_iterations: int = 6,
                turns: int = 3, env_workers: int = 3, env_delay_s: float = 0.03, reward_service: bool = False,
                max_replicas: int = 2, log: Callable[[str], None] = print) -> dict:
    """All runs on a local Ray (2 CPUs, 127.0.0.1), shut down at the end; returns the summary."""
    import ray

    from rollmux.grpo.agentic import run_agentic
    from rollmux.grpo.async_grpo import run_async
    from rollmux.grpo.driver import warm_start_weights

    out.mkdir(parents=True, exist_ok=True)
    profile = replace(ASYNC_PROFILE, reward_service="rewards") if reward_service else ASYNC_PROFILE
    weights = warm_start_weights(ASYNC_PROFILE)
    agent_weights = warm_start_weights(AGENTIC_PROFILE)
    runs: dict[str, dict] = {}
    service_record = None
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        monitor = None
        if reward_service:
            from rollmux.reward_service import ReplicaMonitor, start_service

            start_service(max_replicas=max_replicas)
            monitor = ReplicaMonitor().start()
        latencies: list[float] = []
        for k in (0, *staleness):
            name = "sync" if k == 0 else f"async-k{k}"
            run = run_async(profile, iterations, weights, k)
            latencies += run.reward_latencies_ms
            runs[name] = {"kind": "grpo", **run.to_dict()}
            log(f"{name:20s} {run.wall_per_iteration_s:6.3f} s/iter  staleness used {run.staleness_used}  "
                f"overlap {run.overlap_s:5.2f} s  reward {run.reward_before:.3f} -> {run.reward_after:.3f}")
        if monitor is not None:
            from rollmux.reward_service import summary

            monitor.stop()
            service_record = summary(latencies, monitor)
        for schedule in ("turn", "trajectory"):
            name = f"agentic-{schedule}"
            run = run_agentic(AGENTIC_PROFILE, agentic_iterations, agent_weights, schedule, turns, env_workers,
                              env_delay_s)
            d = run.to_dict()
            runs[name] = {"kind": "agentic", **d}
            log(f"{name:20s} {d['wall_per_iteration_s']:6.3f} s/iter  generation busy "
                f"{d['generation_busy_fraction']:.2f}  env calls {run.env_calls_by_worker}  "
                f"reward {run.reward_before:.3f} -> {run.reward_after:.3f}")
    finally:
        if reward_service:
            from ray import serve

            serve.shutdown()
        ray.shutdown()
    for name, r in runs.items():
        base = runs["sync"] if r["kind"] == "grpo" else runs["agentic-turn"]
        r["async_speedup"] = base["wall_per_iteration_s"] / r["wall_per_iteration_s"]
        if r["kind"] == "agentic":
            r["staleness_used"] = [0] * r["iterations"]  # on-policy: generation and training alternate
    summary_doc = {"profile": ASYNC_PROFILE.name, "agentic_profile": AGENTIC_PROFILE.name, "iterations": iterations,
                   "agentic_iterations": agentic_iterations, "turns": turns, "env_workers": env_workers,
                   "runs": {n: _public(r) for n, r in runs.items()}}
    if service_record is not None:
        summary_doc["reward_service"] = service_record
    (out / "summary.json").write_text(json.dumps(summary_doc, indent=1))
    plot(summary_doc, out)
    return summary_doc


def _public(run: dict) -> dict:
    keep = ("kind", "iterations", "wall_s", "wall_per_iteration_s", "reward_before", "reward_after", "async_speedup",
            "staleness_bound", "staleness_used", "max_staleness", "overlap_s", "generation_s", "training_s",
            "rollout_s", "generation_busy_fraction", "rewards", "env_calls_by_worker", "schedule", "turns")
    out = {k: run[k] for k in keep if k in run}
    if run["kind"] == "grpo":
        out["ratio_out_of_clip"] = [b["ratio_out_of_clip"] for b in run["batches"]]
        out["clip_frac"] = [b["clip_frac"] for b in run["batches"]]
    else:
        out["busy_fraction_per_iteration"] = [r["busy_fraction"] for r in run["per_iteration"]]
        out["generate_calls"] = [r["generate_calls"] for r in run["per_iteration"]]
    return out


def plot(summary_doc: dict, out: Path) -> None:
    """rewards.png: reward per iteration, sync vs async (and the multi-turn runs); replicas.png with the service."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, r in summary_doc["runs"].items():
        ax = axes[0] if r["kind"] == "grpo" else axes[1]
        ax.plot(range(1, len(r["rewards"]) + 1), r["rewards"], marker="o",
                label=f"{name} ({r['wall_per_iteration_s']:.2f} s/iter)")
    axes[0].set_title("GRPO: synchronous vs bounded staleness")
    axes[1].set_title("multi-turn: per-turn barrier vs trajectory-level")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.set_ylabel("mean reward of the batch")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "rewards.png", dpi=110)
    plt.close(fig)
    service = summary_doc.get("reward_service")
    if service:
        fig, ax = plt.subplots(figsize=(6, 3))
        t, n = zip(*service["replicas_over_time"]) if service["replicas_over_time"] else ((), ())
        ax.step(t, n, where="post")
        ax.set_xlabel("s since the service started")
        ax.set_ylabel("running replicas")
        ax.set_title(f"reward service: {service['calls']} calls, p50 {service['p50_ms']:.1f} ms")
        fig.tight_layout()
        fig.savefig(out / "replicas.png", dpi=110)
        plt.close(fig)


def rollart_demo(out: Path = Path("rollart-demo"), iterations: int = 8, agentic_iterations: int = 6,
                 turns: int = 3, env_workers: int = 3, env_delay_s: float = 0.03,
                 reward_service: bool = False, max_replicas: int = 2) -> None:
    """Trajectory-level asynchrony on the demo job: sync vs async k=1,2, multi-turn with and without
    trajectory-level scheduling; writes summary.json and plots to OUT."""
    run_rollart(out, iterations, (1, 2), agentic_iterations, turns, env_workers, env_delay_s, reward_service,
                max_replicas)


def register(app) -> None:
    """Add the ``rollart-demo`` command to a typer ``app``."""
    import typer

    def command(out: Path = typer.Option(Path("rollart-demo"), help="Output folder."),
                iterations: int = typer.Option(8, min=1, help="GRPO iterations per run."),
                agentic_iterations: int = typer.Option(6, min=1, help="Multi-turn iterations per run."),
                turns: int = typer.Option(3, min=1, help="Turns per episode."),
                env_workers: int = typer.Option(3, min=1, help="EnvWorker actors."),
                env_delay_s: float = typer.Option(0.03, min=0.0, help="Base environment latency per step."),
                reward_service: bool = typer.Option(False, "--reward-service",
                                                    help="Score the GRPO rollouts through the shared reward service."),
                max_replicas: int = typer.Option(2, min=1, help="Reward service max replicas.")) -> None:
        """Trajectory-level asynchrony on the demo job (sync vs async k=1,2; multi-turn scheduling)."""
        rollart_demo(out, iterations, agentic_iterations, turns, env_workers, env_delay_s, reward_service,
                     max_replicas)

    app.command("rollart-demo")(command)
