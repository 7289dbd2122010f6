"""The multi-turn task's environment logic in this process (rollmux.grpo.agentic): the next
prompt of every task, the "trajectory" schedule's handling of a failed environment step and
the environment's bounded wait for the reward service. The Ray runs are in test_rollart_demo.py."""
from __future__ import annotations

import asyncio
import gc
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from rollmux.grpo.agentic import EnvWorker, next_prompt
from rollmux.grpo.task import CHARS, TASKS

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_next_prompt_is_a_prompt_of_the_same_task(name):
    """(an add answer made '^850=', which Task.answer refused at the episode's second turn)"""
    task, rng = TASKS[name], random.Random(name)
    for _ in range(500):
        prompt, answer = task.sample(rng)
        for _turn in range(4):  # a chain of turns, each from a random completion (any vocabulary character)
            completion = "".join(rng.choice(CHARS) for _ in range(task.answer_len))
            nxt = next_prompt(prompt, completion, answer)
            assert nxt == next_prompt(prompt, completion, answer)
            prompt, answer = nxt, task.answer(nxt)  # raises SpecError on a prompt not of the task's form


def test_next_prompt_rules():
    assert next_prompt("^1234>", "43+1", "4321") == "^3214>"
    assert next_prompt("^4071>", "0147", "0147") == "^1470>"
    assert next_prompt("^37+48=", "08+", "085") == "^85+50="  # rotated "850": addends "85" and "50"
    assert next_prompt("^99+99=", "198", "198") == "^98+81="


class InProcessEnv:
    """An ``EnvWorker`` called in this process the way ``rollout_episodes`` calls an actor
    (``env.step.remote(...)`` gives an awaitable); raises at (trajectory, turn) ``fail``."""

    def __init__(self, task: str, fail: tuple[int, int] | None = None) -> None:
        self.worker = EnvWorker(task, base_delay_s=0.01, verify_rounds=1)
        self.fail = fail
        # as a Ray actor call, the step starts at once and its result is awaited later (a bare coroutine
        # never awaited, when the schedule ends first, would warn)
        self.step = SimpleNamespace(remote=lambda *args: asyncio.ensure_future(self._step(*args)))

    async def _step(self, trajectory: int, turn: int, prompt: str, completion: str) -> dict:
        if (trajectory, turn) == self.fail:
            raise RuntimeError(f"environment of trajectory {trajectory} failed at turn {turn}")
        return await self.worker.step(trajectory, turn, prompt, completion)


@pytest.fixture(scope="module")
def add_job():
    from rollmux.grpo.policy import build_policy
    from rollmux.grpo.profiles import ROLLOUT_HEAVY_WIDE

    profile = replace(ROLLOUT_HEAVY_WIDE, prompts=2, samples=4, gen_batch=4)
    return profile, build_policy(profile.model, profile.seed)


def test_trajectory_schedule_runs_add_episodes_of_valid_prompts(add_job):
    from rollmux.grpo.agentic import rollout_episodes

    profile, model = add_job
    r = rollout_episodes(model, profile, 0, [InProcessEnv("add"), InProcessEnv("add")], 3, "trajectory",
                         timeout_s=60)
    task = TASKS["add"]
    assert [len(x) for x in r.prompts] == [3] * 8 and [len(x) for x in r.rewards] == [3] * 8
    for prompts, completions in zip(r.prompts, r.completions):
        for t in range(2):  # each turn's prompt is the environment's next prompt of the turn before
            assert prompts[t + 1] == next_prompt(prompts[t], completions[t], task.answer(prompts[t]))
            task.answer(prompts[t + 1])


def test_failed_env_step_ends_the_trajectory_schedule_with_its_own_error(add_job, caplog):
    """(the failed step's task swallowed it: the loop waited out timeout_s x turns, then raised an empty
    TimeoutError, and asyncio logged 'Task exception was never retrieved')"""
    from rollmux.grpo.agentic import rollout_episodes

    profile, model = add_job
    envs = [InProcessEnv("add", fail=(3, 1)), InProcessEnv("add", fail=(3, 1))]
    with pytest.raises(RuntimeError, match="environment of trajectory 3 failed at turn 1"):
        rollout_episodes(model, profile, 0, envs, 3, "trajectory", timeout_s=5)
    gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


class NeverAnswers:
    """A reward service call that never returns (a ``DeploymentResponse`` stand-in)."""

    def __init__(self) -> None:
        self.cancelled = False

    def __await__(self):
        return asyncio.sleep(3600).__await__()

    def cancel(self) -> None:
        self.cancelled = True


def test_env_step_waits_for_the_reward_service_at_most_its_timeout():
    """(the environment step awaited the service without bound)"""
    from rollmux.reward_service import RewardServiceTimeout

    env = EnvWorker("reverse", base_delay_s=0.0, verify_rounds=1, reward_app="rewards", reward_timeout_s=0.2)
    call = NeverAnswers()
    env._reward_handle = SimpleNamespace(score=SimpleNamespace(remote=lambda items, kind: call))
    with pytest.raises(RewardServiceTimeout, match="reward service app 'rewards': no reward after 0.2 s"):
        asyncio.run(asyncio.wait_for(env.step(0, 0, "^1234>", "4321"), 30))
    assert call.cancelled and env.reward_latencies_ms == [] and env.calls == 0
