"""``rollmux demo``: real GRPO jobs multiplexed by RollMux on a local Ray cluster.

What ``run_demo`` does, in order:

1. Warm-up: each job profile's supervised warm-up runs once in this process, so every
   run of a job starts from the same weights (reward above zero from the start).
2. A local Ray cluster (one Ray node per RollMux node: 1 rollout node for two jobs, 2
   for three; 1 training node) and the control plane (in-process HTTP service on
   127.0.0.1, bounded inventory of the same nodes) start.
3. Profile: each job runs alone for ``PROFILE_ITERATIONS`` iterations; its mean phase
   times become the ``t_roll_s`` / ``t_train_s`` of its spec (what the planner uses).
4. Iterations: ``iterations`` if given, else as many as fit ``minutes`` of measured
   runs (solo runs plus the multiplexed run, estimated from the profile).
5. Solo: each job runs alone (its own rollout and training node, nobody else on
   them), one after the other, for that many iterations.
6. Multiplexed: all jobs are submitted together, the planner places them (into one
   co-execution group when its SLO and saturation checks allow), and they run
   concurrently, their phases granted by the group scheduler.
7. Report: busy fraction per pool (phase node-seconds / (nodes x wall time)),
   multiplexed vs solo; slowdown per job (multiplexed mean iteration time / solo mean
   iteration time) against its SLO; reward first -> last; warm switch times from the
   workers' StateCache records. Written to ``out_dir``: ``results.json``,
   ``summary.json`` (per job iterations, rewards and ``weight_sync``: the weight syncs'
   bytes across the pools, bytes inside the rollout pool and seconds, in total and per
   iteration, ``JobRun.weight_sync_summary``; ``moves`` is empty here),
   ``gantt.png`` (measured phases per node), ``rewards.png``, ``busy.png``.

Every phase of every run goes through the SDK (grant, warm load, work, offload,
release), so solo and multiplexed runs carry the same overheads.

``--tail`` (``tail=True``): the long-tail hand-off. Each job gets ``TAIL_WORKERS``
rollout workers on its rollout node (each standing for 8 / ``TAIL_WORKERS`` of its 8
GPUs); every rollout is generated in lock-step rounds of ``gen_batch`` chunks over the
active workers and, once 80% of its sequences are done, reports its tail
(``Phase.tail``) and continues on the workers covering the GPUs it keeps (the spec's
``tail_workers`` is one worker's GPUs, so it keeps one worker); the service
hands the freed GPUs to the next queued rollout of the group, which runs on
``share x TAIL_WORKERS`` workers (at least 1) and grows to all of them when the donor's
rollout ends (``rollmux.grpo.driver._tail_rollout``). Every run (profile, solo,
multiplexed) rolls out this way, so they stay comparable. ``summary.json`` gets
``handoffs`` (count, each slice's donor, recipient, node, share and seconds) and
``gpu_peak`` (the most GPUs any node ran at once, from the recorded stretches); the
Gantt chart draws a rollout stretch at the fraction of the node's GPUs it held.

``--policy rollmux-consolidate`` runs the live-move scenario instead
(``rollmux.demo_moves``): three jobs, a departure, and a job moved to another group
with its Ray workers and state handed over through the object store.
``--policy rollmux-regroup`` runs it on an unbounded cluster, where the departure makes
the service regroup both remaining jobs into a new group on fresh nodes.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from rollmux.errors import OutputPathError, SpecError
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, PoolSpec, SwitchCost

PROFILE_ITERATIONS = 2
SWITCH_ESTIMATE_S = 0.05  # per phase start, charged by the planner: warm load + grant round trip
QUICK_ITERATIONS = 4
#: The least SLO of a quick run's jobs. Quick phases last a tenth of a second, timed over a
#: two-iteration profile on a loaded machine; the measured times of two jobs can then put
#: their pair past the profiles' SLO of 2.0, the planner rightly refuses it, and the jobs
#: run one after the other (a CI failure). Five quick runs on an idle machine planned the
#: pair at 1.42-1.71; 3.0 leaves room for a loaded one.
QUICK_SLO = 3.0
TAIL_WORKERS = 2  # rollout workers per job with --tail (each stands for 8 / TAIL_WORKERS GPUs)
GPUS_PER_NODE = 8


def run_demo(out_dir: Path, jobs: int = 2, minutes: float = 4.0, iterations: int | None = None,
             quick: bool = False, log: Callable[[str], None] = print, tail: bool = False,
             solo: bool = True) -> dict:
    """Run the demo and write its report to ``out_dir``; returns the results dict.

    ``jobs``: 2 or 3. ``minutes``: wall budget of the solo plus multiplexed runs, used
    when ``iterations`` is None. ``quick``: a shortened run for tests (two-iteration
    profile, ``QUICK_ITERATIONS`` iterations unless given, a smaller batch per job, one
    Ray node for all RollMux nodes: ``ray_adapter.demo_ray``).
    ``tail``: the long-tail hand-off (chunked rollouts on ``TAIL_WORKERS`` workers per job).
    ``solo=False`` (tests): no separate solo runs; the profile runs stand for them.
    Raises ``SpecError`` before any work on a bad ``jobs``, ``iterations`` or ``minutes``
    (not a positive, finite number).
    """
    from rollmux.grpo.profiles import DEMO_PROFILES

    if jobs not in DEMO_PROFILES:
        raise SpecError("jobs", jobs, f"one of {sorted(DEMO_PROFILES)}")
    if iterations is not None and iterations < 1:
        raise SpecError("iterations", iterations, "an integer >= 1 or None")
    if not (math.isfinite(minutes) and minutes > 0):
        raise SpecError("minutes", minutes, "a positive, finite number of minutes")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from rollmux.grpo.driver import TailConfig, warm_start_weights
    from rollmux.runtime.ray_adapter import demo_ray

    tail_config = TailConfig(TAIL_WORKERS, gpus_per_node=GPUS_PER_NODE) if tail else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    profiles = DEMO_PROFILES[jobs]
    if quick:
        profiles = tuple(replace(_shrunk(p), slo=max(p.slo, QUICK_SLO)) for p in profiles)
        iterations = iterations or QUICK_ITERATIONS
    t_start = time.time()
    log(f"warm-up: supervised pretraining of {len(profiles)} policies")
    weights = {p.name: warm_start_weights(p) for p in profiles}
    rollout_nodes = [f"R{i}" for i in range(1 if jobs == 2 else 2)]
    train_nodes = ["T0"]
    log(f"starting Ray: rollout pool {rollout_nodes}, training pool {train_nodes}"
        + (" (one Ray node)" if quick else ""))
    with demo_ray(rollout_nodes, train_nodes, one_node=quick), _control_plane(
            len(rollout_nodes), len(train_nodes), out_dir) as (url, token):
        from rollmux.runtime.sdk import Client

        client = Client(url, token=token)
        try:
            log("profile: each job alone for "
                f"{PROFILE_ITERATIONS} iterations (measures t_roll_s, t_train_s for the planner)")
            profiled = {p.name: _run_alone(client, p, f"{p.name}-profile", PROFILE_ITERATIONS, weights[p.name], log,
                                           tail_config) for p in profiles}
            times = {name: _phase_means(run) for name, run in profiled.items()}
            if iterations is None:
                iterations = _fit_iterations(times, minutes, len(rollout_nodes), len(train_nodes))
            log(f"iterations per job: {iterations}")
            if solo:
                solo = {p.name: _run_alone(client, p, f"{p.name}-solo", iterations, weights[p.name], log,
                                           tail_config) for p in profiles}
            else:
                log("solo: the profile runs stand for the solo runs")
                solo = profiled
            mux, explanations = _run_multiplexed(client, profiles, times, iterations, weights, log, tail_config)
        finally:
            client.close()
    assert not ray.is_initialized()
    results = _report(profiles, times, solo, mux, explanations, iterations, time.time() - t_start)
    results["tail"] = tail
    if tail:
        spans = _span_dicts(mux)
        results["handoffs"] = handoffs(spans)
        results["gpu_peak"] = gpu_peak(spans)
    _write(results, solo, mux, out_dir)
    for line in summary_lines(results):
        log(line)
    return results


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to the ``rollmux`` CLI."""

    @app.command("demo")
    def demo(
        out: Path = typer.Option(Path("demo-out"), help="Where to write results.json and the plots."),
        jobs: Optional[int] = typer.Option(None, help="With rollmux: the number of GRPO jobs, 2 (one rollout and "
                                                      "one training node; the default) or 3 (two rollout nodes; on a "
                                                      "2-core machine CPU contention slows phases). The move policies "
                                                      "run three jobs of their own."),
        minutes: float = typer.Option(4.0, help="Wall budget of the solo plus multiplexed runs."),
        iterations: Optional[int] = typer.Option(None, help="Iterations per job (overrides --minutes); with "
                                                                  "rollmux-consolidate or rollmux-regroup, N of the "
                                                                  "N/3, N, 3N jobs, at least 3."),
        policy: str = typer.Option("rollmux", help="rollmux (two or three jobs, solo against multiplexed), "
                                                   "rollmux-consolidate (three jobs; a departure moves a job live) or "
                                                   "rollmux-regroup (three jobs on an unbounded cluster; a departure "
                                                   "regroups the two others on fresh nodes)."),
        migration_s: Optional[float] = typer.Option(None, "--migration-s",
                                                    help="With rollmux-consolidate or rollmux-regroup: the planned "
                                                         "pause of a move until the service has measured one "
                                                         "(default 8 s)."),
        tail: bool = typer.Option(False, "--tail",
                                  help="With rollmux: long-tail hand-off: chunked rollouts on several workers per "
                                       "job; at 80% of "
                                       "sequences done a rollout shrinks and the next queued rollout starts on "
                                       "the freed share of the node."),
    ) -> None:
        """Run real GRPO jobs on a local Ray cluster under the live control plane; report and plot.
        A bad option (``--out`` not a writable folder, ``--minutes`` not positive and finite, an
        option the chosen policy does not take) exits 2 naming it, before any work."""
        from rollmux.report.paths import check_writable

        try:
            moves = policy in ("rollmux-consolidate", "rollmux-regroup")
            if policy != "rollmux" and not moves:
                raise SpecError("policy", policy, "rollmux, rollmux-consolidate or rollmux-regroup")
            unused = ([("--jobs", jobs), ("--tail", tail or None)] if moves else [("--migration-s", migration_s)])
            for option, value in unused:
                if value is not None:
                    raise SpecError(option, value, f"no {option} with --policy {policy} (it does not use it)")
            check_writable(out, "--out", directory=True)
            if moves:
                from rollmux.demo_moves import run_move_demo

                run_move_demo(out, minutes=minutes, iterations=iterations, policy=policy,
                              migration_s=8.0 if migration_s is None else migration_s)
                return
            run_demo(out, jobs=2 if jobs is None else jobs, minutes=minutes, iterations=iterations, tail=tail)
        except (SpecError, OutputPathError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2)


def summary_lines(results: dict) -> list[str]:
    """The human-readable report of a results dict."""
    lines = [f"demo: {len(results['jobs'])} jobs x {results['iterations']} iterations, "
             f"{results['wall_s']:.0f} s in all; planner: " + "; ".join(results["placement_explanations"])]
    lines.append(f"{'job':<12}{'params':>9}{'t_roll':>8}{'t_train':>8}{'solo s/it':>10}{'mux s/it':>9}"
                 f"{'slowdown':>9}{'SLO':>5}  reward first->last (exact)")
    for j in results["jobs"]:
        lines.append(
            f"{j['job']:<12}{j['params']:>9,}{j['t_roll_s']:>8.2f}{j['t_train_s']:>8.2f}"
            f"{j['solo_iteration_s']:>10.2f}{j['mux_iteration_s']:>9.2f}{j['slowdown']:>9.2f}{j['slo']:>5.1f}"
            f"  {j['reward_first']:.3f} -> {j['reward_last']:.3f} ({j['exact_first']:.2f} -> {j['exact_last']:.2f})"
            f"{'' if j['meets_slo'] else '  SLO MISSED'}")
    for mode in ("solo", "multiplexed"):
        b = results["busy"][mode]
        lines.append(f"busy fraction {mode:<12} rollout {b[ROLLOUT]:.0%}  train {b[TRAIN]:.0%}  "
                     f"(wall {results['wall'][mode]:.1f} s)")
    s = results["switches"]
    lines.append(f"warm switches: {s['count']} (load mean {s['load_mean_ms']:.1f} ms, max {s['load_max_ms']:.1f} ms; "
                 f"offload mean {s['offload_mean_ms']:.1f} ms, max {s['offload_max_ms']:.1f} ms; "
                 f"{s['bytes_max'] / 1e6:.1f} MB largest state)")
    if results.get("tail"):
        h = results["handoffs"]
        lines.append(f"long-tail hand-offs: {h['count']} (slices ran " + ", ".join(f"{x:.2f}" for x in h["slice_s"])
                     + f" s); most GPUs on one node at once: {results['gpu_peak']['gpus']:g} of {GPUS_PER_NODE} "
                     f"(service accounting {results['gpu_peak']['service_gpus']:g})")
    return lines


# --- runs -------------------------------------------------------------------------------

@contextmanager
def _control_plane(rollout_nodes: int, train_nodes: int, out_dir: Path, policy: str = "rollmux",
                   migration_s: float = 300.0) -> Iterator[tuple[str, str]]:
    """The control plane over a bounded inventory, served on a free 127.0.0.1 port in a thread."""
    import uvicorn

    from rollmux.runtime.service import Service, ServiceConfig, server_config

    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=rollout_nodes),
                      train=PoolSpec("H800", 5.28, nodes=train_nodes),
                      switch_cost=SwitchCost(mode="fixed", rollout_s=SWITCH_ESTIMATE_S, train_s=SWITCH_ESTIMATE_S))
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rollmux-demo-") as state_dir:
        config = ServiceConfig(lease_s=60.0, policy=policy, migration_s=migration_s)
        service = Service(cluster, str(Path(state_dir) / "state.db"), token, config)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = uvicorn.Server(server_config(service, "127.0.0.1", port))
        thread = threading.Thread(target=server.run, name="rollmux-demo-service", daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError("the demo's control plane did not start within 30 s")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}", token
        finally:
            server.should_exit = True
            thread.join(30)


def _run_alone(client, profile, job_id, iterations, weights, log, tail=None):
    from rollmux.grpo.driver import job_spec, run_job

    # The spec of a lone job only needs to fit; its phase times do not matter to anyone else.
    job = client.submit(job_spec(job_id, profile, 1.0, 1.0, tail_workers=tail and tail.gpus_per_worker))
    run = run_job(job, profile, iterations, weights, tail=tail)
    log(f"  {job_id}: {run.mean_iteration_s:.2f} s/iteration, reward {run.rewards[0]:.3f} -> {run.rewards[-1]:.3f}")
    return run


def _run_multiplexed(client, profiles, times, iterations, weights, log, tail=None):
    from rollmux.grpo.driver import job_spec, run_job, run_together

    handles = [client.submit(job_spec(p.name, p, *times[p.name], tail_workers=tail and tail.gpus_per_worker))
               for p in profiles]
    explanations = []
    for p, h in zip(profiles, handles):
        placement = h.placement
        where = "waiting for nodes" if placement is None else (
            f"{placement['group_id']} R{list(placement['rollout_nodes'])} T{list(placement['train_nodes'])}")
        explanations.append(f"{p.name} -> {where} ({h.view.get('outcome', '')})")
    log("multiplexed: " + "; ".join(explanations))
    runs = run_together(profiles, handles, lambda p, h: run_job(
        h, p, iterations, weights[p.name], tail=tail,
        on_iteration=lambda j, i, r: log(f"  {j} it {i}: reward {r:.3f}") if (i + 1) % 10 == 0 else None))
    return runs, explanations


# --- numbers ----------------------------------------------------------------------------

def _phase_means(run) -> tuple[float, float]:
    """Mean measured (rollout, train) phase seconds of a run."""
    return tuple(statistics.fmean(s.end - s.start for s in run.spans if s.pool == pool) for pool in POOLS)


def _fit_iterations(times: dict, minutes: float, rollout_nodes: int, train_nodes: int) -> int:
    """Iterations such that the solo runs plus the multiplexed run take about ``minutes``.

    The multiplexed iteration is estimated as the busiest pool's load per node or the
    longest solo iteration, whichever is larger.
    """
    solo = sum(r + t for r, t in times.values())
    mux = max(max(r + t for r, t in times.values()),
              sum(r for r, _ in times.values()) / rollout_nodes,
              sum(t for _, t in times.values()) / train_nodes)
    return max(QUICK_ITERATIONS, math.floor(minutes * 60 / (solo + 1.2 * mux)))


def _busy(runs: list, shared: bool) -> tuple[dict[str, float], float]:
    """Busy fraction per pool and the wall time it is measured over.

    ``shared``: the runs ran together, so the pool is the union of their nodes over the
    span from the first grant to the last release; else each run had its own nodes for
    its own span and the node-seconds add up.
    """
    busy = {}
    if shared:
        wall = max(r.end for r in runs) - min(r.start for r in runs)
        for pool in POOLS:
            nodes = {n for r in runs for n in r.placement[f"{pool}_nodes"]}
            busy[pool] = sum(r.phase_seconds(pool) for r in runs) / (len(nodes) * wall)
    else:
        wall = sum(r.end - r.start for r in runs)
        for pool in POOLS:
            capacity = sum(len(r.placement[f"{pool}_nodes"]) * (r.end - r.start) for r in runs)
            busy[pool] = sum(r.phase_seconds(pool) for r in runs) / capacity
    return busy, wall


def _edge_mean(values: list[float], first: bool) -> float:
    k = max(1, min(3, len(values) // 4))
    part = values[:k] if first else values[-k:]
    return statistics.fmean(part)


def _report(profiles, times, solo, mux, explanations, iterations, wall_s) -> dict:
    rows = []
    for p in profiles:
        s, m = solo[p.name], mux[p.name]
        slowdown = m.mean_iteration_s / s.mean_iteration_s
        rows.append({
            "job": p.name, "task": p.task, "params": m.params, "slo": p.slo,
            "t_roll_s": times[p.name][0], "t_train_s": times[p.name][1],
            "solo_iteration_s": s.mean_iteration_s, "mux_iteration_s": m.mean_iteration_s,
            "slowdown": slowdown, "meets_slo": slowdown <= p.slo,
            "reward_first": _edge_mean(m.rewards, True), "reward_last": _edge_mean(m.rewards, False),
            "exact_first": _edge_mean(m.exact, True), "exact_last": _edge_mean(m.exact, False),
            "solo_reward_first": _edge_mean(s.rewards, True), "solo_reward_last": _edge_mean(s.rewards, False),
        })
    busy_solo, wall_solo = _busy(list(solo.values()), shared=False)
    busy_mux, wall_mux = _busy(list(mux.values()), shared=True)
    switches = [sw for r in mux.values() for sw in r.switches]
    loads = [sw.seconds * 1e3 for sw in switches if sw.direction == "load"]
    offloads = [sw.seconds * 1e3 for sw in switches if sw.direction == "offload"]
    return {
        "iterations": iterations, "wall_s": wall_s, "jobs": rows,
        "placement_explanations": explanations,
        "busy": {"solo": busy_solo, "multiplexed": busy_mux},
        "wall": {"solo": wall_solo, "multiplexed": wall_mux},
        "switches": {"count": len(switches), "paths": sorted({sw.path for sw in switches}),
                     "load_mean_ms": statistics.fmean(loads), "load_max_ms": max(loads),
                     "offload_mean_ms": statistics.fmean(offloads), "offload_max_ms": max(offloads),
                     "bytes_max": max(sw.bytes for sw in switches)},
        "curves": {p.name: {"multiplexed": mux[p.name].rewards, "solo": solo[p.name].rewards} for p in profiles},
    }


def _write(results: dict, solo: dict, mux: dict, out_dir: Path) -> None:
    from rollmux.report.demo_plots import busy_fractions, measured_gantt, reward_curves

    full = {**results, "runs": {"solo": {k: r.to_dict() for k, r in solo.items()},
                                "multiplexed": {k: r.to_dict() for k, r in mux.items()}}}
    (out_dir / "results.json").write_text(json.dumps(full, indent=1, default=list))
    summary = {"policy": "rollmux", "moves": [], "tail": bool(results.get("tail")),
               **{k: results[k] for k in ("handoffs", "gpu_peak") if k in results},
               "jobs": {k: {"iterations_done": len(r.rewards), "iterations_target": r.iterations,
                            "groups": [r.placement["group_id"]], "moved": False,
                            "mean_iteration_s": r.mean_iteration_s, "rewards": r.rewards,
                            "weight_sync": r.weight_sync_summary()} for k, r in mux.items()}}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    title = "Multiplexed GRPO jobs: measured phases per node (solid: rollout, hatched: train)"
    if results.get("tail"):
        title += f"\nlong tail: bar height = share of the node's GPUs; {results['handoffs']['count']} hand-offs"
    measured_gantt(_span_dicts(mux), out_dir / "gantt.png", title)
    reward_curves(results["curves"], out_dir / "rewards.png")
    busy_fractions(results["busy"], out_dir / "busy.png")


def _span_dicts(runs: dict) -> list[dict]:
    return [{"job_id": s.job_id, "pool": s.pool, "nodes": list(s.nodes), "iteration": s.iteration,
             "start": s.start, "end": s.end, "share": s.share, "segments": s.segments}
            for r in runs.values() for s in r.spans]


def handoffs(spans: list[dict]) -> dict:
    """The long-tail hand-offs of a run: each rollout granted as a slice (``share`` < 1),
    with its donor, the share, and the seconds it ran as a slice (until it grew to the
    whole node or ended). The donor is the latest rollout of another job on one of the
    slice's nodes to start before it: the slice was granted in that rollout's tail, and
    no other rollout starts on those nodes in between. (Spans are timed by the jobs
    themselves; the donor's may end before the recipient, which polls for its grant,
    records its start.)"""
    slices = []
    for s in spans:
        if s["pool"] != "rollout" or s["share"] >= 1.0:
            continue
        grown = [a for a, _b, _g, sg in s["segments"] if sg >= GPUS_PER_NODE]
        until = min(grown) if grown else s["end"]
        donor = max((d for d in spans if d["pool"] == "rollout" and d["job_id"] != s["job_id"]
                     and set(d["nodes"]) & set(s["nodes"]) and d["start"] <= s["start"]),
                    key=lambda d: d["start"], default=None)
        tail_at = None
        if donor is not None:
            tail_at = next((a for a, _b, _g, sg in donor["segments"] if sg < GPUS_PER_NODE), None)
        slices.append({"recipient": s["job_id"], "recipient_iteration": s["iteration"],
                       "donor": None if donor is None else donor["job_id"],
                       "donor_iteration": None if donor is None else donor["iteration"],
                       "nodes": s["nodes"], "share": s["share"], "start": s["start"], "donor_tail_at": tail_at,
                       "slice_s": until - s["start"], "grew": bool(grown)})
    slices.sort(key=lambda x: x["start"])
    return {"count": len(slices), "slice_s": [x["slice_s"] for x in slices], "slices": slices}


def gpu_peak(spans: list[dict]) -> dict:
    """The most GPUs any node ran at once, from the recorded stretches: ``gpus`` by the
    jobs' active workers, ``service_gpus`` by the service's accounting (a donor's kept
    GPUs, a recipient's share). A span without stretches holds the whole node."""
    events: dict[str, list[tuple[float, int, float, float]]] = {}
    for s in spans:
        pieces = s["segments"] or [[s["start"], s["end"], GPUS_PER_NODE, GPUS_PER_NODE]]
        for node in s["nodes"]:
            for a, b, g, sg in pieces:
                # releases sort before grants at the same instant
                events.setdefault(node, []).extend([(a, 1, g, sg), (b, 0, -g, -sg)])
    peak = {"gpus": 0.0, "service_gpus": 0.0, "node": None}
    for node, evs in events.items():
        g = sg = 0.0
        for _t, _kind, dg, dsg in sorted(evs):
            g, sg = g + dg, sg + dsg
            if g > peak["gpus"] or sg > peak["service_gpus"]:
                peak = {"gpus": max(g, peak["gpus"]), "service_gpus": max(sg, peak["service_gpus"]), "node": node}
    return peak


def _shrunk(profile):
    """A lighter copy of a profile for quick runs: a quarter of the prompts (at least 4)."""
    return replace(profile, prompts=max(4, profile.prompts // 4))
