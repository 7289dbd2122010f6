"""What a simulated run measures, per policy.

* cost: the plan's $/h integrated over time (a step function that changes only when a
  node is provisioned or released); average $/h = total cost / the trace's solo span
  (first arrival to the last end if every job ran alone, ``solo_span_s``). The hours are
  the same for every policy, so $/h compare exactly like total cost; a policy's own
  span (to its last departure, longer when it slows jobs down) is reported beside it.
* GPUs in use per pool over time (same step function), peak and time-average.
* utilization of a pool = GPU-seconds of phase bodies / GPU-seconds allocated; the bubble
  is 1 - utilization (switch and co-location overheads count as idle).
* per job: wait = placement - arrival; mean iteration time = (completion - placement) /
  iterations; the per-iteration slowdown is that over the solo disaggregated iteration
  time T_roll + T_train; JCT = completion - arrival; the end-to-end slowdown is JCT over
  the solo run time (iterations x (T_roll + T_train)), so it also charges the wait.
  An asynchronous job (staleness >= 1) runs n iterations alone in
  n x max(T_roll, T_train) + min(T_roll, T_train) (``Job.solo_run_s``): its solo run time
  is that, and its per-iteration slowdown is the mean iteration over
  ``solo_iteration_s`` = max(T_roll, T_train) + min(T_roll, T_train) / n, so a job alone
  has slowdown 1 on both bases. For a synchronous job the fill is 0 and the figures are
  the ones above.
* per kind (``per_kind``, sync / async): jobs, SLO attainment on the run's basis (a job
  that never ran misses it), mean per-iteration and end-to-end slowdown.
* SLO basis: with unbounded pools no job waits and a job meets its SLO when its
  per-iteration slowdown <= SLO (the two slowdowns are then equal). When either pool is
  bounded (``BOUNDED``), a job meets it when its end-to-end slowdown <= SLO, and a job
  that never ran (rejected, or still waiting when the run ended) misses it.
* pricing (``Cluster.pricing``): pay-per-use, the cost above; owned, every node of a
  bounded pool costs from the first arrival to the run's last event whether a group holds
  it or not, an unbounded pool still per use (``owned_cost``). ``used_cost`` keeps the
  pay-per-use figure either way; with owned nodes the question is makespan, waits and
  utilization, and a policy that ends later pays for more hours.
* reward (``reward_cost``; docs/rollart.md): a job with ``reward_s`` > 0 scores on a
  shared, elastic reward pool billed per use. Scoring streams while its rollout generates
  (``t_roll_s`` already includes it), so execution is unchanged; each iteration the job
  completes bills ``reward_s`` / 3600 x ``reward_price_per_hour`` (``Job.reward_cost``),
  and the pool costs nothing idle. The bill depends only on iterations completed, not
  on placement, so every policy pays it alike. It is part of ``total_cost`` (and so of
  $/h) and of ``used_cost``, whatever the pricing of the node pools, and reported on its
  own (``reward_cost``, ``reward_cost_per_hour``, per job ``JobOutcome.reward_cost``).
* queue: the number of arrived jobs not yet placed, over time (a step series), its peak
  and its time-average over the run. A pool is the binding constraint while a job
  waits and the head of the queue was refused because that pool lacked free nodes
  (``Decision.short_pools``); per pool, the share of the run it was binding and the
  job-seconds waited meanwhile.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rollmux.model import POOLS, ROLLOUT, TRAIN

SLO_TOLERANCE = 1e-9
ITERATION, END_TO_END = "per-iteration", "end-to-end"  # the SLO bases


@dataclass(slots=True)
class JobOutcome:
    """A finished job; ``slo_basis`` says which slowdown ``slo_met`` judges."""

    job_id: str
    arrival_s: float
    placed_s: float
    end_s: float
    iterations: int
    t_solo: float
    slo: float
    outcome: str
    group_id: str
    slo_basis: str = ITERATION
    last_iteration_s: float | None = None  # end of its last full iteration, when it left mid-way
    fill_s: float = 0.0  # ``Job.fill_s``: an asynchronous job's pipeline fill
    staleness: int = 0  # ``Job.staleness`` (0: synchronous)
    reward_cost: float = 0.0  # $ billed by the shared reward pool for its completed iterations

    @property
    def kind(self) -> str:
        return "async" if self.staleness else "sync"

    @property
    def wait_s(self) -> float:
        return self.placed_s - self.arrival_s

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    @property
    def solo_s(self) -> float:
        """How long the job would run alone on its own nodes, placed on arrival."""
        return self.iterations * self.t_solo + self.fill_s

    @property
    def solo_iteration_s(self) -> float:
        """Solo run time per iteration: ``t_solo`` plus the fill spread over the iterations."""
        return self.t_solo + (self.fill_s / self.iterations if self.iterations else 0.0)

    @property
    def mean_iteration_s(self) -> float:
        """Time placed to the end of its last full iteration / iterations done (infinite for a
        job that left, at a fixed departure, before finishing one)."""
        until = self.end_s if self.last_iteration_s is None else self.last_iteration_s
        return (until - self.placed_s) / self.iterations if self.iterations else float("inf")

    @property
    def slowdown(self) -> float:
        """Per-iteration slowdown: mean iteration time / solo iteration time."""
        return self.mean_iteration_s / self.solo_iteration_s

    @property
    def e2e_slowdown(self) -> float:
        """End-to-end slowdown: JCT (wait included) / solo run time."""
        return self.jct_s / self.solo_s if self.solo_s > 0 else float("inf")

    @property
    def slo_met(self) -> bool:
        return (self.e2e_slowdown if self.slo_basis == END_TO_END else self.slowdown) <= self.slo * (1 + SLO_TOLERANCE)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "arrival_s": self.arrival_s, "placed_s": self.placed_s,
                "end_s": self.end_s, "wait_s": self.wait_s, "jct_s": self.jct_s, "iterations": self.iterations,
                "slowdown": round(self.slowdown, 4), "e2e_slowdown": round(self.e2e_slowdown, 4), "slo": self.slo,
                "slo_met": self.slo_met, "slo_basis": self.slo_basis, "outcome": self.outcome,
                "group_id": self.group_id, "kind": self.kind, "reward_cost": self.reward_cost}


@dataclass(slots=True)
class Accounting:
    """Integrates cost, allocated GPUs and the queue over time; collects busy GPU-seconds.

    Levels hold from the instant they are set to the next ``advance``: call ``advance(t)``
    before changing anything at ``t``.
    """

    t0: float | None = None
    last_t: float = 0.0
    rate: float = 0.0
    gpus: dict[str, int] = field(default_factory=lambda: {p: 0 for p in POOLS})
    total_cost: float = 0.0
    gpu_seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    busy: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    peak: dict[str, int] = field(default_factory=lambda: {p: 0 for p in POOLS})
    series: list[tuple[float, float, int, int]] = field(default_factory=list)
    queue: int = 0
    short: tuple[str, ...] = ()  # pools the head of the queue lacked at its last try
    queue_series: list[tuple[float, int]] = field(default_factory=list)
    queue_job_s: float = 0.0
    binding_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    waited_on_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    pool_gpus: dict[str, int] = field(default_factory=dict)  # GPUs held per named pool (a fleet's types)
    pool_gpu_seconds: dict[str, float] = field(default_factory=dict)

    def advance(self, t: float) -> None:
        if self.t0 is None:
            self.t0 = t
        dt = t - self.last_t
        if dt > 0:
            self.total_cost += self.rate * dt / 3600.0
            for p in POOLS:
                self.gpu_seconds[p] += self.gpus[p] * dt
            for p, n in self.pool_gpus.items():
                self.pool_gpu_seconds[p] = self.pool_gpu_seconds.get(p, 0.0) + n * dt
            if self.queue:
                self.queue_job_s += self.queue * dt
                for p in self.short:
                    self.binding_s[p] += dt
                    self.waited_on_s[p] += self.queue * dt
        self.last_t = t

    def set_queue(self, t: float, waiting: int, short: tuple[str, ...]) -> None:
        """``waiting`` jobs queue from ``t`` on; ``short``: the pools their head lacked."""
        self.short = short if waiting else ()
        if waiting == self.queue and (self.queue_series or waiting == 0):
            return
        self.queue = waiting
        if self.queue_series and self.queue_series[-1][0] == t:
            self.queue_series[-1] = (t, waiting)
        else:
            self.queue_series.append((t, waiting))

    def set_level(self, t: float, rate: float, gpus_r: int, gpus_t: int, pools: dict[str, int] | None = None) -> None:
        """From ``t`` on: ``rate`` $/h, GPUs held per role, and per named pool (``pools``)."""
        if pools is not None:
            self.pool_gpus = pools
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


class CostShares:
    """Each group's node cost split among its members, summed per placement kind.

    At every instant a group's $/h (its nodes at their pool's price) is split equally
    among the jobs pinned to it, and each job's share is counted under the kind of
    placement that put it there: the planner's outcome on arrival (``packed``,
    ``new-group``, ``scaled``, ``co-located``, ...), or ``repacked`` / ``regrouped``
    from a move on. Summed over kinds it is the replay's pay-per-use node cost. The
    caller calls ``settle`` before it changes a group's membership or nodes and
    ``track`` after, both at the instant of the change."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[float, float, tuple[tuple[str, str], ...]]] = {}  # gid -> (since, $/h, (job, kind))
        self.cost: dict[str, float] = {}  # kind -> $
        self.jobs: dict[str, set[str]] = {}  # kind -> jobs that ran under it

    def settle(self, group_id: str, now: float) -> None:
        """Charge ``group_id``'s members for its cost since it last changed."""
        entry = self._open.pop(group_id, None)
        if entry is None:
            return
        since, rate, members = entry
        share = rate * (now - since) / 3600.0 / len(members)
        for job_id, kind in members:
            self.cost[kind] = self.cost.get(kind, 0.0) + share
            self.jobs.setdefault(kind, set()).add(job_id)

    def track(self, group_id: str, now: float, rate: float, members: list[tuple[str, str]]) -> None:
        """From ``now`` on, ``group_id`` costs ``rate`` $/h, shared by ``members`` (job, kind)."""
        if members:
            self._open[group_id] = (now, rate, tuple(members))

    def close(self, now: float) -> None:
        for group_id in list(self._open):
            self.settle(group_id, now)

    def table(self) -> dict[str, dict]:
        """kind -> {"jobs": jobs that ran under it, "cost": $, "share": of the node cost}."""
        total = sum(self.cost.values())
        return {kind: {"jobs": len(self.jobs[kind]), "cost": cost, "share": cost / total if total > 0 else 0.0}
                for kind, cost in sorted(self.cost.items(), key=lambda kv: -kv[1])}


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
    slo_basis: str = ITERATION
    bounded: tuple[str, ...] = ()  # the pools with a fixed inventory
    reject_reasons: dict[str, str] = field(default_factory=dict)  # job -> why it never ran
    queue_series: list[tuple[float, int]] = field(default_factory=list)
    queue_job_s: float = 0.0
    binding_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    waited_on_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in POOLS})
    accounting: str = "ours"  # rollmux.accounting: whose modelling choices the run used
    pricing: str = "pay-per-use"  # Cluster.pricing: what total_cost charges
    used_cost: float = 0.0  # the pay-per-use cost (nodes while groups hold them), whatever the pricing
    async_ids: frozenset[str] = frozenset()  # the trace's asynchronous jobs (for ``per_kind``)
    reward_cost: float = 0.0  # $ of the shared reward pool (in total_cost and used_cost; ``bill_reward``)
    cost_by_placement: dict[str, dict] = field(default_factory=dict)  # ``CostShares.table``
    pool_gpu_seconds: dict[str, float] = field(default_factory=dict)  # GPU-seconds held per named pool

    @property
    def reward_cost_per_hour(self) -> float:
        """The reward stage's share of ``cost_per_hour`` (same hours)."""
        return self.reward_cost / (self.reference_span_s / 3600.0) if self.reference_span_s > 0 else 0.0

    @property
    def cost_per_hour(self) -> float:
        return self.total_cost / (self.reference_span_s / 3600.0) if self.reference_span_s > 0 else 0.0

    @property
    def slo_attainment(self) -> float | None:
        """Share of the trace's jobs that met their SLO on ``slo_basis`` (a job that never
        ran missed it); None when no phase was executed."""
        if not self.executed:
            return None
        total = len(self.jobs) + len(self.rejected)
        return sum(j.slo_met for j in self.jobs) / total if total else 1.0

    def attainment(self, basis: str) -> float | None:
        """SLO attainment judged on ``basis`` (ITERATION or END_TO_END), rejected jobs missing."""
        if not self.executed:
            return None
        total = len(self.jobs) + len(self.rejected)
        attr = "e2e_slowdown" if basis == END_TO_END else "slowdown"
        met = sum(getattr(j, attr) <= j.slo * (1 + SLO_TOLERANCE) for j in self.jobs)
        return met / total if total else 1.0

    def bubble(self, pool: str) -> float | None:
        """Idle share of the pool's allocated GPU time; None when the policy used none of it
        or executed no phases."""
        return 1.0 - self.utilization[pool] if self.executed and self.gpu_seconds[pool] > 0 else None

    @property
    def max_queue(self) -> int:
        return max((n for _, n in self.queue_series), default=0)

    @property
    def mean_wait_s(self) -> float:
        return sum(j.wait_s for j in self.jobs) / len(self.jobs) if self.jobs else 0.0

    def binding(self, pool: str) -> float:
        """Share of the run during which ``pool`` lacked the nodes a waiting job needed."""
        return self.binding_s[pool] / self.span_s if self.span_s > 0 else 0.0

    @property
    def limiting_pool(self) -> str | None:
        """The pool that was binding for the longest time; None when no job ever waited on one."""
        pool = max(POOLS, key=lambda p: self.binding_s[p])
        return pool if self.binding_s[pool] > 0 else None

    def per_kind(self) -> dict[str, dict]:
        """Per job kind present in the trace ("sync", "async"): jobs, SLO attainment on
        ``slo_basis`` (a job that never ran misses it; None when no phase was executed),
        mean per-iteration and end-to-end slowdown of the jobs that ran (None if none)."""
        out = {}
        for kind in ("sync", "async"):
            ran = [j for j in self.jobs if j.kind == kind]
            never = sum((k in self.async_ids) == (kind == "async") for k in self.rejected)
            total = len(ran) + never
            if not total:
                continue
            out[kind] = {
                "jobs": total,
                "slo_attainment": sum(j.slo_met for j in ran) / total if self.executed else None,
                "mean_slowdown": sum(j.slowdown for j in ran) / len(ran) if ran else None,
                "mean_e2e_slowdown": sum(j.e2e_slowdown for j in ran) / len(ran) if ran else None,
            }
        return out

    def summary(self) -> dict:
        waits = [j.wait_s for j in self.jobs]
        return {
            "cost_per_hour": self.cost_per_hour,
            "total_cost": self.total_cost,
            "pricing": self.pricing,
            "used_cost": self.used_cost,
            "reward_cost": self.reward_cost,
            "reward_cost_per_hour": self.reward_cost_per_hour,
            "span_hours": self.span_s / 3600.0,
            "solo_span_hours": self.reference_span_s / 3600.0,
            "accounting": self.accounting,
            "slo_attainment": self.slo_attainment,
            "slo_basis": self.slo_basis,
            "slo_attainment_per_iteration": self.attainment(ITERATION),
            "slo_attainment_end_to_end": self.attainment(END_TO_END),
            "bounded_pools": list(self.bounded),
            "mean_wait_s": self.mean_wait_s,
            "max_wait_s": max(waits, default=0.0),
            "max_queue": self.max_queue,
            "mean_queue": self.queue_job_s / self.span_s if self.span_s > 0 else 0.0,
            "queue_series": [[t, n] for t, n in self.queue_series],
            "binding": {p: {"fraction": self.binding(p), "waited_job_hours": self.waited_on_s[p] / 3600.0}
                        for p in POOLS},
            "limiting_pool": self.limiting_pool,
            "peak_rollout_gpus": self.peak_gpus[ROLLOUT],
            "peak_train_gpus": self.peak_gpus[TRAIN],
            "avg_rollout_gpus": self.avg_gpus[ROLLOUT],
            "avg_train_gpus": self.avg_gpus[TRAIN],
            "rollout_utilization": self.utilization[ROLLOUT],
            "train_utilization": self.utilization[TRAIN],
            "rollout_bubble": self.bubble(ROLLOUT),
            "train_bubble": self.bubble(TRAIN),
            "per_kind": self.per_kind(),
            "placements": dict(self.outcomes),
            "cost_by_placement": self.cost_by_placement,
            "events": self.events,
            "wall_s": self.wall_s,
            "note": self.note,
            "jobs": [j.to_dict() for j in self.jobs],
            "never_ran": [{"job_id": k, "reason": self.reject_reasons.get(k, "")} for k in self.rejected],
        }


def solo_span_s(jobs) -> float:
    """First arrival to the last end if every job ran alone at its profiled speed."""
    if not jobs:
        return 0.0
    return max(j.arrival_s + j.solo_run_s(j.solo_iterations()) for j in jobs) - min(j.arrival_s for j in jobs)


def owned_cost(cluster, span_s: float, gpu_seconds: dict[str, float]) -> float:
    """$ of holding every node of each bounded pool for ``span_s`` seconds, plus each
    unbounded pool's allocated GPU-seconds at its price (pay per use)."""
    cost = 0.0
    for pool in POOLS:
        spec = cluster.pool(pool)
        if spec.nodes is not None:
            cost += spec.nodes * cluster.node_price(pool) * span_s / 3600.0
        else:
            cost += gpu_seconds[pool] * spec.price_per_gpu_hour / 3600.0
    return cost


def bill_reward(result: PolicyResult, jobs, iterations: dict[str, int] | None = None) -> float:
    """Add the shared reward pool's bill to ``result`` and return it.

    ``jobs`` are the trace's jobs. Each outcome in ``result.jobs`` is billed
    ``Job.reward_cost`` of the iterations it completed; with ``iterations`` (job id ->
    count, for a curve that executed no phases) those counts are billed instead. The
    sum goes into ``reward_cost``, ``total_cost`` and ``used_cost``.
    """
    by_id = {j.job_id: j for j in jobs}
    total = 0.0
    if iterations is None:
        for outcome in result.jobs:
            outcome.reward_cost = by_id[outcome.job_id].reward_cost(outcome.iterations)
            total += outcome.reward_cost
    else:
        total = sum(by_id[k].reward_cost(n) for k, n in iterations.items())
    result.reward_cost += total
    result.total_cost += total
    result.used_cost += total
    return total


def skipped(policy: str, jobs, why: str, wall_s: float = 0.0) -> PolicyResult:
    """The result of ``policy`` when it did not run on ``jobs`` (``why``: its note says
    ``skipped: why``): no cost, no job, nothing executed."""
    result = finish(policy, Accounting(), [], Counter(), 0, wall_s, None, [], solo_span_s(jobs))
    result.note, result.executed = f"skipped: {why}", False
    return result


def finish(policy: str, acct: Accounting, jobs: list[JobOutcome], outcomes: Counter, events: int,
           wall_s: float, spans, rejected: list[str], reference_span_s: float) -> PolicyResult:
    span = acct.last_t - (acct.t0 or 0.0)
    util = {p: (acct.busy[p] / acct.gpu_seconds[p] if acct.gpu_seconds[p] > 0 else 0.0) for p in POOLS}
    avg = {p: (acct.gpu_seconds[p] / span if span > 0 else 0.0) for p in POOLS}
    return PolicyResult(policy, acct.total_cost, span, dict(acct.peak), avg, util, dict(acct.gpu_seconds), jobs, outcomes,
                        acct.series, events, wall_s, spans, rejected, reference_span_s=reference_span_s,
                        queue_series=acct.queue_series, queue_job_s=acct.queue_job_s,
                        binding_s=dict(acct.binding_s), waited_on_s=dict(acct.waited_on_s),
                        used_cost=acct.total_cost, pool_gpu_seconds=dict(acct.pool_gpu_seconds))
