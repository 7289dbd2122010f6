"""Long-tail hand-off in the live control plane: a rollout that reports its tail frees
GPUs for the next queued rollout of its group; the state survives a restore; the HTTP
API and the SDK carry it."""
from __future__ import annotations

import json

from fastapi.testclient import TestClient

from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.runtime.control import ControlPlane
from rollmux.runtime.service import Service, ServiceConfig, create_app

ADMIN = "tail-admin"


def _cluster() -> Cluster:
    """One rollout and one training node: two jobs must share both."""
    return Cluster(rollout=PoolSpec("H20", 1.85, nodes=1), train=PoolSpec("H800", 5.28, nodes=1),
                   switch_cost=SwitchCost("fixed", 0.0, 0.0))


def _two_jobs() -> ControlPlane:
    cp = ControlPlane(_cluster())
    cp.submit(Job("a", 10.0, 2.0, slo=3.0, iterations=3), 0.0, "0" * 64)
    cp.submit(Job("b", 10.0, 2.0, slo=3.0, iterations=3), 0.0, "1" * 64)
    assert cp.record("a").grant.pool == "rollout" and cp.record("b").grant is None
    return cp


def _grants(cp: ControlPlane) -> list[tuple]:
    return [(e["job_id"], e["pool"], e["at"], e["detail"].get("share", 1.0))
            for e in cp.take_changes().events if e["kind"] == "grant"]


def test_below_the_threshold_nothing_is_handed_off():
    cp = _two_jobs()
    cp.take_changes()
    assert cp.tail("a", 0.5, 4.0) == 8
    assert cp.record("b").grant is None and _grants(cp) == []


def test_a_tail_hands_the_freed_gpus_to_the_next_rollout_and_the_donor_end_gives_it_the_node():
    """Hand-computed timeline (no switch cost, 8 GPUs per node, a keeps 8 // 8 = 1 GPU):
    a's rollout 0-10 reports its tail at 8: b starts at 8 on 7/8 of the node; a's rollout
    ends at 10: b owns the node (share 1); a trains 10-12 on T0; b's rollout ends at 13,
    after a's training: b trains 13-15."""
    cp = _two_jobs()
    cp.take_changes()
    assert cp.tail("a", 0.85, 8.0) == 1
    assert _grants(cp) == [("b", "rollout", 8.0, 0.875)]
    assert cp.tail("a", 0.9, 8.5) == 1, "a repeated report changes nothing"
    cp.release("a", "rollout", cp.record("a").grant.seq, 10.0, 10.0)
    assert cp.record("b").grant.share == 1.0
    assert _grants(cp) == [("a", "train", 10.0, 1.0)]
    cp.release("a", "train", cp.record("a").grant.seq, 2.0, 12.0)
    assert _grants(cp) == []  # a's next rollout waits: b holds the rollout node
    cp.release("b", "rollout", cp.record("b").grant.seq, 5.0, 13.0)
    assert _grants(cp) == [("a", "rollout", 13.0, 1.0), ("b", "train", 13.0, 1.0)]


def test_a_slice_that_ends_first_parks_its_training_behind_the_donors():
    """b's slice (8-9) ends before a's rollout (0-10): b's training is queued only at 10,
    just behind a's own training, as the plain rule would have ordered them."""
    cp = _two_jobs()
    cp.take_changes()
    cp.tail("a", 0.8, 8.0)
    cp.take_changes()
    cp.release("b", "rollout", cp.record("b").grant.seq, 1.0, 9.0)
    assert _grants(cp) == []
    cp.release("a", "rollout", cp.record("a").grant.seq, 10.0, 10.0)
    assert _grants(cp) == [("a", "train", 10.0, 1.0)]
    cp.release("a", "train", cp.record("a").grant.seq, 2.0, 12.0)
    # at 12 both are free: the rollout queue is served first (rule 4), then b's parked training
    assert _grants(cp) == [("a", "rollout", 12.0, 1.0), ("b", "train", 12.0, 1.0)]


def test_a_plane_restored_mid_tail_continues_exactly_as_the_original():
    original = _two_jobs()
    original.tail("a", 0.8, 8.0)
    original.take_changes()
    copy = ControlPlane.restore(json.loads(json.dumps(original.snapshot())))
    assert copy.snapshot() == original.snapshot()
    for cp in (original, copy):
        cp.release("b", "rollout", cp.record("b").grant.seq, 1.0, 9.0)
        cp.release("a", "rollout", cp.record("a").grant.seq, 10.0, 10.0)
        cp.release("a", "train", cp.record("a").grant.seq, 2.0, 12.0)
    assert copy.take_changes().events == original.take_changes().events
    assert copy.snapshot() == original.snapshot()


def test_the_http_api_reports_keep_gpus_and_slices(tmp_path):
    service = Service(_cluster(), str(tmp_path / "s.db"), ADMIN, ServiceConfig())
    with TestClient(create_app(service)) as client:
        h = {"Authorization": f"Bearer {ADMIN}"}
        spec = {"t_roll_s": 10.0, "t_train_s": 2.0, "slo": 3.0, "iterations": 3}
        a = client.post("/v1/jobs", json={"spec": {"job_id": "a", **spec, "tail_workers": 2}}, headers=h).json()
        client.post("/v1/jobs", json={"spec": {"job_id": "b", **spec}}, headers=h)
        ha = {"Authorization": f"Bearer {a['token']}"}
        assert client.post("/v1/jobs/a/acquire", json={"phase": "rollout"}, headers=ha).json()["granted"]
        r = client.post("/v1/jobs/a/tail", json={"fraction": 0.9}, headers=ha)
        assert r.status_code == 200 and r.json()["keep_gpus"] == 2, "the spec's tail_workers"
        b = client.post("/v1/jobs/b/acquire", json={"phase": "rollout"}, headers=h).json()
        assert b["granted"] and b["grant"]["share"] == 0.75
        refused = client.post("/v1/jobs/a/tail", json={"fraction": 1.5}, headers=ha)
        assert refused.status_code == 422 and refused.json()["field"] == "fraction"
        b_token_less = client.post("/v1/jobs/b/tail", json={"fraction": 0.9}, headers=h)
        assert b_token_less.json()["keep_gpus"] == 8, "a slice reports no tail of its own"
