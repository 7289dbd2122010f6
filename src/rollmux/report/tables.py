"""Rich tables for the CLI: the simulate comparison and the plan listing.

Every string that comes from the user (job, group, node and policy names) goes through
``rich.markup.escape``, so a node named ``R[h20-r01]`` prints as written.

With unbounded pools the simulate table has one SLO column, judged per iteration (no job
waits, so it equals the end-to-end figure). When a pool is bounded the table says so in
its title, judges SLOs end to end (``SLO met e2e``) and adds the mean wait, the longest
queue, the makespan and, per pool, the share of the run that pool was the binding
constraint. With owned nodes (``pricing: owned``) the title says that cost is every node
of a bounded pool over the whole run. When the trace has asynchronous jobs
(``Job.staleness`` >= 1) the caption ends with one line per policy and job kind
(``kind_lines``): SLO attainment and mean slowdown of the sync and the async jobs.
When some job scores on the shared reward service (``Job.reward_s`` > 0) the caption
says what the reward stage cost each policy (``reward_line``): it is already inside
``$/h`` and ``total $``. A policy whose jobs ran under several kinds of placement gets a
line with each kind's share of the node cost (``cost_lines``).
"""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from rollmux.model import POOLS, ROLLOUT, TRAIN
from rollmux.sim.metrics import PolicyResult

_SHORT = {ROLLOUT: "R", TRAIN: "T"}


#: Placement outcomes beyond pack / scale rollout / new group (``rollmux.planner.OUTCOME``), short names.
_MORE_KINDS = (("scaled-train", "T-scaled"), ("scaled-both", "RT-scaled"), ("co-located", "co-located"),
               ("hosted", "hosted"))


def placement_counts(outcomes) -> str:
    """"packed/scaled/new", then the other kinds of placement when a policy made any."""
    text = f"{outcomes.get('packed', 0)}/{outcomes.get('scaled', 0)}/{outcomes.get('new-group', 0)}"
    return text + "".join(f" +{outcomes[k]} {name}" for k, name in _MORE_KINDS if outcomes.get(k))


def placement_lines(results: list[PolicyResult]) -> list[str]:
    """One caption line naming the placements beyond pack / scale / new, per policy that made any
    (kept out of the table's column so that the other columns keep their width)."""
    parts = [f"{escape(r.policy)} " + ", ".join(f"{r.outcomes[k]} {name}" for k, name in _MORE_KINDS
                                                 if r.outcomes.get(k))
             for r in results if any(r.outcomes.get(k) for k, _ in _MORE_KINDS)]
    return ["other placements: " + "; ".join(parts)] if parts else []


def cost_lines(results: list[PolicyResult]) -> list[str]:
    """One caption line per policy whose jobs ran under two or more kinds of placement:
    each kind's share of the node cost (``PolicyResult.cost_by_placement``: a group's
    $/h split equally among its members at every instant)."""
    lines = []
    for r in results:
        if len(r.cost_by_placement) > 1:
            lines.append(f"{escape(r.policy)} cost by placement: " + ", ".join(
                f"{escape(kind)} {100 * k['share']:.1f}% ({job_count(k['jobs'])})" for kind, k in r.cost_by_placement.items()))
    return lines


def job_count(n: int) -> str:
    """"1 job", "2 jobs"."""
    return f"{n} job" + "s" * (n != 1)


def simulate_table(results: list[PolicyResult], reference: str = "rollmux", accounting: str = "ours") -> Table:
    """The comparison table; its title names the reference policy and the accounting
    (``rollmux.accounting``: ours, or the paper authors')."""
    ref = next((r for r in results if r.policy == reference), results[0])
    bounded = sorted({p for r in results for p in r.bounded}, key=POOLS.index)
    title = "Policies side by side (cost relative to " + escape(ref.policy) + f"; {escape(accounting)} accounting)"
    slo_col = "SLO met"
    if bounded:
        title += (f"; {' and '.join(bounded)} pool{'s' if len(bounded) > 1 else ''} bounded: "
                  "SLOs judged end to end (JCT / solo run time)")
        slo_col = "SLO met e2e"
    if any(r.pricing == "owned" for r in results):
        title += "; owned nodes: each bounded pool's nodes cost for the whole run, used or idle"
    table = Table(title=title)
    cols = ["policy", "$/h", "total $", "vs " + escape(ref.policy), slo_col]
    if bounded:  # the extra columns; pool pairs share a column to keep the width
        cols += ["wait h", "max queue", "makespan h", "R/T binds", "peak R/T GPUs", "R/T bubble"]
    else:
        cols += ["peak R GPUs", "peak T GPUs", "R bubble", "T bubble"]
    cols += ["packed/scaled/new", "wall s"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right",
                         no_wrap=col in ("policy", "total $", "R/T binds", "R/T bubble", "packed/scaled/new"))
    for r in results:
        o = r.outcomes
        row = [escape(r.policy), f"{r.cost_per_hour:,.1f}", f"{r.total_cost:,.0f}",
               f"{r.total_cost / ref.total_cost:.2f}x" if ref.total_cost else "-", _pct(r.slo_attainment)]
        peak_r, peak_t = str(r.peak_gpus[ROLLOUT]), str(r.peak_gpus[TRAIN])
        if bounded:
            waits = ([f"{r.mean_wait_s / 3600:,.1f}", str(r.max_queue), f"{r.span_s / 3600:,.1f}",
                      _pair(r.binding(ROLLOUT), r.binding(TRAIN))] if r.executed else ["-"] * 4)
            row += waits + [f"{peak_r}/{peak_t}", _pair(r.bubble(ROLLOUT), r.bubble(TRAIN))]
        else:
            row += [peak_r, peak_t, _pct(r.bubble(ROLLOUT)), _pct(r.bubble(TRAIN))]
        row += [f"{o.get('packed', 0)}/{o.get('scaled', 0)}/{o.get('new-group', 0)}"
                + (f" +{o.get('repacked', 0) + o.get('regrouped', 0)} moved"
                   if o.get("repacked") or o.get("regrouped") else ""), f"{r.wall_s:.2f}"]
        table.add_row(*row)
    if bounded:
        table.caption = ("SLO met e2e: (wait + run) / solo run time <= SLO; a job that never ran misses it. "
                         "wait h: mean hours from arrival to placement. makespan h: first arrival to the last job's end. R/T binds: share of the run in which a "
                         "job waited because the rollout / training pool lacked free nodes.")
    kinds = kind_lines(results) + reward_line(results) + placement_lines(results) + cost_lines(results)
    if kinds:
        table.caption = "\n".join(([table.caption] if table.caption else []) + kinds)
    return table


def reward_line(results: list[PolicyResult]) -> list[str]:
    """One caption line when some policy paid the shared reward pool: per policy its
    reward $ and $/h, included in the table's cost columns; empty otherwise."""
    if not any(r.reward_cost for r in results):
        return []
    parts = [f"{escape(r.policy)} ${r.reward_cost:,.0f} (${r.reward_cost_per_hour:,.1f}/h)" for r in results]
    return ["reward (shared pool, billed per use, included in $/h and total $): " + ", ".join(parts)]


def kind_lines(results: list[PolicyResult]) -> list[str]:
    """One line per executed policy when some job is asynchronous: per kind (sync /
    async), jobs, SLO attainment and mean per-iteration slowdown; empty otherwise."""
    if not any(r.async_ids for r in results):
        return []
    lines = []
    for r in results:
        if not r.executed:
            continue
        parts = []
        for kind, k in r.per_kind().items():
            slow = "-" if k["mean_slowdown"] is None else f"{k['mean_slowdown']:.3f}"
            parts.append(f"{kind} {k['jobs']} jobs: SLO met {_pct(k['slo_attainment'])}, mean slowdown {slow}")
        lines.append(f"{escape(r.policy)}: " + "; ".join(parts))
    return lines


def limit_lines(results: list[PolicyResult], nodes: dict[str, int | None]) -> list[str]:
    """One line per policy of a bounded run: which pool limits it and by how much.

    ``nodes`` is each pool's inventory (None: unbounded). Empty for unbounded runs. A
    bounded pool that never bound is called out: more of its nodes would shorten no wait;
    so are the jobs that passed the waiting line by packing (``simulate(backfill=)``).
    """
    lines = []
    for r in results:
        if not r.bounded or not r.executed:
            continue
        pool = r.limiting_pool
        if pool is None:
            lines.append(f"{escape(r.policy)}: no job waited for nodes")
            continue
        other = TRAIN if pool == ROLLOUT else ROLLOUT
        idle = (f" (more {other} nodes would shorten no wait)" if r.binding(other) == 0 and nodes[other] is not None
                else "")
        passed = r.outcomes.get("backfilled", 0)
        lines.append(f"{escape(r.policy)}: limited by the {pool} pool ({nodes[pool]} nodes): binding "
                     f"{_pct(r.binding(pool))} of the run, {r.waited_on_s[pool] / 3600:,.0f} job-hours waited; "
                     f"{other} pool binding {_pct(r.binding(other))}{idle}"
                     + (f"; {passed} jobs passed the waiting line by packing" if passed else ""))
    return lines


def plan_table(plan: dict) -> Table:
    table = Table(title=f"Plan: ${plan['cost_per_hour']:,.2f}/h, {len(plan['groups'])} groups")
    for col in ("group", "$/h", "job", "rollout nodes", "train nodes", "iteration s", "slowdown", "SLO"):
        table.add_column(col)
    for g in plan["groups"]:
        for i, j in enumerate(g["jobs"]):
            ok = "[green]" if j["slowdown"] <= j["slo"] + 1e-9 else "[red]"
            table.add_row(escape(g["group_id"]) if i == 0 else "", f"{g['cost_per_hour']:.2f}" if i == 0 else "",
                          escape(j["job_id"]),
                          escape(",".join(j["rollout_nodes"])) + (" (hosted)" if j.get("hosted") else ""),
                          escape(",".join(j["train_nodes"])), f"{j['iteration_s']:.1f}",
                          f"{ok}{j['slowdown']:.3f}", f"{j['slo']:.2f}")
    return table


def _pair(rollout: float | None, train: float | None) -> str:
    """Two shares as "12.5/30.0%" ("-" for a missing one)."""
    return "/".join("-" if v is None else f"{100 * v:.1f}" for v in (rollout, train)) + "%"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{round(100 * share, 1) + 0.0:.1f}%"  # + 0.0: no "-0.0%" from rounding
