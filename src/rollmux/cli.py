"""The ``rollmux`` command."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rollmux.cli_service import register as register_service_commands
from rollmux.errors import RollMuxError
from rollmux.policies import DEFAULT_POLICIES

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="RollMux: multiplex RL post-training jobs across disaggregated rollout and training pools.")
trace_app = typer.Typer(no_args_is_help=True, help="Make and convert job traces.")
app.add_typer(trace_app, name="trace")
console = Console(width=None if sys.stdout.isatty() else 150)

TRACE_HELP = "A builtin trace (production, philly-mix) or a job-trace CSV file."
CLUSTER_HELP = "Cluster YAML (pools, prices, host memory, inventory, switch cost); default: the paper's testbed."


def _fail(err: Exception) -> None:
    console.print(f"[red]error:[/red] {err}")
    raise typer.Exit(2)


@app.command()
def simulate(
    trace: str = typer.Option("production", help=TRACE_HELP),
    cluster: Optional[Path] = typer.Option(None, help=CLUSTER_HELP),
    policies: str = typer.Option(",".join(DEFAULT_POLICIES),
                                 help="Comma-separated policies: rollmux, rollmux-consolidate (moves single "
                                      "jobs to free nodes; simulator only), rollmux-regroup (also re-solves two "
                                      "groups exactly after a departure and moves their jobs; simulator only), "
                                      "rollmux-bestfit, solo-d, colocated, gavel, random, most-idle, optimal "
                                      "(small traces only)."),
    duration_model: str = typer.Option("worst", help="worst (profiled phase times) or stochastic (shorter, long tail)."),
    seed: int = typer.Option(0, help="Seed for stochastic durations, the random policy and philly-mix."),
    out: Optional[Path] = typer.Option(None, help="Write PNG plots here (cost, GPUs per pool, Gantt)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write all metrics as JSON here."),
) -> None:
    """Replay a job trace through RollMux and the baselines; compare cost, SLOs and idle GPUs."""
    from rollmux.cluster_file import cluster_to_dict, load_cluster
    from rollmux.policies import KNOWN, make_policy
    from rollmux.report.tables import simulate_table
    from rollmux.sim.durations import MODELS
    from rollmux.sim.engine import simulate as run
    from rollmux.sim.optimal_curve import optimal_curve
    from rollmux.traces.builtin import load_trace

    names = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        unknown = [n for n in names if n not in KNOWN]
        if unknown or not names:
            raise RollMuxError(f"--policies: unknown {unknown or 'empty list'}; expected some of {', '.join(KNOWN)}")
        if duration_model not in MODELS:
            raise RollMuxError(f"--duration-model {duration_model!r}: expected one of {', '.join(MODELS)}")
        cl = load_cluster(cluster)
        jobs, info = load_trace(trace, cl, seed)
    except (RollMuxError, OSError) as err:
        _fail(err)
    if not jobs:
        _fail(RollMuxError(f"trace {trace!r} holds no jobs"))
    console.print(f"trace [bold]{info['name']}[/bold]: {info['jobs']} jobs over {info['span_hours']} h "
                  f"of arrivals ({info['source']})")
    results = []
    horizon = max(j.arrival_s for j in jobs) or 1.0
    gantt_of = "rollmux" if "rollmux" in names else names[0]
    with Progress(TextColumn("{task.description:>10}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        for name in names:
            task = progress.add_task(name, total=horizon)
            if name == "optimal":
                result = optimal_curve(jobs, cl)
            else:
                result = run(jobs, cl, make_policy(name, seed), duration_model, seed,
                             record_spans=(out is not None and name == gantt_of),
                             progress=lambda t, task=task: progress.update(task, completed=t))
            progress.update(task, completed=horizon)
            results.append(result)
            if result.note.startswith("skipped"):
                console.print(f"[yellow]{name}: {result.note}[/yellow]")
    shown = [r for r in results if not r.note.startswith("skipped")]
    ref = "rollmux" if any(r.policy == "rollmux" for r in shown) else shown[0].policy
    console.print(simulate_table(shown, ref))
    for r in shown:
        if r.rejected:
            console.print(f"[yellow]{r.policy}: {len(r.rejected)} jobs never ran (cannot fit the inventory)[/yellow]")
    if json_path is not None:
        payload = {"policies": {r.policy: r.summary() for r in results}, "trace": info,
                   "cluster": cluster_to_dict(cl), "duration_model": duration_model, "seed": seed}
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(payload, indent=1))
        console.print(f"wrote {json_path}")
    if out is not None:
        _plots(shown, out)


def _plots(results, out: Path) -> None:
    from rollmux.report import plots

    out.mkdir(parents=True, exist_ok=True)
    written = [plots.cost_over_time(results, out / "cost_over_time.png"),
               plots.gpus_in_use(results, out / "gpus_in_use.png")]
    traced = next((r for r in results if r.spans), None)
    if traced is not None:
        written.append(plots.gantt(traced.spans, out / "gantt.png",
                                   title=f"{traced.policy}: busiest group, phases per node (grey = switch)"))
    console.print("wrote " + ", ".join(str(p) for p in written))


@app.command()
def plan(
    jobs: str = typer.Option(..., "--jobs", help="Job-trace CSV or a builtin trace (production, philly-mix); "
                                              "every job is treated as present at once."),
    cluster: Optional[Path] = typer.Option(None, help=CLUSTER_HELP),
    optimal: bool = typer.Option(False, help="Solve for the minimum-cost plan exactly (up to ~10 jobs)."),
    tie_break: str = typer.Option("first", help="first (Algorithm 1: first cheapest feasible) or best-fit."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the plan JSON here."),
    explain: bool = typer.Option(True, help="List every candidate and its verdict for each job."),
    improve: bool = typer.Option(True, help="After placing in arrival order, regroup a few groups at a time "
                                            "with the exact solver while that lowers the cost (rollmux.improve)."),
    improve_solves: int = typer.Option(1000, min=1, help="At most this many exact solves when improving "
                                                         "(about 1-50 ms each)."),
) -> None:
    """Place every job of a trace (in arrival order, then improved by regrouping, or
    optimally) and explain each decision."""
    from rollmux.cluster_file import load_cluster
    from rollmux.plan_state import PlanState
    from rollmux.planner import Planner
    from rollmux.report.plan_json import plan_to_dict
    from rollmux.report.tables import plan_table
    from rollmux.traces.builtin import load_trace

    try:
        cl = load_cluster(cluster)
        trace, _ = load_trace(jobs, cl)
        decisions, waiting, improvement = [], [], None
        if optimal:
            from rollmux.exact import solve

            state = solve(cl, trace).to_state()
        else:
            planner = Planner(tie_break)
            state = PlanState(cl)
            for job in trace:
                d = planner.decide(state, job, explain=explain)
                decisions.append(d)
                if d.placement is not None:
                    state.apply(job, d.placement)
                elif d.outcome == "wait":
                    waiting.append(job.job_id)
            if improve:
                improvement = _improve(state, improve_solves)
    except (RollMuxError, OSError, ValueError) as err:
        _fail(err)
    result = plan_to_dict(state, waiting, decisions, improvement)
    for d in decisions:
        console.print(f"[bold]{d.job_id}[/bold] -> {d.outcome}"
                      + (f" {d.placement.group_id}" if d.placement and d.placement.group_id else "")
                      + (f" ({d.reason})" if d.reason else ""))
        if explain:
            for c in d.candidates:
                console.print(f"    {c.describe()}", highlight=False)
    if improvement is not None:
        _print_improvement(improvement)
    console.print(plan_table(result))
    if waiting:
        console.print(f"[yellow]waiting: {', '.join(waiting)}[/yellow]")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=1))
        console.print(f"wrote {json_path}")


def _improve(state, max_solves: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from rollmux.improve import improve

    with Progress(TextColumn("improving"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  console=console, transient=True) as bar:
        task = bar.add_task("", total=max_solves)
        return improve(state, max_solves=max_solves,
                       on_solve=lambda n, cost: bar.update(task, completed=n, description=f"${cost:,.2f}/h"))


def _print_improvement(result) -> None:
    for move in result.moves:
        console.print(f"regroup {move.describe()}", highlight=False)
    if result.skipped:
        console.print(f"[yellow]not improved: {result.skipped}[/yellow]")
        return
    end = "a local optimum" if result.local_optimum else f"stopped at the solve limit ({result.solves})"
    console.print(f"improvement: ${result.cost_before:,.2f}/h -> ${result.cost_after:,.2f}/h with "
                  f"{len(result.moves)} regroupings, {result.solves} exact solves ({end})")


# Options shared by the trace commands (typer reads them per command, so one object serves both).
SEED_OPTION = typer.Option(0, help="Seed of the profile, SLO and memory draws.")
MIX_OPTION = typer.Option("mixed", help="mixed, balanced, rollout-heavy or train-heavy.")
SLO_MIN_OPTION = typer.Option(1.0, help="Lower end of the uniform SLO draw.")
SLO_MAX_OPTION = typer.Option(2.0, help="Upper end of the uniform SLO draw.")


@trace_app.command("from-philly")
def from_philly(
    src: Path = typer.Argument(..., help="A Philly-format CSV (job id, arrival time, topology, shape, size, duration)."),
    out: Path = typer.Option(..., help="Where to write the job trace CSV."),
    limit: Optional[int] = typer.Option(None, help="Keep at most this many jobs."),
    seed: int = SEED_OPTION,
    mix: str = MIX_OPTION,
    slo_min: float = SLO_MIN_OPTION,
    slo_max: float = SLO_MAX_OPTION,
) -> None:
    """Turn a public cluster trace (Philly format) into a RollMux job trace."""
    from rollmux.traces.philly import convert_philly

    try:
        stats = convert_philly(src, out, limit, seed, mix, (slo_min, slo_max))
    except (RollMuxError, OSError) as err:
        _fail(err)
    console.print(f"wrote {out}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))


@trace_app.command("generate")
def generate_trace(
    out: Path = typer.Option(..., help="Where to write the job trace CSV."),
    count: int = typer.Option(100, help="Number of jobs."),
    seed: int = SEED_OPTION,
    mix: str = MIX_OPTION,
    slo_min: float = SLO_MIN_OPTION,
    slo_max: float = SLO_MAX_OPTION,
) -> None:
    """Make a synthetic job trace (Poisson arrivals, lognormal durations, the paper's profile mixes)."""
    from rollmux.traces.format import write_trace
    from rollmux.traces.generate import generate

    try:
        jobs = generate(count, seed, mix, (slo_min, slo_max))
        write_trace(jobs, out)
    except (RollMuxError, OSError) as err:
        _fail(err)
    console.print(f"wrote {out}: {len(jobs)} jobs")


register_service_commands(app)

from rollmux.demo import register as register_demo  # noqa: E402

register_demo(app)
