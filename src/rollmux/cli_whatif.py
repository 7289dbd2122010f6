"""``rollmux whatif``: capacity planning over a grid of cluster or fleet configurations.

``register(app)`` adds the command to a Typer app. Like the other commands: choices are
typer enums (policy names: checked against the cluster's or fleet's), output paths are checked before any work, errors name the command's
options and exit with status 2, user strings are escaped before Rich prints them. When
targets are given and no configuration meets them, the outputs are still written and
the exit status is 1. ``--cluster`` may be a fleet file (a ``pools`` list, docs/fleet.md):
its fields vary as ``pools[NAME or INDEX].FIELD``, its policies are those of
``rollmux fleet simulate`` (``whatif_fleet``), ``--profiles`` gives measured phase times.
``--queue`` may be repeated, like ``--policy``: every configuration and policy runs under
each waiting-line order given, and the table, labels and choice then name the order.
"""
from __future__ import annotations

import csv
import enum
import math
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from rollmux.accounting import ACCOUNTINGS
from rollmux.cli_output import console, fail, progress_console
from rollmux.errors import RollMuxError, SpecError
from rollmux.fleet import Profiles
from rollmux.policies import KNOWN
from rollmux.report.paths import json_text
from rollmux.report.tables import job_count
from rollmux.cli_choices import QUEUE_HELP, AccountingName, DurationModel, QueueOrder
from rollmux.whatif import COST_BASES, FLEET, MAX_CONFIGS, UNBOUNDED, Row


#: Simulated policies on a two-pool cluster (``optimal`` is a cost bound, not a simulation).
SIMULATED = tuple(p for p in KNOWN if p != "optimal")
CostBasis = enum.Enum("CostBasis", {b: b for b in COST_BASES}, type=str)

#: Parameters that SpecError names, and the options that set them.
OPTIONS = {"vary": "--vary", "trace": "--trace", "policy": "--policy", "accounting": "--accounting"}
#: Above this many rows the table shows the frontier and the chosen row only.
TABLE_ROWS = 60
#: With more runs than this, progress lines come at most every PROGRESS_S seconds.
EVERY_LINE, PROGRESS_S = 100, 2.0
#: While no run ends, a line says the grid is still running every QUIET_S seconds.
QUIET_S = 15.0


def _fail(err: Exception) -> None:
    """Print ``err`` (a SpecError about a parameter in OPTIONS worded with its option) and exit 2."""
    fail(err, OPTIONS)


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "never" if value == math.inf else format(value, spec)


def _short(text: str, width: int = 90) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[:width - 1] + "…"


def _count(n: int, noun: str) -> str:
    """"1 run", "2 runs"."""
    return f"{n} {noun}" + "s" * (n != 1)


def _value(value) -> str:
    return UNBOUNDED if value is None else str(value)


class _Progress:
    """The ``on_row`` callback: one line per finished run (throttled on big grids), with ETA,
    on stderr (a table redirected to a file holds only itself). The ETA is the mean time per
    finished run since the start times the runs left (runs in parallel end in batches: the
    gap between two of a batch is no run's time); none after the first. ``waiting`` (the
    ``on_wait`` callback) says the grid still runs after QUIET_S seconds without a line:
    one run on a big trace takes minutes."""

    def __init__(self, basis: str, show: tuple[bool, bool]) -> None:
        self.basis, self.show = basis, show
        self.start = self.last = time.perf_counter()

    def __call__(self, row: Row, done: int, total: int) -> None:
        now = time.perf_counter()
        if total > EVERY_LINE and done < total and now - self.last < PROGRESS_S:
            return
        self.last = now
        wait = (f"{job_count(row.never_ran)} never ran" if row.never_ran
                else f"p95 wait {_fmt(row.p95_wait_h, '.2f')} h")
        what = (f"[red]{escape(_short(row.error))}[/red]" if row.error else
                f"${_fmt(row.cost(self.basis))}/h {self.basis}, {wait}, SLO met {_fmt(row.slo_met * 100)}%")
        progress_console.print(f"[{done}/{total}] {escape(row.label(*self.show))}: {what} "
                               f"({self._times(now, done, total)})", highlight=False)

    def waiting(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.last < QUIET_S:
            return
        self.last = now
        progress_console.print(f"[{done}/{total}] running" + (", no run finished yet" if done == 0 else "")
                               + f" ({self._times(now, done, total)})", highlight=False)

    def _times(self, now: float, done: int, total: int) -> str:
        elapsed = now - self.start
        eta = "-" if done < 2 else f"{elapsed / done * (total - done):.0f} s"
        return f"{elapsed:.0f} s elapsed, ETA {eta}"


def _table(rows: list[Row], fields: list[str], marks: dict[int, str], basis: str, show: tuple[bool, bool]) -> Table:
    """The runs as a table; a fleet pool's field heads its column on two lines (``pools[H200]`` / ``.nodes``);
    ``show``: policy and queue columns, when several policies or line orders ran."""
    shown = [r for r in rows if len(rows) <= TABLE_ROWS or id(r) in marks]
    title = f"whatif: {_count(len(rows), 'run')}" + ("" if len(shown) == len(rows) else
                                                     f", the frontier and the chosen one shown ({len(shown)})")
    table = Table(title=title)
    named = (["policy"] if show[0] else []) + (["queue"] if show[1] else [])
    cols = [escape(f.replace("].", "]\n.")) for f in fields] + named + [
        "$/h owned", "$/h used", f"total $ {basis}", "p50 wait h", "p95 wait h", "makespan h", "SLO met",
        "limits", "note"]
    for i, col in enumerate(cols):
        left = i < len(fields) + len(named) or col in ("limits", "note")
        table.add_column(col, justify="left" if left else "right", no_wrap=True,
                         min_width=len("backfill") if col == "queue" else None)
    for r in shown:
        cells = ([_value(r.values[f]) for f in fields] + ([escape(r.policy)] if show[0] else [])
                 + ([r.queue] if show[1] else []))
        cells += [_fmt(r.owned_per_hour), _fmt(r.cost_per_hour), _fmt(r.total(basis), ",.0f"),
                  _fmt(r.p50_wait_h, ".2f"), _fmt(r.p95_wait_h, ".2f"), _fmt(r.makespan_h),
                  _fmt(r.slo_met * 100) + "%" if r.error is None else "-", r.limiting_pool or "-",
                  "cannot run (below)" if r.error else f"{job_count(r.never_ran)} never ran" if r.never_ran
                  else marks.get(id(r), "")]
        table.add_row(*cells, style="bold" if "chosen" in marks.get(id(r), "") else None)
    return table


def _targets_text(max_p95_wait_h: float | None, min_slo: float | None) -> str:
    parts = ["every job ran"]
    if max_p95_wait_h is not None:
        parts.append(f"p95 wait <= {max_p95_wait_h:g} h")
    if min_slo is not None:
        parts.append(f"SLO met >= {min_slo * 100:g}%")
    return ", ".join(parts)


def _why(chosen: Row, qualifying: list[Row], front: list[Row], basis: str, targets: str,
         show: tuple[bool, bool]) -> str:
    """Why ``chosen`` (the cheapest of ``qualifying``) was chosen, in one paragraph."""
    others = sorted((r for r in qualifying if r is not chosen), key=lambda r: r.cost(basis))
    text = (f"chosen: {chosen.label(*show)}: ${chosen.cost(basis):,.2f}/h {basis}, p95 wait "
            f"{chosen.p95_wait_h:.2f} h, SLO met {chosen.slo_met * 100:.1f}%, makespan {chosen.makespan_h:.1f} h. "
            f"Why: the cheapest ({basis} $/h) of {_count(len(qualifying), 'configuration')} meeting the targets "
            f"({targets})")
    if others:
        text += f"; the next cheapest, {others[0].label(*show)}, costs ${others[0].cost(basis):,.2f}/h"
    if any(r is chosen for r in front):
        return text + "; it is on the cost / p95-wait frontier."
    return text + "; it is off the frontier: a row as cheap or cheaper that waits no longer misses the SLO target."


def _write(path: Path, option: str, text: str) -> None:
    from rollmux.report.paths import write_text

    try:
        write_text(path, text, option)
    except RollMuxError as err:
        _fail(err)
    console.print(f"wrote {escape(str(path))}")


def _csv_text(rows: list[Row], fields: list[str], marks: dict[int, str]) -> str:
    from io import StringIO

    from rollmux.report.paths import csv_cell

    out = StringIO()
    metrics = [k for k in rows[0].to_dict() if k != "values"]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(name) for name in fields + metrics + ["on_frontier", "chosen"]])
    for r in rows:
        data = r.to_dict()
        cells = ([_value(r.values[f]) for f in fields] + ["" if data[k] is None else data[k] for k in metrics]
                 + [int("frontier" in marks.get(id(r), "")), int("chosen" in marks.get(id(r), ""))])
        writer.writerow([csv_cell(cell) for cell in cells])  # (a pool name or an error as a formula)
    return out.getvalue()


def _base(cluster: Path | None) -> dict:
    """The dict ``--vary`` changes: a fleet file's (``whatif_fleet.fleet_dict``) or a
    two-pool cluster file's (``cluster_to_dict``; none: the default cluster)."""
    from rollmux.cluster_file import cluster_from_dict, cluster_to_dict, load_cluster, read_mapping
    from rollmux.whatif_fleet import fleet_dict

    if cluster is None:
        return cluster_to_dict(load_cluster(None))
    raw = read_mapping(cluster, "cluster")
    try:
        return fleet_dict(raw) if FLEET in raw else cluster_to_dict(cluster_from_dict(raw))
    except SpecError as err:
        raise RollMuxError(f"--cluster {cluster}: {err}") from None


def _check_policies(names: list[str], base: dict, profiles: Profiles | None) -> None:
    """SpecError("policy", ...) for a name that is not a policy of ``base`` (a fleet's, or
    a two-pool cluster's simulated ones), listing the valid names."""
    from rollmux.whatif_fleet import policy_names

    valid = policy_names(base, profiles) if FLEET in base else SIMULATED
    for name in names:
        if name not in valid:
            raise SpecError("policy", name, f"one of {', '.join(valid)}")


def _profiles(path: Path | None, base: dict) -> Profiles | None:
    """The measured phase times of ``--profiles`` for the fleet ``base`` (None: not given)."""
    from rollmux.fleet import load_profiles
    from rollmux.whatif import build

    if path is None:
        return None
    if FLEET not in base:
        raise RollMuxError(f"--profiles {path}: measured phase times per GPU type are for a fleet file "
                           "(--cluster with a `pools` list)")
    return load_profiles(path, build(base))


def whatif(
    trace: str = typer.Option("production", help="A builtin trace (production, philly-mix) or a job-trace CSV file."),
    cluster: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, readable=True,
                                           help="The base cluster YAML that --vary changes: a two-pool cluster "
                                                "file or a fleet file (a `pools` list of GPU types); default: "
                                                "the paper's testbed (both pools unbounded)."),
    profiles: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, readable=True,
                                            help="Fleets: profile CSV (job_id,gpu,t_roll_s,t_train_s), measured "
                                                 "phase seconds per GPU type; the roofline rule fills the rest."),
    vary: list[str] = typer.Option(..., "--vary",
                                   help="FIELD=VALUES, repeatable: an inclusive range lo:hi:step "
                                        "(train.nodes=10:20:2) or a comma list (rollout.nodes=8,12,unbounded). "
                                        "FIELD: a numeric field of the cluster file (nodes, price_per_gpu_hour, "
                                        "host_mem_gb of rollout/train, gpus_per_node, max_group_size, "
                                        "switch_cost_s in seconds); of a fleet, pools[NAME or INDEX].nodes / "
                                        ".price_per_gpu_hour / .host_mem_gb (pools[H200].nodes=0,2,unbounded). "
                                        "The grid is every combination."),
    policy: list[str] = typer.Option(["rollmux"], "--policy", "--policies",
                                     help="Policy to simulate; repeatable. A two-pool cluster: "
                                          f"{', '.join(SIMULATED)}. A fleet: the policies of `rollmux fleet "
                                          "simulate` (rollmux, rollmux-full, 'rollmux on H20/H800', gavel+, ...)."),
    address: Optional[str] = typer.Option(None, help="An existing Ray cluster (ray.init address); default: "
                                                     "a local Ray instance."),
    workers: Optional[int] = typer.Option(None, min=1, help="CPUs of the local Ray instance (default: the "
                                                            "machine's, at most one per run)."),
    max_p95_wait_h: Optional[float] = typer.Option(None, min=0, help="Target: p95 wait at most this many hours."),
    min_slo: Optional[float] = typer.Option(None, min=0, max=1, help="Target: share of jobs meeting their SLO "
                                                                     "(e.g. 0.99)."),
    cost: CostBasis = typer.Option("owned", help="owned (a bounded pool's every node, all the time; an "
                                                 "unbounded pool as used) or used (the simulator's $/h: "
                                                 "allocated nodes only). Ranks the choice and the frontier."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every row, the frontier and the "
                                                                  "choice as JSON here."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write one line per run as CSV here."),
    plot: Optional[Path] = typer.Option(None, help="Write the cost vs p95-wait frontier plot (PNG) here."),
    seed: int = typer.Option(0, help="Seed for stochastic durations, the random policy and philly-mix."),
    duration_model: DurationModel = typer.Option("worst", help="worst (profiled phase times) or stochastic."),
    accounting: AccountingName = typer.Option("ours", help="ours or paper (rollmux simulate --accounting)."),
    queue: list[QueueOrder] = typer.Option(["backfill"], "--queue", help=QUEUE_HELP + " Repeatable: every "
                                           "configuration and policy runs under each order given."),
) -> None:
    """Capacity planning: simulate the trace on every cluster of a grid (in parallel on Ray),
    then pick the cheapest configuration meeting a p95-wait / SLO target and show the
    cost vs p95-wait Pareto frontier."""
    from rollmux.report.paths import check_outputs
    from rollmux.traces.builtin import load_trace
    from rollmux.whatif import choose, frontier, grid, parse_vary, qualifies
    from rollmux.whatif_fleet import check_accounting
    from rollmux.whatif_ray import run_grid

    names, queues = list(policy), [q.value for q in queue]
    for option, given in (("--policy", names), ("--queue", queues)):
        twice = sorted({n for n in given if given.count(n) > 1})
        if twice:
            _fail(RollMuxError(f"{option} {', '.join(twice)}: given twice"))
    if address and workers:
        _fail(RollMuxError("--workers sizes the local Ray instance; with --address the cluster's CPUs are used"))
    acct = ACCOUNTINGS[accounting.value]
    try:
        check_outputs({"--json": json_path, "--csv": csv_path, "--plot": plot}, {"--plot": (".png",)},
                      inputs={"--trace": trace, "--cluster": cluster, "--profiles": profiles})
        base = _base(cluster)
        measured = _profiles(profiles, base)
        _check_policies(names, base, measured)
        if FLEET in base:
            check_accounting(acct)
        varies = [parse_vary(spec, base, acct) for spec in vary]
        configs = grid(varies)
        jobs, info = load_trace(trace, None, seed)
    except (RollMuxError, OSError) as err:
        _fail(err)
    if not jobs:
        _fail(RollMuxError(f"--trace {trace}: the trace holds no jobs"))
    basis, show = cost.value, (len(names) > 1, len(queues) > 1)
    fields = [v.field for v in varies]
    total = len(configs) * len(names) * len(queues)
    if measured is not None:
        from rollmux.whatif import build

        for line in measured.unused(build(base), jobs):  # (as `fleet simulate` warns; rows dropped silently)
            progress_console.print(f"[yellow]warning: --profiles {escape(str(profiles))}: {escape(line)} (rows not "
                                   f"used)[/yellow]")
    if total > MAX_CONFIGS:
        _fail(RollMuxError(f"--vary, --policy, --queue: {len(configs):,} configurations x {len(names)} "
                           f"polic{'y' if len(names) == 1 else 'ies'} x {len(queues)} line order"
                           f"{'' if len(queues) == 1 else 's'} = {total:,} runs; expected at most "
                           f"{MAX_CONFIGS:,} (split the grid)"))
    console.print(f"trace [bold]{escape(info['name'])}[/bold]: {job_count(info['jobs'])}; "
                  f"{_count(len(configs), 'configuration')} x {len(names)} polic{'y' if len(names) == 1 else 'ies'}"
                  + (f" x {len(queues)} line orders" if len(queues) > 1 else "") + f" = {_count(total, 'run')} on "
                  + (f"Ray at {escape(address)}" if address else "a local Ray instance")
                  + f"; waiting line on bounded pools: {' and '.join(queues)}", highlight=False)
    started = time.perf_counter()
    progress = _Progress(basis, show)
    try:
        rows = run_grid(jobs, base, configs, names, seed=seed, duration_model=duration_model.value,
                        accounting=acct, address=address, num_cpus=workers, profiles=measured,
                        queues=queues, on_row=progress, on_wait=progress.waiting)
    except RollMuxError as err:
        _fail(err)
    wall = time.perf_counter() - started
    front = frontier(rows, basis)
    chosen = choose(rows, basis, max_p95_wait_h, min_slo)
    marks = {id(r): "frontier" for r in front}
    if chosen is not None:
        marks[id(chosen)] = "chosen" + (", frontier" if id(chosen) in marks else "")
    console.print(_table(rows, fields, marks, basis, show))
    failed = [r for r in rows if r.error]
    if failed:
        console.print(f"[yellow]{_count(len(failed), 'run')} could not place the trace (no row on the frontier): "
                      f"{escape(failed[0].label(*show))}: {escape(failed[0].error)}[/yellow]")
    targets = _targets_text(max_p95_wait_h, min_slo)
    qualifying = [r for r in rows if qualifies(r, max_p95_wait_h, min_slo)]
    why = (_why(chosen, qualifying, front, basis, targets, show) if chosen is not None
           else f"no configuration meets the targets ({targets})")
    console.print(f"{len(rows)} run{'s' * (len(rows) != 1)} in {wall:.1f} s; frontier: {len(front)} "
                  f"configuration{'s' * (len(front) != 1)}")
    console.print(("[bold]" if chosen else "[yellow]") + escape(why) + ("[/bold]" if chosen else "[/yellow]"))
    if json_path is not None:
        index = {id(r): i for i, r in enumerate(rows)}
        payload = {"trace": info, "cluster": base, "vary": list(vary), "policies": names,
                   "duration_model": duration_model.value, "seed": seed, "accounting": acct.name,
                   "queues": queues, "cost_basis": basis,
                   "targets": {"max_p95_wait_h": max_p95_wait_h, "min_slo": min_slo},
                   "rows": [r.to_dict() for r in rows], "frontier": [index[id(r)] for r in front],
                   "chosen": index[id(chosen)] if chosen is not None else None, "why": why, "wall_s": wall}
        _write(json_path, "--json", json_text(payload))
    if csv_path is not None:
        _write(csv_path, "--csv", _csv_text(rows, fields, marks))
    if plot is not None:
        from rollmux.report.whatif_plot import frontier_plot

        try:
            console.print(f"wrote {escape(str(frontier_plot(rows, front, chosen, basis, plot, show)))}")
        except OSError as err:
            _fail(RollMuxError(f"--plot {plot}: {err.strerror or err}"))
    if chosen is None:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``whatif`` command to ``app``."""
    app.command("whatif")(whatif)
