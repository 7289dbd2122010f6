"""The job SDK against a real service on loopback (uvicorn in a thread of this process)."""
from __future__ import annotations

import threading
import time

import pytest

from loopback_server import ThreadServer
from rollmux import Client
from rollmux.model import Cluster, PoolSpec, SwitchCost
from rollmux.runtime.sdk import JobCancelled, LeaseLost, RequestRejected, ServerUnavailable

ADMIN = "sdk-admin"


@pytest.fixture
def srv(tmp_path):
    server = ThreadServer(Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                                  switch_cost=SwitchCost("fixed")), str(tmp_path / "state.db"), ADMIN,
                          lease_s=1.0, grace_s=0.5)
    server.start()
    yield server
    server.stop()


def _spec(job_id: str, iterations: int | None = 2) -> dict:
    return {"job_id": job_id, "t_roll_s": 0.05, "t_train_s": 0.05, "slo": 2.0, "iterations": iterations}


class FakeCache:
    """Any object with resident(key, device) works; this one records what happened when."""

    def __init__(self, log: list) -> None:
        self.log = log

    def resident(self, key, device):
        cache = self

        class _Resident:
            def __enter__(self):
                cache.log.append(("load", key, device))

            def __exit__(self, *exc):
                cache.log.append(("offload", key, device))

        return _Resident()


def test_phases_run_in_order_with_the_state_hook_inside_the_grant(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a", iterations=2))
    assert job.wait_placed(5)["rollout_nodes"] == ["R0"]
    log: list = []
    cache = FakeCache(log)

    @job.phase("train", state=cache, device="cpu")
    def train_step():
        log.append(("train", job.view["grant"]["pool"]))

    for _ in range(2):
        with job.phase("rollout") as ph:
            assert ph.grant["nodes"] == ["R0"]
        train_step()
    assert log == [("load", "a/train", "cpu"), ("train", "train"), ("offload", "a/train", "cpu")] * 2
    assert job.view["state"] == "done" and job.view["iterations_done"] == 2
    assert [h[0] for h in job.history] == ["rollout", "train"] * 2
    job.complete()


def test_phase_body_error_still_releases_the_grant(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a"))
    with pytest.raises(RuntimeError):
        with job.phase("rollout"):
            raise RuntimeError("trainer crashed")
    assert job.view["next_phase"] == "train" and job.view["grant"]["pool"] == "train"
    job.cancel()


def test_progress_is_recorded(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a", iterations=None))
    job.progress(0.25)
    assert Client(srv.url, ADMIN).status()["jobs"][0]["progress"] == 0.25
    job.complete()


def test_cancelled_job_raises_on_its_next_phase(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a"))
    Client(srv.url, ADMIN).cancel("a")
    with pytest.raises(JobCancelled, match="cancelled by the admin"):
        with job.phase("rollout"):
            pass


def test_job_without_heartbeat_gets_lease_lost(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a"), heartbeat=False)
    time.sleep(srv.lease_s + 0.5 + 1.2)
    with pytest.raises(LeaseLost):
        with job.phase("rollout"):
            pass


def test_heartbeat_keeps_an_idle_job_alive(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a"))
    time.sleep(srv.lease_s * 2)
    with job.phase("rollout"):
        pass
    job.cancel()


def test_bad_spec_is_rejected_with_its_field(srv):
    with pytest.raises(RequestRejected) as err:
        Client(srv.url, ADMIN).submit(dict(_spec("a"), t_train_s=0))
    assert err.value.status == 422 and err.value.field == "spec.t_train_s"


def test_client_reconnects_to_a_restarted_server(srv):
    job = Client(srv.url, ADMIN, give_up_s=10).submit(_spec("a", iterations=2))
    with job.phase("rollout"):
        srv.stop()
        restart = threading.Timer(0.5, srv.start)
        restart.start()
    restart.join()
    with job.phase("train"):
        pass
    assert job.view["iterations_done"] == 1


def test_server_that_stays_gone_raises_server_unavailable(srv):
    job = Client(srv.url, ADMIN, give_up_s=0.5).submit(_spec("a"), heartbeat=False)
    srv.stop()
    with pytest.raises(ServerUnavailable, match="no answer"):
        with job.phase("rollout"):
            pass
    srv.start()
