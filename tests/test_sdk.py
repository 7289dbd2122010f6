"""The job SDK against a real service on loopback (uvicorn in a thread of this process)."""
from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time

import httpx
import pytest

from loopback_server import LoseAnswer, ThreadServer
from rollmux import Client
from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.runtime.sdk import (MIN_ATTEMPT_S, ClientError, JobCancelled, JobHandle, LeaseLost, NotRollMux,
                                 RequestRejected, ServerUnavailable)

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


def test_phase_body_error_releases_the_grant_as_failed_and_the_phase_is_due_again(srv):
    """A body that raises gives its grant back as failed: nothing is counted and the job
    is due for the same phase, so a retry starts where it stopped (before, the failed
    rollout counted as done and a retried rollout was refused 409 'due for train'; a
    failed training counted as an iteration)."""
    job = Client(srv.url, ADMIN).submit(_spec("a"))
    for name in ("rollout", "train"):
        with pytest.raises(RuntimeError):
            with job.phase(name):
                raise RuntimeError("trainer crashed")
        assert job.view["next_phase"] == name and job.view["iterations_done"] == 0
        with job.phase(name) as ph:  # the retry: granted again, on the same nodes
            assert ph.grant["pool"] == name
    assert job.view["iterations_done"] == 1
    events = [e for e in Client(srv.url, ADMIN).events() if e["job_id"] == "a" and e["kind"] == "finish"]
    assert [bool(e["detail"].get("failed")) for e in events] == [True, False, True, False]
    job.cancel()


def test_an_asynchronous_jobs_failed_rollout_is_not_counted_as_started(srv):
    job = Client(srv.url, ADMIN).submit(_spec("a") | {"staleness": 1})
    with pytest.raises(RuntimeError):
        with job.phase("rollout"):
            raise RuntimeError("generation crashed")
    pipe = job.view["pipeline"]  # (the rollout may be granted again already: started 0 or 1)
    assert (pipe["rollouts_started"] <= 1, pipe["rollouts_done"], job._started, job._rolled) == (True, 0, 0, 0)
    with job.phase("rollout"):
        pass
    with job.phase("train"):
        pass
    assert (job.view["iterations_done"], job.view["pipeline"]["rollouts_done"]) == (1, 1)
    job.cancel()


class FailingCache:
    """A state hook whose load raises, as a CUDA out of memory would."""

    def resident(self, key, device):
        class _Resident:
            def __enter__(self):
                raise MemoryError("CUDA out of memory")

            def __exit__(self, *exc):
                raise AssertionError("never entered: never left")

        return _Resident()


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_state_hook_that_fails_on_entry_gives_the_grant_back_at_once(srv, staleness):
    """The grant was held with nothing to release it (the job kept heartbeating), so the
    other member of its group waited for good; now it is released as failed at once."""
    client = Client(srv.url, ADMIN)
    a = client.submit(_spec("a", iterations=None) | {"staleness": staleness})
    b = client.submit(_spec("b", iterations=None))
    shared = a.wait_placed(5)["rollout_nodes"] == b.wait_placed(5)["rollout_nodes"]
    assert shared or staleness  # (an asynchronous job may get a group of its own)
    with pytest.raises(MemoryError):
        with a.phase("rollout", state=FailingCache(), device="cpu"):
            raise AssertionError("the body must not run")
    ended = [e for e in client.events() if e["job_id"] == "a" and e["kind"] == "finish"]
    assert [(e["pool"], e["detail"].get("failed")) for e in ended] == [("rollout", True)]
    granted = threading.Event()

    def b_rollout() -> None:  # on a thread: without the fix it waited for good
        with b.phase("rollout"):
            granted.set()

    thread = threading.Thread(target=b_rollout, daemon=True)
    thread.start()
    assert granted.wait(10)
    thread.join(10)
    with a.phase("rollout"):  # the retry (e.g. on the host) is granted: the handle holds no phase
        pass
    a.cancel()
    b.cancel()


class RefusingCache:
    """A state hook whose ``resident`` checks its arguments before it makes the context."""

    def resident(self, key, device):
        raise ValueError(f"device={device!r}: this hook offloads to cuda only")


def test_a_state_hook_that_fails_when_asked_for_its_context_gives_the_grant_back(srv):
    """``resident(key, device)`` itself raising (or a ``state=`` without ``resident``) left
    the grant held: the next phase was ``PhaseBusy`` for good and the node stayed held."""
    client = Client(srv.url, ADMIN)
    a = client.submit(_spec("a", iterations=None))
    a.wait_placed(5)
    for state, error in ((RefusingCache(), ValueError), (object(), AttributeError)):
        with pytest.raises(error):
            with a.phase("rollout", state=state, device="cpu"):
                raise AssertionError("the body must not run")
    ended = [e for e in client.events() if e["job_id"] == "a" and e["kind"] == "finish"]
    assert [(e["pool"], e["detail"].get("failed")) for e in ended] == [("rollout", True)] * 2
    with a.phase("rollout"):  # granted again: the handle holds no phase
        pass
    a.cancel()


def test_a_synchronous_handle_refuses_a_second_phase_from_another_thread(srv):
    from rollmux.runtime.sdk import PhaseBusy

    job = Client(srv.url, ADMIN).submit(_spec("a", iterations=None))
    inside, errors = threading.Event(), []

    def other() -> None:
        inside.wait(5)
        try:
            with job.phase("rollout"):
                errors.append("entered")
        except PhaseBusy as err:
            errors.append(str(err))

    thread = threading.Thread(target=other)
    thread.start()
    with job.phase("rollout"):
        inside.set()
        thread.join(10)
    assert len(errors) == 1 and "one phase at a time" in errors[0], errors
    assert job.view["next_phase"] == "train" and [h[0] for h in job.history] == ["rollout"]
    with job.phase("train"):  # the handle goes on
        pass
    job.cancel()


def test_a_release_that_fails_never_hides_the_bodys_exception(srv):
    job = Client(srv.url, ADMIN, give_up_s=0.3).submit(_spec("a"), heartbeat=False)
    with pytest.raises(ValueError, match="bad batch") as err:
        with job.phase("rollout"):
            srv.stop()
            raise ValueError("bad batch")
    assert any("releasing the rollout grant failed too: ServerUnavailable" in n for n in err.value.__notes__)


@pytest.mark.parametrize("kwargs, needle", [
    ({"url": "127.0.0.1:8470"}, "url='127.0.0.1:8470': expected the service's address"),
    ({"url": None}, "url=None"),
    ({"url": "http://"}, "url='http://': expected the service's address"),  # (no host)
    ({"timeout_s": -1}, "timeout_s=-1: expected seconds"),
    ({"give_up_s": float("nan")}, "give_up_s=nan"),
    ({"poll_s": 60}, "poll_s=60: expected seconds from 0 to 30"),
    ({"token": 5}, "token: expected one word of printable ASCII"),
    ({"token": "abc\ndef"}, "got a string of 7 characters with a space or line break"),  # (never shown)
])
def test_client_arguments_the_service_could_never_take_are_refused_naming_them(kwargs, needle):
    args = {"url": "http://127.0.0.1:1"} | kwargs
    t0 = time.monotonic()
    with pytest.raises(ValueError) as err:
        Client(**args)
    assert needle in str(err.value) and time.monotonic() - t0 < 1  # (a bad url was retried for give_up_s)


def test_job_arguments_are_checked_before_any_request(srv):
    import numpy as np

    client = Client(srv.url, ADMIN)
    with pytest.raises(TypeError, match="spec: expected a dict"):
        client.submit(["a"])
    with pytest.raises(ValueError, match=r"spec.t_roll_s=nan: expected a finite number"):
        client.submit(_spec("a") | {"t_roll_s": float("nan")})
    with pytest.raises(TypeError, match="on_move='nope'"):
        client.submit(_spec("a"), on_move="nope")
    with pytest.raises(ValueError, match=r"job_id='../status'"):
        client.attach("../status", "token")
    job = client.submit(_spec("a") | {"iterations": np.int64(3), "slo": np.float32(2.0)})  # numpy scalars
    assert job.view["iterations"] == 3
    with pytest.raises(ValueError, match="fraction=nan"):
        job.progress(float("nan"))
    job.progress(np.float64(0.5))
    job.cancel()


def test_the_sdks_longest_poll_is_the_services():
    from rollmux.runtime.api_models import MAX_WAIT_S
    from rollmux.runtime.sdk import MAX_POLL_S

    assert MAX_POLL_S == MAX_WAIT_S


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


def test_a_handle_outlives_an_outage_longer_than_give_up_s(srv):
    """The service down for 2.5 s, give_up_s 0.5 s: the job's own calls meanwhile raise
    ServerUnavailable, but its heartbeats go on, so once the service is back the handle
    works (it was failed for good, and the job then expired: lost to a slow restart)."""
    job = Client(srv.url, ADMIN, give_up_s=0.5).submit(_spec("a", iterations=2))
    with job.phase("rollout"):
        pass
    srv.stop()
    with pytest.raises(ServerUnavailable):
        job.progress(0.1)
    time.sleep(2.0)
    srv.start()
    with job.phase("train"):
        pass
    assert job.view["iterations_done"] == 1
    time.sleep(2.0)  # lease 1 s + grace 0.5 s: alive only if the heartbeats came back
    assert Client(srv.url, ADMIN).job("a")["state"] == "placed"
    job.cancel()


def test_server_that_stays_gone_raises_server_unavailable(srv):
    job = Client(srv.url, ADMIN, give_up_s=0.5).submit(_spec("a"), heartbeat=False)
    srv.stop()
    with pytest.raises(ServerUnavailable, match="no answer"):
        with job.phase("rollout"):
            pass
    srv.start()


def test_an_add_node_whose_answer_was_lost_adds_one_node_when_retried(srv):
    """The SDK retries a 502; the add had been made, and a counted pool gave the retry
    the next node too (one call, two nodes). Now the retry carries the same request id
    and gets the first answer."""
    client = Client(srv.url, ADMIN)
    lossy = LoseAnswer("/v1/admin/nodes")
    client._http = httpx.Client(base_url=client.url, transport=lossy)
    answer = client.add_node("train")
    assert lossy.lost == 1 and answer["node"] == "T2"
    assert Client(srv.url, ADMIN).status()["nodes"]["train"]["free"] == 3
    assert client.add_node("train")["node"] == "T3"  # a new call: a new node
    assert Client(srv.url, ADMIN).status()["nodes"]["train"]["free"] == 4


def _answering(status: int, body: bytes, content_type: str = "application/json", **headers: str) -> Client:
    """A client whose every request is answered ``status`` with ``body`` (no service)."""
    client = Client("http://127.0.0.1:9", ADMIN, give_up_s=0)
    reply = httpx.Response(status, content=body, headers={"content-type": content_type, **headers})
    client._http = httpx.Client(base_url=client.url, transport=httpx.MockTransport(lambda _request: reply))
    return client


@pytest.mark.parametrize("status, body, content_type, headers, call", [
    (200, b"<html>proxy page</html>", "text/html", {}, "status"),
    (302, b"", "text/plain", {"location": "http://127.0.0.1:1/"}, "status"),
    (200, b"null", "application/json", {}, "status"),
    (200, b"{}", "application/json", {}, "jobs"),
    (200, b"{}", "application/json", {}, "submit"),
    (200, b'{"state": "placed"}', "application/json", {}, "job"),
    (400, b"[1,2,3]", "application/json", {}, "status"),
    (403, b'"forbidden"', "application/json", {}, "submit"),
    (410, b"[]", "application/json", {}, "cancel"),
    (404, b"<html>not found</html>", "text/html", {}, "job"),
])
def test_an_answer_that_is_not_rollmuxs_api_raises_not_rollmux_naming_what_came(status, body, content_type, headers,
                                                                                call):
    """A proxy's page, a redirect or JSON of another shape was a JSONDecodeError, an
    AttributeError ('list' has no 'get'), a KeyError ('job_id') or a TypeError (null)."""
    client = _answering(status, body, content_type, **headers)
    calls = {"status": client.status, "jobs": client.jobs, "job": lambda: client.job("j1"),
             "cancel": lambda: client.cancel("j1"), "submit": lambda: client.submit(_spec("j1"), heartbeat=False)}
    with pytest.raises(NotRollMux) as err:
        calls[call]()
    text = str(err.value)
    assert err.value.status == status and "http://127.0.0.1:9/v1/" in text and "not RollMux's API" in text, text
    assert f"HTTP {status}" in text and content_type in text and repr(body[:60]) in text, text
    assert headers.get("location", "") in text


def test_a_410_naming_a_jobs_end_on_a_call_that_is_not_a_jobs_is_a_refusal_not_a_crash():
    """The job id was read from the path's fourth part: /v1/status has none (IndexError)."""
    with pytest.raises(RequestRejected) as err:
        _answering(410, b'{"state": "done", "reason": "x"}').status()
    assert err.value.status == 410
    with pytest.raises(JobCancelled) as ended:  # a job's own call: its end, as before
        _answering(410, b'{"state": "cancelled", "reason": "by admin"}').job("j1")
    assert ended.value.job_id == "j1" and ended.value.reason == "by admin"


def test_only_a_train_phase_may_restart_its_iteration_on_failure(srv):
    job = Client(srv.url, ADMIN).submit(_spec("r", iterations=None))
    with pytest.raises(ValueError, match="restart_on_failure with phase='rollout'"):
        job.phase("rollout", restart_on_failure=True)
    with pytest.raises(RuntimeError):
        with job.phase("rollout"):
            raise RuntimeError("a failed rollout is due again")
    assert job.view["next_phase"] == "rollout"
    job.cancel()


def test_a_job_follows_a_restart_with_a_shorter_lease(tmp_path):
    """Beats were every quarter of the lease the submit's answer stated, for good: a service
    restarted with a shorter ``--lease-s`` (8 s -> 0.5 s, grace 1 s) expired every idle job.
    Now each answer stating the lease re-derives the period, and beats unanswered during
    the outage come every ``RECONNECT_S``, so the restarted service hears from the job
    in time and the job runs its phases to completion (a phase body longer than the new
    lease + grace included)."""
    server = ThreadServer(Cluster(rollout=PoolSpec("H20", 1.85, nodes=1), train=PoolSpec("H800", 5.28, nodes=1),
                                  switch_cost=SwitchCost("fixed")), str(tmp_path / "state.db"), ADMIN,
                          lease_s=8.0, grace_s=1.0)
    server.start()
    try:
        job = Client(server.url, ADMIN, give_up_s=10).submit(_spec("a", iterations=2))
        for name in ("rollout", "train"):
            with job.phase(name):
                pass
        server.stop()
        time.sleep(2.2)  # longer than the old period (2 s): a beat goes unanswered
        server.lease_s = 0.5
        server.start()
        time.sleep(4.0)  # only heartbeats: the old period (2 s) exceeds the new lease + grace (1.5 s)
        assert Client(server.url, ADMIN).job("a")["state"] == "placed"
        with job.phase("rollout"):
            time.sleep(2.0)
        with job.phase("train"):
            pass
        assert (job.view["state"], job.view["iterations_done"], job.view["lease_s"]) == ("done", 2, 0.5)
    finally:
        server.stop()


class _Hung:
    """A loopback socket that takes connections (the kernel's backlog) and never answers,
    as a SIGSTOPped service does."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def test_give_up_s_bounds_a_call_to_a_service_that_never_answers():
    """The clock started after the first attempt had timed out, and every retry waited a
    whole attempt timeout (a long poll: poll_s + timeout_s), so give_up_s 0.5 s with
    timeout_s 5 s gave up after 10 s or more, saying "no answer for 0.5s". Now no attempt
    outlasts give_up_s and the message names the seconds measured."""
    hung = _Hung()
    try:
        client = Client(hung.url, ADMIN, timeout_s=5.0, give_up_s=0.5, poll_s=10.0)
        job = JobHandle(client, "a", "t" * 32, {"job_id": "a", "state": "placed"}, heartbeat=False)
        for call in (client.status, lambda: job.phase("rollout").__enter__()):  # a plain call, a long poll
            t0 = time.monotonic()
            with pytest.raises(ServerUnavailable) as err:
                call()
            waited = time.monotonic() - t0
            assert 0.5 <= waited < 0.5 + MIN_ATTEMPT_S + 0.3, waited
            said = float(re.search(r"no answer within ([0-9.]+)s \(ReadTimeout", str(err.value)).group(1))
            assert abs(said - waited) < 0.1, (said, waited, str(err.value))
    finally:
        hung.close()


def test_a_5xx_is_reported_as_the_answer_it_was_not_as_no_answer():
    with pytest.raises(ServerUnavailable) as err:
        _answering(503, b"{}").status()
    assert "answered HTTP 503 Service Unavailable" in str(err.value) and "no answer" not in str(err.value)


def _fill(client: Client, job_id: str, **kwargs) -> JobHandle:
    """A job as wide as both pools (two nodes of eight GPUs each) that shares them with no
    other (SLO 1, and a rollout too long to hide another's: any sharing slows it): a
    second one waits."""
    wide = {"rollout_gpus": 16, "train_gpus": 16, "t_roll_s": 10.0, "t_train_s": 1.0, "slo": 1.0}
    return client.submit(_spec(job_id, iterations=None) | wide, **kwargs)


def test_wait_placed_raises_the_end_of_a_job_that_departed_while_it_waited(srv):
    """A handle without heartbeats (``heartbeat=False``, or an ``attach`` to a job that is
    no longer live) never learnt of the end: wait_placed polled until its timeout."""
    admin = Client(srv.url, ADMIN)
    _fill(admin, "a")
    waiting = _fill(admin, "b", heartbeat=False)
    other = _fill(admin, "c", heartbeat=False)
    assert waiting.view["state"] == other.view["state"] == "waiting"
    admin.cancel("b")
    admin.cancel("c")
    for handle in (waiting, Client(srv.url).attach("c", other.token)):
        t0 = time.monotonic()
        with pytest.raises(JobCancelled, match="cancelled by the admin"):
            handle.wait_placed(timeout_s=5)
        assert time.monotonic() - t0 < 2


def test_a_job_object_carries_every_field_the_api_spec_takes(srv):
    """``submit(rollmux.model.Job(...))`` dropped ``tail_workers``: the rollout's tail kept
    an eighth of its GPUs. Every field that the API's job spec and ``Job`` share must
    reach the service; the two jobs below set each one off its default."""
    from rollmux.runtime.api_models import JobSpec

    shared = set(JobSpec.model_fields) & {f.name for f in dataclasses.fields(Job)}
    jobs = [Job("j1", 0.05, 0.05, rollout_gpus=16, train_gpus=8, mem_roll_gb=10.0, mem_train_gb=20.0, slo=3.0,
                model="7B", iterations=3, tail_workers=4, staleness=1, reward_s=0.01, reward_price_per_hour=2.0,
                reward_mem_gb=5.0),
            Job("j2", 0.05, 0.05, train_gpus=16, iterations=3, colocate=True)]
    default = Job("default", 1.0, 1.0)
    for name in shared - {"job_id", "t_roll_s", "t_train_s"}:
        assert any(getattr(j, name) != getattr(default, name) for j in jobs), f"no job sets {name}"
    client = Client(srv.url, ADMIN)
    for job in jobs:
        handle = client.submit(job)
        held = srv.service.control.jobs[job.job_id].job
        assert {n: getattr(held, n) for n in shared} == {n: getattr(job, n) for n in shared}
        handle.cancel()


@pytest.mark.parametrize("token, kind", [("t" * 43 + "\n", "with a space or line break"),
                                         ("tökén-" * 8, "with other than printable ASCII"),
                                         (None, "NoneType"), (12345, "int")])
def test_attach_refuses_what_no_token_is_naming_it_and_never_showing_it(srv, token, kind):
    """A token read from a file with its newline was retried for give_up_s as an outage
    (httpx's LocalProtocolError), the message showing the token; a non-ASCII one raised
    UnicodeEncodeError."""
    client = Client(srv.url, ADMIN, give_up_s=5)
    job = client.submit(_spec("a"))
    t0 = time.monotonic()
    with pytest.raises(ValueError) as err:
        client.attach("a", token)
    text = str(err.value)
    assert text.startswith("token: expected one word of printable ASCII") and kind in text, text
    assert "ttt" not in text and "tök" not in text and time.monotonic() - t0 < 1
    job.cancel()


def test_a_request_that_is_not_valid_http_is_refused_at_once_without_its_header(srv):
    """(what attach's check now keeps out) such a request was retried for give_up_s as an
    outage, and the message showed the header: the token."""
    t0 = time.monotonic()
    with pytest.raises(ClientError) as err:
        Client(srv.url, give_up_s=5).call("GET", "/status", token="secret-part\nrest")
    assert "not valid HTTP" in str(err.value) and "secret" not in str(err.value)
    assert not isinstance(err.value, ServerUnavailable) and time.monotonic() - t0 < 1


def test_phase_and_wait_arguments_are_checked_before_any_request(srv):
    import numpy as np

    client = Client(srv.url, ADMIN)
    job = client.submit(_spec("a", iterations=None) | {"colocate": np.bool_(False)})  # numpy's bool too
    for bad in (-1, float("nan"), "5"):
        with pytest.raises(ValueError, match="timeout_s="):
            job.phase("rollout", timeout_s=bad)
        with pytest.raises(ValueError, match="timeout_s="):
            job.wait_placed(timeout_s=bad)
    with job.phase("rollout") as ph:
        for bad in (float("nan"), "0.5", 2.0, True):  # (NaN was httpx's raw error; the others a 422)
            with pytest.raises(ValueError, match="done_fraction=.*: expected a number from 0 to 1"):
                ph.tail(bad)
        assert ph.tail(np.float64(0.5)) == 8  # below the threshold: every GPU kept
    job.cancel()
