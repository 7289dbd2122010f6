"""Prometheus metrics of the control plane, on a registry of its own (one per service).

Gauges are read from the ``ControlPlane`` at scrape time, so they can never drift from
the state; the phase-duration histogram is fed by each release (durations as the job
measured them).
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rollmux.model import POOLS
from rollmux.runtime.control import ControlPlane

PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class _StateCollector:
    def __init__(self, control: Callable[[], ControlPlane]) -> None:
        self._control = control

    def collect(self):
        cp = self._control()
        jobs = GaugeMetricFamily("rollmux_jobs", "Jobs by state", labels=["state"])
        for state, n in cp.counts().items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily("rollmux_groups", "Co-execution groups", value=len(cp.plan.groups))
        yield GaugeMetricFamily("rollmux_grants_outstanding", "Phases granted and not yet ended",
                                value=cp.outstanding_grants())
        yield CounterMetricFamily("rollmux_grants", "Grants given since the state file was created",
                                  value=cp.grants_total)
        busy = CounterMetricFamily("rollmux_pool_busy_node_seconds", "Node-seconds of ended phases",
                                   labels=["pool"])
        idle = CounterMetricFamily("rollmux_pool_idle_node_seconds",
                                   "Provisioned node-seconds not spent in an ended phase", labels=["pool"])
        for pool in POOLS:
            busy.add_metric([pool], cp.busy_s[pool])
            idle.add_metric([pool], max(0.0, cp.provisioned_s[pool] - cp.busy_s[pool]))
        yield busy
        yield idle
        yield GaugeMetricFamily("rollmux_cost_per_hour_dollars", "Hourly price of every provisioned node",
                                value=cp.plan.cost_per_hour())


class ServiceMetrics:
    """The registry, the histogram the service feeds, and the Prometheus text rendering."""

    def __init__(self, control: Callable[[], ControlPlane]) -> None:
        self.registry = CollectorRegistry()
        self.phase_seconds = Histogram("rollmux_phase_duration_seconds", "Phase durations reported by jobs",
                                       ["pool"], buckets=PHASE_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(control))

    def observe_phase(self, pool: str, seconds: float) -> None:
        self.phase_seconds.labels(pool).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
