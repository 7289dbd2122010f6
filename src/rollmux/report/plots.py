"""PNG plots for ``rollmux simulate --out``: cost over time, GPUs in use per pool, and a
Gantt chart of the busiest RollMux group (rollout and training lanes, one colour per job).
Matplotlib with the Agg backend: no display needed."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollmux.sim.metrics import PolicyResult  # noqa: E402


def save(fig, path: Path) -> Path:
    """Lay out, write as PNG and close: the last step of every figure here."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _steps(series, index: int, t0: float):
    xs, ys = [], []
    for point in series:
        xs.append((point[0] - t0) / 3600.0)
        ys.append(point[index])
    return xs, ys


def cost_over_time(results: list[PolicyResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in results:
        xs, ys = _steps(r.series, 1, 0.0)
        ax.step(xs, ys, where="post", label=f"{r.policy} (avg ${r.cost_per_hour:,.0f}/h)", linewidth=1.2)
    ax.set_xlabel("hours since first arrival")
    ax.set_ylabel("$ per hour")
    ax.set_title("Cluster cost over time")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def gpus_in_use(results: list[PolicyResult], path: Path) -> Path:
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for idx, (ax, pool) in enumerate(zip(axes, ("rollout (H20)", "training (H800)"))):
        for r in results:
            xs, ys = _steps(r.series, 2 + idx, 0.0)
            ax.step(xs, ys, where="post", label=r.policy, linewidth=1.1)
        ax.set_ylabel(f"{pool} GPUs")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=3)
    axes[1].set_xlabel("hours since first arrival")
    axes[0].set_title("GPUs in use per pool")
    return save(fig, path)


def busiest_group_window(spans) -> tuple[str, list]:
    """The group with the most phase time and a window of about three of its meta-iterations."""
    busy: dict[str, float] = {}
    for gid, _, _, _, start, _, end in spans:
        busy[gid] = busy.get(gid, 0.0) + end - start
    gid = max(busy, key=busy.get)
    own = sorted((s for s in spans if s[0] == gid), key=lambda s: s[4])
    mid = own[len(own) // 2][4]
    jobs = {s[1] for s in own if abs(s[4] - mid) < 4 * 3600}
    longest = max(s[6] - s[4] for s in own)
    width = 3 * longest * max(1, len(jobs))
    return gid, [s for s in own if mid <= s[4] < mid + width]


def gantt(spans, path: Path, title: str = "") -> Path:
    gid, window = busiest_group_window(spans)
    lanes = sorted({n for s in window for n in s[3]}, key=lambda n: (n[0] != "R", n))
    jobs = sorted({s[1] for s in window})
    colours = plt.get_cmap("tab10")
    t0 = window[0][4]
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.6 * len(lanes)))
    for _, job, pool, nodes, start, body_start, end in window:
        c = colours(jobs.index(job) % 10)
        for node in nodes:
            y = lanes.index(node)
            if body_start > start:
                ax.barh(y, (body_start - start) / 60, left=(start - t0) / 60, color="lightgrey", height=0.6)
            ax.barh(y, (end - body_start) / 60, left=(body_start - t0) / 60, color=c, height=0.6,
                    edgecolor="black", linewidth=0.4)
            ax.text((body_start + end) / 2 / 60 - t0 / 60, y, f"{job} {pool[0].upper()}", ha="center",
                    va="center", fontsize=6)
    ax.set_yticks(range(len(lanes)), [f"{n} ({'rollout' if n[0] == 'R' else 'train'})" for n in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("minutes")
    ax.set_title(title or f"Group {gid}: phases per node (grey = switch)")
    return save(fig, path)
