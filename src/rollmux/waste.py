"""The waste rate: what a plan pays per hour beyond the work its jobs get done.

Identity. Let b_j be the price of the node time one solo iteration of job j keeps busy,

    b_j = R_j * n_R(j) * price_R + T_j * n_T(j) * price_T        ($ * s / h)

(n_p(j): j's nodes in pool p, its profile's phase times), and iter_j the seconds one of
its iterations takes where it runs (``GroupAnalysis.iteration_s``). Its *work rate*
u_j = b_j / iter_j is the value, in $/h, of the work it gets done per hour. A job that
runs its I_j iterations accrues exactly I_j * b_j / 3600 $ of work, however fast or slow
it ran, so over any replay in which every job finishes

    node $ = sum_j I_j * b_j / 3600  +  integral over time of  W(t) dt,
    W = sum over groups G of  (C_G - sum_{j in G} u_j)        (the waste rate, $/h)

with C_G the group's node $/h. The first term is fixed by the trace; a decision can only
change the second. A plan that costs less per hour but slows its members down (their
u_j fall, and they hold nodes longer) can raise W: the waste rate is the quantity whose
integral is the bill, which $/h alone is not. The identity holds for steady states (a
group's iteration times are its analysis'); transients after a change are outside it.

``b_j`` uses the job's disaggregated profile in every kind of group, so a co-located job's
work is the same work; its iteration is the co-located one (``rollmux.colocation``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

from rollmux import colocation
from rollmux.model import POOLS, ROLLOUT, Cluster, Job
from rollmux.plan_state import PlanState


def iteration_value(job: Job, cluster: Cluster) -> float:
    """b_j: the $/h-seconds of node time one solo iteration of ``job`` keeps busy."""
    gpn = cluster.gpus_per_node
    return sum((job.t_roll_s if pool == ROLLOUT else job.t_train_s) * job.nodes(pool, gpn) * cluster.node_price(pool)
               for pool in POOLS)


def max_work_rate(job: Job, cluster: Cluster, colocation_allowed: bool = False) -> float:
    """An upper bound on u_j anywhere: b_j over the fastest iteration the job can run
    (its solo iteration, or co-located alone when that is allowed and faster)."""
    fastest = job.t_solo
    if colocation_allowed:
        fastest = min(fastest, colocation.iteration_s(job, cluster))
    return iteration_value(job, cluster) / fastest


def group_work_rate(state: PlanState, group_id: str) -> float:
    """sum of the members' work rates u_j, at the group's analysed iteration times ($/h)."""
    iteration = state.analysis(group_id).iteration_s
    return sum(iteration_value(m.job, state.cluster) / iteration[m.job.job_id] for m in state.groups[group_id].members)


def group_waste(state: PlanState, group_id: str) -> float:
    """C_G - ``group_work_rate``: the group's waste rate ($/h)."""
    return state.group_cost_per_hour(group_id) - group_work_rate(state, group_id)


def waste_per_hour(state: PlanState) -> float:
    """W of the whole plan ($/h)."""
    return sum(group_waste(state, gid) for gid in state.groups)


def group_shape(state: PlanState, group_id: str) -> tuple:
    """(members, their models sorted, rollout nodes, training nodes, co-located): what
    ``WasteLedger`` sums by unless told otherwise."""
    group = state.groups[group_id]
    return (len(group.members), tuple(sorted(m.job.model for m in group.members)), len(group.rollout_nodes),
            len(group.train_nodes), group.colocated)


@dataclass
class WasteLedger:
    """Where a replay's waste sits: pass ``observe`` as ``sim.engine.simulate(on_change=...)``.

    Between two plan changes every group keeps its nodes and its analysed iteration times,
    so ``by_key[k] = [hours, node $, work $]`` sums, over the groups whose ``key`` is k, the
    group-hours, C_G dt and sum_j u_j dt. Summed over keys the node $ is the replay's node
    cost; the work $ differs from sum_j I_j b_j / 3600 by the transients and the pauses of
    moves, which the analysis does not see (module docstring)."""

    key: Callable[[PlanState, str], Hashable] = group_shape
    by_key: dict[Hashable, list[float]] = field(default_factory=dict)
    _since: float = 0.0
    _open: list[tuple[Hashable, float, float]] = field(default_factory=list)  # (key, C, U) until the next change

    def observe(self, now: float, state: PlanState) -> None:
        hours = (now - self._since) / 3600.0
        for key, cost, work in self._open:
            entry = self.by_key.setdefault(key, [0.0, 0.0, 0.0])
            entry[0] += hours
            entry[1] += cost * hours
            entry[2] += work * hours
        self._since = now
        self._open = [(self.key(state, gid), state.group_cost_per_hour(gid), group_work_rate(state, gid))
                      for gid in state.groups]

    def totals(self) -> tuple[float, float]:
        """(node $, work $) over every key."""
        return sum(v[1] for v in self.by_key.values()), sum(v[2] for v in self.by_key.values())
