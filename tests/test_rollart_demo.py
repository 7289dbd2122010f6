"""Trajectory-level asynchrony on the demo job: asynchronous GRPO with bounded staleness and
the multi-turn task with environment actors (rollmux.grpo.async_grpo, rollmux.grpo.agentic,
rollmux.demo_rollart). One local Ray for the module, shut down whatever happens."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from rollmux.grpo.algorithm import grpo_loss
from rollmux.grpo.profiles import ROLLOUT_HEAVY, ROLLOUT_HEAVY_WIDE

ray = pytest.importorskip("ray")
pytest.importorskip("transformers")
from rollmux.runtime.ray_start import start_ray  # noqa: E402 (needs ray)

#: small enough for seconds per run on a loaded 2-core machine; training comparable to rollout
PROFILE = replace(ROLLOUT_HEAVY, name="reverse-async-test", prompts=16, samples=8, gen_batch=8, epochs=4,
                  minibatch=64)
AGENT = replace(ROLLOUT_HEAVY, name="reverse-agent-test", prompts=4, samples=4, gen_batch=8, minibatch=48)
ADD_AGENT = replace(ROLLOUT_HEAVY_WIDE, name="add-agent-test", prompts=2, samples=4, gen_batch=4, minibatch=24)


@pytest.mark.parametrize("args, says", [
    (["--env-delay-s", "inf"], "env_delay_s=inf: expected a finite number of seconds >= 0"),
    (["--env-delay-s", "inf", "--live"], "env_delay_s=inf: expected a finite number of seconds >= 0"),
    (["--out", "/dev/null/x"], "--out /dev/null/x: cannot make the folder"),
])
def test_rollart_demo_refuses_bad_options_before_any_work(tmp_path, args, says):
    """(an infinite environment delay was accepted; --out under a file gave a traceback)"""
    import time

    from typer.testing import CliRunner

    from rollmux.cli import app

    out = tmp_path / "out"
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["rollart-demo", "--out", str(out), *args])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output
    assert time.monotonic() - t0 < 10 and not out.exists()


def test_importance_ratio_against_the_behaviour_policy_is_clipped():
    """Off-policy correction: rho = pi / pi_behaviour, clipped to [0.8, 1.2]; beyond it no gradient."""
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    # current policy: ratios 1.0, 1.1 (inside), 1.5 and 0.5 (outside the clip range)
    current = torch.log(torch.tensor([[0.5, 0.55, 0.75, 0.25]])).requires_grad_(True)
    loss, stats = grpo_loss(current, behaviour, torch.tensor([1.0]), clip=0.2)
    loss.backward()
    grad = current.grad[0]
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert grad[2] == 0  # ratio 1.5 > 1.2 with A > 0: clipped, no gradient
    assert grad[0] != 0 and grad[1] != 0 and grad[3] != 0  # min() keeps the unclipped term below 0.8
    # with a negative advantage the low side is the clipped one
    current.grad = None
    loss, _ = grpo_loss(current, behaviour, torch.tensor([-1.0]), clip=0.2)
    loss.backward()
    assert current.grad[0][3] == 0 and current.grad[0][2] != 0
    # the clipped surrogate's value: -(1*1 + 1.1 + 1.2 + 0.5)/4
    loss, _ = grpo_loss(current.detach(), behaviour, torch.tensor([1.0]), clip=0.2)
    assert loss.item() == pytest.approx(-(1.0 + 1.1 + 1.2 + 0.5) / 4, rel=1e-5)


def test_multi_turn_next_prompt_and_training_layout():
    from rollmux.grpo.agentic import Rollout, env_delay_s, next_prompt, training_batch

    assert next_prompt("^1234>", "43+1", "4321") == "^3214>"
    assert env_delay_s(0, 1, 2, 0.03) == env_delay_s(0, 1, 2, 0.03)
    assert 0.03 <= env_delay_s(0, 5, 0, 0.03) <= 0.15
    p = replace(AGENT, prompts=1, samples=2)
    r = Rollout(prompts=[["^1234>", "^3211>"], ["^1234>", "^3214>"]], completions=[["4321", "1123"], ["4311", "4123"]],
                rewards=[[1.0, 0.5], [0.5, 0.5]], wall_s=1.0, generation_s=0.5, generate_calls=2, env_calls=4)
    b = training_batch(p, r)
    assert b["prompts"].shape == (4, 6) and b["completions"].shape == (4, 4)
    assert b["rewards"].tolist() == [0.75, 0.5, 0.75, 0.5]  # (turn, sample) rows, trajectory rewards


def test_rollart_demo_stops_the_replica_monitor_when_a_run_fails(tmp_path, monkeypatch):
    """(the monitor's thread still polled when Serve and Ray went down after a failed run; a poll after
    that could start a new local Ray); runs before the module's Ray starts, as run_rollart starts its own"""
    import threading
    import time

    from ray import serve

    import rollmux.grpo.async_grpo as async_grpo
    import rollmux.grpo.driver as driver
    from rollmux.demo_rollart import run_rollart

    def failing_run(*_args, **_kwargs):
        time.sleep(1.0)  # the monitor takes a few samples
        raise RuntimeError("the first GRPO run failed")

    def monitors() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name == "reward-replicas"]

    shutdown, at_shutdown = serve.shutdown, []

    def recorded_shutdown() -> None:
        at_shutdown.append(monitors())
        shutdown()

    monkeypatch.setattr(async_grpo, "run_async", failing_run)
    monkeypatch.setattr(driver, "warm_start_weights", lambda profile: {})
    monkeypatch.setattr(serve, "shutdown", recorded_shutdown)
    with pytest.raises(RuntimeError, match="the first GRPO run failed"):
        run_rollart(tmp_path, iterations=1, staleness=(1,), agentic_iterations=1, reward_service=True,
                    log=lambda _: None)
    assert at_shutdown == [[]] and monitors() == [] and not ray.is_initialized()


@pytest.fixture(scope="module")
def local_ray():
    start_ray(lambda: ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                               _node_ip_address="127.0.0.1"))
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def weights():
    from rollmux.grpo.driver import warm_start_weights

    return warm_start_weights(PROFILE)


def test_async_k1_overlaps_and_respects_staleness(local_ray, weights):
    from rollmux.grpo.async_grpo import run_async

    sync = run_async(PROFILE, 4, weights, 0, timeout_s=120)
    async1 = run_async(PROFILE, 4, weights, 1, timeout_s=120)
    assert sync.staleness_used == [0, 0, 0, 0] and sync.overlap_s == 0.0
    assert max(async1.staleness_used) <= 1 and async1.staleness_used[1:] == [1, 1, 1]
    # generation of i+1 ran while training i did (robust on a loaded machine, unlike wall time)
    assert async1.overlap_s > 0
    for run in (sync, async1):
        assert len(run.batches) == 4
        assert all(math.isfinite(b["reward"]) and math.isfinite(b["loss"]) for b in run.batches)
        assert math.isfinite(run.reward_before) and math.isfinite(run.reward_after)
        assert all(b["trained_at_version"] == b["step"] for b in run.batches)
    # k = 0: the behaviour policy is the current one (ratio 1, nothing clipped by staleness);
    # stale batches are off-policy: ratios differ from 1 and the clip bites
    assert all(b["ratio_max_dev"] < 1e-3 for b in sync.batches)
    assert all(b["ratio_max_dev"] > 1e-3 for b in async1.batches[1:])
    assert sync.reward_before == async1.reward_before  # same starting weights, same evaluation


@pytest.mark.slow
def test_async_k2_never_exceeds_its_bound(local_ray, weights):
    from rollmux.grpo.async_grpo import run_async

    run = run_async(PROFILE, 5, weights, 2, timeout_s=120)
    assert max(run.staleness_used) <= 2 and run.overlap_s > 0


def test_multi_turn_env_actors_are_called_and_trajectories_complete(local_ray):
    from rollmux.grpo.agentic import run_agentic
    from rollmux.grpo.driver import warm_start_weights

    w = warm_start_weights(AGENT)
    turns, trajectories = 3, AGENT.prompts * AGENT.samples
    runs = {s: run_agentic(AGENT, 2, w, s, turns=turns, env_workers=2, base_delay_s=0.03, timeout_s=60)
            for s in ("turn", "trajectory")}
    for run in runs.values():
        d = run.to_dict()
        # every trajectory's every turn hit an environment (2 training iterations + 2 evaluations)
        assert sum(run.env_calls_by_worker) == 4 * trajectories * turns
        assert all(c > 0 for c in run.env_calls_by_worker)
        assert all(r["env_calls"] == trajectories * turns for r in run.per_iteration)
        assert all(math.isfinite(x) for x in d["rewards"]) and math.isfinite(run.reward_after)
        assert 0 < d["generation_busy_fraction"] <= 1
    # the per-turn barrier generates in full batches; trajectory-level takes what is ready
    assert all(r["generate_calls"] == turns * trajectories // 8 for r in runs["turn"].per_iteration)


def test_multi_turn_add_episodes_complete_on_env_actors(local_ray):
    """(the add task's next prompt was not an add prompt: the env actors raised at the second turn)"""
    from rollmux.grpo.agentic import run_agentic
    from rollmux.grpo.policy import build_policy

    w = build_policy(ADD_AGENT.model, ADD_AGENT.seed).state_dict()
    turns, trajectories = 3, ADD_AGENT.prompts * ADD_AGENT.samples
    run = run_agentic(ADD_AGENT, 1, w, "trajectory", turns=turns, env_workers=2, base_delay_s=0.01, timeout_s=60)
    assert sum(run.env_calls_by_worker) == 3 * trajectories * turns  # 1 iteration + 2 evaluations ("turn")
    assert all(math.isfinite(x) for x in run.to_dict()["rewards"] + [run.reward_before, run.reward_after])


def test_env_actor_failure_under_trajectory_schedule_is_raised_at_once(local_ray):
    """(a failed step's exception was dropped: the rollout waited out timeout_s x turns, then raised an
    empty TimeoutError); here every step fails: reverse environments get add prompts"""
    import time

    from rollmux.errors import SpecError
    from rollmux.grpo.agentic import rollout_episodes, start_env_workers
    from rollmux.grpo.policy import build_policy

    envs = start_env_workers("reverse", 2, 0.01)
    try:
        ray.get([e.stats.remote() for e in envs], timeout=60)  # the actors are up before timing
        model = build_policy(ADD_AGENT.model, ADD_AGENT.seed)
        t0 = time.monotonic()
        with pytest.raises(SpecError, match="expected a prompt of task 'reverse'"):
            rollout_episodes(model, ADD_AGENT, 0, envs, 3, "trajectory", timeout_s=30)
        assert time.monotonic() - t0 < 15
    finally:
        for e in envs:
            ray.kill(e)


@pytest.mark.slow
def test_rollart_demo_writes_summary_and_plots(tmp_path):
    from rollmux.demo_rollart import run_rollart

    doc = run_rollart(tmp_path, iterations=3, agentic_iterations=2, log=lambda _: None)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(doc))
    assert set(saved["runs"]) == {"sync", "async-k1", "async-k2", "agentic-turn", "agentic-trajectory"}
    assert saved["runs"]["sync"]["async_speedup"] == 1.0
    assert max(saved["runs"]["async-k2"]["staleness_used"]) <= 2
    assert (tmp_path / "rewards.png").stat().st_size > 0
