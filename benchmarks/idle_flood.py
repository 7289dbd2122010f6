"""Silent connections against ``rollmux serve``: does the service come back by itself?

A client that connects and sends nothing holds a file descriptor of the service. uvicorn
closes such a connection never (a new one gets no timer); ``--header-timeout-s`` closes
it. For each header timeout of ``--timeouts`` (the first is meant as "none", 3600 s): the
service runs in a subprocess with its descriptors limited (``ulimit -n --fd-limit``) on a
free 127.0.0.1 port and a fresh state file; ``--connections`` sockets connect and send
nothing; then ``GET /healthz`` is tried at once (during the flood) and again
``--after-s`` seconds later (each with a 5 s timeout), and the flood's sockets are
counted as closed by the server or not. One table, one row per timeout.

    python benchmarks/idle_flood.py [--connections 300] [--fd-limit 128] [--timeouts 3600,3]
                                    [--after-s 4]
"""
from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def health(port: int) -> str:
    """``GET /healthz``'s status, or the error's name."""
    try:
        return str(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code)
    except httpx.HTTPError as err:
        return type(err).__name__


def flood(timeout_s: float, connections: int, fd_limit: int, after_s: float) -> tuple[int, str, str, int]:
    """(connections opened, health during, health after, closed by the server)."""
    port = free_port()
    rollmux = Path(sys.executable).with_name("rollmux")
    with tempfile.TemporaryDirectory(prefix="rollmux-flood-") as tmp:
        env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=secrets.token_hex(16))
        cmd = (f"ulimit -n {fd_limit}; exec {rollmux} serve --state {tmp}/state.db --port {port} "
               f"--header-timeout-s {timeout_s:g}")
        server = subprocess.Popen(["bash", "-c", cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        socks: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 60
            while health(port) != "200":
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"rollmux serve did not start on port {port}")
                time.sleep(0.2)
            for _ in range(connections):
                sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                socks.append(sock)
            during = health(port)
            time.sleep(after_s)
            after = health(port)
            closed = 0
            for sock in socks:
                sock.setblocking(False)
                try:
                    closed += sock.recv(1) == b""
                except BlockingIOError:
                    pass
                except OSError:
                    closed += 1
            return len(socks), during, after, closed
        finally:
            for sock in socks:
                sock.close()
            server.terminate()
            server.wait(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--fd-limit", type=int, default=128)
    ap.add_argument("--timeouts", default="3600,3", help="--header-timeout-s values, comma separated")
    ap.add_argument("--after-s", type=float, default=4.0)
    args = ap.parse_args()
    try:
        timeouts = [float(t) for t in args.timeouts.split(",") if t]
        valid = bool(timeouts) and all(0.1 <= t <= 3600 for t in timeouts)
    except ValueError:
        valid = False
    if not valid:
        ap.error(f"--timeouts {args.timeouts!r}: expected comma-separated seconds from 0.1 to 3600 "
                 "(rollmux serve --header-timeout-s), e.g. 3600,3")
    if not args.after_s >= 0:
        ap.error(f"--after-s {args.after_s:g}: expected seconds >= 0")
    print(f"{args.connections} silent connections against rollmux serve (ulimit -n {args.fd_limit}); "
          f"GET /healthz during the flood and {args.after_s:g} s later")
    print(f"{'--header-timeout-s':>18} {'opened':>7} {'during':>20} {'after':>20} {'closed by server':>17}")
    for timeout_s in timeouts:
        opened, during, after, closed = flood(timeout_s, args.connections, args.fd_limit, args.after_s)
        print(f"{timeout_s:>18g} {opened:>7} {during:>20} {after:>20} {closed:>17}")


if __name__ == "__main__":
    main()
