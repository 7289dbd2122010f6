"""Weight sync from the training pool to the rollout pool (rollmux.weight_sync).

Shard planning is checked as a property over random size lists. The protocols run on a
local 5-node Ray cluster (rollout R0-R2, train T0-T1; started once per module, always
shut down): both leave every rollout actor with weights bit-equal to the trainer's,
scatter+broadcast moves exactly one model across the pools and naive one per rollout
node.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.weight_sync import WeightSyncError, plan_shards

ray = pytest.importorskip("ray")

from rollmux.model import ROLLOUT, TRAIN  # noqa: E402
from rollmux.plan_state import Placement  # noqa: E402
from rollmux.runtime.ray_adapter import RayJobRunner, local_cluster  # noqa: E402
from rollmux.weight_sync import (  # noqa: E402
    WeightReceiver,
    WeightSender,
    naive_sync,
    scatter_broadcast_sync,
)

ROLLOUT_NODES = ("R0", "R1", "R2")
TRAIN_NODES = ("T0", "T1")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=40), st.integers(1, 12))
def test_plan_shards_is_a_balanced_contiguous_partition(sizes, parts):
    shards = plan_shards(sizes, parts)
    assert shards == plan_shards(list(sizes), parts)  # deterministic
    assert len(shards) == parts
    assert [i for r in shards for i in r] == list(range(len(sizes)))  # disjoint, in order, covering
    assert all(r.step == 1 for r in shards)
    total, largest = sum(sizes), max(sizes, default=0)
    for r in shards:
        got = sum(sizes[i] for i in r)
        assert abs(got * parts - total) <= largest * parts  # |shard - M/parts| <= max size


def test_plan_shards_rejects_misuse():
    for sizes, parts in [([1, 2], 0), ([1, 2], 1.5), ([1, -2], 2), ([1.0], 2)]:
        with pytest.raises(WeightSyncError):
            plan_shards(sizes, parts)


def test_plan_shards_splits_equal_tensors_evenly():
    assert plan_shards([4] * 8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]


def model_state() -> dict[str, torch.Tensor]:
    """A small state dict of mixed dtypes and shapes, 0-dim and empty tensors included."""
    gen = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(300, 64, generator=gen),
        "layers.0.attn.weight": torch.randn(64, 64, generator=gen).to(torch.bfloat16),
        "layers.0.attn.bias": torch.randn(64, generator=gen).half(),
        "layers.0.mlp.weight": torch.randn(256, 64, generator=gen),
        "layers.0.norm.scale": torch.tensor(1.5),
        "layers.0.empty": torch.zeros(0, 8),
        "steps": torch.randint(0, 1 << 40, (17,), generator=gen),
        "head.weight": torch.randn(64, 300, generator=gen),
    }


@pytest.fixture(scope="module")
def pools():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        with local_cluster(ROLLOUT_NODES, TRAIN_NODES, gpus_per_node=8) as c:
            plan = Placement(group_id="g0", rollout_nodes=ROLLOUT_NODES, train_nodes=TRAIN_NODES)
            with RayJobRunner("sync", plan, WeightReceiver, WeightSender, timeout_s=60) as runner:
                senders, receivers = runner.workers(TRAIN), runner.workers(ROLLOUT)
                where = {(w.pool, w.planned_node, w.node_id) for w in runner.where(timeout_s=60)}
                assert all(planned == actual for _, planned, actual in where)
                yield senders, receivers
        assert not ray.is_initialized()
        assert c.head_node is None and not c.worker_nodes


@pytest.mark.parametrize("sync", [naive_sync, scatter_broadcast_sync])
def test_sync_delivers_bit_equal_weights_and_counts_bytes(pools, sync):
    senders, receivers = pools
    state = model_state()
    model_bytes = sum(t.nbytes for t in state.values())
    assert ray.get([s.set_weights.remote(state) for s in senders]) == [model_bytes] * len(senders)

    report = sync(senders, receivers, verify=True)

    r = len(receivers)
    assert (report.rollout_nodes, report.train_nodes, report.model_bytes) == (r, len(senders), model_bytes)
    if sync is naive_sync:
        assert (report.cross_pool_bytes, report.intra_pool_bytes) == (r * model_bytes, 0)
    else:
        assert (report.cross_pool_bytes, report.intra_pool_bytes) == (model_bytes, (r - 1) * model_bytes)
        assert [name for name, _ in report.stages] == ["scatter", "gather"]
    assert report.seconds > 0
    for got in ray.get([w.weights.remote() for w in receivers]):
        assert list(got) == list(state)
        for name, tensor in state.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_sync_takes_each_update(pools):
    """A second update replaces the first on every receiver."""
    senders, receivers = pools
    ray.get([s.random_weights.remote([("a", (33, 7)), ("b", (5,))], "float32", 11) for s in senders])
    scatter_broadcast_sync(senders, receivers, verify=True)
    first = ray.get(receivers[0].weights.remote())
    ray.get([s.random_weights.remote([("a", (33, 7)), ("b", (5,))], "float32", 12) for s in senders])
    scatter_broadcast_sync(senders, receivers, verify=True)
    second = ray.get(receivers[2].weights.remote())
    assert not torch.equal(first["a"], second["a"])


def test_senders_must_agree(pools):
    senders, receivers = pools
    ray.get(senders[0].random_weights.remote([("a", (4,))], "float32", 1))
    ray.get(senders[1].random_weights.remote([("a", (5,))], "float32", 1))
    for sync in (naive_sync, scatter_broadcast_sync):
        with pytest.raises(WeightSyncError, match="sender 1"):
            sync(senders, receivers)
    with pytest.raises(WeightSyncError, match="sender"):
        naive_sync([], receivers)
