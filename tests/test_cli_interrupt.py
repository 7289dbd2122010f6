"""Ctrl-C during ``rollmux plan``'s regrouping: the first stops it between exact solves and
the plan so far is printed and written; a second aborts as usual."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollmux.cli_output import first_interrupt_stops

ROLLMUX = str(Path(sys.executable).with_name("rollmux"))


def test_the_first_interrupt_only_sets_the_event_and_the_second_raises():
    before = signal.getsignal(signal.SIGINT)
    with first_interrupt_stops("the test stops") as seen:
        assert not seen.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        assert seen.wait(10)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            seen.wait(10)  # (the handler runs in this thread, here at the latest)
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_while_regrouping_keeps_the_plan_so_far(tmp_path):
    """Bounds no run reaches here (100,000 solves, 10 minutes: production has hundreds of
    groups); the interrupt is sent once the command says it is regrouping."""
    out = tmp_path / "plan.json"
    proc = subprocess.Popen([ROLLMUX, "plan", "--jobs", "production", "--no-explain", "--improve-solves", "100000",
                             "--improve-s", "600", "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        assert first.startswith("regrouping: at most 100000 exact solves"), first
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Ctrl-C: regrouping stops after the exact solve under way" in stderr
    said = [line for line in stdout.splitlines() if line.startswith("improvement:")]
    assert len(said) == 1 and said[0].endswith("(stopped by Ctrl-C)"), said
    plan = json.loads(out.read_text())
    improvement = plan["improvement"]
    assert (improvement["limit"], improvement["local_optimum"]) == ("interrupted", False)
    assert improvement["solves"] < 100_000 and plan["cost_per_hour"] == pytest.approx(improvement["cost_after"])
    assert f"-> ${improvement['cost_after']:,.2f}/h" in said[0]
    assert len({j["job_id"] for g in plan["groups"] for j in g["jobs"]}) + len(plan["waiting"]) == 200
