"""Prometheus metrics of the control plane, on a registry of its own (one per service).

State gauges are read from the ``ControlPlane`` at scrape time, so they can never drift
from the state. Per-job gauges (iterations done, measured slowdown, seconds since the
job was last heard from) are exported while at most ``per_job_limit`` jobs are live,
to bound label cardinality. The service feeds the histograms and counters:

* ``rollmux_phase_duration_seconds{pool}``: phase durations as the jobs measured them;
* ``rollmux_grant_wait_seconds{pool}``: from a phase becoming due (placement or the end
  of the job's previous phase) to its grant, on the service's clock;
* ``rollmux_commit_seconds``: one state-file commit; ``rollmux_commit_failures_total``;
* ``rollmux_event_loop_lag_seconds``: how late a 100 ms timer fires on the event loop
  (a blocked loop shows here first);
* ``rollmux_regroup_decide_seconds``: one round of regroupings decided off the lock
  (``rollmux.runtime.regroup_ticket``); ``rollmux_regroups_stale_total``: decisions its
  check found stale when they came back (dropped, and asked for again);
* ``rollmux_lease_expiries_total``; ``rollmux_http_errors_total{status}``;
* ``rollmux_phases_overdue{pool}`` (read at scrape time, on the service's clock): phases
  held longer than their profile allows (``ControlPlane.overdue``).

Per tenant of the tenants file (their number is the operator's, so the labels are
bounded): ``rollmux_tenant_live_jobs{tenant}``, ``rollmux_tenant_gpus{tenant}`` (rollout
plus training GPUs its live jobs ask for) and ``rollmux_tenant_quota{tenant,bound}``
(``max_live_jobs``, ``max_gpus``; only the bounds the file sets).
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rollmux.model import POOLS
from rollmux.runtime.control import ControlPlane

PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
FAST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class _StateCollector:
    def __init__(self, control: Callable[[], ControlPlane], age: Callable[[str], float | None],
                 per_job_limit: int, tenants: Callable[[], dict[str, dict]],
                 now: Callable[[], float] | None) -> None:
        self._control = control
        self._age = age
        self._limit = per_job_limit
        self._tenants = tenants
        self._now = now

    def collect(self):
        yield from self._tenant_gauges()
        cp = self._control()
        jobs = GaugeMetricFamily("rollmux_jobs", "Jobs by state", labels=["state"])
        for state, n in cp.counts().items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily("rollmux_groups", "Co-execution groups", value=len(cp.plan.groups))
        yield GaugeMetricFamily("rollmux_grants_outstanding", "Phases granted and not yet ended",
                                value=cp.outstanding_grants())
        if self._now is not None:
            overdue = GaugeMetricFamily("rollmux_phases_overdue", "Phases held longer than their profile allows "
                                        "(ControlPlane.overdue: a hung worker's phase shows here)", labels=["pool"])
            late = [o["pool"] for o in cp.overdue(self._now())]
            for pool in POOLS:
                overdue.add_metric([pool], late.count(pool))
            yield overdue
        yield CounterMetricFamily("rollmux_grants", "Grants given since the state file was created",
                                  value=cp.grants_total)
        busy = CounterMetricFamily("rollmux_pool_busy_node_seconds", "Node-seconds of phases, those still "
                                   "held counted until the scrape", labels=["pool"])
        idle = CounterMetricFamily("rollmux_pool_idle_node_seconds",
                                   "Provisioned node-seconds not spent in a phase, until the scrape", labels=["pool"])
        spent, provisioned = (cp.node_seconds(self._now()) if self._now is not None
                              else (cp.busy_s, cp.provisioned_s))
        for pool in POOLS:
            busy.add_metric([pool], spent[pool])
            idle.add_metric([pool], max(0.0, provisioned[pool] - spent[pool]))
        held = GaugeMetricFamily("rollmux_nodes_in_use", "Nodes some group holds, per pool (on a fleet, per "
                                 "GPU pool by name)", labels=["pool"])
        for pool in cp.pool_nodes():
            held.add_metric([pool], cp.plan.nodes_in_use(pool))
        yield held
        yield busy
        yield idle
        yield GaugeMetricFamily("rollmux_cost_per_hour_dollars", "Hourly price of every provisioned node",
                                value=cp.plan.cost_per_hour())
        live = [r for r in list(cp.jobs.values()) if r.live]
        if len(live) <= self._limit:
            its = GaugeMetricFamily("rollmux_job_iterations_done", "Iterations a live job has finished",
                                    labels=["job_id"])
            slow = GaugeMetricFamily("rollmux_job_measured_slowdown",
                                     "A live job's mean iteration time over its solo iteration time",
                                     labels=["job_id"])
            seen = GaugeMetricFamily("rollmux_job_seconds_since_heard", "Seconds since the job's last call",
                                     labels=["job_id"])
            for rec in live:
                its.add_metric([rec.job_id], rec.iterations_done)
                s = rec.measured_slowdown()
                if s is not None:
                    slow.add_metric([rec.job_id], s)
                age = self._age(rec.job_id)
                if age is not None:
                    seen.add_metric([rec.job_id], age)
            yield its
            yield slow
            yield seen

    def _tenant_gauges(self):
        usage = self._tenants()
        live = GaugeMetricFamily("rollmux_tenant_live_jobs", "A tenant's live jobs (waiting or running)",
                                 labels=["tenant"])
        gpus = GaugeMetricFamily("rollmux_tenant_gpus", "GPUs (rollout + training) a tenant's live jobs ask for",
                                 labels=["tenant"])
        quota = GaugeMetricFamily("rollmux_tenant_quota", "A tenant's quota, per bound its entry sets",
                                  labels=["tenant", "bound"])
        for name, row in usage.items():
            live.add_metric([name], row["live_jobs"])
            gpus.add_metric([name], row["gpus"])
            for bound in ("max_live_jobs", "max_gpus"):
                if row[bound] is not None:
                    quota.add_metric([name, bound], row[bound])
        yield live
        yield gpus
        yield quota


class ServiceMetrics:
    """The registry, the instruments the service feeds, and the Prometheus text rendering."""

    def __init__(self, control: Callable[[], ControlPlane], age: Callable[[str], float | None],
                 per_job_limit: int = 500, tenants: Callable[[], dict[str, dict]] = dict,
                 now: Callable[[], float] | None = None) -> None:
        r = self.registry = CollectorRegistry()
        self.phase_seconds = Histogram("rollmux_phase_duration_seconds", "Phase durations reported by jobs",
                                       ["pool"], buckets=PHASE_BUCKETS, registry=r)
        self.grant_wait = Histogram("rollmux_grant_wait_seconds", "From a phase becoming due to its grant",
                                    ["pool"], buckets=WAIT_BUCKETS, registry=r)
        self.commit_seconds = Histogram("rollmux_commit_seconds", "One state-file commit", buckets=FAST_BUCKETS,
                                        registry=r)
        self.commit_failures = Counter("rollmux_commit_failures", "Commits that could not be written "
                                       "(nothing changed)", registry=r)
        self.loop_lag = Histogram("rollmux_event_loop_lag_seconds", "Lateness of a 100 ms event-loop timer",
                                  buckets=FAST_BUCKETS, registry=r)
        self.loop_lag_max = Gauge("rollmux_event_loop_lag_max_seconds", "Largest event-loop lag in the last "
                                  "10 s", registry=r)
        self.regroup_decide_seconds = Histogram("rollmux_regroup_decide_seconds", "One round of regroupings "
                                                "decided off the lock", buckets=FAST_BUCKETS, registry=r)
        self.regroups_stale = Counter("rollmux_regroups_stale", "Regroupings decided off the lock and found "
                                      "stale when they came back", registry=r)
        self.expiries = Counter("rollmux_lease_expiries", "Jobs that lost their lease", registry=r)
        self.http_errors = Counter("rollmux_http_errors", "Error answers by status", ["status"], registry=r)
        r.register(_StateCollector(control, age, per_job_limit, tenants, now))

    def render(self) -> bytes:
        return generate_latest(self.registry)
