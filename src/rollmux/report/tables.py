"""Rich tables for the CLI: the simulate comparison and the plan listing."""
from __future__ import annotations

from rich.table import Table

from rollmux.sim.metrics import PolicyResult


def simulate_table(results: list[PolicyResult], reference: str = "rollmux") -> Table:
    ref = next((r for r in results if r.policy == reference), results[0])
    table = Table(title="Policies side by side (cost relative to " + ref.policy + ")")
    for col in ("policy", "$/h", "total $", "vs " + ref.policy, "SLO met", "peak R GPUs", "peak T GPUs",
                "R bubble", "T bubble", "packed/scaled/new", "wall s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        o = r.outcomes
        table.add_row(
            r.policy, f"{r.cost_per_hour:,.1f}", f"{r.total_cost:,.0f}",
            f"{r.total_cost / ref.total_cost:.2f}x" if ref.total_cost else "-",
            _pct(r.slo_attainment), str(r.peak_gpus["rollout"]), str(r.peak_gpus["train"]),
            _pct(r.bubble("rollout")), _pct(r.bubble("train")),
            f"{o.get('packed', 0)}/{o.get('scaled', 0)}/{o.get('new-group', 0)}"
            + (f" +{o.get('repacked', 0) + o.get('regrouped', 0)} moved"
               if o.get("repacked") or o.get("regrouped") else ""), f"{r.wall_s:.2f}",
        )
    return table


def plan_table(plan: dict) -> Table:
    table = Table(title=f"Plan: ${plan['cost_per_hour']:,.2f}/h, {len(plan['groups'])} groups")
    for col in ("group", "$/h", "job", "rollout nodes", "train nodes", "iteration s", "slowdown", "SLO"):
        table.add_column(col)
    for g in plan["groups"]:
        for i, j in enumerate(g["jobs"]):
            ok = "[green]" if j["slowdown"] <= j["slo"] + 1e-9 else "[red]"
            table.add_row(g["group_id"] if i == 0 else "", f"{g['cost_per_hour']:.2f}" if i == 0 else "",
                          j["job_id"], ",".join(j["rollout_nodes"]), ",".join(j["train_nodes"]),
                          f"{j['iteration_s']:.1f}", f"{ok}{j['slowdown']:.3f}", f"{j['slo']:.2f}")
    return table


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"
