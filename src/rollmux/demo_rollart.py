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

``--live`` (``run_rollart_live``): three jobs at once under the live control plane (the
``rollmux demo`` service on 127.0.0.1, a local Ray with one node per RollMux node: rollout
R0, R1 and training T0, T1), sharing one reward service: an asynchronous GRPO job (k = 1,
``run_async_live``: rollout i+1 granted while training i runs, from two threads), a
multi-turn agentic job (``run_agentic_live``, trajectory-level scheduling, its environment
workers scoring through the service) and a synchronous GRPO job (``rollmux.grpo.driver.run_job``).
The planner keeps the asynchronous job in a group of its own (R0 + T0) and packs the two
synchronous ones into one co-execution group (R1 + T1) whose phases it interleaves.
``summary.json``: per job its group and nodes, iterations, wall time per iteration, the
batch reward before / after (``_edge``: the mean of the first / last k = min(2, n // 2) of the
n iterations, at least one, so the two windows never share an iteration when n >= 2), the staleness used;
``phases`` (every phase span per node, seconds from the start, as the jobs' SDKs measured
them) and ``checks`` (no two phases overlapped on a node; each synchronous job alternated;
the asynchronous job's rollout i+1 overlapped its training i and never ran more than k
ahead, from the spans and from the service's event log); the reward service's record.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path

from rollmux.errors import OutputPathError, SpecError

#: --live: the staleness of the asynchronous job; the three jobs are ``LIVE_JOBS``
#: (name, profile, staleness). They share the model, task and seed, so one warm-up serves all three.
LIVE_STALENESS = 1


@cache
def _profiles() -> dict:
    """``ASYNC_PROFILE``, ``AGENTIC_PROFILE``, ``LIVE_JOBS``: made on first use, because the
    profiles import torch and the CLI registers this command at every start."""
    from rollmux.grpo.profiles import ROLLOUT_HEAVY

    asynchronous = replace(ROLLOUT_HEAVY, name="reverse-async", epochs=2, minibatch=384)
    agentic = replace(ROLLOUT_HEAVY, name="reverse-agent", prompts=8, samples=8, gen_batch=8, minibatch=192)
    live = (("async-k1", replace(asynchronous, name="async-k1", slo=3.0), LIVE_STALENESS),
            ("agentic", replace(agentic, name="agentic", slo=3.0), 0),
            ("sync", replace(asynchronous, name="sync", slo=3.0), 0))
    return {"ASYNC_PROFILE": asynchronous, "AGENTIC_PROFILE": agentic, "LIVE_JOBS": live}


def __getattr__(name: str):
    if name in ("ASYNC_PROFILE", "AGENTIC_PROFILE", "LIVE_JOBS"):
        return _profiles()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The specs' phase times (s) for the planner: estimates of the order the jobs measure on
#: 2 shared cores, not profiled (the service reports measured maxima and over-profile
#: phases); the SLO of 3 absorbs the contention of three jobs on two cores.
LIVE_ESTIMATES = {"async-k1": (1.0, 1.0), "agentic": (1.5, 0.5), "sync": (0.8, 1.0)}


def _check_env_delay(env_delay_s: float) -> None:
    """Raises ``SpecError`` unless ``env_delay_s`` is a finite number of seconds >= 0 (an
    infinite one would hold every environment step forever)."""
    if isinstance(env_delay_s, bool) or not isinstance(env_delay_s, (int, float)) \
            or not (math.isfinite(env_delay_s) and env_delay_s >= 0):
        raise SpecError("env_delay_s", env_delay_s, "a finite number of seconds >= 0")


def run_rollart(out: Path, iterations: int = 8, staleness: tuple[int, ...] = (1, 2), agentic_iterations: int = 6,
                turns: int = 3, env_workers: int = 3, env_delay_s: float = 0.03, reward_service: bool = False,
                max_replicas: int = 2, log: Callable[[str], None] = print) -> dict:
    """All runs on a local Ray (2 CPUs, 127.0.0.1), shut down at the end; returns the summary.
    Raises ``SpecError`` before any work on a bad ``env_delay_s`` (``_check_env_delay``)."""
    _check_env_delay(env_delay_s)
    import ray

    from rollmux.grpo.agentic import run_agentic
    from rollmux.grpo.async_grpo import run_async
    from rollmux.grpo.driver import warm_start_weights
    from rollmux.runtime.ray_start import start_ray

    out.mkdir(parents=True, exist_ok=True)
    profiles = _profiles()
    async_profile, agentic_profile = profiles["ASYNC_PROFILE"], profiles["AGENTIC_PROFILE"]
    profile = replace(async_profile, reward_service="rewards") if reward_service else async_profile
    weights = warm_start_weights(async_profile)
    agent_weights = warm_start_weights(agentic_profile)
    runs: dict[str, dict] = {}
    service_record = None
    start_ray(lambda: ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                               _node_ip_address="127.0.0.1"))
    monitor = None
    try:
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
            run = run_agentic(agentic_profile, agentic_iterations, agent_weights, schedule, turns, env_workers,
                              env_delay_s)
            d = run.to_dict()
            runs[name] = {"kind": "agentic", **d}
            log(f"{name:20s} {d['wall_per_iteration_s']:6.3f} s/iter  generation busy "
                f"{d['generation_busy_fraction']:.2f}  env calls {run.env_calls_by_worker}  "
                f"reward {run.reward_before:.3f} -> {run.reward_after:.3f}")
    finally:
        if monitor is not None:
            monitor.stop()  # before Serve and Ray go down (idempotent): its polls would start a new Ray
        if reward_service:
            from ray import serve

            serve.shutdown()
        ray.shutdown()
    for name, r in runs.items():
        base = runs["sync"] if r["kind"] == "grpo" else runs["agentic-turn"]
        r["async_speedup"] = base["wall_per_iteration_s"] / r["wall_per_iteration_s"]
        if r["kind"] == "agentic":
            r["staleness_used"] = [0] * r["iterations"]  # on-policy: generation and training alternate
    summary_doc = {"profile": async_profile.name, "agentic_profile": agentic_profile.name,
                   "iterations": iterations,
                   "agentic_iterations": agentic_iterations, "turns": turns, "env_workers": env_workers,
                   "runs": {n: _public(r) for n, r in runs.items()}}
    if service_record is not None:
        summary_doc["reward_service"] = service_record
    (out / "summary.json").write_text(json.dumps(summary_doc, indent=1))
    plot(summary_doc, out)
    return summary_doc


def run_rollart_live(out: Path, iterations: int = 6, agentic_iterations: int | None = None, turns: int = 3,
                     env_workers: int = 3, env_delay_s: float = 0.03, reward_service: bool = True,
                     max_replicas: int = 2, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """The three jobs under the live control plane (see the module docstring); returns the
    summary written to ``out/summary.json``. ``quick``: smaller batches (tests). Raises
    ``SpecError`` before any work on a bad ``env_delay_s`` (``_check_env_delay``)."""
    _check_env_delay(env_delay_s)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from rollmux.demo import _control_plane
    from rollmux.grpo.agentic import run_agentic_live
    from rollmux.grpo.async_grpo import run_async_live
    from rollmux.grpo.driver import job_spec, run_job, run_together, warm_start_weights
    from rollmux.runtime.ray_adapter import demo_ray
    from rollmux.runtime.sdk import Client

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    live_jobs = _profiles()["LIVE_JOBS"]
    counts = {"async-k1": iterations, "sync": iterations, "agentic": agentic_iterations or iterations}
    app = "rewards" if reward_service else None
    profiles = {}
    for name, profile, _k in live_jobs:
        if quick:
            profile = replace(profile, prompts=max(4, profile.prompts // 4), minibatch=max(32, profile.minibatch // 4))
        if name != "agentic" and app is not None:
            profile = replace(profile, reward_service=app)
        profiles[name] = profile
    staleness = {name: k for name, _p, k in live_jobs}
    log("warm-up: supervised pretraining (one policy: the three jobs share model, task and seed)")
    t_start = time.time()
    weights = warm_start_weights(_profiles()["ASYNC_PROFILE"])
    runs, latencies, service_record = {}, [], None
    log(f"[{time.time() - t_start:5.1f} s] starting Ray (R0, R1, T0, T1{' on one Ray node' if quick else ''}) "
        "and the control plane")
    with demo_ray(["R0", "R1"], ["T0", "T1"], one_node=quick), _control_plane(2, 2, out) as (url, token):
        monitor = None
        try:
            if app is not None:
                from rollmux.reward_service import ReplicaMonitor, start_service

                log(f"[{time.time() - t_start:5.1f} s] starting the reward service")
                start_service(max_replicas=max_replicas)
                monitor = ReplicaMonitor().start()
            log(f"[{time.time() - t_start:5.1f} s] submitting the three jobs")
            client = Client(url, token=token)
            try:
                handles = {}
                for name, profile, k in live_jobs:
                    spec = job_spec(name, profiles[name], *LIVE_ESTIMATES[name], iterations=counts[name])
                    handles[name] = client.submit({**spec, "staleness": k})
                for name, h in handles.items():
                    p = h.placement
                    log(f"{name:9s} -> " + ("waiting for nodes" if p is None else
                                            f"{p['group_id']} rollout {p['rollout_nodes']} train {p['train_nodes']}")
                        + f" ({h.view.get('outcome', '')})")
                t0 = time.time()
                switches: list = []

                def drive(profile, handle):
                    name = handle.job_id
                    if name == "async-k1":
                        return run_async_live(handle, profile, counts[name], weights)
                    if name == "agentic":
                        return run_agentic_live(handle, profile, counts[name], weights, "trajectory", turns,
                                                env_workers, env_delay_s, reward_app=app, switches=switches)
                    return run_job(handle, profile, counts[name], weights)

                names = [n for n, _p, _k in live_jobs]
                runs = run_together([profiles[n] for n in names], [handles[n] for n in names], drive)
                log(f"[{time.time() - t_start:5.1f} s] all jobs done")
                events = client.events(0)
                status = client.status()
            finally:
                client.close()
        finally:
            if monitor is not None:
                from rollmux.reward_service import summary

                monitor.stop()  # before Serve and Ray go down: its polls would start a new Ray
                latencies = [*runs["async-k1"].reward_latencies_ms, *runs["agentic"].reward_latencies_ms] if runs \
                    else []
                service_record = summary(latencies, monitor)
            if app is not None:
                from ray import serve

                serve.shutdown()
    assert not ray.is_initialized()
    doc = live_summary(runs, handles, events, status, staleness, t0, counts)
    doc.update(wall_s=time.time() - t_start, quick=quick, turns=turns, env_workers=env_workers,
               estimates=LIVE_ESTIMATES)
    if service_record is not None:
        service_record["callers"] = ("async-k1 rollouts and agentic environment steps (the sync job's worker "
                                     "calls it too; its latencies stay in the worker)")
        doc["reward_service"] = service_record
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    for line in live_lines(doc):
        log(line)
    return doc


def _edge(values: list[float], first: bool) -> float:
    """The mean of the first (``first``) or last k of the n ``values``, k = min(2, n // 2) but at
    least 1: disjoint windows for n >= 2 (for n = 1 both are the one value)."""
    k = max(1, min(2, len(values) // 2))
    return statistics.fmean(values[:k] if first else values[-k:])


def live_summary(runs: dict, handles: dict, events: list[dict], status: dict, staleness: dict, t0: float,
                 counts: dict) -> dict:
    """The live run's summary: jobs, phase spans per node and the checks (module docstring)."""
    jobs, phases = {}, defaultdict(list)
    for name, h in handles.items():
        run = runs[name]
        seen = defaultdict(int)
        spans = []
        for pool, nodes, _seq, start, end in h.history:
            spans.append({"job": name, "pool": pool, "iteration": seen[pool], "nodes": list(nodes),
                          "start": round(start - t0, 4), "end": round(end - t0, 4)})
            seen[pool] += 1
            for node in nodes:
                phases[node].append(spans[-1])
        if name == "async-k1":
            rewards, used = [b["reward"] for b in run.batches], run.staleness_used
        elif name == "agentic":
            rewards, used = [r["reward"] for r in run.per_iteration], [0] * len(run.per_iteration)
        else:
            rewards, used = run.rewards, [0] * len(run.rewards)
        wall = max(s["end"] for s in spans) - min(s["start"] for s in spans)
        place = h.placement or {}
        jobs[name] = {"staleness": staleness[name], "group": place.get("group_id"),
                      "rollout_nodes": place.get("rollout_nodes"), "train_nodes": place.get("train_nodes"),
                      "iterations": len(rewards), "iterations_target": counts[name],
                      "wall_s": wall, "wall_per_iteration_s": wall / max(1, len(rewards)),
                      "reward_before": _edge(rewards, True), "reward_after": _edge(rewards, False),
                      "rewards": rewards, "staleness_used": used,
                      "service_iterations_done": next((j["iterations_done"] for j in status["jobs"]
                                                       if j["job_id"] == name), None)}
    for spans in phases.values():
        spans.sort(key=lambda s: s["start"])
    return {"jobs": jobs, "phases": dict(phases), "checks": live_checks(handles, events, staleness)}


def live_checks(handles: dict, events: list[dict], staleness: dict) -> dict:
    """Whether the phases alternated and overlapped as the execution rule says, from the
    jobs' own spans (wall clock) and from the service's event log (sequence order)."""
    by_node = defaultdict(list)
    for name, h in handles.items():
        for pool, nodes, _seq, start, end in h.history:
            for node in nodes:
                by_node[node].append((start, end))
    node_ok = all(a[1] <= b[0] for spans in by_node.values() for a, b in zip(sorted(spans), sorted(spans)[1:]))
    out: dict = {"no_two_phases_on_a_node": node_ok}
    # the log: who holds each node, each job's counters (r, f, t) at each grant
    holder, held, count, log_ok = {}, {}, defaultdict(lambda: [0, 0, 0]), True
    for e in sorted(events, key=lambda e: e["seq"]):
        job, pool = e["job_id"], e["pool"]
        if e["kind"] == "grant":
            r, f, t = count[job]
            log_ok &= (job, pool) not in held and not any(n in holder for n in e["nodes"])
            if pool == "rollout":
                log_ok &= r - t <= staleness.get(job, 0)
                count[job][0] += 1
            else:
                log_ok &= f > t
            held[(job, pool)] = e["nodes"]
            holder.update({n: job for n in e["nodes"]})
        elif e["kind"] == "finish":
            for n in held.pop((job, pool), ()):
                holder.pop(n, None)
            count[job][1 if pool == "rollout" else 2] += 1
        elif e["kind"] == "remove":
            for p in ("rollout", "train"):
                for n in held.pop((job, p), ()):
                    holder.pop(n, None)
    out["log_respects_rule"] = bool(log_ok)
    for name, h in handles.items():
        hist = h.history
        if staleness[name] == 0:
            names = [x[0] for x in hist]
            out[f"{name}_alternated"] = (names == ["rollout", "train"] * (len(names) // 2)
                                         and all(a[4] <= b[3] for a, b in zip(hist, hist[1:])))
        else:
            rolls = [(x[3], x[4]) for x in hist if x[0] == "rollout"]
            trains = [(x[3], x[4]) for x in hist if x[0] == "train"]
            pairs = [max(0.0, min(rolls[i + 1][1], trains[i][1]) - max(rolls[i + 1][0], trains[i][0]))
                     for i in range(min(len(rolls) - 1, len(trains)))]
            # rollout j (0-based) began only after training j-1-k ended
            k = staleness[name]
            ahead = all(rolls[j][0] >= trains[j - 1 - k][1] for j in range(k + 1, len(rolls)))
            out[f"{name}_overlap_s"] = sum(pairs)
            out[f"{name}_rollout_overlapped_training"] = sum(1 for x in pairs if x > 0)
            out[f"{name}_never_more_than_k_ahead"] = ahead
    return out


def live_lines(doc: dict) -> list[str]:
    lines = [f"{'job':10s}{'k':>2s} {'group':>6s} {'nodes':>8s} {'iters':>6s} {'s/iter':>7s}  reward before -> after"]
    for name, j in doc["jobs"].items():
        lines.append(f"{name:10s}{j['staleness']:>2d} {j['group'] or '-':>6s} "
                     f"{'+'.join((j['rollout_nodes'] or []) + (j['train_nodes'] or [])):>8s} {j['iterations']:>6d} "
                     f"{j['wall_per_iteration_s']:>7.2f}  {j['reward_before']:.3f} -> {j['reward_after']:.3f}")
    lines.append("checks: " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in doc["checks"].items()))
    if "reward_service" in doc:
        r = doc["reward_service"]
        lines.append(f"reward service: {r['calls']} calls counted, p50 {r['p50_ms'] or 0:.1f} ms, "
                     f"p99 {r['p99_ms'] or 0:.1f} ms, replicas max {r['replicas_max']}")
    return lines


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
        ax.set_xlabel("s since the service was ready")
        ax.set_ylabel("running replicas")
        ax.set_title(f"reward service: {service['calls']} calls, p50 {service['p50_ms']:.1f} ms")
        fig.tight_layout()
        fig.savefig(out / "replicas.png", dpi=110)
        plt.close(fig)


def rollart_demo(out: Path = Path("rollart-demo"), iterations: int = 8, agentic_iterations: int = 6,
                 turns: int = 3, env_workers: int = 3, env_delay_s: float = 0.03,
                 reward_service: bool = False, max_replicas: int = 2, live: bool = False) -> None:
    """Trajectory-level asynchrony on the demo job: sync vs async k=1,2, multi-turn with and without
    trajectory-level scheduling; writes summary.json and plots to OUT. ``live``: the three jobs
    under the live control plane instead (always with the reward service)."""
    if live:
        run_rollart_live(out, iterations, agentic_iterations, turns, env_workers, env_delay_s, True, max_replicas)
        return
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
                max_replicas: int = typer.Option(2, min=1, help="Reward service max replicas."),
                live: bool = typer.Option(False, "--live",
                                          help="Run three jobs (async k=1, multi-turn agentic, sync) at once under "
                                               "the live control plane, sharing the reward service.")) -> None:
        """Trajectory-level asynchrony on the demo job (sync vs async k=1,2; multi-turn scheduling);
        --live: three jobs multiplexed by the live control plane. A bad option (``--out`` not a
        writable folder, ``--env-delay-s`` not finite) exits 2 naming it, before any work."""
        from rollmux.report.paths import check_writable

        try:
            check_writable(out, "--out", directory=True)
            rollart_demo(out, iterations, agentic_iterations, turns, env_workers, env_delay_s, reward_service,
                         max_replicas, live)
        except (SpecError, OutputPathError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2)

    app.command("rollart-demo")(command)
