"""Per-job results of a simulated run as CSV: one row per (policy, job).

Contract
--------
* ``job_rows(results)`` gives the rows as dicts keyed by ``COLUMNS``, policy by policy in
  the order given; within a policy the jobs that ran (``PolicyResult.jobs``: by arrival,
  then id), then those that never ran (``PolicyResult.rejected``: rejected on arrival,
  or still waiting when the run ended). A policy that executed no phases (the
  ``optimal`` cost curve, ``PolicyResult.executed`` False) has no jobs and no rows.
* A job that ran carries the ``JobOutcome`` figures: seconds on the simulation clock
  rounded to 3 decimals (``wait_s`` = placed - arrival, ``jct_s`` = end - arrival,
  ``t_solo_s`` = ``Job.t_solo``, its steady solo iteration: T_roll + T_train, or for an
  asynchronous job max(T_roll, T_train)), slowdowns (per iteration, and end to end: JCT /
  solo run time, ``Job.solo_run_s``, which adds an asynchronous job's pipeline fill) to
  4, ``slo_met`` judged on the policy's ``slo_basis``, ``reward_usd`` (what the shared
  reward pool billed for its completed iterations, ``JobOutcome.reward_cost``; 0 for a
  job that scores in its own rollout) to 6, and an empty ``reason``.
* A job that never ran has its id, the policy's ``slo_basis``, ``slo_met`` False (it
  counts as missing its SLO), ``outcome`` "never-ran", the reason the simulator gave,
  and every other field empty.
* ``write_jobs_csv(results, path)`` writes the header and those rows (UTF-8, the csv
  module's quoting, so commas and quotes in ids survive; text a spreadsheet would take
  for a formula, such as an id ``=HYPERLINK(...)``, gets a leading ``'``), creating the
  parent folder, whole or not at all, and returns ``path``. An infinite slowdown (a job
  cut off before one full iteration under fixed departures) is written ``inf``.
"""
from __future__ import annotations

import csv
from pathlib import Path

from rollmux.report.paths import csv_cell, written_by
from rollmux.sim.metrics import JobOutcome, PolicyResult

COLUMNS = ("policy", "job_id", "arrival_s", "placed_s", "wait_s", "end_s", "jct_s", "iterations", "t_solo_s",
           "slowdown", "e2e_slowdown", "slo", "slo_basis", "slo_met", "outcome", "group_id", "reward_usd", "reason")
NEVER_RAN = "never-ran"


def _ran(policy: str, basis: str, j: JobOutcome) -> dict:
    return {"policy": policy, "job_id": j.job_id, "arrival_s": round(j.arrival_s, 3),
            "placed_s": round(j.placed_s, 3), "wait_s": round(j.wait_s, 3), "end_s": round(j.end_s, 3),
            "jct_s": round(j.jct_s, 3), "iterations": j.iterations, "t_solo_s": round(j.t_solo, 3),
            "slowdown": round(j.slowdown, 4), "e2e_slowdown": round(j.e2e_slowdown, 4), "slo": j.slo,
            "slo_basis": basis, "slo_met": j.slo_met, "outcome": j.outcome, "group_id": j.group_id,
            "reward_usd": round(j.reward_cost, 6), "reason": ""}


def job_rows(results: list[PolicyResult]) -> list[dict]:
    """Every (policy, job) row; see the module contract."""
    rows = []
    for r in results:
        if not r.executed:
            continue
        rows += [_ran(r.policy, j.slo_basis, j) for j in r.jobs]
        for job_id in r.rejected:
            row = dict.fromkeys(COLUMNS, "")
            row.update(policy=r.policy, job_id=job_id, slo_basis=r.slo_basis, slo_met=False, outcome=NEVER_RAN,
                       reason=r.reject_reasons.get(job_id, ""))
            rows.append(row)
    return rows


def write_jobs_csv(results: list[PolicyResult], path: Path) -> Path:
    """Write ``job_rows(results)`` as CSV at ``path``; see the module contract."""
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in job_rows(results))

    return written_by(Path(path), write, "--jobs-csv")
