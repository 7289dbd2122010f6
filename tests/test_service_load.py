"""benchmarks/service_load.py: ``rollmux serve`` under a mixed load of job clients and admin
readers, SIGKILLed mid-load and restarted on its state file, stays consistent: no 5xx,
every accepted job present with the state, iterations and moves its client saw, no node
in two overlapping grants, an event log without gaps. Latencies are not asserted."""
from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("service_load")


def _assert_consistent(r: dict) -> None:
    c, examples = r["consistency"], r["examples"]
    assert c["five_xx"] == 0, examples["five_xx"]
    assert c["accepted"] > 0
    assert c["present"] == c["accepted"], examples["missing"]
    assert c["mismatches"] == 0, examples["mismatches"]
    assert c["overlaps"] == 0, examples["overlaps"]
    assert c["grant_problems"] == 0, examples["grant_problems"]
    assert (c["seq_gaps"], c["seq_dups"], c["seq_unordered"]) == (0, 0, 0)
    assert c["unexpected"] == 0, examples["unexpected"]
    assert c["gave_up"] == 0, examples["gave_up"]
    assert c["log_errors"] == 0, examples["log_errors"]
    assert c["not_restored"] == 0
    assert r["ok"]


def test_hedge_under_load_and_a_sigkill_stays_consistent(bench, tmp_path):
    args = bench.parse_args(["--policies", "rollmux-hedge", "--workers", "8", "--seconds", "9", "--kills", "1"])
    r = bench.run_policy("rollmux-hedge", args, tmp_path)
    _assert_consistent(r)
    assert len(r["kills_down_s"]) == 1  # killed once, serving again
    assert sum(r["transport_errors"].values()) > 0  # the clients did see the server go away
    assert r["phases"] > 0 and r["latency"]["release"]["calls"] > 0


@pytest.mark.slow
def test_every_policy_at_forty_clients_with_two_kills(bench, tmp_path):
    out = tmp_path / "load.json"
    rc = bench.main(["--policies", "rollmux", "rollmux-hedge@locked", "rollmux-hedge", "--workers", "40",
                     "--seconds", "30", "--kills", "2", "--workdir", str(tmp_path), "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    for r in results:
        _assert_consistent(r)
        assert len(r["kills_down_s"]) == 2
        assert r["phases"] > 0
    assert [r["policy"] for r in results] == ["rollmux", "rollmux-hedge@locked", "rollmux-hedge"]
    assert all(r["regroupings"] > 0 and r["moves"] > 0 for r in results[1:])
    assert rc == 0


def test_a_policy_suffix_names_where_the_service_decides_regroupings(bench, tmp_path):
    args = bench.parse_args([])
    argv = bench.Served(tmp_path / "a", "rollmux-hedge@locked", args, "x").argv
    assert argv[argv.index("--policy") + 1] == "rollmux-hedge"
    assert argv[argv.index("--regroup-decisions") + 1] == "locked"
    assert "--regroup-decisions" not in bench.Served(tmp_path / "b", "rollmux-hedge", args, "x").argv


def _grant(seq, at, job, nodes):
    return {"seq": seq, "at": at, "kind": "grant", "job_id": job, "nodes": nodes}


def _end(seq, at, job, kind="finish"):
    return {"seq": seq, "at": at, "kind": kind, "job_id": job, "nodes": []}


def test_the_grant_check_finds_overlaps_double_grants_and_gaps(bench):
    clean = [_grant(1, 0.0, "a", ["r0"]), _end(2, 1.0, "a"), _grant(3, 1.0, "b", ["r0"]), _end(4, 2.0, "b", "remove")]
    assert bench.grant_check(clean) == {"grant_problems": [], "overlaps": [], "seq_gaps": 0, "seq_dups": 0,
                                        "seq_unordered": 0}
    overlap = [_grant(1, 0.0, "a", ["r0", "r1"]), _grant(2, 0.5, "b", ["r1"]), _end(3, 1.0, "a"),
               _end(4, 2.0, "b")]
    assert len(bench.grant_check(overlap)["overlaps"]) == 1
    twice = [_grant(1, 0.0, "a", ["r0"]), _grant(2, 0.5, "a", ["r1"]), _end(3, 1.0, "a")]
    assert len(bench.grant_check(twice)["grant_problems"]) == 1
    left_open = [_grant(1, 0.0, "a", ["r0"])]
    assert len(bench.grant_check(left_open)["grant_problems"]) == 1
    holes = [_grant(2, 0.0, "a", ["r0"]), _end(3, 1.0, "a"), _end(3, 1.0, "a"), _grant(5, 1.0, "b", ["r1"]),
             _end(6, 2.0, "b")]
    g = bench.grant_check(holes)
    assert (g["seq_gaps"], g["seq_dups"]) == (2, 1)


def test_the_state_check_compares_what_the_clients_saw(bench):
    ledger = bench.Ledger()

    def job(job_id, end, iterations=2, moves=(), **kw):
        ledger.jobs[job_id] = {"job_id": job_id, "fate": "run", "iterations": iterations, "planned": 4,
                               "acked_moves": list(moves), "end": end, **kw}

    job("done", "done", 4, moves=(7,))
    job("stopped", "stopped", sweep="cancelled")
    job("raced", "stopped", sweep="expired")  # the lease won the race against the final cancel
    job("silent", "abandoned", sweep="expired")
    job("lost", "ended", ended_state="expired")
    job("wrong", "done", 4)  # the service says cancelled
    job("short", "cancelled", 2)  # the service counts 1 iteration
    job("nomove", "done", 4, moves=(9,))  # the service logged no moved event
    job("odd410", "ended", ended_state="done")  # a 410 the client did not cause
    job("gone", "done", 4)  # not in the service's list
    seen = {"done": ("done", 4), "stopped": ("cancelled", 2), "raced": ("expired", 2), "silent": ("expired", 2),
            "lost": ("expired", 2), "wrong": ("cancelled", 4), "short": ("cancelled", 1), "nomove": ("done", 4),
            "odd410": ("done", 2)}
    jobs = {j: {"job_id": j, "state": s, "iterations_done": n} for j, (s, n) in seen.items()}
    events = [{"seq": 1, "kind": "moved", "job_id": "done"}]
    missing, bad, tally = bench.state_check(ledger, jobs, events)
    assert missing == ["gone"]
    assert sorted({b.split(":")[0] for b in bad}) == ["nomove", "odd410", "short", "wrong"]
    assert tally["lease lost while active"] == 1 and tally["expired before the final cancel"] == 1
