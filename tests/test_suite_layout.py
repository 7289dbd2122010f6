"""The suite's own layout: every test module that starts processes, servers, Ray or a real
framework, or reads the wall clock, is in ``conftest.SERIAL_MODULES`` (``make test`` runs
those alone, after the others ran two at a time)."""
from __future__ import annotations

import re
from pathlib import Path

from conftest import SERIAL_MODULES

#: what a live test module contains (imports and calls that start or time something)
LIVE = re.compile(r"time\.sleep|monotonic|TestClient|httpx|subprocess|Popen|socket|uvicorn|import ray|ray\.init"
                  r"|local_cluster|run_demo|run_move_demo|run_rollart|import torch|importorskip\(\"(torch|ray|trl)")


def test_serial_marks_cover_every_live_module():
    here = Path(__file__).parent
    live = {p.stem for p in here.glob("test_*.py") if p.name != Path(__file__).name and LIVE.search(p.read_text())}
    assert live - SERIAL_MODULES == set(), "add these to conftest.SERIAL_MODULES"
    assert SERIAL_MODULES <= {p.stem for p in here.glob("test_*.py")}, "SERIAL_MODULES names a missing module"
