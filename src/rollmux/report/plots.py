"""PNG plots for ``rollmux simulate --out`` and the HTML report: cost over time, each
policy's total cost against a reference, GPUs in use per pool (against the pool's
capacity where it is bounded), the queue of waiting jobs (bounded pools), all three
over hours since the first arrival (``first_arrival``), and a Gantt chart of one group
(by default the busiest) over a time window of the simulation clock (rollout and
training lanes, one colour per job, with a legend). Pools are labelled with the GPU
types the cluster configures (``gpus``: pool -> GPU type name). Text from the user (job
and node names) is drawn as written: a ``$`` never starts mathtext. Matplotlib with the
Agg backend: no display needed."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from rollmux.errors import ReportError  # noqa: E402
from rollmux.report.paths import written_by  # noqa: E402
from rollmux.model import POOLS, ROLLOUT, TRAIN  # noqa: E402
from rollmux.sim.metrics import PolicyResult  # noqa: E402

_POOL_WORD = {ROLLOUT: "rollout", TRAIN: "training"}
MISSES_SLOS = "(misses SLOs)"


def save(fig, path: Path) -> Path:
    """Lay out, write as PNG (whole or not at all, ``paths.replacing``) and close: the last
    step of every figure here."""
    try:
        fig.tight_layout()
        written_by(Path(path), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)
    return path


def plain(text: str) -> str:
    """``text`` for a matplotlib label, shown literally (``$`` escaped so it starts no mathtext)."""
    return text.replace("$", r"\$")


def misses_slos(result: PolicyResult) -> bool:
    """Whether an executed policy left any job of the trace short of its SLO (or never ran it)."""
    return result.executed and result.slo_attainment is not None and result.slo_attainment < 1.0


def first_arrival(results: list[PolicyResult]) -> float:
    """The origin of the time-series figures ("hours since first arrival"), on the
    simulation clock: the earliest change of any result's plan or queue, which is the
    first arrival that some policy placed or queued (0.0 when no result has any)."""
    return min((s[0][0] for r in results for s in (r.series, r.queue_series) if s), default=0.0)


def _steps(series, index: int, t0: float):
    xs, ys = [], []
    for point in series:
        xs.append((point[0] - t0) / 3600.0)
        ys.append(point[index])
    return xs, ys


def mean_rate(series) -> float:
    """The time-average of the step series ``series`` ((t, $/h, ...) points, each level
    held to the next point) from its first point to its last: the area under the drawn
    curve over its span; 0.0 for fewer than two points."""
    if len(series) < 2:
        return 0.0
    area = sum(a[1] * (b[0] - a[0]) for a, b in zip(series, series[1:]))
    return area / (series[-1][0] - series[0][0]) if series[-1][0] > series[0][0] else 0.0


def cost_over_time(results: list[PolicyResult], path: Path, mark_slo_misses: bool = False) -> Path:
    """$/h of each policy's plan over time: what the nodes its groups hold cost (pay per
    use), each curve's legend giving its mean over its own span (``mean_rate``; the shared
    reward pool's per-use bill is not in it). A policy priced ``owned`` has its curve
    labelled "used", and a dotted flat line in its colour at its owned cost per hour of
    its run (``total_cost`` less the reward bill, over ``span_s``) labelled "owned".
    ``mark_slo_misses``: a policy that misses any SLO is drawn dashed, its legend entry
    ending in "(misses SLOs)"."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    t0 = first_arrival(results)
    for r in results:
        xs, ys = _steps(r.series, 1, t0)
        missed = mark_slo_misses and misses_slos(r)
        owned = r.pricing == "owned"
        (line,) = ax.step(xs, ys, where="post", linewidth=1.2, linestyle="--" if missed else "-",
                          label=f"{r.policy}{' used' * owned} (mean \\${mean_rate(r.series):,.0f}/h)"
                          + (f" {MISSES_SLOS}" if missed else ""))
        if owned and xs and r.span_s > 0:
            rate = (r.total_cost - r.reward_cost) / (r.span_s / 3600.0)
            ax.plot([xs[0], xs[-1]], [rate, rate], color=line.get_color(), linestyle=":", linewidth=1.2,
                    label=f"{r.policy} owned (\\${rate:,.0f}/h)")
    ax.set_xlabel("hours since first arrival")
    ax.set_ylabel("$ per hour")
    ax.set_title("Cluster cost over time")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def savings(results: list[PolicyResult], path: Path, reference: str) -> Path:
    """Total cost of every policy, one horizontal bar each, labelled with its ratio to the
    ``reference`` policy's and what the reference saves against it; the reference's bar
    is dark, and a policy that misses any SLO is hatched and says so."""
    ref = next(r for r in results if r.policy == reference)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(results)))
    for y, r in enumerate(results):
        missed = misses_slos(r)
        ax.barh(y, r.total_cost, color="#333333" if r is ref else "#4c72b0", height=0.6,
                hatch="//" if missed else None, edgecolor="white" if missed else None)
        note = f"\\${r.total_cost:,.0f}"
        if r is ref:
            note += " (reference)"
        elif ref.total_cost > 0 and r.total_cost > 0:
            ratio = r.total_cost / ref.total_cost
            edge = (f"{reference} saves {100 * (1 - 1 / ratio):.0f}%" if ratio >= 1
                    else f"{reference} costs {100 * (1 / ratio - 1):.0f}% more")
            note += f"  {ratio:.2f}x, {edge}"
        if missed:
            note += f" {MISSES_SLOS}"
        ax.text(r.total_cost, y, " " + note, va="center", fontsize=8)
    ax.set_yticks(range(len(results)), [r.policy for r in results])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.6 * max((r.total_cost for r in results), default=0.0) or 1.0)
    ax.set_xlabel("total cost ($)")
    ax.set_title(f"Total cost per policy, against {reference}")
    ax.grid(axis="x", alpha=0.3)
    return save(fig, path)


def gpus_in_use(results: list[PolicyResult], path: Path, gpus: dict[str, str],
                capacity: dict[str, int | None] | None = None) -> Path:
    """GPUs allocated per pool over time, one panel per pool labelled with its GPU type;
    ``capacity`` (pool -> GPUs, None = unbounded) draws a bounded pool's inventory as a
    dotted black line."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t0 = first_arrival(results)
    for idx, (ax, pool) in enumerate(zip(axes, POOLS)):
        for r in results:
            xs, ys = _steps(r.series, 2 + idx, t0)
            ax.step(xs, ys, where="post", label=r.policy, linewidth=1.1)
        cap = (capacity or {}).get(pool)
        if cap is not None:
            ax.axhline(cap, color="black", linestyle=":", linewidth=1.2, label=f"capacity ({cap} GPUs)")
        ax.set_ylabel(f"{_POOL_WORD[pool]} ({gpus[pool]}) GPUs")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=3)
    if (capacity or {}).get(POOLS[1]) is not None:  # the lower panel's legend: its capacity line only
        axes[1].legend(handles=axes[1].get_lines()[-1:], fontsize=8)
    axes[1].set_xlabel("hours since first arrival")
    axes[0].set_title("GPUs in use per pool")
    return save(fig, path)


def queue_length(results: list[PolicyResult], path: Path) -> Path:
    """Jobs waiting for nodes over time, per policy (a step series from the first arrival;
    0 where none waited)."""
    fig, ax = plt.subplots(figsize=(10, 3.5))
    t0 = first_arrival(results)
    for r in results:
        if not r.executed:
            continue
        xs, ys = _steps([(t0, 0), *r.queue_series], 1, t0)
        ax.step(xs, ys, where="post", label=f"{r.policy} (max {r.max_queue})", linewidth=1.1)
    ax.set_xlabel("hours since first arrival")
    ax.set_ylabel("jobs waiting")
    ax.set_title("Queue: jobs waiting for nodes")
    ax.legend(fontsize=8, ncol=3)
    ax.grid(alpha=0.3)
    return save(fig, path)


def busiest_group(spans) -> str:
    """The group with the most phase time."""
    busy: dict[str, float] = {}
    for gid, _, _, _, start, _, end in spans:
        busy[gid] = busy.get(gid, 0.0) + end - start
    return max(busy, key=busy.get)


def group_window(spans, gid: str) -> list:
    """The spans of group ``gid`` starting in a window of about three of its
    meta-iterations from the middle of its life (``gantt_frame`` draws every span of the
    group overlapping them)."""
    own = sorted((s for s in spans if s[0] == gid), key=lambda s: s[4])
    mid = own[len(own) // 2][4]
    jobs = {s[1] for s in own if abs(s[4] - mid) < 4 * 3600}
    longest = max(s[6] - s[4] for s in own)
    width = 3 * longest * max(1, len(jobs))
    return [s for s in own if mid <= s[4] < mid + width]


def frame_name(policy: str, frame) -> str:
    """"POLICY: group G, A-B h": the policy and ``gantt_frame``'s group and window (hours on
    the simulation clock), as a Gantt chart's title and caption name them."""
    gid, (lo, hi), _ = frame
    return f"{policy}: group {gid}, {lo / 3600:,.2f}-{hi / 3600:,.2f} h"


def gantt_frame(spans, group: str | None = None, window: tuple[float, float] | None = None
                ) -> tuple[str, tuple[float, float], list]:
    """What a Gantt chart shows: ``(group, (start_s, end_s), spans)``, every span of
    ``group`` (default: the busiest) that overlaps the window, one that started before it
    included (default window: from the first start to the last end of ``group_window``'s
    spans), on the simulation clock, by start.

    Raises ReportError when ``spans`` is empty, ``group`` ran no phase in them, or
    ``window`` is not a start before an end or holds none of the group's phases.
    """
    groups = sorted({s[0] for s in spans}, key=lambda g: (len(g), g))
    if not groups:
        raise ReportError("gantt_group", group, "a run that recorded its phases (record_spans=True)")
    if group is not None and group not in groups:
        shown = ", ".join(groups[:20]) + (f", ... ({len(groups)} groups)" if len(groups) > 20 else "")
        raise ReportError("gantt_group", group, f"a group that ran phases: {shown}")
    gid = group if group is not None else busiest_group(spans)
    if window is None:
        started = group_window(spans, gid)
        window = started[0][4], max(s[6] for s in started)
    elif not window[0] < window[1]:
        raise ReportError("gantt_window", window, "(start_s, end_s) with start < end")
    lo, hi = window
    picked = sorted((s for s in spans if s[0] == gid and s[4] < hi and s[6] > lo), key=lambda s: s[4])
    if not picked:
        raise ReportError("gantt_window", window, f"a window in which group {gid} ran a phase")
    return gid, (lo, hi), picked


def lane_pools(spans) -> dict[str, str]:
    """The pool of every node in ``spans``: a node that ever ran a training phase is a
    training node (co-located nodes run both), any other a rollout node. Node names are
    not trusted to say it (real inventories name nodes freely)."""
    pools: dict[str, str] = {}
    for _, _, pool, nodes, *_ in spans:
        for node in nodes:
            if pool == TRAIN or node not in pools:
                pools[node] = pool
    return pools


def gantt(spans, path: Path, gpus: dict[str, str], title: str = "", group: str | None = None,
          window: tuple[float, float] | None = None) -> Path:
    """Phases per node of one group over a window (``gantt_frame``: default the busiest
    group, about three meta-iterations): one lane per node, one colour per job (legend),
    switch time grey; bars wide enough carry the job and phase (R/T)."""
    gid, (lo, hi), shown = gantt_frame(spans, group, window)
    pool_of = lane_pools(s for s in spans if s[0] == gid)
    lanes = sorted({n for s in shown for n in s[3]}, key=lambda n: (POOLS.index(pool_of[n]), n))
    jobs = sorted({s[1] for s in shown})
    colours = plt.get_cmap("tab10")
    labelled = (hi - lo) * 0.04  # narrower bars go unlabelled; the legend names their job
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.6 * len(lanes)))
    for _, job, pool, nodes, start, body_start, end in shown:
        c = colours(jobs.index(job) % 10)
        for node in nodes:
            y = lanes.index(node)
            if body_start > start:
                ax.barh(y, (body_start - start) / 60, left=(start - lo) / 60, color="lightgrey", height=0.6)
            ax.barh(y, (end - body_start) / 60, left=(body_start - lo) / 60, color=c, height=0.6,
                    edgecolor="black", linewidth=0.4)
            mid = (max(body_start, lo) + min(end, hi)) / 2
            if min(end, hi) - max(body_start, lo) >= labelled:
                ax.text((mid - lo) / 60, y, plain(f"{job} {pool[0].upper()}"), ha="center", va="center",
                        fontsize=6, clip_on=True)
    ax.set_yticks(range(len(lanes)), [plain(f"{n} ({gpus[pool_of[n]]} {_POOL_WORD[pool_of[n]]})") for n in lanes])
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) / 60)
    ax.set_xlabel(f"minutes after {lo / 3600:,.2f} h")
    handles = [Patch(color=colours(i % 10), label=plain(job)) for i, job in enumerate(jobs)]
    handles.append(Patch(color="lightgrey", label="switch"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, title="job",
              title_fontsize=7, frameon=False)
    ax.set_title(plain(title) if title else f"Group {plain(gid)}: phases per node (grey = switch)")
    return save(fig, path)
