"""The benchmark scripts refuse a bad argument before any work: exit status 2, the
parser's one-line error naming the option, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    ("bounded_waits", ["--configs", "production:24x16"], "--configs"),
    ("bounded_waits", ["--configs", "production:12x8:0"], "--configs"),
    ("bounded_waits", ["--configs", "nosuch:12x8:40"], "--configs"),
    ("bounded_waits", ["--configs", "production:12x8:40", "--policies", "nosuch"], "--policies"),
    ("queue_backfill", ["--configs", "production:12x8"], "--configs"),
    ("queue_backfill", ["--configs", "production:12x8:40", "--policies", "nosuch"], "--policies"),
    ("bounded_regroup", ["--clusters", "12x10"], "--clusters"),
    ("bounded_regroup", ["--clusters", "12x10:40", "--policies", "nosuch"], "--policies"),
    ("colocation_split", ["--thresholds", "abc"], "--thresholds"),
    ("colocation_split", ["--trace", "nosuch"], "--trace"),
    ("colocation_split", ["--policy", "nosuch"], "--policy"),
    ("idle_flood", ["--timeouts", "abc"], "--timeouts"),
    ("state_switch", ["--cycles", "0"], "--cycles"),
    ("state_switch", ["--cycles", "1"], "--cycles"),
    ("state_switch", ["--max-params", "abc"], "--max-params"),
    ("control_plane", ["--clients", "0"], "--clients"),
    ("control_plane", ["--run-s", "0"], "--run-s"),
    ("control_plane", ["--commit-rounds", "0"], "--commit-rounds"),
    ("control_plane", ["--heavy-submits", "0"], "--heavy-submits"),
    ("control_plane", ["--client-procs", "0"], "--client-procs"),
    ("long_tail", ["--trace", "nosuch"], "--trace"),
    ("long_tail", ["--policies", "nosuch"], "--policies"),
    ("slo_orders", ["--mix", "nosuch"], "--mix"),
    ("service_load", ["--policies", "nosuch"], "--policies"),
]


@pytest.mark.parametrize(("script", "argv", "option"), BAD, ids=[f"{s} {' '.join(a)}" for s, a, _ in BAD])
def test_a_bad_argument_is_refused_by_the_parser(script, argv, option):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")]))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *argv], capture_output=True,
                         text=True, env=env, timeout=60)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert run.stdout == ""  # refused before any work
    assert run.stderr.splitlines()[-1].startswith(f"{script}.py: error: {option}"), run.stderr[-2000:]
