"""The long-tail demo, CI-sized: two real GRPO jobs, each rolling out on two workers in
chunks; a rollout that reaches 80% of its sequences reports its tail, shrinks to one
worker, and the service hands the freed share of the node to the other job's queued
rollout, which starts on one worker and grows to two when the donor's rollout ends.

Checked: at least one hand-off, with its donor's tail before the slice's start; no node
ever runs more GPUs than it has, recomputed here from the recorded stretches (both what
the active workers stand for and the service's accounting); every job reaches its
target with alternating phases and contiguous iterations; and the chunked, shrunk and
grown rollouts lose nothing: the rewards are bit-equal to an in-process replay of the
plain (unchunked) job.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest


def _peak(spans: list[dict], gpus_per_node: int) -> tuple[float, float]:
    """Most GPUs on one node at once: (by active workers, by the service's accounting)."""
    events: dict[str, list] = {}
    for s in spans:
        pieces = s["segments"] or [[s["start"], s["end"], gpus_per_node, gpus_per_node]]
        for node in s["nodes"]:
            for a, b, g, sg in pieces:
                assert s["start"] <= a < b <= s["end"]
                events.setdefault(node, []).extend([(a, 1, g, sg), (b, 0, -g, -sg)])
    worst = [0.0, 0.0]
    for evs in events.values():
        g = sg = 0.0
        for _t, _k, dg, dsg in sorted(evs):
            g, sg = g + dg, sg + dsg
            worst = [max(worst[0], g), max(worst[1], sg)]
    return worst[0], worst[1]


def test_quick_tail_demo_hands_off_without_overcommitting_a_node(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    pytest.importorskip("transformers")
    from rollmux.demo import GPUS_PER_NODE, run_demo
    from rollmux.grpo.driver import replay_job, warm_start_weights
    from rollmux.grpo.profiles import DEMO_PROFILES

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    lines: list[str] = []
    iterations = 4
    run_demo(tmp_path, jobs=2, iterations=iterations, quick=True, tail=True, solo=False, log=lines.append)
    summary = json.loads((tmp_path / "summary.json").read_text())
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]["multiplexed"]
    assert (tmp_path / "gantt.png").stat().st_size > 0

    # At least one hand-off: a rollout granted a slice of another job's node during its tail.
    h = summary["handoffs"]
    assert h["count"] >= 1 and len(h["slice_s"]) == h["count"], "\n".join(lines)
    for x in h["slices"]:
        assert x["donor"] not in (None, x["recipient"]) and 0 < x["share"] < 1 and x["slice_s"] > 0
        assert x["donor_tail_at"] is not None and x["donor_tail_at"] <= x["start"]

    # Capacity, from the recorded spans and their stretches.
    spans = [s for r in runs.values() for s in r["spans"]]
    assert any(s["share"] < 1 for s in spans) and any(len(s["segments"]) > 1 for s in spans)
    gpus, service_gpus = _peak(spans, GPUS_PER_NODE)
    assert gpus <= GPUS_PER_NODE and service_gpus <= GPUS_PER_NODE
    assert summary["gpu_peak"]["gpus"] == gpus and summary["gpu_peak"]["service_gpus"] == service_gpus

    # Every job at its target; phases alternate; iterations contiguous.
    for job_id, job in summary["jobs"].items():
        assert job["iterations_done"] == iterations == len(job["rewards"])
        own = runs[job_id]["spans"]
        assert [(s["pool"], s["iteration"]) for s in own] == [(p, i) for i in range(iterations)
                                                                for p in ("rollout", "train")]
        assert all(a["end"] <= b["start"] for a, b in zip(own, own[1:]))

    # Nothing lost in the chunking, shrinking and growing: the plain job's rewards, bit for bit.
    donor = h["slices"][0]["donor"]
    profile = next(p for p in DEMO_PROFILES[2] if p.name == donor)
    profile = replace(profile, prompts=max(4, profile.prompts // 4))  # the quick run's shrunk profile
    rewards, _ = replay_job(profile, iterations, warm_start_weights(profile))
    assert summary["jobs"][donor]["rewards"] == rewards
