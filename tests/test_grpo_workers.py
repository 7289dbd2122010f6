"""The GRPO driver's workers under moves that fail: the job keeps its workers and its
state (``_Workers._relocate``), and follows the nodes the service placed it on after."""
from __future__ import annotations

import os

import pytest
import ray
import torch

from rollmux.grpo.driver import _Workers
from rollmux.grpo.policy import build_policy
from rollmux.grpo.profiles import ROLLOUT_HEAVY
from rollmux.runtime.ray_adapter import UnknownNodeError, demo_ray

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _slots(worker) -> dict[str, torch.Tensor]:
    return ray.get(worker.export_state.remote(), timeout=60)["slots"]


def test_a_move_to_nodes_that_cannot_take_the_workers_keeps_them_and_their_state():
    """The old workers were killed before the new ones started; when the start failed
    (a node Ray does not know), the exported state was dropped with them and every
    later phase of the job failed (ActorDiedError)."""
    profile = ROLLOUT_HEAVY
    weights = {k: v.detach().clone() for k, v in build_policy(profile.model, profile.seed).state_dict().items()}
    with demo_ray(["R0", "R1"], ["T0"], one_node=True):
        workers = _Workers("j", profile, {"group_id": "g1", "rollout_nodes": ["R0"], "train_nodes": ["T0"]},
                           weights, timeout_s=20.0)
        try:
            before = {pool: _slots(workers.actor(pool)) for pool in ("rollout", "train")}
            with pytest.raises(UnknownNodeError, match="R9"):
                workers.move({"from_group": "g1", "to_group": "g2", "rollout_nodes": ["R9"], "train_nodes": ["T0"],
                              "seq": 1})
            assert workers.where == (("R0",), ("T0",)) and workers.group_id == "g1" and workers.moves == []
            for pool, slots in before.items():
                after = _slots(workers.actor(pool))
                assert after.keys() == slots.keys() and all(torch.equal(after[k], slots[k]) for k in slots)
            # the service placed the job afresh (on R1): the workers follow it there, state and all
            workers.follow({"group_id": "g3", "rollout_nodes": ["R1"], "train_nodes": ["T0"]})
            assert workers.where == (("R1",), ("T0",)) and workers.runner.placement.rollout_nodes == ("R1",)
            after = _slots(workers.train)
            assert all(torch.equal(after[k], before["train"][k]) for k in before["train"])
            runner = workers.runner
            workers.follow({"group_id": "g3", "rollout_nodes": ["R1"], "train_nodes": ["T0"]})
            assert workers.runner is runner  # already there: nothing moves
        finally:
            workers.shutdown()
