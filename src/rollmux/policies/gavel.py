"""Gavel+-style heterogeneity-aware placement: each job picks the GPU configuration with
the best throughput per dollar, with no phase interleaving between jobs.

Options per job: disaggregated (its own H20 rollout nodes and H800 training nodes, one
iteration = T_roll + T_train) or co-located on its own training nodes (the ``colocated``
baseline's times, switches included; only when both phases' state fits a training node,
``colocation.fits``). Throughput per dollar = 1 / (iteration seconds x
$/h of the nodes). Like Gavel, it knows nothing of SLOs; ties go to disaggregation. An
option that needs more nodes of a bounded pool than the pool has in all can never run,
so it is never chosen: a job whose own nodes of both pools exceed the inventory runs
co-located when it can, and is rejected, naming the pool, when it cannot.
"""
from __future__ import annotations

from rollmux import colocation
from rollmux.model import ROLLOUT, TRAIN, Cluster, Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision, Inventory
from rollmux.policies.base import isolated
from rollmux.policies.colocated import Colocated


class Gavel:
    name = "gavel"

    def __init__(self) -> None:
        self._colo = Colocated()

    def colocate(self, job: Job, cluster: Cluster) -> bool:
        """True when co-location gives ``job`` more iterations per dollar than disaggregation,
        or when disaggregated it could never run (its own nodes of both pools exceed the
        inventory); always for a job that only runs co-located (``Job.colocate``), never for
        one whose state fits no training node."""
        if job.colocate:
            return True
        if not colocation.fits(job, cluster):
            return False
        gpn = cluster.gpus_per_node
        if Inventory.of(cluster).short(job.nodes(ROLLOUT, gpn), job.nodes(TRAIN, gpn)):
            return True
        return colocation.iteration_price(job, cluster, True) < colocation.iteration_price(job, cluster, False)

    def place(self, state: PlanState, job: Job) -> Decision:
        colo = self.colocate(job, state.cluster)
        return self._colo.place(state, job) if colo else isolated(state, job)
