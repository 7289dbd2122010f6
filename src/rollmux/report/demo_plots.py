"""PNG plots of a measured ``rollmux demo`` run (Matplotlib, Agg backend).

* ``measured_gantt``: one lane per RollMux node, one bar per granted phase as the
  jobs' SDKs timed it (grant arrival to release), coloured by job; rollout bars are
  solid, training bars hatched. Times are seconds since the first grant. A long-tail
  rollout (a span with ``segments``) is drawn stretch by stretch at the fraction of
  the node's GPUs it held: a donor's bar hangs from the top of the lane and shrinks
  at its tail, a recipient's slice stands on the bottom of the lane (they never
  overlap while the node is shared) and grows to full height when it owns the node
  (it may then report a tail of its own and shrink to the top); a small triangle
  marks each tail report. Moves (the
  live-move demo), if given, are a dashed line at the hand-off from the old nodes'
  lanes to the new ones, labelled with the job and the groups.
* ``reward_curves``: mean reward per iteration of each job (multiplexed and, dashed,
  solo).
* ``busy_fractions``: busy fraction of each pool, multiplexed against solo.

Each function takes the plain dicts of the demo's ``results.json`` and returns the path.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollmux.report.plots import save  # noqa: E402

_COLOURS = plt.get_cmap("tab10").colors


def measured_gantt(spans: list[dict], path: Path, title: str = "", moves: list[dict] | None = None,
                   gpus_per_node: int = 8) -> Path:
    """``spans``: dicts with job_id, pool, nodes, start, end (wall-clock seconds) and,
    for long-tail rollouts, share and segments ([start, end, gpus, service_gpus]).

    ``moves``: dicts with job_id, from_group, to_group, from_nodes, to_nodes, at
    (wall-clock start of the hand-off) and handoff_s.
    """
    t0 = min(s["start"] for s in spans)
    nodes = sorted({n for s in spans for n in s["nodes"]}, key=lambda n: (n[0] != "R", n))
    jobs = list(dict.fromkeys(s["job_id"] for s in spans))
    colour = {j: _COLOURS[i % len(_COLOURS)] for i, j in enumerate(jobs)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.7 * len(nodes)))
    for s in spans:
        pieces = s.get("segments") or [[s["start"], s["end"], gpus_per_node, gpus_per_node]]
        slice_ = s.get("share", 1.0) < 1.0
        for n in s["nodes"]:
            y = nodes.index(n)
            for k, (a, b, g, sg) in enumerate(pieces):
                h = 0.6 * g / gpus_per_node
                # inverted y axis: y - 0.3 is the lane's top edge; a slice stands on the
                # bottom edge, everything else (a full node, a tail) hangs from the top
                bottom = y + 0.3 - h if slice_ and k == 0 else y - 0.3
                ax.bar(a - t0, h, width=b - a, bottom=bottom, align="edge", color=colour[s["job_id"]],
                       hatch="" if s["pool"] == "rollout" else "///", edgecolor="black", linewidth=0.3)
                if k > 0 and sg < gpus_per_node:  # a tail report
                    ax.plot(a - t0, y - 0.36, marker="v", color="black", markersize=4)
    for k, m in enumerate(moves or ()):
        lanes = [nodes.index(n) for n in [*m["from_nodes"], *m["to_nodes"]] if n in nodes]
        if not lanes:
            continue
        x0, x1 = m["at"] - t0, m["at"] - t0 + m["handoff_s"]
        ax.plot([x0, x1], [min(lanes) - 0.4, max(lanes) + 0.4], linestyle="--", color=colour.get(m["job_id"], "k"),
                linewidth=1.5)
        ax.annotate(f"{m['job_id']}: {m['from_group']} -> {m['to_group']}", (x1, max(lanes) + 0.4), fontsize=8,
                    xytext=(4, 11 * k), textcoords="offset points", va="bottom")
    ax.set_yticks(range(len(nodes)), nodes)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first grant")
    ax.set_title(title or "Measured phases per node (solid: rollout, hatched: train)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[j]) for j in jobs]
    ax.legend(handles, jobs, loc="upper right", fontsize=8, ncol=len(jobs))
    ax.grid(axis="x", alpha=0.3)
    return save(fig, path)


def reward_curves(curves: dict[str, dict[str, list[float]]], path: Path, title: str = "GRPO reward per iteration",
                  ylabel: str = "mean reward (fraction of answer characters correct)",
                  xlabel: str = "iteration") -> Path:
    """``curves``: job -> {"multiplexed": [...], "solo": [...]} mean reward per iteration."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (job, runs) in enumerate(curves.items()):
        c = _COLOURS[i % len(_COLOURS)]
        ax.plot(runs["multiplexed"], color=c, label=f"{job} (multiplexed)")
        if runs.get("solo"):
            ax.plot(runs["solo"], color=c, linestyle="--", alpha=0.6, label=f"{job} (solo)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def busy_fractions(busy: dict[str, dict[str, float]], path: Path) -> Path:
    """``busy``: "multiplexed"/"solo" -> pool -> busy fraction in [0, 1]."""
    pools = list(busy["multiplexed"])
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.38
    for k, mode in enumerate(("solo", "multiplexed")):
        xs = [i + (k - 0.5) * width for i in range(len(pools))]
        values = [busy[mode][p] for p in pools]
        bars = ax.bar(xs, values, width, label=mode, color=_COLOURS[k])
        ax.bar_label(bars, labels=[f"{v:.0%}" for v in values], fontsize=8)
    ax.set_xticks(range(len(pools)), pools)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("busy fraction (phase node-seconds / node-seconds)")
    ax.set_title("Pool busy fraction")
    ax.legend(fontsize=8)
    return save(fig, path)
