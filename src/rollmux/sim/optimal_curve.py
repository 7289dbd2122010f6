"""The ``optimal`` baseline: the exact solver's cost for the jobs present at each instant.

It is an offline lower bound, not an executed schedule: each job is present from its
arrival for its solo run time (iterations x T_solo), and at every arrival or departure
the whole set of present jobs is re-planned optimally (``rollmux.exact.solve``), with
free regrouping. The cost rate of that optimum is integrated over time. When more than
``max_jobs`` jobs are ever present at once the baseline is skipped (the search grows
like 3^n) and says so.
"""
from __future__ import annotations

import time
from collections import Counter

from rollmux.exact import solve
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job
from rollmux.sim.metrics import Accounting, PolicyResult, bill_reward, finish, skipped, solo_span_s


def max_concurrency(jobs: list[Job]) -> int:
    edges = sorted([(j.arrival_s, 1) for j in jobs] + [(j.arrival_s + j.solo_run_s(j.solo_iterations()), -1)
                                                       for j in jobs], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, delta in edges:
        live += delta
        peak = max(peak, live)
    return peak


def optimal_curve(jobs: list[Job], cluster: Cluster, max_jobs: int = 10) -> PolicyResult:
    started = time.perf_counter()
    acct = Accounting()
    peak = max_concurrency(jobs)
    if peak > max_jobs or any(cluster.pool(p).nodes is not None for p in POOLS):
        why = f"{peak} jobs present at once > {max_jobs}" if peak > max_jobs else "bounded pools"
        return skipped("optimal", jobs, why, time.perf_counter() - started)
    changes: dict[float, list[tuple[int, Job]]] = {}
    for j in jobs:
        changes.setdefault(j.arrival_s, []).append((1, j))
        changes.setdefault(j.arrival_s + j.solo_run_s(j.solo_iterations()), []).append((-1, j))
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
            gpn = cluster.gpus_per_node
            gpus = {p: sum(len(g.nodes(p)) for g in sol.groups) * gpn for p in POOLS}
            acct.set_level(t, sol.cost_per_hour, gpus[ROLLOUT], gpus[TRAIN])
        else:
            acct.set_level(t, 0.0, 0, 0)
    result = finish("optimal", acct, [], Counter(), events, time.perf_counter() - started, None, [],
                    solo_span_s(jobs))
    result.note = "lower bound: optimal regrouping at every arrival and departure, migration free"
    bill_reward(result, jobs, {j.job_id: j.solo_iterations() for j in jobs})  # every iteration runs
    result.executed = False
    return result
