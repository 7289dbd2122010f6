"""What a simulated run measures, per policy.

* cost: the plan's $/h integrated over time (a step function that changes only when a
  node is provisioned or released); average $/h = total cost / the trace's solo span
  (first arrival to the last end if every job ran alone, ``solo_span_s``). The hours are
  the same for every policy, so $/h compare exactly like total cost; a policy's own
  span (to its last departure, longer when it slows jobs down) is reported beside it.
* GPUs in use per pool over time (same step function), peak and time-average.
* utilization of a pool = GPU-seconds of phase bodies / GPU-seconds allocated; the bubble
  is 1 - utilization (switch and co-location overheads count as idle).
* per job: mean iteration time = (completion - placement) / iterations, slowdown against
  its solo disaggregated iteration time T_roll + T_train, SLO met when slowdown <= SLO,
  completion time (JCT) from arrival, placement outcome.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rollmux.model import POOLS, ROLLOUT, TRAIN

SLO_TOLERANCE = 1e-9


@dataclass(slots=True)
class JobOutcome:
    job_id: str
    arrival_s: float
    placed_s: float
    end_s: float
    iterations: int
    t_solo: float
    slo: float
    outcome: str
    group_id: str

    @property
    def mean_iteration_s(self) -> float:
        return (self.end_s - self.placed_s) / self.iterations

    @property
    def slowdown(self) -> float:
        return self.mean_iteration_s / self.t_solo

    @property
    def slo_met(self) -> bool:
        return self.slowdown <= self.slo * (1 + SLO_TOLERANCE)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "arrival_s": self.arrival_s, "placed_s": self.placed_s,
                "end_s": self.end_s, "jct_s": self.end_s - self.arrival_s, "iterations": self.iterations,
                "slowdown": round(self.slowdown, 4), "slo": self.slo, "slo_met": self.slo_met,
                "outcome": self.outcome, "group_id": self.group_id}


@dataclass(slots=True)
class Accounting:
    """Integrates cost and allocated GPUs over time; collects busy GPU-seconds."""

    t0: float | None = None
    last_t: float = 0.0
    rate: float = 0.0
    gpus: dict[str, int] = field(default_factory=lambda: {p: 0 for p in POOLS})
    total_cost: float = 0.0
    gpu_seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    busy: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    peak: dict[str, int] = field(default_factory=lambda: {p: 0 for p in POOLS})
    series: list[tuple[float, float, int, int]] = field(default_factory=list)

    def advance(self, t: float) -> None:
        if self.t0 is None:
            self.t0 = t
        dt = t - self.last_t
        if dt > 0:
            self.total_cost += self.rate * dt / 3600.0
            for p in POOLS:
                self.gpu_seconds[p] += self.gpus[p] * dt
        self.last_t = t

    def set_level(self, t: float, rate: float, gpus_r: int, gpus_t: int) -> None:
        if rate == self.rate and gpus_r == self.gpus[ROLLOUT] and gpus_t == self.gpus[TRAIN]:
            return
        self.rate = rate
        self.gpus[ROLLOUT], self.gpus[TRAIN] = gpus_r, gpus_t
        self.peak[ROLLOUT] = max(self.peak[ROLLOUT], gpus_r)
        self.peak[TRAIN] = max(self.peak[TRAIN], gpus_t)
        if self.series and self.series[-1][0] == t:
            self.series[-1] = (t, rate, gpus_r, gpus_t)
        else:
            self.series.append((t, rate, gpus_r, gpus_t))


@dataclass(slots=True)
class PolicyResult:
    policy: str
    total_cost: float
    span_s: float
    peak_gpus: dict[str, int]
    avg_gpus: dict[str, float]
    utilization: dict[str, float]
    gpu_seconds: dict[str, float]
    jobs: list[JobOutcome]
    outcomes: Counter
    series: list[tuple[float, float, int, int]]
    events: int
    wall_s: float
    spans: list[tuple[str, str, str, tuple[str, ...], float, float, float]] | None = None
    rejected: list[str] = field(default_factory=list)
    note: str = ""

    reference_span_s: float = 0.0
    executed: bool = True  # False for a cost curve that ran no phases (the optimal bound)

    @property
    def cost_per_hour(self) -> float:
        return self.total_cost / (self.reference_span_s / 3600.0) if self.reference_span_s > 0 else 0.0

    @property
    def slo_attainment(self) -> float | None:
        """Share of jobs that met their SLO; None when no phase was executed."""
        if not self.executed:
            return None
        return sum(j.slo_met for j in self.jobs) / len(self.jobs) if self.jobs else 1.0

    def bubble(self, pool: str) -> float | None:
        """Idle share of the pool's allocated GPU time; None when the policy used none of it
        or executed no phases."""
        return 1.0 - self.utilization[pool] if self.executed and self.gpu_seconds[pool] > 0 else None

    def summary(self) -> dict:
        return {
            "cost_per_hour": self.cost_per_hour,
            "total_cost": self.total_cost,
            "span_hours": self.span_s / 3600.0,
            "solo_span_hours": self.reference_span_s / 3600.0,
            "slo_attainment": self.slo_attainment,
            "peak_rollout_gpus": self.peak_gpus[ROLLOUT],
            "peak_train_gpus": self.peak_gpus[TRAIN],
            "avg_rollout_gpus": self.avg_gpus[ROLLOUT],
            "avg_train_gpus": self.avg_gpus[TRAIN],
            "rollout_utilization": self.utilization[ROLLOUT],
            "train_utilization": self.utilization[TRAIN],
            "rollout_bubble": self.bubble(ROLLOUT),
            "train_bubble": self.bubble(TRAIN),
            "placements": dict(self.outcomes),
            "events": self.events,
            "wall_s": self.wall_s,
            "note": self.note,
            "jobs": [j.to_dict() for j in self.jobs],
        }


def solo_span_s(jobs) -> float:
    """First arrival to the last end if every job ran alone at its profiled speed."""
    if not jobs:
        return 0.0
    return max(j.arrival_s + j.solo_iterations() * j.t_solo for j in jobs) - min(j.arrival_s for j in jobs)


def finish(policy: str, acct: Accounting, jobs: list[JobOutcome], outcomes: Counter, events: int,
           wall_s: float, spans, rejected: list[str], reference_span_s: float) -> PolicyResult:
    span = acct.last_t - (acct.t0 or 0.0)
    util = {p: (acct.busy[p] / acct.gpu_seconds[p] if acct.gpu_seconds[p] > 0 else 0.0) for p in POOLS}
    avg = {p: (acct.gpu_seconds[p] / span if span > 0 else 0.0) for p in POOLS}
    return PolicyResult(policy, acct.total_cost, span, dict(acct.peak), avg, util, dict(acct.gpu_seconds), jobs, outcomes,
                        acct.series, events, wall_s, spans, rejected, reference_span_s=reference_span_s)
