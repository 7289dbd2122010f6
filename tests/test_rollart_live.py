"""``rollmux rollart-demo --live``: an asynchronous (k = 1), a multi-turn agentic and a
synchronous GRPO job at once under the live control plane, sharing the reward service.

The quick run (CI, about 75 s on a loaded 2-core machine) checks the summary against
oracles of its own: the phase spans per node, recomputed; the asynchronous job's
overlap and staleness; the groups the planner made; every job's iterations as the
service counted them.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

pytest.importorskip("ray")
pytest.importorskip("transformers")


def _check(doc: dict, iterations: dict[str, int]) -> None:
    jobs = doc["jobs"]
    assert set(jobs) == {"async-k1", "agentic", "sync"}
    a, g, s = jobs["async-k1"], jobs["agentic"], jobs["sync"]
    # the planner: the asynchronous job in a group of its own; the two others multiplexed in one
    assert a["group"] != s["group"] and g["group"] == s["group"]
    assert not set(a["rollout_nodes"] + a["train_nodes"]) & set(s["rollout_nodes"] + s["train_nodes"])
    assert g["rollout_nodes"] == s["rollout_nodes"] and g["train_nodes"] == s["train_nodes"]
    for name, j in jobs.items():
        assert j["iterations"] == j["iterations_target"] == iterations[name] == j["service_iterations_done"]
        assert all(math.isfinite(r) for r in j["rewards"]) and len(j["rewards"]) == iterations[name]
        assert math.isfinite(j["reward_before"]) and math.isfinite(j["reward_after"])
    assert a["staleness"] == 1 and a["staleness_used"][0] == 0 and max(a["staleness_used"]) <= 1
    assert 1 in a["staleness_used"]  # some rollout generated with the previous policy: it ran ahead
    # phase spans per node, recomputed: never two at once on a node
    spans_of = defaultdict(list)
    for node, spans in doc["phases"].items():
        ordered = sorted(spans, key=lambda x: x["start"])
        assert all(x["end"] <= y["start"] for x, y in zip(ordered, ordered[1:])), node
        for x in spans:
            spans_of[(x["job"], x["pool"])].append(x)
    # the shared rollout node ran both synchronous jobs' rollouts, interleaved
    shared = doc["phases"][s["rollout_nodes"][0]]
    assert {x["job"] for x in shared} == {"agentic", "sync"}
    for name in ("agentic", "sync"):
        mine = sorted(spans_of[(name, "rollout")] + spans_of[(name, "train")], key=lambda x: x["start"])
        assert [x["pool"] for x in mine] == ["rollout", "train"] * iterations[name]
        assert all(x["end"] <= y["start"] for x, y in zip(mine, mine[1:]))
    # the asynchronous job: rollout i+1 overlapped training i; rollout j began after training j-2 ended
    rolls = sorted(spans_of[("async-k1", "rollout")], key=lambda x: x["iteration"])
    trains = sorted(spans_of[("async-k1", "train")], key=lambda x: x["iteration"])
    overlap = [min(rolls[i + 1]["end"], trains[i]["end"]) - max(rolls[i + 1]["start"], trains[i]["start"])
               for i in range(len(trains) - 1)]
    assert max(overlap) > 0
    assert all(rolls[j]["start"] >= trains[j - 2]["end"] for j in range(2, len(rolls)))
    assert all(v is True or (isinstance(v, (int, float)) and v > 0) for v in doc["checks"].values()), doc["checks"]


def test_live_three_jobs_quick(tmp_path):
    from rollmux.demo_rollart import run_rollart_live

    iterations = {"async-k1": 3, "sync": 3, "agentic": 2}
    doc = run_rollart_live(tmp_path, iterations=3, agentic_iterations=2, turns=2, env_workers=2, quick=True,
                           log=lambda _: None)
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(doc))
    _check(doc, iterations)
    assert doc["reward_service"]["calls"] > 0 and doc["reward_service"]["replicas_max"] >= 1


@pytest.mark.parametrize("values, before, after", [
    ([0.1], 0.1, 0.1), ([0.1, 0.3], 0.1, 0.3), ([0.1, 0.2, 0.3], 0.1, 0.3),
    ([0.1, 0.2, 0.3, 0.4], 0.15, 0.35), ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 0.15, 0.55),
])
def test_reward_before_and_after_are_means_of_disjoint_windows(values, before, after):
    """(both were the mean of the first / last min(2, n) values: for n = 2 the same number, for n = 3
    sharing the middle iteration)"""
    from rollmux.demo_rollart import _edge

    assert _edge(values, True) == pytest.approx(before) and _edge(values, False) == pytest.approx(after)


def test_the_cli_has_the_live_option():
    from typer.testing import CliRunner

    from rollmux.cli import app

    result = CliRunner().invoke(app, ["rollart-demo", "--help"])
    assert result.exit_code == 0 and "--live" in result.output


@pytest.mark.slow
def test_live_three_jobs_one_ray_node_per_rollmux_node(tmp_path):
    from rollmux.demo_rollart import run_rollart_live

    doc = run_rollart_live(tmp_path, iterations=6, agentic_iterations=4, log=lambda _: None)
    _check(doc, {"async-k1": 6, "sync": 6, "agentic": 4})
