"""The plan JSON format (a contract with outside tools).

``{"cost_per_hour": X, "groups": [{"group_id", "rollout_nodes", "train_nodes", "colocated",
"cost_per_hour", "jobs": [{"job_id", "rollout_nodes", "train_nodes", "hosted", "iteration_s",
"slowdown", "slo"}]}], "waiting": [job ids], "decisions": [explanations],
"improvement": null | {"cost_before", "cost_after", "solves", "local_optimum", "limit" ("", "solves",
"seconds" or "interrupted" (Ctrl-C): what stopped it short of a local optimum), "skipped",
"moves": [{"before": {group id: [job ids]}, "after": {...}, "cost_before", "cost_after"}]}}``,
and with ``rollmux plan --stress N`` (N > 0) also ``"stress": [{"group", "job_id", "slo",
"analysed", "settled", "history", "missed"}]``: per member of a group of two or more, the
worst of N perturbed histories (``rollmux.histories``; ``analysed`` the plan's slowdown,
``settled`` the one it settled at in ``history``, ``missed`` whether that is above ``slo``).
``plan_to_dict`` builds every key but ``stress``, which the command adds.

``decisions`` are the arrival-order placements; when an improvement ran, ``groups`` is the
plan after its regroupings. ``slowdown`` is the iteration over the job's own solo
iteration on its disaggregated nodes (its SLO basis), also for a co-located group
(``colocated``: its rollout runs on its training nodes, docs/placement_space.md).
``hosted``: the job runs both phases on some of its group's training nodes
(``Member.hosted``, the ``host`` placement space); its ``rollout_nodes`` are then those
training nodes.
"""
from __future__ import annotations

from rollmux.improve import Improvement
from rollmux.plan_state import PlanState
from rollmux.planner import Decision


def plan_to_dict(state: PlanState, waiting: list[str], decisions: list[Decision],
                 improvement: Improvement | None = None) -> dict:
    groups = []
    for gid, group in state.groups.items():
        a = state.analysis(gid)
        groups.append({
            "group_id": gid,
            "rollout_nodes": list(group.rollout_nodes),
            "train_nodes": list(group.train_nodes),
            "colocated": group.colocated,
            "cost_per_hour": round(group.cost_per_hour(state.cluster), 4),
            "jobs": [{
                "job_id": m.job.job_id,
                "rollout_nodes": list(m.rollout_nodes),
                "train_nodes": list(m.train_nodes),
                "hosted": m.hosted,
                "iteration_s": round(a.iteration_s[m.job.job_id], 4),
                "slowdown": round(a.iteration_s[m.job.job_id] / m.job.t_solo, 4),
                "slo": m.job.slo,
            } for m in group.members],
        })
    return {
        "cost_per_hour": round(state.cost_per_hour(), 4),
        "groups": groups,
        "waiting": list(waiting),
        "decisions": [d.to_dict() for d in decisions],
        "improvement": None if improvement is None else {
            "cost_before": round(improvement.cost_before, 4),
            "cost_after": round(improvement.cost_after, 4),
            "solves": improvement.solves,
            "local_optimum": improvement.local_optimum,
            "limit": improvement.limit,
            "skipped": improvement.skipped,
            "moves": [m.to_dict() for m in improvement.moves],
        },
    }
