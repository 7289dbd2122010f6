"""One self-contained HTML page comparing the policies of a simulated run.

Contract
--------
``write_html_report(results, cluster, path, title=, trace_info=, accounting=)`` writes a
single UTF-8 file that needs nothing else: inline CSS, every figure a base64 PNG data
URI, no script, no external URL. It holds

* a summary: the trace (``trace_info``, as ``rollmux.traces.builtin.load_trace`` returns
  it), the accounting, the pools (their configured GPU types, prices and inventories) and
  the reference policy ("rollmux" when present, else the first), then per policy $/h,
  total $ (with a "reward $" column, the shared reward pool's per-use bill already inside
  total $, when some job scores on it), cost against the reference, SLO attainment on the policy's basis, jobs that
  never ran, the bubble of each pool, the mean wait and the placements; and, for the
  policies whose jobs ran under two or more kinds of placement, each kind's share of
  the node cost (``PolicyResult.cost_by_placement``);
* figures (``rollmux.report.plots``): each policy's total cost against the reference's;
  cost over time (each curve's mean in its legend, and with owned nodes a flat line at
  the owned $/h), a policy that misses any SLO dashed and marked "(misses SLOs)"; GPUs
  in use per pool with the capacity of a bounded pool (nodes x GPUs per node); the
  queue when a pool is bounded (these three in hours since the first arrival); and a
  Gantt chart of one group of the first policy that recorded its phases
  (``PolicyResult.spans``), ``gantt_group`` over ``gantt_window`` (seconds on the
  simulation clock, as the jobs' arrival times), by default the busiest group over
  about three of its meta-iterations (``plots.gantt_frame``);
* per policy a table of its jobs (``rollmux.report.jobs_csv.job_rows``: jobs that never
  ran included, with the reason), at most ``ROW_CAP`` rows each, with a note when cut.

Results whose note says they were skipped (the optimal curve on a large trace, a policy
that could place no job) are left out of the tables and figures and named in the summary
with that note. Every string that comes from the user (title, trace fields, job, group
and node names, reasons) is escaped with ``html.escape``. Raises ReportError, before
anything is written, when no result is left to show, when ``gantt_group`` is not a group
in the recorded spans (or ``gantt_group`` / ``gantt_window`` is given and no policy
recorded spans), or when ``gantt_window`` is not a start before an end holding a phase
of that group.
"""
from __future__ import annotations

import base64
import tempfile
from html import escape
from pathlib import Path

from rollmux.errors import ReportError
from rollmux.model import POOLS, Cluster
from rollmux.report import plots
from rollmux.report.jobs_csv import COLUMNS, job_rows
from rollmux.report.paths import write_text
from rollmux.report.tables import job_count, placement_counts
from rollmux.sim.metrics import PolicyResult

ROW_CAP = 2000

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1150px;
       color: #222; padding: 0 12px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; white-space: normal; } .text { text-align: left; }
td.wrap { white-space: normal; min-width: 16em; } .scroll { overflow-x: auto; }
tr.ref td { font-weight: bold; } td.miss { color: #b00020; } td.met { color: #1b7f3b; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; }
dt { font-weight: bold; } dd { margin: 0; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption, .note { color: #555; font-size: 0.9em; }
details { margin: 0.6em 0; } summary { cursor: pointer; font-weight: bold; }
"""


def reference_policy(results: list[PolicyResult]) -> str:
    """The policy others are compared with: "rollmux" when present, else the first."""
    return "rollmux" if any(r.policy == "rollmux" for r in results) else results[0].policy


def write_html_report(results: list[PolicyResult], cluster: Cluster, path: Path, *, title: str, trace_info: dict,
                      accounting: str, gantt_group: str | None = None,
                      gantt_window: tuple[float, float] | None = None) -> Path:
    """Write the report at ``path`` (parent folder created) and return ``path``; see the
    module contract."""
    shown = [r for r in results if not r.note.startswith("skipped")]
    if not shown:
        raise ReportError("results", [r.policy for r in results], "at least one policy that was not skipped")
    traced = next((r for r in shown if r.spans), None)
    frame = None
    if traced is not None or gantt_group is not None or gantt_window is not None:
        frame = plots.gantt_frame(traced.spans if traced else [], gantt_group, gantt_window)
    ref = reference_policy(shown)
    with tempfile.TemporaryDirectory() as tmp:
        figures = _figures(shown, cluster, ref, traced, frame, Path(tmp))
    page = "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _summary(results, shown, cluster, ref, trace_info, accounting),
        "<h2>Figures</h2>", *figures,
        "<h2>Jobs</h2>", _job_tables(shown, ref),
        "</body></html>"])
    return write_text(Path(path), page, "--html")


def _figures(shown: list[PolicyResult], cluster: Cluster, ref: str, traced: PolicyResult | None, frame,
             tmp: Path) -> list[str]:
    """The figures as <figure> elements, drawn into ``tmp`` and embedded."""
    gpus = {p: cluster.pool(p).gpu for p in POOLS}
    capacity = {p: None if cluster.pool(p).nodes is None else cluster.pool(p).nodes * cluster.gpus_per_node
                for p in POOLS}
    out = [_figure(plots.savings(shown, tmp / "savings.png", ref),
                   f"Total cost of each policy; the ratio is to {ref}'s. Hatched: the policy misses SLOs."),
           _figure(plots.cost_over_time(shown, tmp / "cost.png", mark_slo_misses=True),
                   "The plan's $/h over time (its nodes, per use); the legend gives each curve's mean over its "
                   "span." + (" Dotted and flat: the owned $/h (every node of a bounded pool, for the whole run)."
                              if any(r.pricing == "owned" for r in shown) else "")
                   + " Dashed: the policy misses at least one job's SLO."),
           _figure(plots.gpus_in_use(shown, tmp / "gpus.png", gpus, capacity),
                   "GPUs allocated per pool; a dotted line is the capacity of a bounded pool.")]
    if any(r.bounded for r in shown):
        out.append(_figure(plots.queue_length(shown, tmp / "queue.png"), "Jobs waiting for free nodes."))
    if frame is not None:
        gid, (lo, hi), _ = frame
        name = plots.frame_name(traced.policy, frame)
        png = plots.gantt(traced.spans, tmp / "gantt.png", gpus, title=f"{name}: phases per node (grey = switch)",
                          group=gid, window=(lo, hi))
        out.append(_figure(png, f"{name} ({lo:,.0f}-{hi:,.0f} s): one lane per node, one colour per job; "
                                "R = rollout, T = training phase."))
    else:
        out.append('<p class="note">No Gantt chart: no policy recorded its phases.</p>')
    return out


def _figure(png: Path, caption: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def _text(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _class(name: str) -> str:
    """A class attribute, or nothing for no class."""
    return f' class="{name}"' if name else ""


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _pool_line(cluster: Cluster, pool: str) -> str:
    spec = cluster.pool(pool)
    size = ("unbounded" if spec.nodes is None
            else f"{spec.nodes} nodes x {cluster.gpus_per_node} GPUs = {spec.nodes * cluster.gpus_per_node} GPUs")
    return f"{spec.gpu} at ${spec.price_per_gpu_hour:,.2f}/GPU-h, {size}"


def _summary(results: list[PolicyResult], shown: list[PolicyResult], cluster: Cluster, ref: str, trace_info: dict,
             accounting: str) -> str:
    facts = [(f"trace {k}", _text(v)) for k, v in trace_info.items()]
    facts += [("accounting", accounting)] + [(f"{p} pool", _pool_line(cluster, p)) for p in POOLS]
    facts.append(("reference policy", ref))
    facts += [(f"{r.policy} (not shown)", r.note) for r in results if r not in shown]
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
    ref_cost = next(r for r in shown if r.policy == ref).total_cost
    reward = any(r.reward_cost for r in results)
    head = ["policy", "$/h", "total $"] + (["reward $"] if reward else []) + [f"vs {ref}", "SLO met", "basis",
                                                                             "never ran"]
    head += [f"{p} ({cluster.pool(p).gpu}) bubble" for p in POOLS]
    head += ["mean wait (min)", "packed/scaled/new", "note"]
    rows = []
    for r in shown:
        o = r.outcomes
        miss = plots.misses_slos(r)
        cells = [(r.policy, "text"), (f"{r.cost_per_hour:,.1f}", ""), (f"{r.total_cost:,.0f}", "")]
        cells += [(f"{r.reward_cost:,.0f}", "")] if reward else []
        cells += [(f"{r.total_cost / ref_cost:.2f}x" if ref_cost else "-", ""),
                 (_pct(r.slo_attainment), "miss" if miss else "met" if r.executed else ""),
                 (r.slo_basis if r.executed else "-", ""), (str(len(r.rejected)), "")]
        cells += [(_pct(r.bubble(p)), "") for p in POOLS]
        cells += [(f"{r.mean_wait_s / 60:,.1f}" if r.executed else "-", ""),
                  (placement_counts(o), ""), (r.note, "text wrap")]
        tds = "".join(f"<td{_class(cls)}>{escape(text)}</td>" for text, cls in cells)
        rows.append(f"<tr{_class('ref' if r.policy == ref else '')}>{tds}</tr>")
    ths = "".join(f"<th{_class('text' if h in ('policy', 'note') else '')}>{escape(h)}</th>" for h in head)
    return (f"<h2>Summary</h2><dl>{items}</dl><table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}"
            "</tbody></table><p class=\"note\">SLO met: share of the trace's jobs within their SLO on the basis "
            "shown (per-iteration slowdown, or end to end: (wait + run) / solo run time); a job that never ran "
            "misses it. Bubble: idle share of the pool's allocated GPU time."
            + (" reward $: what the shared reward pool billed (per use, by completed iterations), included in "
               "$/h and total $." if reward else "") + "</p>" + _cost_by_placement(shown))


def _cost_by_placement(shown: list[PolicyResult]) -> str:
    """The table of each policy's node cost by kind of placement, for the policies whose jobs
    ran under two or more kinds (``PolicyResult.cost_by_placement``); empty when none did."""
    split = [r for r in shown if len(r.cost_by_placement) > 1]
    if not split:
        return ""
    kinds: list[str] = []
    for r in split:
        kinds += [k for k in r.cost_by_placement if k not in kinds]
    ths = "".join(f"<th{_class('text' if h == 'policy' else '')}>{escape(h)}</th>" for h in ["policy"] + kinds)
    rows = []
    for r in split:
        cells = [f"<td class=\"text\">{escape(r.policy)}</td>"]
        for kind in kinds:
            k = r.cost_by_placement.get(kind)
            cells.append("<td>-</td>" if k is None else
                         f"<td>{_pct(k['share'])} (${k['cost']:,.0f}, {job_count(k['jobs'])})</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f"<h3>Cost by placement</h3><table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            "<p class=\"note\">At every instant a group's node cost is shared equally by its members; a "
            "member's share counts under the placement it got on arrival, or repacked / regrouped once it "
            "was moved. The kinds add up to the policy's node cost.</p>")


_TEXT_COLUMNS = ("job_id", "slo_basis", "outcome", "group_id", "reason")


def _cell(column: str, value) -> str:
    """A job-table cell: seconds whole, slowdowns to 3 decimals, text escaped."""
    if column == "slo_met":
        return "yes" if value else "no"
    if value == "" or column in _TEXT_COLUMNS or column in ("slo", "iterations"):
        return escape(str(value))
    if column in ("slowdown", "e2e_slowdown"):
        return f"{value:.3f}"
    if column == "reward_usd":
        return f"{value:,.2f}"
    return f"{value:,.0f}"


def _job_tables(shown: list[PolicyResult], ref: str) -> str:
    columns = [c for c in COLUMNS if c != "policy"]
    ths = "".join(f"<th{_class('text' if c in _TEXT_COLUMNS else '')}>{escape(c)}</th>" for c in columns)
    parts = ['<p class="note">Times in seconds on the simulation clock; slowdown per iteration, e2e_slowdown = '
             "JCT / solo run time. The jobs CSV holds the same rows.</p>"]
    for r in shown:
        if not r.executed:
            continue
        rows = job_rows([r])
        trs = []
        for row in rows[:ROW_CAP]:
            tds = "".join(f"<td{_class(_cls(c, row))}>{_cell(c, row[c])}</td>" for c in columns)
            trs.append(f'<tr class="job">{tds}</tr>')
        cut = (f'<p class="note">Showing the first {ROW_CAP:,} of {len(rows):,} jobs; the jobs CSV has all.</p>'
               if len(rows) > ROW_CAP else "")
        parts.append(f'<details{" open" if r.policy == ref else ""}><summary>{escape(r.policy)}: '
                     f"{job_count(len(r.jobs))} ran, {len(r.rejected)} never ran</summary>{cut}"
                     f"<div class=\"scroll\"><table><thead><tr>{ths}</tr></thead><tbody>{''.join(trs)}</tbody>"
                     "</table></div></details>")
    return "".join(parts)


def _cls(column: str, row: dict) -> str:
    if column == "slo_met":
        return "met" if row[column] else "miss"
    return "text wrap" if column == "reason" else "text" if column in _TEXT_COLUMNS else ""
