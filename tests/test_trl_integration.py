"""TRL's GRPOTrainer as RollMux jobs: two toy GRPO jobs (tiny random Qwen2, CPU) run
together under the live control plane on a local Ray cluster, short version; plus the
phase checks, the toy reward, the SmolLM2-shaped policy, the refusals of a bad policy or
device and the cache that notes CUDA memory, on their own."""
from __future__ import annotations

import contextlib
import json
import math

import pytest

from rollmux.integrations.checks import phase_checks

STEPS = 6


def _span(pool, node, start, end):
    return {"pool": pool, "nodes": [node], "start": start, "end": end}


def test_phase_checks_find_overlaps_and_broken_alternation():
    a = [_span("rollout", "R0", 0, 1), _span("train", "T0", 1, 2)]
    b = [_span("rollout", "R0", 1, 2), _span("train", "T0", 2, 3)]
    assert phase_checks({"a": a, "b": b}, {"a": 1, "b": 1})["ok"]
    late = [_span("rollout", "R0", 0.5, 2), _span("train", "T0", 2, 3)]
    found = phase_checks({"a": a, "b": late}, {"a": 1, "b": 1})
    assert not found["ok"] and found["overlaps"] == [{"node": "R0", "jobs": ["a", "b"], "at": 0.5}]
    swapped = [_span("train", "T0", 0, 1), _span("rollout", "R0", 1, 2)]
    assert phase_checks({"a": swapped}, {"a": 1})["alternates"] == {"a": False}
    assert phase_checks({"a": a}, {"a": 2})["alternates"] == {"a": False}


def test_digit_reward_counts_target_positions():
    pytest.importorskip("transformers")
    from rollmux.integrations.trl_toy import COMPLETION_LEN, digit_reward, toy_tokenizer

    assert digit_reward(["7" * COMPLETION_LEN, "77", "1234"], ["7", "7", "9"]) == [1.0, 2 / COMPLETION_LEN, 0.0]
    tok = toy_tokenizer()
    assert tok.decode(tok("3>")["input_ids"] + [tok.eos_token_id], skip_special_tokens=True) == "3>"


def test_two_trl_jobs_alternate_without_overlap_and_learn(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    pytest.importorskip("trl")
    from rollmux.integrations.trl_jobs import JOBS, run_two_jobs

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    lines: list[str] = []
    summary = run_two_jobs(tmp_path, steps=STEPS, log=lines.append, timeout_s=240)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert summary["checks"]["ok"], summary["checks"]
    assert (summary["device"], summary["policy"]) == ("cpu", "tiny-qwen2")
    jobs = summary["jobs"]
    assert set(jobs) == {j.job_id for j in JOBS}
    assert len({j["group"] for j in jobs.values()}) == 1, "both jobs share one co-execution group"
    spans = []
    for job_id, j in jobs.items():
        assert j["steps_done"] == STEPS == j["service_iterations_done"] and j["service_state"] == "done"
        assert [(s["pool"], s["iteration"]) for s in j["phase_spans"]] == [
            (p, i) for i in range(STEPS) for p in ("rollout", "train")]
        rewards = j["rewards"]
        assert len(rewards) == STEPS and all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in rewards)
        assert len(set(rewards)) > 1 or j["reward_after"] > j["reward_before"], f"{job_id}: rewards degenerate"
        assert len(j["losses"]) == STEPS and all(math.isfinite(x) for x in j["losses"])
        # park + (load, offload) per phase + hand-back load, all on the warm path
        assert j["switches"]["count"] == 2 + 4 * STEPS and j["switches"]["paths"] == ["warm"]
        # fp32 weights and two AdamW moments of the 75k-parameter policy, plus its buffers and step counters
        assert 12 * j["parameters"] < j["switches"]["bytes_max"] < 12.01 * j["parameters"]
        assert 70_000 < j["parameters"] < 80_000
        assert j["device_memory"] is None, "no CUDA switch, nothing noted"
        spans += [dict(s, job=job_id) for s in j["phase_spans"]]
    # the jobs ran together: some phase of one overlaps in time a phase of the other on another node
    assert any(a["job"] != b["job"] and a["node"] != b["node"] and a["start"] < b["end"] and b["start"] < a["end"]
               for a in spans for b in spans)
    assert any("checks:" in line and line.endswith("ok") for line in lines)
    assert all((tmp_path / name).stat().st_size > 10_000 for name in ("gantt.png", "rewards.png"))
    import ray

    assert not ray.is_initialized()


def test_profile_runs_a_trl_job_alone_and_reports_worst_case_phases(tmp_path):
    pytest.importorskip("trl")
    from rollmux.integrations.profile import profile_job
    from rollmux.integrations.trl_jobs import JOBS, build_trainer

    prof = profile_job(lambda job, n: build_trainer(job, JOBS[0], n, str(tmp_path)).train(), iterations=2)
    assert len(prof.rollout_s) == len(prof.train_s) == 2
    assert prof.t_roll_s == max(prof.rollout_s) >= prof.mean_roll_s > 0
    assert prof.t_train_s == max(prof.train_s) >= prof.mean_train_s > 0


def test_bad_policy_or_device_is_refused_before_anything_starts(tmp_path):
    pytest.importorskip("transformers")
    import torch

    from rollmux.errors import SpecError
    from rollmux.integrations.trl_jobs import run_two_jobs

    with pytest.raises(SpecError, match="policy='gpt-9'"):
        run_two_jobs(tmp_path, steps=1, policy="gpt-9")
    with pytest.raises(SpecError, match="device='tpu'"):
        run_two_jobs(tmp_path, steps=1, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match="CUDA"):
            run_two_jobs(tmp_path, steps=1, device="cuda")
    for steps in (2.5, True, "3", float("nan")):  # (2.5 started Ray and both jobs, then failed in the actor)
        with pytest.raises(SpecError, match="steps="):
            run_two_jobs(tmp_path, steps=steps)
    with pytest.raises(SpecError, match="policy="):
        run_two_jobs(tmp_path, steps=1, policy=["tiny-qwen2"])
    assert list(tmp_path.iterdir()) == [], "nothing written"


@contextlib.contextmanager
def _placed_job(tmp_path, job_id: str):
    """A control plane of one node per pool on 127.0.0.1, with ``job_id`` placed on it:
    (client, job handle)."""
    from rollmux.demo import _control_plane
    from rollmux.runtime.sdk import Client

    with _control_plane(1, 1, str(tmp_path)) as (url, token):
        client = Client(url, token=token)
        try:
            job = client.submit({"job_id": job_id, "t_roll_s": 1.0, "t_train_s": 1.0, "slo": 2.0})
            job.wait_placed(timeout_s=60)
            yield client, job
        finally:
            client.close()


def _config(tmp_path, max_steps: int, **extra):
    """A GRPOConfig for the tiny policy on the CPU: 8 completions per prompt, no saving
    (``extra``: other GRPOConfig fields)."""
    from trl import GRPOConfig

    from rollmux.integrations.trl_toy import COMPLETION_LEN

    fields = dict(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=max_steps, seed=1,
                  per_device_train_batch_size=8, num_generations=8, max_completion_length=COMPLETION_LEN,
                  learning_rate=1e-2, beta=0.0, logging_steps=1, save_strategy="no", report_to="none",
                  disable_tqdm=True)
    return GRPOConfig(**(fields | extra))


def test_smollm2_shaped_policy_has_smollm2_135m_architecture_over_the_toy_vocabulary():
    pytest.importorskip("transformers")
    import torch

    from rollmux.integrations.trl_toy import POLICIES, toy_tokenizer

    tok = toy_tokenizer()
    model = POLICIES["smollm2-135m"].build(tok, 3)
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.rope_theta if hasattr(c, "rope_theta") else
            c.rope_parameters["rope_theta"]) == (9, 3, 100000.0)
    assert c.vocab_size == len(tok) and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    # SmolLM2-135M's 134.5M parameters less 49,152 - 17 embedding rows of width 576
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 - (49_152 - len(tok)) * 576
    again = POLICIES["smollm2-135m"].build(tok, 3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_device_memory_cache_notes_cuda_switches_only():
    import torch

    from rollmux.integrations.trl_jobs import DeviceMemoryCache

    cpu = DeviceMemoryCache(1 << 20)
    module = torch.nn.Linear(8, 8)
    cpu.register("k", module, None)
    cpu.offload("k")
    cpu.load("k", "cpu")
    assert cpu.after == {"load": [], "offload": []} and cpu.summary() is None
    if not torch.cuda.is_available():
        return
    gpu = DeviceMemoryCache(1 << 30)
    big = torch.nn.Linear(4096, 4096).cuda()                      # 64 MiB of fp32 state
    gpu.register("k", big, None)
    gpu.offload("k")
    gpu.load("k", "cuda")
    gpu.offload("k")
    summary = gpu.summary()
    assert summary["offload"]["count"] == 2 and summary["load"]["count"] == 1
    assert summary["load"]["allocated_min"] - summary["offload"]["allocated_max"] >= 4096 * 4096 * 4


def test_compare_alone_sums_the_solo_runs_and_checks_the_series_value_for_value():
    from rollmux.errors import SpecError
    from rollmux.integrations.trl_jobs import compare_alone

    def run(wall, **jobs):
        return {"steps": 2, "phases_wall_s": wall,
                "jobs": {k: {"rewards": r, "losses": [0.5, -0.25]} for k, r in jobs.items()}}

    together = run(7.0, a=[0.1, 0.2], b=[0.3, 0.4])
    out = compare_alone(together, [run(5.0, a=[0.1, 0.2]), run(9.0, b=[0.3, 0.5])])
    assert (out["together_s"], out["alone_s"], out["speedup"]) == (7.0, 14.0, 2.0)
    assert out["same_rewards"] == {"a": True, "b": False} and out["same_losses"] == {"a": True, "b": True}
    with pytest.raises(SpecError, match="alone"):
        compare_alone(together, [run(5.0, a=[0.1, 0.2])])
    with pytest.raises(SpecError, match="2 steps each"):
        compare_alone(together, [run(5.0, a=[0.1, 0.2]), dict(run(9.0, b=[0.3, 0.4]), steps=3)])


def test_write_plots_draws_a_window_and_refuses_an_empty_one(tmp_path):
    pytest.importorskip("matplotlib")
    from rollmux.errors import SpecError
    from rollmux.integrations.trl_jobs import write_plots

    spans = [{"pool": pool, "node": node, "iteration": i, "start": 10.0 + 2 * i + k, "end": 11.0 + 2 * i + k}
             for i in range(5) for k, (pool, node) in enumerate((("rollout", "R0"), ("train", "T0")))]
    summary = {"policy": "tiny-qwen2", "device": "cpu",
               "jobs": {"a": {"phase_spans": spans, "rewards": [0.1, 0.2, 0.4, 0.5, 0.7]}}}
    paths = write_plots(summary, tmp_path / "plots", window=(2.0, 6.0), alone=[summary])
    assert [p.name for p in paths] == ["gantt.png", "rewards.png"] and all(p.stat().st_size > 10_000 for p in paths)
    with pytest.raises(SpecError, match="window"):
        write_plots(summary, tmp_path / "none", window=(100.0, 200.0))
    assert not (tmp_path / "none").exists()


def test_example_refuses_bad_arguments_with_a_message_and_status_2(tmp_path):
    pytest.importorskip("trl")
    import subprocess
    import sys
    from pathlib import Path

    import torch

    example = Path(__file__).parents[1] / "examples" / "trl" / "two_jobs.py"
    bad = [(["--steps", "0"], "steps=0")] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "device='cuda'")])
    for args, message in bad:
        done = subprocess.run([sys.executable, str(example), "--out", str(tmp_path / "out"), *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_train_that_raises_hands_the_model_back_and_can_be_run_again(tmp_path):
    """A reward function that fails at the third generation: ``train`` raises, the model's
    parameters are back (they were left as (0,) tensors parked in the cache), the failed
    rollout is due again (it counted as done, so the retry was refused 409 'due for
    train'), and a second ``train`` runs all its steps."""
    pytest.importorskip("trl")
    import torch

    from rollmux.errors import SpecError
    from rollmux.integrations.trl import RollMuxGRPOTrainer
    from rollmux.integrations.trl_toy import digit_reward, shift_dataset, toy_tokenizer, tiny_qwen2

    calls = [0]

    def flaky_reward(completions, target, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("reward server down")
        return digit_reward(completions, target, **kwargs)

    tokenizer = toy_tokenizer()
    model = tiny_qwen2(tokenizer, 1)
    shapes = [tuple(p.shape) for p in model.parameters()]
    config = _config(tmp_path, max_steps=4)
    with _placed_job(tmp_path, "flaky") as (client, job):
        trainer = RollMuxGRPOTrainer(job=job, model=model, reward_funcs=flaky_reward, args=config,
                                     processing_class=tokenizer, train_dataset=shift_dataset(0, 8 * 4, 1))
        with pytest.raises(RuntimeError, match="reward server down"):
            trainer.train()
        assert [tuple(p.shape) for p in model.parameters()] == shapes
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert f"{job.job_id}/policy" not in trainer.phases.cache
        view = client.job("flaky")
        assert (view["next_phase"], view["iterations_done"]) == ("rollout", 2)
        trainer.train()
        assert trainer.state.global_step == 4 and client.job("flaky")["iterations_done"] == 6
        job.complete()
    with pytest.raises(SpecError, match="job='NoneType'"):
        RollMuxGRPOTrainer(job=None, model=model, reward_funcs=digit_reward, args=config)


def test_a_train_whose_update_fails_can_be_run_again(tmp_path):
    """A callback raising at the end of step 2 (a checkpoint's disk full) failed the train
    phase; the job was then due for training, and the second ``train()``, which starts
    with a generation, was refused for good (409 'due for train'). The failed update now
    restarts the job's iteration at its rollout (``restart_on_failure``)."""
    pytest.importorskip("trl")
    from transformers import TrainerCallback

    from rollmux.integrations.trl import RollMuxGRPOTrainer
    from rollmux.integrations.trl_toy import digit_reward, shift_dataset, toy_tokenizer, tiny_qwen2

    class DiskFull(TrainerCallback):
        armed = True

        def on_step_end(self, args, state, control, **kwargs):
            if self.armed and state.global_step == 2:
                self.armed = False
                raise OSError("checkpoint disk full")

    tokenizer = toy_tokenizer()
    model = tiny_qwen2(tokenizer, 1)
    config = _config(tmp_path, max_steps=4)
    with _placed_job(tmp_path, "update") as (client, job):
        trainer = RollMuxGRPOTrainer(job=job, model=model, reward_funcs=digit_reward, args=config,
                                     processing_class=tokenizer, train_dataset=shift_dataset(0, 8 * 4, 1),
                                     callbacks=[DiskFull()])
        with pytest.raises(OSError, match="checkpoint disk full"):
            trainer.train()
        view = client.job("update")
        assert (view["next_phase"], view["iterations_done"]) == ("rollout", 1)
        trainer.train()
        assert trainer.state.global_step == 4 and client.job("update")["iterations_done"] == 5
        job.complete()


def test_a_cache_too_small_for_the_model_is_named_and_left_as_it_was(tmp_path):
    """The budget error was masked by a 'load with residency device' error from the hand
    back, and the entry stayed in the user's cache, so every later train() failed too,
    whatever the budget. A cache of the wrong kind is refused before the trainer is built."""
    pytest.importorskip("trl")

    from rollmux.errors import SpecError
    from rollmux.integrations.trl import RollMuxGRPOTrainer
    from rollmux.integrations.trl_toy import digit_reward, shift_dataset, toy_tokenizer, tiny_qwen2
    from rollmux.runtime.state_cache import CacheBudgetError, StateCache

    tokenizer = toy_tokenizer()
    model = tiny_qwen2(tokenizer, 1)
    config = _config(tmp_path, max_steps=1)
    with _placed_job(tmp_path, "small") as (client, job):
        for cache, needle in (("x", "cache='str'"), (object(), "cache='object'")):
            with pytest.raises(SpecError, match=needle):
                RollMuxGRPOTrainer(job=job, model=model, reward_funcs=digit_reward, args=config, cache=cache)
        with pytest.raises(SpecError, match="cache_budget_bytes='8G'"):
            RollMuxGRPOTrainer(job=job, model=model, reward_funcs=digit_reward, args=config, cache_budget_bytes="8G")
        cache = StateCache(1000)
        trainer = RollMuxGRPOTrainer(job=job, model=model, reward_funcs=digit_reward, args=config, cache=cache,
                                     processing_class=tokenizer, train_dataset=shift_dataset(0, 8, 1))
        with pytest.raises(CacheBudgetError, match="budget has 1000 bytes left"):
            trainer.train()
        assert "small/policy" not in cache and all(p.numel() for p in model.parameters())
        cache.budget_bytes = 1 << 30
        trainer.train()
        assert trainer.state.global_step == 1 and client.job("small")["iterations_done"] == 1
        job.complete()


def _eval_free(entry: dict) -> dict:
    """A log entry without its timings (they differ run to run)."""
    return {k: v for k, v in entry.items() if not k.endswith(("runtime", "per_second", "step_time"))}


def test_eval_on_start_runs_in_the_first_rollout_grant_as_plain_trl_evaluates(tmp_path):
    """``eval_on_start``: transformers evaluates right after ``on_train_begin``, when the
    state was parked (placeholders of 0 elements) and no grant held, so the evaluation's
    forward failed ('weight' must be 2-D). It now takes the job's first rollout grant,
    which the first generation keeps: the logs (evaluations included) are plain TRL's,
    and the phases still alternate."""
    pytest.importorskip("trl")
    from trl import GRPOTrainer

    from rollmux.integrations.trl import RollMuxGRPOTrainer
    from rollmux.integrations.trl_toy import digit_reward, shift_dataset, toy_tokenizer, tiny_qwen2

    tokenizer = toy_tokenizer()
    extra = dict(eval_strategy="steps", eval_steps=2, eval_on_start=True, per_device_eval_batch_size=8)
    data = dict(train_dataset=shift_dataset(0, 8 * 4, 1), eval_dataset=shift_dataset(0, 8, 2))
    plain = GRPOTrainer(model=tiny_qwen2(tokenizer, 1), reward_funcs=digit_reward, processing_class=tokenizer,
                        args=_config(tmp_path / "plain", 2, **extra), **data)
    plain.train()
    with _placed_job(tmp_path, "eos") as (client, job):
        trainer = RollMuxGRPOTrainer(job=job, model=tiny_qwen2(tokenizer, 1), reward_funcs=digit_reward,
                                     processing_class=tokenizer, args=_config(tmp_path, 2, **extra), **data)
        trainer.train()
        assert [h[0] for h in job.history] == ["rollout", "train"] * 2
        assert client.job("eos")["iterations_done"] == 2
        job.complete()
    logs = [_eval_free(e) for e in trainer.state.log_history]
    assert logs == [_eval_free(e) for e in plain.state.log_history]
    assert sum("eval_loss" in e for e in logs) == 2


def test_reference_and_reward_models_are_parked_with_the_policy(tmp_path):
    """``beta > 0``: TRL builds a reference model, and a reward function may be a model;
    both stayed on the device between phases (only the policy and optimizer were parked).
    They are now in the job's cache entry: 0-element placeholders after every phase,
    back on the host after ``train``, and the run is plain TRL's, step for step."""
    pytest.importorskip("trl")
    import torch
    from transformers import Qwen2ForSequenceClassification
    from trl import GRPOTrainer

    from rollmux.integrations.trl import RollMuxGRPOTrainer, logged_series
    from rollmux.integrations.trl_toy import digit_reward, shift_dataset, toy_tokenizer, tiny_qwen2

    tokenizer = toy_tokenizer()
    tiny_qwen2(tokenizer, 1).save_pretrained(tmp_path / "policy")

    def build(cls, out, **extra):
        config = tiny_qwen2(tokenizer, 2).config
        config.num_labels = 1
        torch.manual_seed(3)
        scorer = Qwen2ForSequenceClassification(config)
        return cls(model=str(tmp_path / "policy"), reward_funcs=[digit_reward, scorer],
                   reward_processing_classes=[None, tokenizer], processing_class=tokenizer,
                   args=_config(out, 2, beta=0.04), train_dataset=shift_dataset(0, 8 * 2, 1), **extra)

    plain = build(GRPOTrainer, tmp_path / "plain")
    plain.train()
    with _placed_job(tmp_path, "beta") as (client, job):
        trainer = build(RollMuxGRPOTrainer, tmp_path, job=job)
        others = [trainer.ref_model, trainer.reward_funcs[1]]
        parked = []
        release = trainer.phases.release

        def watch(failure=None):
            release(failure)
            parked.append([sum(p.numel() for p in m.parameters()) for m in others])

        trainer.phases.release = watch
        trainer.train()
        job.complete()
    assert len(parked) >= 4 and all(sizes == [0, 0] for sizes in parked[:4]), parked
    assert all(p.numel() and p.device.type == "cpu" for m in others for p in m.parameters())
    assert logged_series(trainer.state.log_history, "kl") == logged_series(plain.state.log_history, "kl")
    assert logged_series(trainer.state.log_history, "loss") == logged_series(plain.state.log_history, "loss")
    assert logged_series(trainer.state.log_history, "kl")[-1] > 0
