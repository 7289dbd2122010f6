"""The ``rollmux`` command.

Option values that are choices are validated by typer against the list they show;
output paths are checked before any work starts; errors name the command's options
(``--duration-model``, ``--cluster FILE``), not Python's parameter names; every string
that comes from the user is escaped before Rich prints it.
"""
from __future__ import annotations

import enum
import sys
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from rollmux.accounting import ACCOUNTINGS
from rollmux.cli_output import cluster_option, console, first_interrupt_stops, progress_console
from rollmux.cli_output import fail as _fail
from rollmux.cli_output import write_json as _write_json
from rollmux.cli_service import register as register_service_commands
from rollmux.errors import RollMuxError, SpecError
from rollmux.planner import TIE_BREAKS
from rollmux.policies import DEFAULT_POLICIES, KNOWN, check_accounting
from rollmux.report.progress import progress_reporter
from rollmux.cli_choices import QUEUE_HELP, SPACES, AccountingName, DurationModel, QueueOrder, SpaceName
from rollmux.traces.philly import MIXES

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="RollMux: multiplex RL post-training jobs across disaggregated rollout and training pools.")
trace_app = typer.Typer(no_args_is_help=True, help="Make and convert job traces.")
app.add_typer(trace_app, name="trace")

TRACE_HELP = "A builtin trace (production, philly-mix) or a job-trace CSV file."
CLUSTER_HELP = "Cluster YAML (pools, prices, host memory, inventory, switch cost); default: the paper's testbed."
CLUSTER_OPTION = typer.Option(None, help=CLUSTER_HELP, exists=True, dir_okay=False, readable=True)
#: ``rollmux plan``'s default bound on improving, in seconds: the production trace improves to
#: its local optimum well within it in the paper space; the full space's solves take longer
IMPROVE_S = 120.0

#: The choices of choice-valued options, as typer enums (typer checks them and lists them).
TieBreak = enum.Enum("TieBreak", {t: t for t in TIE_BREAKS}, type=str)
Mix = enum.Enum("Mix", {m: m for m in MIXES}, type=str)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"rollmux {version('rollmux')}", highlight=False)
        except PackageNotFoundError:
            console.print("rollmux (not installed as a package)")
        raise typer.Exit()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, ``warning: <message>`` (Python's own format shows
    the module and source line that raised it, which name nothing of the user's)."""
    typer.echo(f"warning: {message}", err=True)


@app.callback()
def _main(show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                            help="Print the version and exit.")) -> None:
    warnings.showwarning = _show_warning


def _load_cluster(path: Optional[Path]):
    """``load_cluster`` with a SpecError prefixed by ``--cluster FILE``."""
    from rollmux.cluster_file import load_cluster

    return cluster_option(load_cluster, path)


def _policy_list(value: str) -> str:
    """Typer callback: ``--policies`` must be a comma list of distinct known names."""
    names = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown or not names:
        raise typer.BadParameter(f"{'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'empty list'}; "
                                 f"choose from {', '.join(KNOWN)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise typer.BadParameter(f"{', '.join(map(repr, twice))} listed twice")
    return value


def _hours_window(value: Optional[str]) -> tuple[float, float] | None:
    """``--gantt-window START:END`` in hours, START < END, both >= 0 and finite in seconds too."""
    if value is None:
        return None
    try:
        start, end = (float(v) for v in value.split(":"))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected START:END in hours, e.g. 10:12") from None
    if not (0 <= start < end < float("inf")):
        raise typer.BadParameter(f"{value!r}: expected 0 <= START < END hours")
    if not end * 3600 < float("inf"):
        raise typer.BadParameter(f"{value!r}: END {end:g} h is not a finite number of seconds; expected at most "
                                 f"{sys.float_info.max / 3600:.6g} hours")
    return start, end


@app.command()
def simulate(
    trace: str = typer.Option("production", help=TRACE_HELP),
    cluster: Optional[Path] = CLUSTER_OPTION,
    policies: str = typer.Option(",".join(DEFAULT_POLICIES), callback=_policy_list,
                                 help="Comma-separated policies: rollmux, rollmux-consolidate (moves single "
                                      "jobs to free nodes; simulator only), rollmux-regroup (also re-solves two "
                                      "groups exactly after a departure and moves their jobs; simulator only), "
                                      "rollmux-bestfit, rollmux-full and rollmux-full-regroup (the planner also "
                                      "scales training sides and co-locates; docs/placement_space.md), "
                                      "rollmux-host (also co-locates a job on a group's training nodes) and "
                                      "rollmux-host-regroup (with regrouping in that space), "
                                      "rollmux-lifetime and rollmux-full-lifetime (each arrival placed by the "
                                      "dollars it adds until its group ends, not its $/h), rollmux-hedge (no "
                                      "group dearer than its jobs alone on their cheapest options, jobs alone "
                                      "gathered; docs/fleet.md), solo-d, "
                                      "colocated, gavel, random, most-idle, optimal "
                                      "(small traces only)."),
    duration_model: DurationModel = typer.Option("worst", help="worst (profiled phase times) or stochastic "
                                                               "(shorter, long tail)."),
    seed: int = typer.Option(0, help="Seed for stochastic durations, the random policy and philly-mix."),
    tail: bool = typer.Option(False, "--tail/--no-tail",
                              help="Long-tail migration: a rollout whose threshold share of responses is done "
                                   "keeps its tail GPUs and hands the rest to the next queued rollout of its "
                                   "group (docs/long_tail.md). Off by default."),
    tail_threshold: float = typer.Option(0.8, min=0.01, max=0.99,
                                         help="With --tail: fraction of a rollout's responses done when its "
                                              "tail begins."),
    out: Optional[Path] = typer.Option(None, help="Write PNG plots here (cost, GPUs per pool, Gantt; the queue "
                                                  "when a pool is bounded)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write all metrics as JSON here."),
    jobs_csv: Optional[Path] = typer.Option(None, "--jobs-csv", help="Write one row per policy and job (waits, "
                                                                       "JCT, slowdowns, SLO, placement) here."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here (summary, "
                                                             "savings, cost and GPUs over time, Gantt, per-job "
                                                             "tables; docs/report.md)."),
    gantt_group: Optional[str] = typer.Option(None, help="With --html: the group the Gantt chart shows (e.g. g3); "
                                                         "default the busiest."),
    gantt_window: Optional[str] = typer.Option(None, callback=_hours_window,
                                               help="With --html: the Gantt chart's time window as START:END in "
                                                    "hours of the simulation clock (e.g. 10:12)."),
    fast_forward: bool = typer.Option(True, "--fast-forward/--event-by-event",
                                      help="Skip whole periods of groups whose schedule repeats (same results; "
                                           "docs/simulator.md) or replay every phase."),
    accounting: AccountingName = typer.Option("ours", help="ours (jobs run all their iterations; switch cost, "
                                                           "host memory, saturation gate, whole-run SLO checks) "
                                                           "or paper (the authors' simulator: fixed departures, "
                                                           "none of those, one node per pool per job, a rollout "
                                                           "node at 1/3 of a training node), or paper-widths "
                                                           "(paper at the trace's widths); docs/reproduce.md."),
    queue: QueueOrder = typer.Option("backfill", help=QUEUE_HELP),
) -> None:
    """Replay a job trace through RollMux and the baselines; compare cost, SLOs and idle GPUs.

    With a bounded pool (nodes in the cluster file) jobs may wait; SLOs are then judged end to end.

    The table then also shows the mean wait, the longest queue and which pool was binding.
    """
    from rollmux.cluster_file import cluster_to_dict
    from rollmux.errors import CapacityError
    from rollmux.model import POOLS
    from rollmux.policies import make_policy
    from rollmux.report.paths import check_outputs, check_writable
    from rollmux.report.tables import job_count, limit_lines, simulate_table
    from rollmux.sim.engine import simulate as run
    from rollmux.sim.metrics import skipped
    from rollmux.sim.optimal_curve import optimal_curve
    from rollmux.traces.builtin import load_trace

    names = [p.strip() for p in policies.split(",") if p.strip()]
    model = duration_model.value
    if html is None and (gantt_group is not None or gantt_window is not None):
        option = "--gantt-group" if gantt_group is not None else "--gantt-window"
        _fail(RollMuxError(f"{option} chooses what the HTML report's Gantt chart shows: it needs --html FILE"))
    try:
        if out is not None:
            check_writable(out, "--out", directory=True)
        check_outputs({"--json": json_path, "--jobs-csv": jobs_csv, "--html": html,
                       **{f"--out ({name})": out / name for name in (PLOT_NAMES if out is not None else ())}},
                      inputs={"--trace": trace, "--cluster": cluster})
        acct = ACCOUNTINGS[accounting.value]
        for name in names:
            check_accounting(name, acct)
        cl = acct.apply_cluster(_load_cluster(cluster))
        jobs, info = load_trace(trace, cl, seed)
    except (RollMuxError, OSError) as err:
        _fail(err, {"trace": "--trace"})
    if not jobs:
        _fail(RollMuxError(f"--trace {trace}: the trace holds no jobs"))
    console.print(f"trace [bold]{escape(info['name'])}[/bold]: {job_count(info['jobs'])} over "
                  f"{info['span_hours']} h of arrivals ({escape(info['source'])})")
    # The Gantt chart shows rollmux's phases, else the first listed policy's that runs any (not the optimal
    # curve): that one runs first and records them; if it places nothing, the next one run does.
    tracing = out is not None or html is not None
    by_name, failed = {}, []
    for name in sorted(names, key=lambda n: (n != "rollmux", n == "optimal")):  # (a stable sort: listed order)
        with progress_reporter(progress_console, name, 2 * len(jobs)) as update:  # (arrivals and departures)
            if name == "optimal":
                result = optimal_curve(jobs, cl, accounting=acct)
            else:
                try:
                    result = run(jobs, cl, make_policy(name, seed, acct, cl), model, seed, accounting=acct,
                                 record_spans=tracing and not any(r.spans for r in by_name.values()),
                                 tail=tail, tail_threshold=tail_threshold, progress=update,
                                 fast_forward=fast_forward, backfill=queue.value == "backfill")
                except CapacityError as err:
                    failed.append(err)
                    result = skipped(name, jobs, str(err))  # (placed nothing: the others are still compared)
                    result.accounting = acct.name
        by_name[name] = result
    results = [by_name[name] for name in names]
    for result in results:
        if result.note.startswith("skipped"):
            console.print(f"[yellow]{escape(result.policy)}: {escape(result.note)}[/yellow]")
    shown = [r for r in results if not r.note.startswith("skipped")]
    if not shown:
        _fail(failed[0] if failed else
              RollMuxError(f"--policies {policies}: every policy asked for was skipped (above), nothing to compare"))
    if html is not None and (gantt_group is not None or gantt_window is not None):
        _check_gantt(shown, gantt_group, gantt_window)  # before any output is written
    ref = "rollmux" if any(r.policy == "rollmux" for r in shown) else shown[0].policy
    console.print(simulate_table(shown, ref, acct.name))
    for line in limit_lines(shown, {p: cl.pool(p).nodes for p in POOLS}):
        console.print(line, highlight=False)
    for r in shown:
        if r.rejected:
            first = r.rejected[0]
            console.print(f"[yellow]{escape(r.policy)}: {job_count(len(r.rejected))} never ran, counted as missing "
                          f"their SLO ({escape(first)}: {escape(r.reject_reasons.get(first, ''))})[/yellow]")
    if json_path is not None:
        payload = {"policies": {r.policy: r.summary() for r in results}, "trace": info,
                   "cluster": cluster_to_dict(cl), "duration_model": model, "seed": seed,
                   "accounting": {**acct.to_dict(),
                                  "units_per_policy": {r.policy: acct.units(r.total_cost, cl) for r in results}},
                   **({"tail": {"threshold": tail_threshold}} if tail else {})}
        _write_json(json_path, payload)
    if out is not None:
        try:
            _plots(shown, out, cl)
        except OSError as err:
            _fail(RollMuxError(f"--out {out}: {err.strerror or err}"))
    if jobs_csv is not None:
        from rollmux.report.jobs_csv import write_jobs_csv
        try:
            console.print(f"wrote {escape(str(write_jobs_csv(results, jobs_csv)))}")
        except RollMuxError as err:
            _fail(err)
    if html is not None:
        from rollmux.report.html import write_html_report
        try:
            path = write_html_report(results, cl, html, title=f"RollMux simulation: {info['name']}",
                                     trace_info=info, accounting=acct.name, gantt_group=gantt_group,
                                     gantt_window=gantt_window and (gantt_window[0] * 3600, gantt_window[1] * 3600))
        except RollMuxError as err:
            _gantt_fail(err, gantt_window)
        console.print(f"wrote {escape(str(path))}")


def _check_gantt(shown, group: str | None, window_h: tuple[float, float] | None) -> None:
    """``--gantt-group`` / ``--gantt-window`` against the phases recorded in ``shown`` (what
    ``--html`` will chart); exits 2 naming the option when the report would refuse them."""
    from rollmux.report import plots

    traced = next((r for r in shown if r.spans), None)
    if traced is None:
        option = (f"--gantt-group {group}" if group is not None
                  else f"--gantt-window {window_h[0]:g}:{window_h[1]:g}")
        _fail(RollMuxError(f"{option}: no policy run here executed phases to chart (optimal is a cost curve, not a "
                           "schedule); add a simulated policy to --policies"))
    try:
        plots.gantt_frame(traced.spans, group, window_h and (window_h[0] * 3600, window_h[1] * 3600))
    except RollMuxError as err:
        _gantt_fail(err, window_h)


def _gantt_fail(err: RollMuxError, window_h: tuple[float, float] | None) -> None:
    """Print a report's error with the option it is about (a window in the hours given) and exit 2."""
    if isinstance(err, SpecError) and err.field == "gantt_window":  # say it in the hours given
        err = SpecError(err.field, f"{window_h[0]:g}:{window_h[1]:g}", err.expected)
    _fail(err, {"gantt_group": "--gantt-group", "gantt_window": "--gantt-window"})


#: The files ``simulate --out DIR`` writes in DIR: cost, GPUs per pool, the queue (when a pool
#: is bounded) and the Gantt chart (when a policy recorded its phases).
COST_PNG, GPUS_PNG, QUEUE_PNG, GANTT_PNG = PLOT_NAMES = ("cost_over_time.png", "gpus_in_use.png", "queue_length.png",
                                                        "gantt.png")


def _plots(results, out: Path, cluster) -> None:
    from rollmux.model import POOLS
    from rollmux.report import plots

    gpus = {p: cluster.pool(p).gpu for p in POOLS}
    out.mkdir(parents=True, exist_ok=True)
    written = [plots.cost_over_time(results, out / COST_PNG), plots.gpus_in_use(results, out / GPUS_PNG, gpus)]
    if any(r.bounded for r in results):
        written.append(plots.queue_length(results, out / QUEUE_PNG))
    traced = next((r for r in results if r.spans), None)
    if traced is not None:
        gid, window, _ = frame = plots.gantt_frame(traced.spans)
        written.append(plots.gantt(traced.spans, out / GANTT_PNG, gpus, group=gid, window=window,
                                   title=f"{plots.frame_name(traced.policy, frame)}: busiest group, phases per "
                                         "node (grey = switch)"))
    console.print("wrote " + ", ".join(escape(str(p)) for p in written))


@app.command()
def plan(
    jobs: str = typer.Option(..., "--jobs", help="Job-trace CSV or a builtin trace (production, philly-mix); "
                                              "every job is treated as present at once."),
    cluster: Optional[Path] = CLUSTER_OPTION,
    optimal: bool = typer.Option(False, help="Solve for the minimum-cost plan exactly (at most 12 jobs; the "
                                             "search grows like 3^n: in the full space 10 jobs take tens of "
                                             "seconds and GBs of memory)."),
    space: SpaceName = typer.Option("paper", help="Placement space of the planner, the regrouping and --optimal: "
                                                  "paper (pack, scale rollout, new group), full (also scale "
                                                  "training sides and co-locate) or host (paper, and a job may run "
                                                  "both phases on a group's training nodes; docs/placement_space.md)."),
    tie_break: TieBreak = typer.Option("first", help="first (Algorithm 1: first cheapest feasible) or best-fit."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the plan JSON here."),
    explain: bool = typer.Option(True, help="List every candidate and its verdict for each job."),
    improve: bool = typer.Option(True, help="After placing in arrival order, regroup a few groups at a time "
                                            "with the exact solver while that lowers the cost (rollmux.improve)."),
    improve_solves: int = typer.Option(1000, min=1, help="At most this many exact solves when improving "
                                                         "(in the paper space about 1-50 ms each; in the full "
                                                         "and host spaces up to tens of seconds)."),
    improve_s: float = typer.Option(IMPROVE_S, "--improve-s", min=0.0, max=86_400.0,
                                    help="Stop improving after this many seconds (checked before each solve: "
                                         "the one under way finishes); the plan so far is kept."),
    stress: int = typer.Option(0, min=0, help="Then run each group of two or more through this many perturbed "
                                              "histories on the execution rule (staggered joins, a spell of short "
                                              "phases, a cancel; rollmux.histories) and show where each member "
                                              "settles against its SLO. 0: off."),
) -> None:
    """Place every job of a trace (in arrival order, then improved by regrouping, or
    optimally) and explain each decision."""
    from rollmux.plan_state import PlanState
    from rollmux.planner import Planner
    from rollmux.report.paths import check_outputs
    from rollmux.report.plan_json import plan_to_dict
    from rollmux.report.tables import plan_table
    from rollmux.traces.builtin import load_trace

    try:
        check_outputs({"--json": json_path}, inputs={"--jobs": jobs, "--cluster": cluster})
        cl = _load_cluster(cluster)
        trace, _ = load_trace(jobs, cl)
        if not trace:
            raise RollMuxError(f"--jobs {jobs}: the trace holds no jobs")
        decisions, waiting, improvement = [], [], None
        if optimal:
            from rollmux.exact import solve

            progress_console.print(f"solving exactly: {len(trace)} jobs in the {space.value} space (the search "
                                   "grows like 3^n; no progress until it ends)", highlight=False)
            state = solve(cl, trace, space=SPACES[space.value]).to_state()
        else:
            planner = Planner(tie_break.value, space=SPACES[space.value])
            state = PlanState(cl)
            for job in trace:
                d = planner.decide(state, job, explain=explain)
                decisions.append(d)
                if d.placement is not None:
                    state.apply(job, d.placement)
                elif d.outcome == "wait":
                    waiting.append(job.job_id)
            if improve:
                improvement = _improve(state, improve_solves, improve_s, SPACES[space.value])
    except (RollMuxError, OSError, ValueError) as err:
        _fail(err, {"trace": "--jobs"})
    result = plan_to_dict(state, waiting, decisions, improvement)
    if stress:
        result["stress"] = _stress(state, stress)
    for d in decisions:
        console.print(f"[bold]{escape(d.job_id)}[/bold] -> {d.outcome}"
                      + (f" {escape(d.placement.group_id)}" if d.placement and d.placement.group_id else "")
                      + (f" ({escape(d.reason)})" if d.reason else ""))
        if explain:
            for c in d.candidates:
                console.print(f"    {escape(c.describe())}", highlight=False)
    if improvement is not None:
        _print_improvement(improvement)
    console.print(plan_table(result))
    if stress:
        _print_stress(result["stress"], stress)
    if waiting:
        console.print(f"[yellow]waiting: {escape(', '.join(waiting))}[/yellow]")
    if json_path is not None:
        _write_json(json_path, result)


def _stress(state, histories: int) -> list[dict]:
    """Each member's worst settled slowdown over ``histories`` perturbed histories."""
    from rollmux.histories import stress_plan

    shared = sum(len(g.members) > 1 for g in state.groups.values())
    with progress_reporter(progress_console, "stress", shared) as update:
        settled = stress_plan(state, histories, on_group=lambda done, _: update(done))
    worst = {}
    for m in settled:
        if m.job_id not in worst or m.slowdown > worst[m.job_id].slowdown:
            worst[m.job_id] = m
    return [{"group": m.group_id, "job_id": m.job_id, "slo": m.slo, "analysed": round(m.analysed, 4),
             "settled": round(m.slowdown, 4), "history": m.history, "missed": m.missed}
            for m in sorted(worst.values(), key=lambda m: (m.group_id, m.job_id))]


def _print_stress(rows: list[dict], histories: int) -> None:
    from rich.table import Table

    table = Table(title=f"stress: the worst of {histories} histories per group (rollmux.histories)")
    for column in ("group", "job", "SLO", "analysed", "settled", "history", ""):
        table.add_column(column, justify="left" if column in ("group", "job", "") else "right")
    for r in rows:
        table.add_row(escape(r["group"]), escape(r["job_id"]), f"{r['slo']:.3f}", f"{r['analysed']:.4f}",
                      f"{r['settled']:.4f}", str(r["history"]), "[red]above its SLO[/red]" if r["missed"] else "ok")
    console.print(table)
    missed = sum(r["missed"] for r in rows)
    console.print(f"{missed} of {len(rows)} members in shared groups settled above their SLO in some history"
                  if rows else "stress: no group of two or more jobs")


def _improve(state, max_solves: int, max_seconds: float, space):
    """``improve`` bounded by ``max_solves`` and ``max_seconds``, with progress on stderr (a
    bar on a terminal, else a line first and then every few seconds): the larger of the
    shares of either bound used, so the ETA never runs past the time bound. A first Ctrl-C
    stops it before the next solve, the plan so far kept (``limit`` "interrupted"); a
    second aborts."""
    import time

    from rollmux.improve import improve

    began = time.monotonic()
    with first_interrupt_stops("regrouping stops after the exact solve under way, keeping the plan so far") \
            as interrupted:
        if not progress_console.is_terminal:  # (said once the first Ctrl-C only stops the regrouping)
            progress_console.print(f"regrouping: at most {max_solves} exact solves or {max_seconds:g} s "
                                   "(--improve-solves, --improve-s; Ctrl-C stops it, keeping the plan so far)",
                                   highlight=False)
        with progress_reporter(progress_console, "improving", 1.0) as update:
            return improve(state, max_solves=max_solves, space=space, max_seconds=max_seconds,
                           stop=interrupted.is_set,
                           on_solve=lambda n, _: update(max(n / max_solves,
                                                            (time.monotonic() - began) / max(max_seconds, 1e-9))))


def _print_improvement(result) -> None:
    for move in result.moves:
        console.print(f"regroup {escape(move.describe())}", highlight=False)
    if result.skipped:
        console.print(f"[yellow]not improved: {escape(result.skipped)}[/yellow]")
        return
    end = ("a local optimum" if result.local_optimum else "stopped at --improve-s" if result.limit == "seconds"
           else "stopped by Ctrl-C" if result.limit == "interrupted"
           else f"stopped at the solve limit ({result.solves})")
    console.print(f"improvement: ${result.cost_before:,.2f}/h -> ${result.cost_after:,.2f}/h with "
                  f"{len(result.moves)} regroupings, {result.solves} exact solves ({end})")


# Options shared by the trace commands (typer reads them per command, so one object serves both).
SEED_OPTION = typer.Option(0, help="Seed of the profile, SLO and memory draws.")
MIX_OPTION = typer.Option("mixed", help="Profile mix: one profile or all of them (mixed).")
SLO_MIN_OPTION = typer.Option(1.0, help="Lower end of the uniform SLO draw.")
SLO_MAX_OPTION = typer.Option(2.0, help="Upper end of the uniform SLO draw.")
#: Parameters of the trace helpers that SpecError names, and the options that set them.
TRACE_OPTIONS = {"mix": "--mix", "slo_range": "--slo-min/--slo-max", "count": "--count", "limit": "--limit",
                 "min_gpus": "--min-gpus", "window": "--window", "staleness": "--staleness", "reward_s": "--reward-s",
                 "reward_price_per_hour": "--reward-price"}


def philly_report(stats: dict) -> str:
    """What ``trace from-philly`` dropped and changed, in lines a person reads."""
    dropped = {"malformed rows": stats["malformed"], "outside --window": stats["outside_window"],
               "below --min-gpus": stats["below_min_gpus"], "zero length": stats["zero_length"],
               "duplicate ids": stats["duplicate"], "beyond --limit": stats["beyond_limit"]}
    kept = stats["kept"] or 1
    lines = ["  dropped: " + (", ".join(f"{n:,} {k}" for k, n in dropped.items() if n) or "none"),
             f"  changed: {stats['rounded_up']:,} jobs ({100 * stats['rounded_up'] / kept:.1f}%) rounded up to whole "
             f"8-GPU nodes per phase, {stats['capped']:,} capped at 32 GPUs per phase",
             "  widths (rollout+train GPUs): " + ", ".join(
                 f"{w} {n:,}" for w, n in sorted(stats["widths"].items(), key=lambda kv: int(kv[0].split("+")[0]))),
             "  models: " + ", ".join(f"{m} {n:,}" for m, n in sorted(stats["models"].items(),
                                                                         key=lambda kv: int(kv[0][:-1])))]
    return "\n".join(lines)


@trace_app.command("from-philly")
def from_philly(
    src: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                               help="A Philly-format CSV (job id, arrival time, topology, shape, size, duration)."),
    out: Path = typer.Option(..., help="Where to write the job trace CSV."),
    limit: Optional[int] = typer.Option(None, min=0, help="Keep at most this many jobs (after the filters)."),
    min_gpus: int = typer.Option(1, min=1, help="Drop Philly jobs of fewer GPUs (87% of Philly jobs hold 1 GPU; "
                                                "each would become an 8+8-GPU RL job)."),
    window: Optional[str] = typer.Option(None, callback=_hours_window,
                                         help="Keep jobs arriving in START:END hours of the file's clock "
                                              "(START inclusive)."),
    segment_out: Optional[Path] = typer.Option(None, help="Also write the kept Philly records (the bundled "
                                                          "philly-mix's format) here."),
    seed: int = SEED_OPTION,
    mix: Mix = MIX_OPTION,
    slo_min: float = SLO_MIN_OPTION,
    slo_max: float = SLO_MAX_OPTION,
) -> None:
    """Turn a public cluster trace (Philly format) into a RollMux job trace, and say what was dropped or changed.

    Mapping (docs/traces.md): a Philly job of G GPUs becomes an RL job with ceil(G/2) GPUs per phase rounded up to
    whole 8-GPU nodes (at most 32), 7B up to 8 GPUs, 14B up to 16, 32B above; phase times and SLO are drawn.
    """
    from rollmux.report.paths import check_outputs
    from rollmux.traces.philly import convert_philly

    try:
        check_outputs({"--out": out, "--segment-out": segment_out}, inputs={"SRC": src})
        stats = convert_philly(src, out, limit, seed, mix.value, (slo_min, slo_max), min_gpus,
                               window and (window[0] * 3600, window[1] * 3600), segment_out)
    except (RollMuxError, OSError) as err:
        _fail(err, TRACE_OPTIONS)
    console.print(f"wrote {escape(str(out))}: {stats['kept']:,} jobs kept of {stats['rows']:,} rows")
    console.print(philly_report(stats), highlight=False)
    if segment_out is not None:
        console.print(f"wrote {escape(str(segment_out))}")


@trace_app.command("generate")
def generate_trace(
    out: Path = typer.Option(..., help="Where to write the job trace CSV."),
    count: int = typer.Option(100, min=0, help="Number of jobs."),
    seed: int = SEED_OPTION,
    mix: Mix = MIX_OPTION,
    slo_min: float = SLO_MIN_OPTION,
    slo_max: float = SLO_MAX_OPTION,
    async_share: float = typer.Option(0.0, min=0.0, max=1.0,
                                      help="Share of jobs made asynchronous (bounded staleness, docs/rollart.md)."),
    staleness: int = typer.Option(1, min=1, help="Policy versions an asynchronous job's rollout may lag."),
    reward_share: float = typer.Option(0.0, min=0.0, max=1.0,
                                       help="Share of jobs with a reward model of their own size class (its host "
                                            "memory per rollout node: the size's Table 2 rollout figure, added to "
                                            "mem_roll_gb; docs/rollart.md)."),
    reward_s: float = typer.Option(60.0, min=0.0,
                                   help="Seconds per iteration those jobs score on the shared reward service, "
                                        "billed per use; their reward model then leaves their rollout nodes. 0: "
                                        "they score inside their own rollout and keep it there."),
    reward_price: float = typer.Option(1.85, min=0.0,
                                       help="$ per busy hour of the shared reward pool (default: one H20 GPU-hour)."),
) -> None:
    """Make a synthetic job trace (Poisson arrivals, lognormal durations, the paper's profile mixes)."""
    from rollmux.report.paths import check_writable
    from rollmux.traces.format import write_trace
    from rollmux.traces.generate import generate

    try:
        check_writable(out, "--out")
        jobs = generate(count, seed, mix.value, (slo_min, slo_max), async_share=async_share, staleness=staleness,
                        reward_share=reward_share, reward_s=reward_s, reward_price_per_hour=reward_price)
        write_trace(jobs, out)  # (which makes --out's folder once the jobs are ready)
    except (RollMuxError, OSError) as err:
        _fail(err, TRACE_OPTIONS)
    console.print(f"wrote {escape(str(out))}: {len(jobs)} jobs")


register_service_commands(app)

from rollmux.cli_fleet import register as register_fleet  # noqa: E402
from rollmux.cli_frameworks import register as register_frameworks  # noqa: E402
from rollmux.cli_kernel import register as register_kernel  # noqa: E402
from rollmux.cli_whatif import register as register_whatif  # noqa: E402
from rollmux.demo import register as register_demo  # noqa: E402
from rollmux.demo_rollart import register as register_rollart  # noqa: E402

register_whatif(app)
register_fleet(app)
register_frameworks(app, trace_app, console, _fail)
register_demo(app)
register_rollart(app)
register_kernel(app)
