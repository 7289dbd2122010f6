"""PNG plots for ``rollmux simulate --out``: cost over time, GPUs in use per pool, the
queue of waiting jobs (bounded pools), and a Gantt chart of the busiest RollMux group
(rollout and training lanes, one colour per job). Pools are labelled with the GPU types
the cluster configures (``gpus``: pool -> GPU type name). Matplotlib with the Agg
backend: no display needed."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollmux.model import POOLS, ROLLOUT, TRAIN  # noqa: E402
from rollmux.sim.metrics import PolicyResult  # noqa: E402

_POOL_WORD = {ROLLOUT: "rollout", TRAIN: "training"}


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


def gpus_in_use(results: list[PolicyResult], path: Path, gpus: dict[str, str]) -> Path:
    """GPUs allocated per pool over time, one panel per pool labelled with its GPU type."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for idx, (ax, pool) in enumerate(zip(axes, POOLS)):
        for r in results:
            xs, ys = _steps(r.series, 2 + idx, 0.0)
            ax.step(xs, ys, where="post", label=r.policy, linewidth=1.1)
        ax.set_ylabel(f"{_POOL_WORD[pool]} ({gpus[pool]}) GPUs")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=3)
    axes[1].set_xlabel("hours since first arrival")
    axes[0].set_title("GPUs in use per pool")
    return save(fig, path)


def queue_length(results: list[PolicyResult], path: Path) -> Path:
    """Jobs waiting for nodes over time, per policy (a step series; 0 where none waited)."""
    fig, ax = plt.subplots(figsize=(10, 3.5))
    t0 = min((r.series[0][0] for r in results if r.series), default=0.0)
    for r in results:
        if not r.executed:
            continue
        xs, ys = _steps(r.queue_series or [(t0, 0)], 1, t0)
        ax.step(xs, ys, where="post", label=f"{r.policy} (max {r.max_queue})", linewidth=1.1)
    ax.set_xlabel("hours since first arrival")
    ax.set_ylabel("jobs waiting")
    ax.set_title("Queue: jobs waiting for nodes")
    ax.legend(fontsize=8, ncol=3)
    ax.grid(alpha=0.3)
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


def gantt(spans, path: Path, gpus: dict[str, str], title: str = "") -> Path:
    gid, window = busiest_group_window(spans)
    pool_of = lane_pools(s for s in spans if s[0] == gid)
    lanes = sorted({n for s in window for n in s[3]}, key=lambda n: (POOLS.index(pool_of[n]), n))
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
    ax.set_yticks(range(len(lanes)), [f"{n} ({gpus[pool_of[n]]} {_POOL_WORD[pool_of[n]]})" for n in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("minutes")
    ax.set_title(title or f"Group {gid}: phases per node (grey = switch)")
    return save(fig, path)
