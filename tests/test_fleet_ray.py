"""Independent work as Ray tasks (``rollmux.ray_tasks``) and ``rollmux fleet plan``'s
fixed-type plans run on it: the same rows as in this process, in the same order."""
from __future__ import annotations

import json
import math
import operator
import time
from functools import partial
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from loopback_server import free_port
from rollmux.cli import app
from rollmux.fleet import load_profiles
from rollmux.fleet_exact import improve_fleet
from rollmux.fleet_file import load_fleet
from rollmux.fleet_planner import FleetPlanner, alternatives
from rollmux.planner import FULL_SPACE
from rollmux.ray_tasks import map_tasks, serial_map
from rollmux.traces.format import read_trace

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fleet"


def test_map_tasks_returns_each_call_in_item_order_and_reports_each_as_done():
    # functions of the standard library: a task's function must be importable by Ray's workers
    seen = []
    shared = ("abcdefg",)
    items = [(k, k + 3) for k in range(5)]
    out = map_tasks(operator.getitem, (shared[0],), [(slice(*item),) for item in items], command="test",
                    num_cpus=2, on_done=lambda i, result, done, total: seen.append((i, result, done, total)))
    assert out == serial_map(operator.getitem, shared, [(slice(*item),) for item in items])
    assert out == ["abc", "bcd", "cde", "def", "efg"]
    assert sorted(i for i, *_ in seen) == list(range(5))  # each once, in finishing order
    assert [done for _, _, done, _ in seen] == list(range(1, 6)) and {t for *_, t in seen} == {5}
    assert all(result == out[i] for i, result, _, _ in seen)
    assert not ray.is_initialized()  # the local instance it started is gone
    polls = []
    assert map_tasks(time.sleep, (), [(0.5,), (1.0,)], command="test", num_cpus=2,
                     on_wait=lambda done, total: polls.append((done, total))) == [None, None]
    assert polls and {t for _, t in polls} == {2} and {d for d, _ in polls} <= {0, 1}  # a heartbeat while none ends
    assert [d for d, _ in polls] == sorted(d for d, _ in polls)
    with pytest.raises(ValueError, match="math domain error"):
        map_tasks(math.sqrt, (), [(4.0,), (-1.0,)], command="test", num_cpus=2)
    assert not ray.is_initialized()
    assert map_tasks(math.sqrt, (), [], command="test") == []  # nothing to run: Ray not started


def test_map_tasks_starts_its_own_instance_beside_another_ray_cluster():
    """Another Ray cluster on the machine (``ray start --head``, a test's cluster, or the
    address file a killed one left): ``ray.init(num_cpus=...)`` attached to it and failed
    ("num_cpus ... must not be provided"); whatif crashed with a traceback."""
    from rollmux.runtime.ray_adapter import local_cluster

    with local_cluster(["R0"], ["T0"]):
        ray.shutdown()  # the cluster runs on; this driver leaves it, as another process would be
        assert map_tasks(operator.neg, (), [(1,), (2,)], command="test", num_cpus=1) == [-1, -2]
    assert not ray.is_initialized()


def test_an_address_where_nothing_answers_is_refused_at_once():
    from rollmux.errors import RollMuxError

    port = free_port()  # a port nobody listens on
    t0 = time.monotonic()
    with pytest.raises(RollMuxError, match=f"test: cannot connect to the Ray cluster at 127.0.0.1:{port}"):
        map_tasks(operator.neg, (), [(1,)], command="test", address=f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 10 and not ray.is_initialized()  # (Ray itself retried for minutes)


def test_fixed_type_plans_on_ray_are_the_serial_plans():
    fleet = load_fleet(EXAMPLE / "three_types.yaml")
    profiles = load_profiles(EXAMPLE / "profiles.csv", fleet)
    jobs = read_trace(EXAMPLE / "jobs.csv")
    planner = FleetPlanner(fleet, profiles, space=FULL_SPACE)
    regroup = partial(improve_fleet, space=FULL_SPACE)
    steps = []
    rows = alternatives(planner, jobs, regroup, progress=steps.append,
                        mapper=partial(map_tasks, command="test", num_cpus=2))
    assert rows == alternatives(planner, jobs, regroup)
    assert [r.name for r in rows[1:1 + len(fleet.views())]] == [f"rollmux on {v.name}" for v in fleet.views()]
    assert steps == list(range(1, 2 + len(fleet.views())))
    assert not ray.is_initialized()


def test_fleet_plan_with_workers_writes_the_same_plan(tmp_path):
    args = ["fleet", "plan", "--jobs", str(EXAMPLE / "jobs.csv"), "--cluster", str(EXAMPLE / "three_types.yaml"),
            "--profiles", str(EXAMPLE / "profiles.csv")]
    runner = CliRunner()
    serial, parallel = tmp_path / "serial.json", tmp_path / "parallel.json"
    first = runner.invoke(app, [*args, "--json", str(serial)])
    second = runner.invoke(app, [*args, "--json", str(parallel), "--workers", "2"])
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    assert json.loads(parallel.read_text()) == json.loads(serial.read_text())
    assert "fleet plan $326.83/h vs the best fixed-type assignment" in second.output
