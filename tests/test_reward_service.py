"""The shared reward service: exact rewards equal the in-process verifiers, the learned
model's scores are well formed, a rollout worker gets the same batch through the service,
and a burst of concurrent clients scales the Serve deployment up and, after it, down."""
from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace

import httpx
import pytest

os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")  # read when Serve is imported
pytest.importorskip("ray.serve")

from loopback_server import free_port  # noqa: E402
from rollmux.errors import SpecError  # noqa: E402
from rollmux.grpo.task import TASKS, get_task, reward  # noqa: E402
from rollmux.reward_model import (  # noqa: E402
    check_items,
    exact_rewards,
    model_rewards,
    train_reward_model,
    training_items,
)

MAX_REPLICAS = 3
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")


def random_items(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    """Items over all tasks with uniformly random digit completions (a quarter exact answers)."""
    items = []
    for _ in range(n):
        task = TASKS[rng.choice(sorted(TASKS))]
        prompt, answer = task.sample(rng)
        completion = answer if rng.random() < 0.25 else "".join(rng.choice("0123456789")
                                                                for _ in range(task.answer_len))
        items.append((task.name, prompt, completion))
    return items


def test_answer_from_prompt_is_the_sampled_answer_and_exact_rewards_use_it():
    rng = random.Random(0)
    for task in TASKS.values():
        for _ in range(200):
            prompt, answer = task.sample(rng)
            assert task.answer(prompt) == answer
    items = random_items(rng, 300)
    assert exact_rewards(items) == [reward(c, get_task(t).answer(p)) for t, p, c in items]


def test_learned_model_trains_and_scores_every_item_in_unit_interval():
    model, losses = train_reward_model(steps=60, seed=1)
    assert all(math.isfinite(x) for x in losses) and sum(losses[-10:]) < sum(losses[:10])
    scores = model_rewards(model, training_items(random.Random(2), 50))
    assert len(scores) == 50 and all(0.0 < s < 1.0 for s in scores)


@pytest.mark.parametrize("task, prompt", [
    ("reverse", ""), ("sort", "4071>"), ("reverse", "^1>"), ("add", "^ab+cd="), ("add", "^4071>"), ("sort", "^40712>"),
])
def test_a_prompt_not_of_its_tasks_form_is_refused_naming_it(task, prompt):
    """(an empty prompt raised ZeroDivisionError, letters a bare ValueError, the rest were scored)"""
    with pytest.raises(SpecError, match=re.escape(f"prompt={prompt!r}: expected a prompt of task {task!r}")):
        get_task(task).answer(prompt)
    with pytest.raises(SpecError, match="prompt="):
        exact_rewards([(task, prompt, "000")])


def test_reward_against_an_empty_answer_is_refused():
    with pytest.raises(SpecError, match="answer=''"):
        reward("1", "")


def test_learned_model_scores_an_empty_batch():
    """(torch.tensor([]) is float: the embedding raised RuntimeError)"""
    model, _ = train_reward_model(steps=1, seed=0)
    assert model_rewards(model, []) == []


@pytest.mark.parametrize("items, field", [
    ("abc", "items="), ([5], r"items\[0\]="), ([("sort", "^4071>")], r"items\[0\]="),
    ([("sort", "^4071>", None)], r"items\[0\]="), ([("sort", "^4071>", "0147"), ("nope", "^4071>", "0147")],
                                                   r"items\[1\]\.task='nope'"),
    ([("add", "^37+48=", "085"), ("reverse", "", "1")], r"items\[1\]\.prompt=''"),
    ([("reverse", "^1234>", "4321"), ("reverse", "^1234>", "ab\u00e9\x00")], r"items\[1\]\.completion='ab"),
    ([("add", "^37+48=", "08 ")], r"items\[0\]\.completion='08 ': expected characters from '\^0123456789\+=>'"),
])
def test_check_items_names_the_first_bad_item(items, field):
    with pytest.raises(SpecError, match=field):
        check_items(items)


@pytest.mark.parametrize("options, field", [
    ({"min_replicas": -1}, "min_replicas=-1"), ({"min_replicas": 1.5}, "min_replicas=1.5"),
    ({"min_replicas": 3, "max_replicas": 1}, "max_replicas=1: expected an integer >= 1 and >= min_replicas"),
    ({"max_replicas": 0}, "max_replicas=0"), ({"max_replicas": True}, "max_replicas=True"),
    ({"target_ongoing_requests": 0}, "target_ongoing_requests=0"),
    ({"target_ongoing_requests": float("nan")}, "target_ongoing_requests=nan"),
])
def test_start_service_refuses_bad_scaling_before_fitting_the_model(monkeypatch, options, field):
    """(they reached Serve after the model was fitted, some only as its own error, some not at all)"""
    import rollmux.reward_service as reward_service

    def no_fit(*_args, **_kwargs):
        raise AssertionError("the model was fitted before the options were checked")

    monkeypatch.setattr(reward_service, "train_reward_model", no_fit)
    with pytest.raises(SpecError, match=re.escape(field)):
        reward_service.start_service(**options)


def test_replica_monitor_before_start_and_when_its_poll_fails(monkeypatch):
    """(stop() before start() raised RuntimeError, elapsed() AttributeError; a failing poll ended the
    thread with a traceback)"""
    import rollmux.reward_service as reward_service

    idle = reward_service.ReplicaMonitor()
    assert idle.elapsed() == 0.0 and idle.stop() == [] and idle.stop() == []
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)

    def gone(*_args):
        raise RuntimeError("Serve is down")

    monkeypatch.setattr(reward_service, "running_replicas", gone)
    monitor = reward_service.ReplicaMonitor(interval_s=0.01).start()
    monitor._thread.join(timeout=10)
    assert not monitor._thread.is_alive() and errors == [] and monitor.stop() == []
    assert monitor.elapsed() > 0


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "5", True])
def test_service_timeouts_must_be_positive_finite_seconds(value):
    from rollmux.reward_service import RewardClient, start_service

    with pytest.raises(SpecError, match="ready_timeout_s"):
        start_service(ready_timeout_s=value)
    with pytest.raises(SpecError, match="timeout_s"):
        RewardClient(timeout_s=value)


def test_start_without_cpu_for_a_replica_fails_in_bounded_time_and_deletes_the_app():
    """(serve.run waited forever for a replica no node could place); in a process of its
    own, on a Ray with no CPU"""
    code = textwrap.dedent("""
        import os, time
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray
        from ray import serve
        from rollmux.reward_service import RewardServiceTimeout, start_service
        ray.init(address="local", num_cpus=0, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
        try:
            t0 = time.monotonic()
            try:
                start_service(model_steps=1, ready_timeout_s=2)
            except RewardServiceTimeout as err:
                print("refused:", err)
            print("seconds:", round(time.monotonic() - t0), "apps:", sorted(serve.status().applications))
        finally:
            serve.shutdown()
            ray.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: reward service app 'rewards': no replica ready after 2 s (no resources to place a replica" \
        in out.stdout, out.stdout + out.stderr[-3000:]
    seconds, apps = re.search(r"seconds: (\d+) apps: (\[.*?\])", out.stdout).groups()
    assert int(seconds) < 20 and apps == "[]"


@pytest.fixture(scope="module")
def service():
    """The service on a local Ray (2 CPUs, 127.0.0.1) with its HTTP route on a free
    loopback port; yields that port. Serve and Ray go down even on failure."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from rollmux.reward_service import running_service

    port = free_port()
    with running_service(max_replicas=MAX_REPLICAS, upscale_delay_s=1.0, downscale_delay_s=3.0,
                         model_steps=100, http_port=port):
        yield port


def test_service_exact_rewards_equal_in_process_and_learned_scores_are_finite(service):
    from rollmux.reward_service import RewardClient

    items = random_items(random.Random(3), 400)
    client = RewardClient()
    assert client.score(items, "exact") == exact_rewards(items)
    learned = client.score(items, "learned")
    assert len(learned) == len(items) and all(math.isfinite(s) and 0.0 < s < 1.0 for s in learned)
    assert len(client.latencies_ms) == 2 and all(ms > 0 for ms in client.latencies_ms)
    with pytest.raises(ValueError, match="kind"):
        client.score(items[:2], "bogus")
    answer = httpx.post(f"http://127.0.0.1:{service}/rewards", json={"items": items, "kind": "exact"}, timeout=60)
    assert answer.status_code == 200 and answer.json()["rewards"] == exact_rewards(items)


def test_http_refuses_malformed_requests_with_422_naming_the_field(service):
    """(every one answered 500 without naming what was wrong)"""
    url = f"http://127.0.0.1:{service}/rewards"
    good = ["sort", "^4071>", "0147"]
    bodies = [(b"{nope", "body"), ([1, 2], "body"), ({"kind": "exact"}, "items"), ({"items": None}, "items"),
              ({"items": "abc"}, "items"), ({"items": [5]}, "items[0]"), ({"items": [good[:2]]}, "items[0][2]"),
              ({"items": [good], "kind": "bogus"}, "kind"), ({"items": [good], "kinds": "exact"}, "kinds"),
              ({"items": [good, ["nope", "^4071>", "0147"]]}, "items[1].task"),
              ({"items": [["reverse", "", "1"]]}, "items[0].prompt"), ({"items": [["add", "^ab+cd=", "000"]]},
                                                                    "items[0].prompt"),
              ({"items": [good, ["sort", "^4071>", "ab\u00e9"]], "kind": "learned"}, "items[1].completion"),
              ({"items": [good, ["sort", "^4071>", "ab\u00e9"]], "kind": "exact"}, "items[1].completion"),
              ({"items": [["sort", "^4071>", "01", "7"]]}, "items[0]"),
              ({"items": [["sort", 5, "0147"]]}, "items[0][1]")]
    for body, field in bodies:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        answer = httpx.post(url, timeout=60, **kw)
        assert answer.status_code == 422 and answer.json()["field"] == field, (body, answer.text)
        assert answer.json()["error"].startswith(field), answer.text
    for kind in ("exact", "learned"):
        assert httpx.post(url, json={"items": [], "kind": kind}, timeout=60).json() == {"rewards": []}


def test_handle_refuses_bad_items_naming_them_and_times_out_boundedly(service):
    """(an empty prompt raised ZeroDivisionError in the replica, an empty learned batch
    RuntimeError; a call waited without bound)"""
    from rollmux.errors import SpecError
    from rollmux.reward_service import RewardClient, RewardServiceTimeout

    client = RewardClient()
    with pytest.raises(SpecError, match=re.escape("items[1].prompt=''")):
        client.score([("sort", "^4071>", "0147"), ("reverse", "", "1")])
    odd = "ab\u00e9\x00"
    for kind in ("exact", "learned"):  # (the learned kind refused it as 'text', the exact one scored it)
        with pytest.raises(SpecError, match=re.escape(f"items[1].completion={odd!r}")):
            client.score([("sort", "^4071>", "0147"), ("sort", "^4071>", odd)], kind)
    assert client.score([], "learned") == [] and client.score([], "exact") == []
    hurried = RewardClient(timeout_s=1e-4)
    with pytest.raises(RewardServiceTimeout, match="reward service app 'rewards': no rewards after 0.0001 s"):
        hurried.score(random_items(random.Random(5), 4000), "learned")
    assert hurried.latencies_ms == []


def test_rollout_worker_batch_through_the_service_is_the_in_process_batch(service):
    pytest.importorskip("transformers")
    import torch

    from rollmux.grpo.driver import warm_start_weights
    from rollmux.grpo.policy import ModelSpec
    from rollmux.grpo.profiles import JobProfile
    from rollmux.grpo.workers import RolloutWorker
    from rollmux.runtime.ray_adapter import WorkerInfo

    local = JobProfile("add-mini", "add", ModelSpec(32, 1), prompts=4, samples=4, gen_batch=8, warmup_steps=5)
    shared = replace(local, reward_service="rewards")
    weights = warm_start_weights(local)
    batches = []
    for profile in (local, shared):
        worker = RolloutWorker(WorkerInfo(profile.name, "rollout", "here", 0))
        worker.setup(profile, weights)
        worker.switch_in()
        batch, _ = worker.rollout(0, None)
        worker.prepare(1, None)
        batches.append((batch, worker.chunk(1, 8)))
    (roll_a, chunk_a), (roll_b, chunk_b) = batches
    for a, b in ((roll_a, roll_b), (chunk_a, chunk_b)):
        assert torch.equal(a["completions"], b["completions"]) and torch.equal(a["rewards"], b["rewards"])
    assert worker._reward_client.latencies_ms, "the shared profile's rewards came from the service"


def test_burst_of_clients_scales_replicas_up_then_down(service):
    from rollmux.reward_service import ReplicaMonitor, RewardClient, summary

    monitor = ReplicaMonitor(interval_s=0.25).start()
    clients = [RewardClient() for _ in range(6)]
    items = random_items(random.Random(4), 256)
    stop = threading.Event()

    def hammer(client: RewardClient) -> None:
        while not stop.is_set():
            client.score(items, "learned")

    threads = [threading.Thread(target=hammer, args=(c,), daemon=True) for c in clients]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 45.0
        while monitor.latest() <= 1 and time.monotonic() < deadline:
            time.sleep(0.25)
        time.sleep(1.0)  # a little longer under load: the peak is recorded
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30.0)
    deadline = time.monotonic() + 45.0
    while monitor.latest() > 1 and time.monotonic() < deadline:
        time.sleep(0.25)
    record = summary([ms for c in clients for ms in c.latencies_ms], monitor)
    monitor.stop()
    peak = record["replicas_max"]
    assert 1 < peak <= MAX_REPLICAS, f"no scale-up under the burst: {record['replicas_over_time'][-8:]}"
    assert record["replicas_over_time"][-1][1] == 1, f"no scale-down after it: {record['replicas_over_time'][-8:]}"
    assert set(record) == {"calls", "p50_ms", "p99_ms", "replicas_max", "replicas_over_time"}
    assert record["calls"] > 0 and record["p50_ms"] <= record["p99_ms"]


@pytest.mark.slow
def test_rollout_worker_actors_of_two_jobs_score_through_the_service(service):
    """The demo's path: two jobs' rollout workers as Ray actors call the shared service
    from inside Ray (their own DeploymentHandles) and get the in-process batches."""
    pytest.importorskip("transformers")
    import ray
    import torch

    from rollmux.grpo.driver import warm_start_weights
    from rollmux.grpo.policy import ModelSpec
    from rollmux.grpo.profiles import JobProfile
    from rollmux.grpo.workers import RolloutWorker
    from rollmux.runtime.ray_adapter import WorkerInfo

    profiles = [JobProfile("reverse-mini", "reverse", ModelSpec(32, 1), prompts=8, samples=4, gen_batch=16,
                           warmup_steps=5, seed=1, reward_service="rewards"),
                JobProfile("add-mini", "add", ModelSpec(32, 1), prompts=8, samples=4, gen_batch=16,
                           warmup_steps=5, seed=2, reward_service="rewards")]
    weights = [warm_start_weights(p) for p in profiles]
    actor = ray.remote(RolloutWorker).options(num_cpus=0)
    workers = [actor.remote(WorkerInfo(p.name, "rollout", "here", 0)) for p in profiles]
    try:
        ray.get([w.setup.remote(p, ws) for w, p, ws in zip(workers, profiles, weights)], timeout=120)
        ray.get([w.switch_in.remote() for w in workers], timeout=60)
        remote = ray.get([w.rollout.remote(step, None) for step in range(3) for w in workers], timeout=120)
    finally:
        for w in workers:
            ray.kill(w, no_restart=True)
    local = []
    for step in range(3):
        for p, ws in zip(profiles, weights):
            worker = RolloutWorker(WorkerInfo(p.name, "rollout", "here", 0))
            worker.setup(replace(p, reward_service=None), ws)
            worker.switch_in()
            local.append(worker.rollout(step, None))
    for (a, _), (b, _) in zip(remote, local):
        assert torch.equal(a["completions"], b["completions"]) and torch.equal(a["rewards"], b["rewards"])
