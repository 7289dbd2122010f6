"""The ``rollmux whatif --plot`` figure: cost ($/h) against p95 wait (hours).

Every configuration where every job ran is a grey point; the Pareto frontier's points
are joined by a line (cheapest first); the chosen configuration, when there is one, is
a red star. Points are labelled with their varied values (all of them up to
``LABEL_ALL`` points, else the frontier's and the chosen one's). Rows with an error or
with jobs that never ran have no finite p95 wait and are left out; the title counts them.
Matplotlib with the Agg backend.
"""
from __future__ import annotations

from pathlib import Path

from rollmux.report.plots import plain, plt, save
from rollmux.whatif import Row, qualifies

LABEL_ALL = 40


def frontier_plot(rows: list[Row], front: list[Row], chosen: Row | None, basis: str, path: Path,
                  show: tuple[bool, bool] = (False, False)) -> Path:
    """Write the figure to ``path`` (PNG); see the module docstring. ``show``: whether the
    labels name each run's policy and its waiting line's order (``Row.label``)."""
    shown = [r for r in rows if qualifies(r)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.scatter([r.p95_wait_h for r in shown], [r.cost(basis) for r in shown], s=18, color="0.6",
               label="configuration", zorder=2)
    ax.plot([r.p95_wait_h for r in front], [r.cost(basis) for r in front], "-o", color="tab:blue", ms=5,
            label="Pareto frontier", zorder=3)
    if chosen is not None:
        ax.scatter([chosen.p95_wait_h], [chosen.cost(basis)], marker="*", s=220, color="tab:red",
                   label="chosen", zorder=4)
    marked = {id(r) for r in front} | {id(chosen)}
    labelled = shown if len(shown) <= LABEL_ALL else [r for r in shown if id(r) in marked]
    for r in labelled:
        ax.annotate(plain(r.label(*show)), (r.p95_wait_h, r.cost(basis)), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    left_out = len(rows) - len(shown)
    ax.set_title(f"cost vs p95 wait, {len(shown)} configurations"
                 + (f" ({left_out} left out: error or jobs never ran)" if left_out else ""), fontsize=10)
    ax.set_xlabel("p95 wait (hours)")
    ax.set_ylabel(f"$/h ({basis})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)
