"""The demo's weights go from the training worker to the rollout workers by weight sync.

One tiny GRPO job (the demo's rollout-heavy profile, 4 prompts) runs 2 iterations under
the live control plane on a local Ray cluster (R0, T0), its rollout chunked over 2
rollout workers (the long-tail demo's layout), then again with one rollout worker.
Checked: one sync per update that a rollout uses; with 2 receivers scatter + broadcast
moves exactly one model copy across the pools and one inside the rollout pool, with one
the single copy and nothing inside; the synced weights are bit-equal to the weights an
in-process trainer produces from the same rollout (model digest), and the rollouts sample
with them (rewards bit-equal to an in-process replay); the summary's fields.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

ITERATIONS = 2


def _batch(profile, weights) -> dict:
    """Iteration 0's rollout batch, generated in this process (no Ray)."""
    from rollmux.grpo.workers import RolloutWorker
    from rollmux.model import ROLLOUT
    from rollmux.runtime.ray_adapter import WorkerInfo

    roll = RolloutWorker(WorkerInfo(profile.name, ROLLOUT, "replay", 0))
    roll.setup(profile, weights)
    roll.switch_in()
    return roll.rollout(0, None)[0]


def _first_update_of(profile, weights) -> tuple[dict[str, torch.Tensor], dict]:
    """The trainer's weights after iteration 0 and its stats, computed in this process."""
    from rollmux.grpo.workers import TrainWorker
    from rollmux.model import TRAIN
    from rollmux.runtime.ray_adapter import WorkerInfo

    train = TrainWorker(WorkerInfo(profile.name, TRAIN, "replay", 0))
    train.setup(profile, weights)
    train.switch_in()
    return train.train(_batch(profile, weights))


def _first_update(profile, weights) -> dict[str, torch.Tensor]:
    threads = torch.get_num_threads()
    try:
        return _first_update_of(profile, weights)[0]
    finally:
        torch.set_num_threads(threads)


def test_demo_job_weights_reach_its_rollout_workers_by_weight_sync(tmp_path, monkeypatch):
    from rollmux.demo import _control_plane
    from rollmux.grpo.driver import TailConfig, job_spec, replay_job, run_job, warm_start_weights
    from rollmux.grpo.profiles import ROLLOUT_HEAVY
    from rollmux.runtime.ray_adapter import local_cluster
    from rollmux.runtime.sdk import Client
    from rollmux.weight_sync import digest, model_digest

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    profile = replace(ROLLOUT_HEAVY, prompts=4)
    weights = warm_start_weights(profile)
    tail = TailConfig(workers=2)
    with local_cluster(["R0"], ["T0"], num_cpus=1), _control_plane(1, 1, tmp_path) as (url, token):
        client = Client(url, token=token)
        try:
            two = run_job(client.submit(job_spec("ws-two", profile, 1.0, 1.0, tail_workers=tail.gpus_per_worker)),
                          profile, ITERATIONS, weights, tail=tail)
            one = run_job(client.submit(job_spec("ws-one", profile, 1.0, 1.0)), profile, ITERATIONS, weights)
        finally:
            client.close()
    assert not ray.is_initialized()

    new = _first_update(profile, weights)
    model_bytes = sum(t.nbytes for t in new.values())
    want_digest = model_digest({k: digest(t) for k, t in new.items()})
    rewards, _ = replay_job(profile, ITERATIONS, weights)
    for run, receivers, method in ((two, 2, "scatter_broadcast"), (one, 1, "naive")):
        # One sync per rollout after an update; it carried the trainer's update bit for bit.
        assert [s["iteration"] for s in run.weight_syncs] == list(range(1, ITERATIONS))
        for s in run.weight_syncs:
            assert (s["method"], s["receivers"], s["senders"]) == (method, receivers, 1)
            assert s["model_bytes"] == model_bytes
            assert s["cross_pool_bytes"] == model_bytes  # one model copy across the pools
            assert s["intra_pool_bytes"] == (receivers - 1) * model_bytes
            assert s["seconds"] > 0
        assert run.weight_syncs[0]["digest"] == want_digest
        # ... and the rollouts sampled with exactly those weights.
        assert run.rewards == rewards

        summary = json.loads(json.dumps(run.weight_sync_summary()))
        assert summary["method"] == method and summary["receivers"] == receivers
        assert summary["syncs"] == ITERATIONS - 1 and summary["model_bytes"] == model_bytes
        assert summary["cross_pool_bytes"] == (ITERATIONS - 1) * model_bytes
        assert summary["intra_pool_bytes"] == (ITERATIONS - 1) * (receivers - 1) * model_bytes
        assert summary["seconds"] == pytest.approx(sum(s["seconds"] for s in run.weight_syncs))
        assert [sorted(x) for x in summary["per_iteration"]] == [
            ["cross_pool_bytes", "intra_pool_bytes", "iteration", "seconds"]] * (ITERATIONS - 1)


def test_a_moved_trainer_sends_the_weights_of_its_last_update():
    """After a move (export_state, then import_state on a fresh worker), the new training
    worker's sender state is its predecessor's last update, bit for bit, in the same key
    order (tied embedding names included), and its digests are the predecessor's."""
    from rollmux.grpo.driver import warm_start_weights
    from rollmux.grpo.profiles import TRAIN_HEAVY
    from rollmux.grpo.workers import TrainWorker
    from rollmux.model import TRAIN
    from rollmux.runtime.ray_adapter import WorkerInfo

    profile = replace(TRAIN_HEAVY, prompts=4, epochs=1, warmup_steps=0)  # kl_coef > 0: a reference too
    weights = warm_start_weights(profile)
    threads = torch.get_num_threads()
    try:
        new, _ = _first_update_of(profile, weights)
        old = TrainWorker(WorkerInfo(profile.name, TRAIN, "T0", 0))
        old.setup(profile, weights)
        old.switch_in()
        old.update(_batch(profile, weights))
        old.switch_out()
        assert list(old.state) == list(new) and all(torch.equal(old.state[k], t) for k, t in new.items())
        moved = TrainWorker(WorkerInfo(profile.name, TRAIN, "T1", 0))
        moved.import_state(profile, old.export_state())
        assert list(moved.state) == list(old.state)
        assert all(torch.equal(moved.state[k].view(torch.uint8), t.view(torch.uint8)) for k, t in old.state.items())
        assert moved.digests() == old.digests()
    finally:
        torch.set_num_threads(threads)
