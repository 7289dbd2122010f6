"""benchmarks/bounded_waits.py: `rollmux-hedge` with and without its gathering of jobs
alone when the waiting line's head is refused, on a fixed cluster where that matters."""
from __future__ import annotations

import sys
from pathlib import Path


def test_the_trigger_meets_more_slos_where_the_training_pool_binds(benchmark_script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    bench = benchmark_script("bounded_waits")
    monkeypatch.setattr(sys, "argv", ["bounded_waits.py", "--configs", "production:16x14:60"])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    rows = {line[:49].split("16x14:60", 1)[1].strip(): line[49:].split() for line in out if "16x14:60" in line}
    assert set(rows) == {"hedge", "hedge, no wait trigger", "rollmux-regroup"}
    slo = {k: float(v[1].rstrip("%")) for k, v in rows.items()}
    regroupings = {k: int(v[3]) for k, v in rows.items()}
    # the first 60 production jobs on 16 H20 + 14 H800 nodes: jobs alone hold the
    # training nodes the line waits for until they are gathered
    assert slo["hedge"] > slo["hedge, no wait trigger"]
    assert regroupings["hedge"] > regroupings["hedge, no wait trigger"]
    assert out[-1] == "hedge against no wait trigger: more SLOs met on 1, fewer on 0, the same on 0"
    assert any(line.strip().startswith("hedge: mean $/h") for line in out)
