"""``ray_adapter.demo_ray(one_node=True)``, the local Ray of the quick demos: one Ray node
that advertises every RollMux node's resources. Workers are pinned by those resources as
on one Ray node per RollMux node, and ``RayJobRunner.where`` still names the planned
nodes although every worker shares one Ray node."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rollmux.model import ROLLOUT, TRAIN  # noqa: E402
from rollmux.plan_state import Placement  # noqa: E402
from rollmux.runtime.ray_adapter import RayJobRunner, WorkerInfo, demo_ray, rollmux_nodes  # noqa: E402


class Worker:
    def __init__(self, info: WorkerInfo) -> None:
        self.info = info

    def whoami(self) -> tuple[str, str, str]:
        return (self.info.job_id, self.info.pool, self.info.node_id)


def test_one_ray_node_carries_every_rollmux_node_and_workers_land_where_planned(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # Ray pickles ``Worker`` by reference: its workers must import this module too.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                    os.environ.get("PYTHONPATH")])))
    plan = Placement(group_id="g0", rollout_nodes=("R1",), train_nodes=("T0",))
    with demo_ray(["R0", "R1"], ["T0"], one_node=True) as cluster:
        assert cluster is None
        nodes = rollmux_nodes()
        assert sorted(nodes) == ["R0", "R1", "T0"] and len(set(nodes.values())) == 1
        resources = ray.cluster_resources()
        assert resources["rollout_gpu"] == 16 and resources["train_gpu"] == 8
        with RayJobRunner("A", plan, Worker, Worker, timeout_s=60) as runner:
            where = runner.where(timeout_s=60)
            assert [(w.pool, w.planned_node, w.node_id) for w in where] == [(ROLLOUT, "R1", "R1"), (TRAIN, "T0", "T0")]
            calls = [runner.workers(pool)[0].whoami.remote() for pool in (ROLLOUT, TRAIN)]
            assert ray.get(calls, timeout=60) == [("A", ROLLOUT, "R1"), ("A", TRAIN, "T0")]
    assert not ray.is_initialized()
