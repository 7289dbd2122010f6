"""``rollmux fleet``: plan and simulate on a fleet of several GPU types, and check the roofline rule.

``fleet plan`` places a trace's jobs (all present at once) on the fleet's views, improves
the plan by regrouping, and compares it, as effective $/h (``rollmux.fleet_planner``),
with every fixed-type assignment and the no-sharing baselines; ``--optimal`` adds the
exact optimum (at most 12 jobs). ``fleet simulate`` replays a trace on the fleet
under RollMux and every baseline over types (``rollmux.policies.fleet``). ``fleet
roofline`` reports how far the roofline rule of ``rollmux.fleet`` is from a trace's own
co-located timings.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from rollmux.cli_choices import QUEUE_HELP, SPACES, DurationModel, FleetSpaceName, QueueOrder
from rollmux.cli_output import cluster_option, console, progress_console
from rollmux.cli_output import fail as _fail
from rollmux.cli_output import write_json as _write_json
from rollmux.errors import RollMuxError

fleet_app = typer.Typer(no_args_is_help=True, help="Plan on a fleet of several GPU types (docs/fleet.md).")

FLEET_OPTION = typer.Option(None, "--cluster", exists=True, dir_okay=False, readable=True,
                            help="Fleet YAML (a `pools` list of GPU types) or a two-pool cluster YAML; "
                                 "default: the paper's testbed.")


def _money(marginal: float) -> str:
    """An effective marginal cost as '+$12.34/h' or '-$0.27/h'."""
    return f"{'-' if marginal < 0 else '+'}${abs(marginal):,.2f}/h"


def _where(d) -> str:
    """A decision's types in words: 'H20 -> H800' or 'co-located on H800'."""
    return d.view if d.view is not None else "nowhere"


@fleet_app.command("plan")
def plan(
    jobs: str = typer.Option(..., "--jobs", help="Job-trace CSV or a builtin trace; every job is present at once."),
    cluster: Optional[Path] = FLEET_OPTION,
    profiles: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, readable=True,
                                            help="Profile CSV (job_id,gpu,t_roll_s,t_train_s): measured phase "
                                                 "seconds per GPU type; the roofline rule fills the rest."),
    space: FleetSpaceName = typer.Option("paper", help="Placement space inside each view: paper or full "
                                                  "(training scaling and co-location; docs/placement_space.md)."),
    improve: bool = typer.Option(True, help="Regroup the plan (and each fixed-type plan) with the exact solver."),
    optimal: bool = typer.Option(False, help="Also solve for the exact optimum on the fleet (at most 12 jobs; the "
                                             "search grows like 3^n)."),
    explain: bool = typer.Option(False, help="List every view's verdict for each job, and under it every "
                                             "candidate that view's planner looked at."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the plan and the comparison as JSON here."),
    workers: Optional[int] = typer.Option(None, min=1, help="Run the fixed-type plans in parallel on a local Ray "
                                                            "instance of this many CPUs (default: one after the "
                                                            "other in this process). Worth it with regrouping on "
                                                            "hundreds of jobs, which takes minutes per plan."),
    address: Optional[str] = typer.Option(None, help="Run the fixed-type plans in parallel on this existing Ray "
                                                     "cluster (ray.init address)."),
) -> None:
    """Choose each job's GPU types and group, and what that saves.

    Places every job of the trace (all present at once) on the fleet's pairs of types,
    regroups the plan exactly, and compares its effective $/h with every fixed-type
    assignment and the no-sharing baselines (solo-d, co-located, Gavel+ over types).
    The comparison plans (and regroups) the trace once per pair of types; --workers or
    --address runs those plans in parallel on Ray, with the same results."""
    from rollmux.exact import DEFAULT_MAX_JOBS, ExactLimitError
    from rollmux.fleet import Profiles, load_profiles
    from rollmux.fleet_exact import MAX_SOLVES, check_limits, improve_fleet, solve_fleet
    from rollmux.fleet_file import load_fleet
    from rollmux.fleet_planner import FleetPlanner, alternatives, plan_jobs
    from rollmux.ray_tasks import map_tasks, serial_map
    from rollmux.report.paths import check_outputs
    from rollmux.report.progress import progress_reporter
    from rollmux.traces.builtin import load_trace

    chosen_space = SPACES[space.value]
    if address and workers:
        _fail(RollMuxError("--workers sizes a local Ray instance; with --address the cluster's CPUs are used"))
    mapper = (partial(map_tasks, command="rollmux fleet plan", address=address, num_cpus=workers)
              if address or workers else serial_map)
    try:
        check_outputs({"--json": json_path}, inputs={"--jobs": jobs, "--cluster": cluster, "--profiles": profiles})
        fleet = cluster_option(load_fleet, cluster)
        measured = load_profiles(profiles, fleet) if profiles is not None else Profiles()
        trace, _ = load_trace(jobs, None)
        if not trace:
            raise RollMuxError(f"--jobs {jobs}: the trace holds no jobs")
        if optimal:
            if len(trace) > DEFAULT_MAX_JOBS:  # (check_limits words it for the library: max_jobs is no option)
                raise ExactLimitError(f"--optimal solves at most {DEFAULT_MAX_JOBS} jobs (the search grows like "
                                      f"3^n); --jobs {jobs} holds {len(trace)}")
            check_limits(fleet, trace)
        _warn_unused(profiles, measured, fleet, trace)
        planner = FleetPlanner(fleet, measured, space=chosen_space)
        regroup = partial(improve_fleet, space=chosen_space) if improve else None
        # one step per plan: the fleet's, then each fixed-type one (every plan is
        # regrouped, which is where the time goes: minutes on 200 jobs); inside the
        # fleet's own step, its solves out of the most it may make
        with progress_reporter(progress_console, "fleet plan", 1 + len(fleet.views())) as update:
            state, decisions = plan_jobs(planner, trace, explain=explain)
            improvement = (improve_fleet(state, space=chosen_space, on_solve=lambda n, _: update(n / MAX_SOLVES))
                           if improve else None)
            update(1)
            rows = alternatives(planner, trace, regroup, progress=update, planned=(state, decisions),
                                mapper=mapper)
        optimum = solve_fleet(fleet, trace, measured, chosen_space) if optimal else None
    except (RollMuxError, OSError, ValueError) as err:
        _fail(err)
    for d in decisions:
        kind = d.decision.outcome if d.decision is not None else d.outcome
        console.print(f"[bold]{escape(d.job_id)}[/bold] -> {escape(_where(d))} {kind}"
                      + (f" {_money(d.effective_cost)}" if d.view else f" ({escape(d.reason)})"), highlight=False)
        if explain:
            for v in d.verdicts:
                cost = _money(v.effective_cost) if v.effective_cost is not None else ""
                console.print(f"    {escape(v.view)}: {cost} {escape(v.reason)}", highlight=False)
                for c in v.decision.candidates if v.decision is not None else ():
                    console.print(f"        {escape(c.describe())}", highlight=False)
    if improvement is not None and improvement.skipped:
        console.print(f"[yellow]not regrouped: {escape(improvement.skipped)}[/yellow]")
    elif improvement is not None:
        for move in improvement.moves:
            console.print(f"regroup {escape(move.describe())}", highlight=False)
        console.print(f"improvement: ${improvement.cost_before:,.2f}/h -> ${improvement.cost_after:,.2f}/h "
                      f"({len(improvement.moves)} regroupings, {improvement.solves} exact solves)")
    console.print(_groups_table(state))
    fleet_cost = state.effective_cost_per_hour()
    fixed = [r for r in rows if r.kind == "fixed-view" and not r.misses]
    best_fixed = min(fixed, key=lambda r: r.effective_cost) if fixed else None
    console.print(_alternatives_table(rows, fleet_cost, best_fixed, optimum))
    if best_fixed is not None and best_fixed.effective_cost > 0:
        saving = 1 - fleet_cost / best_fixed.effective_cost
        console.print(f"fleet plan ${fleet_cost:,.2f}/h vs the best fixed-type assignment "
                      f"({escape(best_fixed.name)}) ${best_fixed.effective_cost:,.2f}/h: "
                      f"{100 * abs(saving):.1f}% {'less' if saving >= 0 else 'more'}", highlight=False)
    if json_path is not None:
        payload = {"space": space.value, "effective_cost_per_hour": round(fleet_cost, 4),
                   "cost_per_hour": round(state.cost_per_hour(), 4),
                   "decisions": [d.to_dict() for d in decisions],
                   "groups": _groups(state),
                   "improvement": None if improvement is None else [m.to_dict() for m in improvement.moves],
                   "alternatives": [{"name": r.name, "kind": r.kind, "effective_cost_per_hour":
                                     round(r.effective_cost, 4), "misses": list(r.misses)} for r in rows],
                   "best_fixed": best_fixed.name if best_fixed else None,
                   "optimum": None if optimum is None else round(optimum.objective, 4)}
        _write_json(json_path, payload)


def _groups(state) -> list[dict]:
    out = []
    for name, (view, sub) in state.views.items():
        for g in sub.groups.values():
            out.append({"view": name, "group": g.group_id, "rollout_gpu": view.rollout.gpu,
                        "train_gpu": view.train.gpu, "colocated": g.colocated,
                        "rollout_nodes": len(g.rollout_nodes) if not g.colocated else 0,
                        "train_nodes": len(g.train_nodes), "jobs": [m.job.job_id for m in g.members],
                        "cost_per_hour": round(g.cost_per_hour(view.cluster), 4),
                        "effective_cost_per_hour": round(state.group_effective(name, g), 4)})
    return out


def _groups_table(state) -> Table:
    table = Table(title="fleet plan: groups and their GPU types")
    for column in ("group", "rollout", "training", "jobs", "$/h", "effective $/h"):
        table.add_column(column, justify="right" if "$" in column else "left")
    for g in _groups(state):
        rollout = "(on its training nodes)" if g["colocated"] else f"{g['rollout_nodes']} x {g['rollout_gpu']}"
        table.add_row(escape(g['group']), escape(rollout),
                      escape(f"{g['train_nodes']} x {g['train_gpu']}"), escape(", ".join(g["jobs"])),
                      f"{g['cost_per_hour']:,.2f}", f"{g['effective_cost_per_hour']:,.2f}")
    table.caption = (f"${state.cost_per_hour():,.2f}/h of nodes; ${state.effective_cost_per_hour():,.2f}/h effective "
                     "(at each group's speed on its types against the reference types)")
    return table


def _warn_unused(path, measured, fleet, trace) -> None:
    """Say which rows of ``--profiles`` this run never reads (they were dropped silently)."""
    for line in measured.unused(fleet, trace):
        console.print(f"[yellow]warning: --profiles {escape(str(path))}: {escape(line)} (rows not used)[/yellow]")


def _alternatives_table(rows, fleet_cost: float, best_fixed, optimum) -> Table:
    table = Table(title="the same jobs, other ways (effective $/h, every job present at once)")
    for column in ("plan", "effective $/h", "x fleet plan", "jobs it cannot serve"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    def ratio(cost: float) -> str:  # (a fleet plan that serves no job costs nothing)
        return f"{cost / fleet_cost:.3f}" if fleet_cost > 0 else "-"

    if optimum is not None:
        table.add_row("exact optimum (fleet)", f"{optimum.objective:,.2f}", ratio(optimum.objective), "0")
    for r in rows:
        if r.misses and not r.effective_cost:
            table.add_row(escape(r.name), "-", "-", f"all {len(r.misses)}")
            continue
        name = escape(r.name) + (" (best fixed)" if r is best_fixed else "")
        table.add_row(name, f"{r.effective_cost:,.2f}", ratio(r.effective_cost),
                      str(len(r.misses)) if r.misses else "0")
    table.caption = ("a plan that cannot serve some job (too slow for its SLO on those types, or no nodes left "
                     "in a bounded pool) counts only the rest")
    return table


@fleet_app.command("simulate")
def simulate(
    jobs: str = typer.Option(..., "--jobs", help="Job-trace CSV or a builtin trace, replayed in virtual time."),
    cluster: Optional[Path] = FLEET_OPTION,
    profiles: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, readable=True,
                                            help="Profile CSV (job_id,gpu,t_roll_s,t_train_s)."),
    duration_model: DurationModel = typer.Option("worst", help="Phase durations: worst (the profiles), or drawn."),
    seed: int = typer.Option(0, help="Seed of drawn durations."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every policy's summary as JSON here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw every policy's total cost against RollMux's "
                                                             "as a PNG here."),
    queue: QueueOrder = typer.Option("backfill", help=QUEUE_HELP),
    policies_opt: Optional[str] = typer.Option(None, "--policies",
                                               help="Run only these, comma-separated, by the names in the table "
                                                    "(e.g. 'rollmux,rollmux-hedge,gavel+'); default every one. "
                                                    "rollmux-full-regroup on a trace of 1,000 jobs takes many "
                                                    "minutes."),
) -> None:
    """Replay a trace on the fleet under RollMux and every baseline over types.

    Policies: RollMux choosing each job's types (rollmux in the paper's placement space,
    rollmux-full in the full one; -lifetime forms placing each arrival by the dollars it
    adds until its group ends; -regroup forms also moving running jobs after departures;
    rollmux-hedge keeping every group no dearer than its jobs alone on their cheapest options),
    RollMux on each fixed pair of types, solo-d on each
    pair, co-located on each type, and Gavel+ over types. Prints what each run cost and
    the SLOs it kept, and how the cost of rollmux, rollmux-full and the cheapest RollMux
    policy that met every SLO splits by kind of placement and GPU types."""
    from rollmux.errors import CapacityError
    from rollmux.fleet import Profiles, load_profiles
    from rollmux.fleet_file import load_fleet
    from rollmux.policies.fleet import FLEET_ROLLMUX, fleet_policies
    from rollmux.report.paths import check_outputs
    from rollmux.report.progress import progress_reporter
    from rollmux.report.tables import cost_lines
    from rollmux.sim.engine import simulate as run
    from rollmux.traces.builtin import load_trace

    try:
        check_outputs({"--json": json_path, "--plot": plot}, {"--plot": (".png",)},
                      inputs={"--jobs": jobs, "--cluster": cluster, "--profiles": profiles})
        fleet = cluster_option(load_fleet, cluster)
        measured = load_profiles(profiles, fleet) if profiles is not None else Profiles()
        trace, _ = load_trace(jobs, None)
        _warn_unused(profiles, measured, fleet, trace)
        policies = fleet_policies(fleet, measured)
        if policies_opt is not None:
            policies = _chosen(policies, policies_opt)
    except (RollMuxError, OSError, ValueError) as err:
        _fail(err)
    if not trace:
        _fail(RollMuxError(f"--jobs {jobs}: the trace holds no jobs"))
    results, none = [], []
    for policy in policies:
        with progress_reporter(progress_console, policy.name, 2 * len(trace)) as update:  # (arrivals, departures)
            try:
                results.append(run(trace, fleet.views()[0].cluster, policy, duration_model.value, seed,
                                   progress=update, backfill=queue.value == "backfill"))
            except CapacityError as err:
                none.append((policy.name, err.reason))
                reason = str(err)
    if not results:
        _fail(RollMuxError(f"no policy can run this trace on {cluster}: {reason}"))
    ours = next((r for r in results if r.policy == "rollmux"), results[0])  # (the reference of the ratios)
    table = Table(title=f"{len(trace)} jobs on {len(fleet.pools)} GPU types, {duration_model.value} durations")
    for column in ("policy", "total $", f"x {ours.policy}", "$/h", "SLO met", "never ran", "span h"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for r in results:
        table.add_row(escape(r.policy), f"{r.total_cost:,.0f}",
                      f"{r.total_cost / ours.total_cost:.3f}" if ours.total_cost > 0 else "-",
                      f"{r.cost_per_hour:,.2f}", f"{100 * r.slo_attainment:.1f}%", str(len(r.rejected)),
                      f"{r.span_s / 3600:.1f}")
    table.caption = ("total $ is the whole replay (the same work for every policy); a job too slow for its SLO on a "
                     "policy's types still runs there and misses it"
                     + (f"; bounded pools (paid per use): a job waits for nodes (the line: {queue.value}), its SLO is "
                        "judged end to end, and one that never ran costs nothing and misses it"
                        if any(p.nodes is not None for p in fleet.pools)
                        else ""))
    console.print(table)
    # the split of rollmux, rollmux-full and the cheapest RollMux policy at full SLO attainment, if another
    full = [r for r in results if r.policy in FLEET_ROLLMUX and r.slo_attainment == 1.0]
    cheapest = min(full, key=lambda r: r.total_cost).policy if full else "rollmux"
    for line in cost_lines([r for r in results if r.policy in ("rollmux", "rollmux-full", cheapest)]):
        console.print(line, highlight=False)
    if none:  # (short of nodes on their types, or too slow for every SLO there)
        console.print("placed no job, so not in the table:", highlight=False)
        for name, why in none:
            console.print(escape(f"  {name}: {why}"), highlight=False)
    if plot is not None:
        from rollmux.report.plots import savings

        try:
            console.print(f"wrote {escape(str(savings(results, plot, ours.policy)))}")
        except OSError as err:
            _fail(RollMuxError(f"--plot {plot}: {err.strerror or err}"))
    cheaper = [r for r in results if r is not ours and r.total_cost < ours.total_cost
               and r.slo_attainment >= ours.slo_attainment]
    if cheaper:
        console.print(f"[yellow]cheaper than {escape(ours.policy)} at no fewer SLOs: "
                      f"{escape(', '.join(r.policy for r in cheaper))}[/yellow]")
    if json_path is not None:
        payload = {"duration_model": duration_model.value, "seed": seed, "queue": queue.value,
                   "policies": {r.policy: {k: v for k, v in r.summary().items() if k != "jobs"} for r in results},
                   "serve_no_job": [name for name, _ in none], "no_job_reasons": dict(none)}
        _write_json(json_path, payload)


@fleet_app.command("roofline")
def roofline(
    jobs: str = typer.Option("production", "--jobs", help="A trace with co-located timings (t_roll_colo_s, "
                                                          "t_train_colo_s) to check the rule against."),
    cluster: Optional[Path] = FLEET_OPTION,
) -> None:
    """How far the roofline rule is from a trace's measured co-located times.

    The rule: rollout time ~ 1 / memory bandwidth, training time ~ 1 / TFLOPS. Checked
    against the trace's own co-located phase times on the training GPU type."""
    from rollmux.fleet import roofline_check
    from rollmux.fleet_file import load_fleet
    from rollmux.model import ROLLOUT, TRAIN
    from rollmux.traces.builtin import load_trace

    try:
        fleet = cluster_option(load_fleet, cluster)
        trace, _ = load_trace(jobs, None)
        checks = {side: roofline_check(trace, fleet, side) for side in (ROLLOUT, TRAIN)}
    except (RollMuxError, OSError, ValueError) as err:
        _fail(err)
    ref_r, ref_t = fleet.reference
    table = Table(title=f"roofline rule vs measured, on {escape(ref_t)} (from {escape(ref_r)} rollouts)")
    table.add_column("model")
    table.add_column("rollout error", justify="right")
    table.add_column("training error", justify="right")
    for model in sorted(set(checks[ROLLOUT].by_model) | set(checks[TRAIN].by_model)):
        cells = [f"{100 * checks[s].by_model[model]:+.1f}%" if model in checks[s].by_model else "-"
                 for s in (ROLLOUT, TRAIN)]
        table.add_row(escape(model), *cells)
    console.print(table)
    for side, name in ((ROLLOUT, "rollout"), (TRAIN, "training")):
        c = checks[side]
        console.print(f"{name}: {c.rows} jobs, median |error| {100 * c.median_abs:.1f}%, mean |error| "
                      f"{100 * c.mean_abs:.1f}%, worst {100 * c.worst:+.1f}%", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``fleet`` command group to ``app``."""
    app.add_typer(fleet_app, name="fleet")


def _chosen(policies: list, names: str) -> list:
    """The ``policies`` named in ``names`` (comma-separated, as the table names them), in table
    order; SpecError naming an unknown one and listing the names."""
    from rollmux.errors import SpecError

    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = [p.name for p in policies]
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise SpecError("--policies", names, f"names among {', '.join(known)}")
    return [p for p in policies if p.name in wanted]
