"""The demo, shortened: two real GRPO jobs (tiny models, a few iterations) run alone (the
profile runs stand for the solo runs) and multiplexed on a local Ray cluster under the live control plane, plus unit checks of
the GRPO pieces the workers use."""
from __future__ import annotations

import json
import random

import pytest
import torch

from rollmux.grpo.algorithm import group_advantages, grpo_loss
from rollmux.grpo.task import TASKS, decode, encode, get_task, reward


def test_every_task_answers_are_checked_exactly():
    rng = random.Random(0)
    for task in TASKS.values():
        for _ in range(20):
            prompt, answer = task.sample(rng)
            assert len(encode(prompt)) == task.prompt_len and len(answer) == task.answer_len
            assert decode(encode(prompt)) == prompt
            assert reward(answer, answer) == 1.0
    prompt, answer = get_task("add").sample(rng)
    assert int(answer) == sum(int(x) for x in prompt[1:-1].split("+"))
    assert reward("1794", "1704") == 0.75


def test_group_advantages_are_zero_mean_per_group_and_zero_for_flat_groups():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2])
    adv = group_advantages(rewards, 4)
    assert adv[:4].sum().abs() < 1e-5 and adv[0] > 0 > adv[1]
    assert torch.all(adv[4:] == 0)
    with pytest.raises(ValueError):
        group_advantages(rewards, 3)


def test_clipped_loss_ignores_ratio_beyond_clip_and_kl_is_zero_at_the_reference():
    logp_old = torch.zeros(2, 3)
    logp = torch.full((2, 3), 0.5, requires_grad=True)  # ratio e^0.5 > 1.2
    loss, stats = grpo_loss(logp, logp_old, torch.tensor([1.0, 1.0]), clip=0.2, logp_ref=logp.detach(), kl_coef=0.1)
    loss.backward()
    assert torch.all(logp.grad == 0)  # clipped on the positive side: no gradient
    assert stats["clip_frac"] == 1.0 and stats["kl"] == pytest.approx(0.0)


def test_quick_demo_two_jobs_interleave_and_learn(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    pytest.importorskip("transformers")
    from rollmux.demo import run_demo

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    lines: list[str] = []
    results = run_demo(tmp_path, jobs=2, iterations=4, quick=True, solo=False, log=lines.append)
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "gantt.png", "rewards.png", "busy.png"}
    saved = json.loads((tmp_path / "results.json").read_text())
    mux = saved["runs"]["multiplexed"]
    assert len(mux) == 2
    placements = [r["placement"] for r in mux.values()]
    assert placements[0]["group_id"] == placements[1]["group_id"], "both jobs share one co-execution group"
    for run in mux.values():
        assert [s["pool"] for s in run["spans"]] == ["rollout", "train"] * 4
        assert len(run["rewards"]) == 4 and all(0.0 <= r <= 1.0 for r in run["rewards"])
        assert {s["direction"] for s in run["switches"]} == {"load", "offload"}
        assert all(s["path"] == "warm" for s in run["switches"])
    # On each node, phases of different jobs never overlap, and some phases of the two
    # jobs do overlap in time on different nodes (rollout of one while the other trains).
    spans = [s for run in mux.values() for s in run["spans"]]
    overlapping_elsewhere = 0
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if a["job_id"] == b["job_id"]:
                continue
            apart = a["end"] <= b["start"] or b["end"] <= a["start"]
            if set(a["nodes"]) & set(b["nodes"]):
                assert apart, f"{a['job_id']} and {b['job_id']} overlap on {a['nodes']}"
            elif not apart:
                overlapping_elsewhere += 1
    assert overlapping_elsewhere > 0
    for job in results["jobs"]:
        assert job["slowdown"] > 0 and job["solo_iteration_s"] > 0
    for mode in ("solo", "multiplexed"):
        assert all(0.0 < f <= 1.0 for f in results["busy"][mode].values())
    assert results["switches"]["count"] == 2 * 2 * 2 * 4
    assert any("busy fraction multiplexed" in line for line in lines)


@pytest.mark.parametrize("args, says", [
    (["--minutes", "nan"], "minutes=nan: expected a positive, finite number of minutes"),
    (["--minutes", "inf"], "minutes=inf: expected a positive, finite number of minutes"),
    (["--out", "/dev/null/x"], "--out /dev/null/x: cannot make the folder"),
    (["--policy", "rollmux-regroup", "--jobs", "2"], "--jobs=2: expected no --jobs with --policy rollmux-regroup"),
    (["--policy", "rollmux-consolidate", "--tail"], "--tail=True: expected no --tail with --policy"),
    (["--migration-s", "3"], "--migration-s=3.0: expected no --migration-s with --policy rollmux"),
    (["--policy", "rollmux-full"], "policy='rollmux-full': expected rollmux, rollmux-consolidate or rollmux-regroup"),
])
def test_demo_refuses_bad_options_before_any_work(tmp_path, args, says):
    """(--minutes nan or inf ran ~25 s of warm-up, Ray and profiling, then crashed in
    math.floor; --out under a file gave a traceback; --jobs and --tail with a move policy,
    --migration-s with rollmux, were silently ignored)"""
    import time

    from typer.testing import CliRunner

    from rollmux.cli import app

    out = tmp_path / "out"
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["demo", "--out", str(out), *args])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output
    assert time.monotonic() - t0 < 10 and not out.exists()
