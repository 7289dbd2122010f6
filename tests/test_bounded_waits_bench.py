"""benchmarks/bounded_waits.py: `rollmux-hedge` and `rollmux-full-regroup` with and
without their regrouping of jobs alone when the waiting line's head is refused, on a
fixed cluster where that matters."""
from __future__ import annotations

import sys
from pathlib import Path


def test_the_trigger_meets_more_slos_where_the_training_pool_binds(benchmark_script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    bench = benchmark_script("bounded_waits")
    monkeypatch.setattr(sys, "argv", ["bounded_waits.py", "--configs", "production:16x14:60"])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    rows = {}
    for line in out:
        if "16x14:60" in line:
            label, *cols = line.split("16x14:60", 1)[1].rsplit(None, 5)
            rows[label.strip()] = cols
    triggered = ("rollmux-hedge", "rollmux-full-regroup")
    assert set(rows) == {*triggered, *(name + ", no wait trigger" for name in triggered), "rollmux-regroup"}
    slo = {k: float(v[1].rstrip("%")) for k, v in rows.items()}
    regroupings = {k: int(v[3]) for k, v in rows.items()}
    # the first 60 production jobs on 16 H20 + 14 H800 nodes: jobs alone hold the
    # training nodes the line waits for until they are regrouped
    for name in triggered:
        assert slo[name] > slo[name + ", no wait trigger"], name
        assert regroupings[name] > regroupings[name + ", no wait trigger"], name
        assert f"{name} against no wait trigger: more SLOs met on 1, fewer on 0, the same on 0" in out
    assert not any(line.startswith("rollmux-regroup against") for line in out)  # it has no trigger
    assert any(line.strip().startswith("rollmux-hedge: mean $/h") for line in out)
