"""The Ray adapter on a local 4-node cluster (R0, R1, T0, T1), started once per module.

Two jobs in one co-execution group share T0: job A on R0 + T0, job B on R1 + T0. The
last test runs two jobs end to end under the live control plane (HTTP, SDK): the
planner's placement drives the adapter, and the workers' own timestamps show that the
grants keep jobs off each other's nodes.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from loopback_server import free_port  # noqa: E402
from rollmux.errors import SpecError  # noqa: E402
from rollmux.model import ROLLOUT, TRAIN  # noqa: E402
from rollmux.plan_state import Placement  # noqa: E402
from rollmux.runtime.ray_adapter import (  # noqa: E402
    PlacementTimeout,
    RayAdapterError,
    RayJobRunner,
    UnknownNodeError,
    WorkerInfo,
    local_cluster,
    node_resources,
    rollmux_nodes,
)

PLAN_A = Placement(group_id="g0", rollout_nodes=("R0",), train_nodes=("T0",))
PLAN_B = Placement(group_id="g0", rollout_nodes=("R1",), train_nodes=("T0",))


class Worker:
    """A tiny worker: remembers who it is and does a small torch computation."""

    def __init__(self, info: WorkerInfo) -> None:
        self.info = info

    def step(self, n: int) -> float:
        import torch

        x = torch.arange(n * n, dtype=torch.float32).reshape(n, n)
        return float((x @ x.T).trace())

    def busy(self, seconds: float) -> tuple[str, float, float]:
        """Hold the node for ``seconds``; returns (RollMux node, start, end) in wall-clock time."""
        start = time.time()
        time.sleep(seconds)
        return (self.info.node_id, start, time.time())

    def whoami(self) -> tuple[str, str, str, int]:
        return (self.info.job_id, self.info.pool, self.info.node_id, self.info.index)


def expected_trace(n: int) -> float:
    return float(sum(v * v for v in range(n * n)))


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        # Ray pickles ``Worker`` by reference: its workers must import this module too.
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
        with local_cluster(["R0", "R1"], ["T0", "T1"], gpus_per_node=8) as c:
            yield c
        assert not ray.is_initialized()
        assert c.head_node is None and not c.worker_nodes


@pytest.fixture
def runners():
    """Runners a test starts; all are shut down afterwards, even on failure."""
    started: list[RayJobRunner] = []
    try:
        yield started
    finally:
        for r in started:
            r.shutdown()


def start(runners: list[RayJobRunner], job_id: str, plan: Placement, **kw) -> RayJobRunner:
    runner = RayJobRunner(job_id, plan, Worker, Worker, timeout_s=30, **kw)
    runners.append(runner)
    return runner.start()


def wait_until(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_node_resources_convention():
    assert node_resources("R0", ROLLOUT, 8) == {"rollmux_node:R0": 1, "rollout_gpu": 8}
    assert node_resources("T3", TRAIN, 4) == {"rollmux_node:T3": 1, "train_gpu": 4}
    for bad in [("", ROLLOUT, 8), ("R0", "gpu", 8), ("R0", ROLLOUT, -1), ("R0", ROLLOUT, 1.5)]:
        with pytest.raises(SpecError):
            node_resources(*bad)


def test_cluster_advertises_every_node(cluster):
    nodes = rollmux_nodes()
    assert sorted(nodes) == ["R0", "R1", "T0", "T1"]
    assert len(set(nodes.values())) == 4
    assert ray.cluster_resources()["rollout_gpu"] == 16


def test_two_jobs_share_t0_and_land_on_planned_nodes(cluster, runners):
    a = start(runners, "A", PLAN_A)
    b = start(runners, "B", PLAN_B)
    ray_ids = rollmux_nodes()
    for runner, plan in ((a, PLAN_A), (b, PLAN_B)):
        locations = runner.where(timeout_s=60)
        assert [(loc.pool, loc.node_id) for loc in locations] == [
            (ROLLOUT, plan.rollout_nodes[0]),
            (TRAIN, plan.train_nodes[0]),
        ]
        for loc in locations:
            assert loc.node_id == loc.planned_node
            assert loc.ray_node_id == ray_ids[loc.planned_node]
    # Both jobs' training workers sit on the same physical node.
    assert a.where()[1].ray_node_id == b.where()[1].ray_node_id == ray_ids["T0"]
    calls = [w.step.remote(4) for r in (a, b) for pool in (ROLLOUT, TRAIN) for w in r.workers(pool)]
    assert ray.get(calls, timeout=60) == [expected_trace(4)] * 4
    assert ray.get(b.workers(TRAIN)[0].whoami.remote()) == ("B", TRAIN, "T0", 0)


def test_shutdown_frees_one_job_and_spares_the_other(cluster, runners):
    a = start(runners, "A", PLAN_A)
    b = start(runners, "B", PLAN_B)
    a_workers = a.workers(ROLLOUT) + a.workers(TRAIN)
    ray.get([w.step.remote(2) for w in a_workers], timeout=60)
    a_pg = a.placement_group.id.hex()
    a.shutdown()
    a.shutdown()  # idempotent
    assert not a.started and a.workers(ROLLOUT) == [] and a.workers(TRAIN) == []
    for w in a_workers:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(w.step.remote(2), timeout=30)
    assert ray.util.placement_group_table()[a_pg]["state"] == "REMOVED"
    # R0 holds nothing any more; T0 still holds job B's claim.
    assert wait_until(lambda: ray.available_resources().get("rollmux_node:R0") == 1.0)
    assert wait_until(lambda: ray.available_resources().get("rollmux_node:T0") == pytest.approx(0.99))
    b_workers = b.workers(ROLLOUT) + b.workers(TRAIN)
    assert ray.get([w.step.remote(3) for w in b_workers], timeout=60) == [expected_trace(3)] * 2


def test_several_workers_per_node(cluster, runners):
    plan = Placement(group_id=None, rollout_nodes=("R0", "R1"), train_nodes=("T1",))
    runner = start(runners, "C", plan, workers_per_node=2)
    locations = runner.where(timeout_s=60)
    assert [(loc.pool, loc.index, loc.node_id) for loc in locations] == [
        (ROLLOUT, 0, "R0"), (ROLLOUT, 1, "R0"), (ROLLOUT, 2, "R1"), (ROLLOUT, 3, "R1"),
        (TRAIN, 0, "T1"), (TRAIN, 1, "T1"),
    ]


def test_unknown_node_raises_and_creates_nothing(cluster, runners):
    before = dict(ray.util.placement_group_table())
    runner = RayJobRunner("X", Placement(None, ("R0", "R9"), ("T7",)), Worker, Worker)
    runners.append(runner)
    with pytest.raises(UnknownNodeError) as err:
        runner.start()
    assert err.value.missing == ("R9", "T7")
    assert "rollmux_node:R9" in str(err.value) and "R0, R1, T0, T1" in str(err.value)
    assert not runner.started and runner.workers(ROLLOUT) == []
    assert ray.util.placement_group_table() == before


def test_full_node_times_out_and_withdraws(cluster, runners):
    start(runners, "B", PLAN_B)  # holds 0.01 of T0
    greedy = RayJobRunner("G", Placement(None, ("R0",), ("T0",)), Worker, Worker, claim=1.0, timeout_s=1.5)
    runners.append(greedy)
    before = set(ray.util.placement_group_table())
    t0 = time.monotonic()
    with pytest.raises(PlacementTimeout):
        greedy.start()
    assert time.monotonic() - t0 < 10
    assert not greedy.started
    new = [pg for pg_id, pg in ray.util.placement_group_table().items() if pg_id not in before]
    assert [pg["state"] for pg in new] == ["REMOVED"]
    assert wait_until(lambda: ray.available_resources().get("rollmux_node:R0") == 1.0)


def test_an_interrupted_reservation_is_withdrawn(cluster, runners, monkeypatch):
    """Ctrl-C while ``start`` waits for the reservation left the placement group pending,
    with ``started`` False, so nothing could remove it."""
    import rollmux.runtime.ray_adapter as adapter

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    runner = RayJobRunner("I", Placement(None, ("R0",), ("T0",)), Worker, Worker, timeout_s=5)
    runners.append(runner)
    before = set(ray.util.placement_group_table())
    monkeypatch.setattr(adapter.ray, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.start()
    monkeypatch.undo()
    new = [pg for pg_id, pg in ray.util.placement_group_table().items() if pg_id not in before]
    assert [pg["state"] for pg in new] == ["REMOVED"] and not runner.started


@pytest.mark.parametrize("kwargs, field", [
    ({"workers_per_node": 0}, "workers_per_node"), ({"workers_per_node": 1.5}, "workers_per_node"),
    ({"workers_per_node": "2"}, "workers_per_node"), ({"claim": 0}, "claim"),
    ({"timeout_s": float("inf")}, "timeout_s"), ({"timeout_s": float("nan")}, "timeout_s"),
    ({"actor_options": {"num_gpus": 1}}, "actor_options"), ({"actor_options": ["x"]}, "actor_options"),
    ({"claim": 0.00005}, "claim"), ({"claim": 0.5, "workers_per_node": 3}, "claim"),
    ({"job_id": None}, "job_id"), ({"job_id": ""}, "job_id"),
    ({"placement": None}, "placement"), ({"placement": {"rollout_nodes": ["R0"], "train_nodes": ["T0"]}}, "placement"),
    ({"placement": Placement("g", (), ())}, "placement"),
    ({"rollout_worker": None}, "rollout_worker"), ({"train_worker": Worker(None)}, "train_worker"),
])
def test_bad_arguments_are_rejected_before_ray(kwargs, field):
    """(an infinite or NaN timeout passed, then Ray failed with the placement group made; a claim
    below Ray's 0.0001 precision failed at start, one that never fits waited for the timeout; a
    None job id, placement or worker passed, or failed with AttributeError / AssertionError)"""
    args = {"job_id": "A", "placement": PLAN_A, "rollout_worker": Worker, "train_worker": Worker, **kwargs}
    with pytest.raises(SpecError, match=field):
        RayJobRunner(**args)


def test_a_colocated_node_counts_both_pools_claims():
    colocated = Placement.colocated_on(("T0",))
    with pytest.raises(SpecError, match="claim.*2 workers pinned to node T0"):
        RayJobRunner("A", colocated, Worker, Worker, claim=0.6)
    assert RayJobRunner("A", colocated, Worker, Worker, claim=0.5).claim == 0.5


def test_a_second_runner_of_one_job_id_is_refused(cluster, runners):
    """(Ray's RaySystemError on the duplicate placement group name)"""
    start(runners, "same", PLAN_A)
    twin = RayJobRunner("same", PLAN_B, Worker, Worker, timeout_s=30)
    runners.append(twin)
    with pytest.raises(RayAdapterError, match="job 'same': another runner of this job id"):
        twin.start()
    assert not twin.started
    runners[0].shutdown()
    assert twin.start().started


def test_a_second_driver_of_one_job_id_is_refused(cluster, runners):
    """(a driver of its own has a Ray namespace of its own, where the first driver's placement
    group was not found: it started a second set of workers for the job)"""
    import subprocess
    import sys

    start(runners, "twice", PLAN_A)
    code = ("import ray\nfrom rollmux.plan_state import Placement\n"
            "from rollmux.runtime.ray_adapter import RayAdapterError, RayJobRunner\n"
            f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
            "try:\n    RayJobRunner('twice', Placement(None, ('R1',), ('T1',)), object, object, timeout_s=30).start()\n"
            "    print('started')\n"
            "except RayAdapterError as err:\n    print('refused:', err)\nray.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: job 'twice': another runner of this job id" in out.stdout, out.stdout + out.stderr[-2000:]
    names = [pg["name"] for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]
    assert names.count("rollmux-twice") == 1


def test_start_without_a_ray_connection_says_so():
    """(it raised Ray's own RaySystemError); in a process of its own, with no Ray connection"""
    import subprocess
    import sys

    code = ("from rollmux.runtime.ray_adapter import RayAdapterError, RayJobRunner\n"
            "from rollmux.plan_state import Placement\n"
            "try:\n    RayJobRunner('A', Placement(None, ('R0',), ('T0',)), object, object).start()\n"
            "except RayAdapterError as err:\n    print('refused:', err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: job 'A': no Ray connection" in out.stdout, out.stdout + out.stderr


@pytest.fixture
def control_plane(tmp_path):
    """The live service (2 rollout + 2 train nodes, no switch cost) on a local port."""
    uvicorn = pytest.importorskip("uvicorn")
    from rollmux.model import Cluster, PoolSpec, SwitchCost
    from rollmux.runtime.service import Service, ServiceConfig, server_config

    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                      switch_cost=SwitchCost(mode="fixed"))
    service = Service(cluster, str(tmp_path / "state.db"), "admin", ServiceConfig(lease_s=30.0))
    port = free_port()
    server = uvicorn.Server(server_config(service, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: server.started, 15)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def run_job(job, runner: RayJobRunner, iterations: int, hold_s: float, log: list, errors: list) -> None:
    """The job's driver loop: each phase, under its grant, keeps that pool's workers busy."""
    try:
        for _ in range(iterations):
            for pool in (ROLLOUT, TRAIN):
                with job.phase(pool) as phase:
                    spans = ray.get([w.busy.remote(hold_s) for w in runner.workers(pool)], timeout=60)
                    log.extend((job.job_id, pool, tuple(phase.grant["nodes"]), span) for span in spans)
        job.complete()
    except Exception as exc:  # reported by the test thread
        errors.append(exc)


def test_end_to_end_under_control_plane(cluster, runners, control_plane):
    from rollmux.runtime.sdk import Client

    client = Client(control_plane, token="admin")
    jobs = [client.submit({"job_id": j, "t_roll_s": 0.2, "t_train_s": 0.2, "slo": 3.0, "iterations": 2})
            for j in ("a", "b")]
    try:
        placements = {job.job_id: job.wait_placed(timeout_s=20) for job in jobs}
        assert placements["a"]["group_id"] == placements["b"]["group_id"]
        a_nodes, b_nodes = ({*p["rollout_nodes"], *p["train_nodes"]} for p in placements.values())
        assert a_nodes & b_nodes, "a co-execution group shares nodes"
        for job in jobs:
            p = placements[job.job_id]
            plan = Placement(p["group_id"], tuple(p["rollout_nodes"]), tuple(p["train_nodes"]))
            runner = start(runners, job.job_id, plan)
            assert [loc.node_id for loc in runner.where(timeout_s=60)] == [*plan.rollout_nodes, *plan.train_nodes]
        log: list = []
        errors: list = []
        threads = [threading.Thread(target=run_job, args=(job, r, 2, 0.2, log, errors))
                   for job, r in zip(jobs, runners)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads) and errors == []
    finally:
        for job in jobs:
            job.close()
        client.close()
    for job in jobs:  # phases alternate and each ran on its job's pinned nodes
        assert [h[0] for h in job.history] == [ROLLOUT, TRAIN] * 2
        p = placements[job.job_id]
        assert {h[1] for h in job.history} == {tuple(p["rollout_nodes"]), tuple(p["train_nodes"])}
    assert len(log) == 2 * 2 * 2
    for job_id, pool, granted, (node, _, _) in log:
        assert node in granted  # the worker that did the work sits on a granted node
    # On every node, busy spans of different jobs never overlap (seen from inside the actors).
    pairs = 0
    for i, (job_i, _, _, (node_i, s_i, e_i)) in enumerate(log):
        for job_j, _, _, (node_j, s_j, e_j) in log[i + 1:]:
            if node_i == node_j and job_i != job_j:
                pairs += 1
                assert e_i <= s_j or e_j <= s_i, f"{job_i} and {job_j} overlap on {node_i}"
    assert pairs > 0
