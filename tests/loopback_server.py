"""The RollMux service on a fixed 127.0.0.1 port, in a thread, for networked tests.

``stop()`` then ``start()`` again resumes the same state file (a restart); ``start`` is
``open`` (restore) then ``serve``, so a test can look at the restored state before any
client reaches it. Start-up and shutdown are bounded in time."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn

from rollmux.model import Cluster
from rollmux.runtime.service import Service, ServiceConfig, server_config


def free_port() -> int:
    """A 127.0.0.1 port nothing listens on now (the kernel's pick, released at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    def __init__(self, cluster: Cluster, path: str, admin: str, lease_s: float, grace_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cluster, self.path, self.admin = cluster, path, admin
        self.lease_s, self.grace_s = lease_s, grace_s

    def start(self) -> None:
        self.open()
        self.serve()

    def open(self) -> None:
        """Open the service on the state file (a restart restores it here), not yet serving."""
        self.service = Service(self.cluster, self.path, self.admin,
                               ServiceConfig(lease_s=self.lease_s, grace_s=self.grace_s))

    def serve(self) -> None:
        self.server = uvicorn.Server(server_config(self.service, "127.0.0.1", self.port))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            assert self.thread.is_alive(), "server thread died"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive()


class LoseAnswer(httpx.BaseTransport):
    """Passes every request to the service, but answers the ``nth`` one to ``path`` with a
    502, as a proxy whose upstream timed out would: the change is made, its answer lost."""

    def __init__(self, path: str, nth: int = 1) -> None:
        self.inner, self.path, self.nth, self.seen, self.lost = httpx.HTTPTransport(), path, nth, 0, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == self.path:
            self.seen += 1
            if self.seen == self.nth:
                response.read()
                response.close()
                self.lost += 1
                return httpx.Response(502, request=request)
        return response
