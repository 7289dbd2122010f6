"""The ``optimal`` baseline: the exact solver's cost for the jobs present at each instant.

It is an offline lower bound, not an executed schedule: each job is present from its
arrival for as long as it would run alone (``present_s``), and at every arrival or
departure the whole set of present jobs is re-planned optimally (``rollmux.exact.solve``),
with free regrouping. The cost rate of that optimum is integrated over time. When more
than ``max_jobs`` jobs are ever present at once the baseline is skipped (the search grows
like 3^n) and says so.

Under an accounting (``rollmux.accounting``) the bound is held to the policies' terms:
with ``fixed_departures`` a job is present from its arrival to its recorded departure
(``leave_after_s``), as every policy's job is, and $/h is over the trace's own span
(``departure_span_s``); with ``one_node_per_pool`` every job is solved on one node per
pool, as RollMux's planner places it (its phase times unchanged).

It bounds the node cost of the plans the solver searches: groups of the paper's placement
space (``rollmux.planner.PAPER_SPACE``) that keep their members' SLOs, such as RollMux's
planner and the solo baseline build. A policy outside that space (co-location: colocated,
gavel, the full space) or that packs without an SLO check (random, most-idle) can cost
less. The shared reward pool bills every iteration a job runs at solo speed: all of them,
or under fixed departures those it completes alone before it leaves.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import replace

from rollmux.accounting import OURS, CostAccounting, departure_span_s, leave_after_s
from rollmux.exact import solve
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job
from rollmux.sim.metrics import Accounting, PolicyResult, bill_reward, finish, skipped, solo_span_s


def present_s(job: Job, accounting: CostAccounting = OURS) -> float:
    """Seconds the bound keeps ``job`` after its arrival: its solo run time, or under fixed
    departures until its recorded departure."""
    return leave_after_s(job) if accounting.fixed_departures else job.solo_run_s(job.solo_iterations())


def max_concurrency(jobs: list[Job], accounting: CostAccounting = OURS) -> int:
    """The most jobs the bound has present at once (``present_s``)."""
    edges = sorted([(j.arrival_s, 1) for j in jobs] + [(j.arrival_s + present_s(j, accounting), -1) for j in jobs],
                   key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, delta in edges:
        live += delta
        peak = max(peak, live)
    return peak


def optimal_curve(jobs: list[Job], cluster: Cluster, max_jobs: int = 10,
                  accounting: CostAccounting = OURS) -> PolicyResult:
    """The bound for ``jobs`` on ``cluster`` (as ``accounting`` sees it: ``apply_cluster``)
    under ``accounting``; see the module docstring."""
    started = time.perf_counter()
    acct = Accounting()
    peak = max_concurrency(jobs, accounting)
    if peak > max_jobs or any(cluster.pool(p).nodes is not None for p in POOLS):
        why = f"{peak} jobs present at once > {max_jobs}" if peak > max_jobs else "bounded pools"
        result = skipped("optimal", jobs, why, time.perf_counter() - started)
        result.accounting = accounting.name
        return result
    gpn = cluster.gpus_per_node
    solved = ([replace(j, rollout_gpus=min(j.rollout_gpus, gpn), train_gpus=min(j.train_gpus, gpn)) for j in jobs]
              if accounting.one_node_per_pool else jobs)
    changes: dict[float, list[tuple[int, Job]]] = {}
    for j in solved:
        changes.setdefault(j.arrival_s, []).append((1, j))
        changes.setdefault(j.arrival_s + present_s(j, accounting), []).append((-1, j))
    present: dict[str, Job] = {}
    events = 0
    for t in sorted(changes):
        acct.advance(t)
        for delta, j in changes[t]:
            events += 1
            if delta > 0:
                present[j.job_id] = j
            else:
                present.pop(j.job_id, None)
        ordered = sorted(present.values(), key=lambda j: (j.arrival_s, j.job_id))
        if ordered:
            sol = solve(cluster, ordered, max_jobs=max_jobs)
            gpus = {p: sum(len(g.nodes(p)) for g in sol.groups) * gpn for p in POOLS}
            acct.set_level(t, sol.cost_per_hour, gpus[ROLLOUT], gpus[TRAIN])
        else:
            acct.set_level(t, 0.0, 0, 0)
    fixed = accounting.fixed_departures
    result = finish("optimal", acct, [], Counter(), events, time.perf_counter() - started, None, [],
                    departure_span_s(jobs) if fixed else solo_span_s(jobs))
    result.note = "lower bound: optimal regrouping at every arrival and departure, migration free"
    result.accounting = accounting.name
    bill_reward(result, jobs, {j.job_id: _solo_iterations(j, fixed) for j in jobs})
    result.executed = False
    return result


def _solo_iterations(job: Job, fixed: bool) -> int:
    """Iterations ``job`` runs at solo speed: all of them, or with ``fixed`` departures those
    it completes before it leaves (one that ends at its departure counts, as in the engine)."""
    if not fixed:
        return job.solo_iterations()
    return max(0, math.floor((leave_after_s(job) - job.fill_s) / job.t_solo * (1 + 1e-12)))
