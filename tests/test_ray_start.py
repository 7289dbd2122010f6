"""rollmux.runtime.ray_start: a Ray start that timed out is cleaned up and tried again;
nothing else is retried. Real child processes stand in for the raylet and GCS."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

pytest.importorskip("ray")
from rollmux.runtime.ray_start import is_start_timeout, start_ray  # noqa: E402 (needs ray)

TIMEOUT = "The current node timed out during startup. This could happen because ..."
PORT_FILE = "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_0a1b"


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_timed_out_start_is_reaped_and_retried():
    survivor = _sleeper()  # there before the start: must be left alone
    spawned: list[subprocess.Popen] = []

    def start() -> str:
        spawned.append(_sleeper())
        if len(spawned) == 1:
            raise Exception(TIMEOUT)
        if len(spawned) == 2:  # the GCS server started, its port file not written in time
            raise RuntimeError(PORT_FILE)
        return "up"

    try:
        assert start_ray(start, wait_s=0) == "up"
        assert len(spawned) == 3
        for proc in spawned[:2]:  # the failed attempts' processes are gone, and reaped (no zombie)
            assert not psutil.pid_exists(proc.pid)
        assert spawned[2].poll() is None and survivor.poll() is None
    finally:
        for proc in [survivor, *spawned]:
            proc.kill()
            proc.wait()


def test_the_last_timeout_is_raised_after_every_attempt():
    calls = []

    def start() -> None:
        calls.append(1)
        raise Exception(TIMEOUT)

    with pytest.raises(Exception, match="timed out during startup"):
        start_ray(start, attempts=2, wait_s=0)
    assert len(calls) == 2


@pytest.mark.parametrize("err", [RuntimeError(TIMEOUT), ValueError("bad address"), Exception("other"),
                                 Exception(PORT_FILE), RuntimeError("other " + PORT_FILE)])
def test_other_errors_pass_through_at_once_and_kill_nothing(err):
    calls, spawned = [], []

    def start() -> None:
        calls.append(1)
        spawned.append(_sleeper())
        raise err

    try:
        with pytest.raises(type(err)) as caught:
            start_ray(start, wait_s=0)
        assert caught.value is err and len(calls) == 1
        assert spawned[0].poll() is None
    finally:
        spawned[0].kill()
        spawned[0].wait()


def test_only_the_two_timeouts_count_and_attempts_must_be_positive():
    assert is_start_timeout(Exception(TIMEOUT)) and is_start_timeout(RuntimeError(PORT_FILE))
    assert not is_start_timeout(RuntimeError(TIMEOUT)) and not is_start_timeout(Exception("timed out"))
    with pytest.raises(ValueError, match="attempts"):
        start_ray(lambda: None, attempts=0)
