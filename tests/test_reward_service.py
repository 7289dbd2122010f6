"""The shared reward service: exact rewards equal the in-process verifiers, the learned
model's scores are well formed, a rollout worker gets the same batch through the service,
and a burst of concurrent clients scales the Serve deployment up and, after it, down."""
from __future__ import annotations

import math
import os
import random
import socket
import threading
import time
from dataclasses import replace

import httpx
import pytest

os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")  # read when Serve is imported
pytest.importorskip("ray.serve")

from rollmux.grpo.task import TASKS, get_task, reward  # noqa: E402
from rollmux.reward_model import exact_rewards, model_rewards, train_reward_model, training_items  # noqa: E402

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


@pytest.fixture(scope="module")
def service():
    """The service on a local Ray (2 CPUs, 127.0.0.1) with its HTTP route on a free
    loopback port; yields that port. Serve and Ray go down even on failure."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from rollmux.reward_service import running_service

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
