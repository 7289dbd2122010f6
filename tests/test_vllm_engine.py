"""vLLM engines as rollout state (rollmux.integrations.vllm_engine) and the vLLM GRPO jobs' learner.

The state's contract (what it asks the engine, in which order, and what it refuses) is
checked against a recording stand-in for ``vllm.LLM`` that exposes the same four calls;
the real engine is exercised by the CUDA test at the end (skipped without vLLM and a
GPU) and by ``benchmarks/gpu_vllm.sh`` on the lent GPU.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rollmux.errors import DeviceUnavailableError, FrameworkConfigError, SpecError
from rollmux.integrations.vllm_engine import VllmEngineState, sleep_mode_enabled
from rollmux.integrations.vllm_jobs import JOBS, GRPOLearner, VllmJob, engines_overlap, run_two_jobs
from rollmux.runtime.state_cache import CacheStateError, Residency


class RecordingLLM:
    """Answers ``sleep``, ``wake_up`` and ``collective_rpc`` like ``vllm.LLM`` and notes each call."""

    def __init__(self, sleep_mode: bool = True) -> None:
        config = SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=sleep_mode))
        self.llm_engine = SimpleNamespace(vllm_config=config)
        self.calls: list[tuple] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags else None))


def test_level_1_wakes_inside_the_block_and_sleeps_after_it():
    llm = RecordingLLM()
    engine = VllmEngineState(llm, level=1, measure=lambda: None)
    engine.park()
    assert llm.calls == [("sleep", 1)] and engine.residency is Residency.HOST
    for _ in range(2):
        with engine.resident("job/rollout", "cuda") as inside:
            assert inside is llm and engine.residency is Residency.DEVICE
            llm.calls.append(("generate",))
    assert llm.calls == [("sleep", 1), ("wake_up", None), ("generate",), ("sleep", 1),
                         ("wake_up", None), ("generate",), ("sleep", 1)]
    assert [r.direction for r in engine.records] == ["sleep", "wake", "sleep", "wake", "sleep"]
    assert all(r.device_bytes is None and r.level == 1 for r in engine.records)
    assert engine.summary()["sleep"]["count"] == 3 and engine.summary()["wake"]["count"] == 2


def test_level_2_maps_weights_loads_them_then_maps_the_kv_cache():
    llm = RecordingLLM()
    loaded = []
    engine = VllmEngineState(llm, level=2, load_weights=lambda x: (loaded.append(x), llm.calls.append(("load",))),
                             measure=lambda: None)
    engine.park()
    with engine.resident():
        pass
    assert llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("load",), ("wake_up", ("kv_cache",)),
                         ("sleep", 2)]
    assert loaded == [llm]
    wake = [r for r in engine.records if r.direction == "wake"][0]
    assert 0 <= wake.load_s <= wake.seconds


def test_an_engine_awake_at_first_is_not_woken_and_a_raising_body_still_sleeps():
    llm = RecordingLLM()
    engine = VllmEngineState(llm, level=1, measure=lambda: None)
    with pytest.raises(RuntimeError, match="boom"):
        with engine.resident():
            raise RuntimeError("boom")
    assert llm.calls == [("sleep", 1)] and engine.residency is Residency.HOST


class MappingLLM(RecordingLLM):
    """A ``RecordingLLM`` that tracks the tags whose pages are mapped, refusing to map one twice
    (as the allocator does)."""

    def __init__(self) -> None:
        super().__init__()
        self.mapped: set[str] = {"weights", "kv_cache"}

    def sleep(self, level: int = 1) -> None:
        super().sleep(level)
        self.mapped.clear()

    def wake_up(self, tags: list[str] | None = None) -> None:
        super().wake_up(tags)
        for tag in tags or ["weights", "kv_cache"]:
            if tag in self.mapped:
                raise RuntimeError(f"{tag} already mapped")
            self.mapped.add(tag)


@pytest.mark.parametrize("level", [1, 2])
def test_a_wake_whose_load_fails_puts_the_engine_back_to_sleep(level):
    """A level-2 wake whose ``load_weights`` raised left the weights' pages mapped with the
    state saying 'host', outside any grant; the retry's wake then mapped them again."""
    llm = MappingLLM()
    failures = [OSError("weights folder half-written")]

    def load(_):
        if failures:
            raise failures.pop()

    engine = VllmEngineState(llm, level=level, load_weights=load, measure=lambda: None)
    engine.park()
    with pytest.raises(OSError, match="half-written"):
        with engine.resident():
            pytest.fail("the body ran without weights")
    assert llm.calls[-1] == ("sleep", level) and not llm.mapped and engine.residency is Residency.HOST
    with engine.resident():  # the next grant wakes afresh
        assert llm.mapped == {"weights", "kv_cache"}
    assert not llm.mapped and [r.direction for r in engine.records] == ["sleep", "wake", "sleep"]


def test_a_failed_kv_cache_wake_sleeps_and_a_failed_sleep_is_noted():
    llm = MappingLLM()
    engine = VllmEngineState(llm, level=2, load_weights=lambda _: None, measure=lambda: None)
    engine.park()
    llm.mapped.add("kv_cache")  # (mapping the KV cache fails)
    with pytest.raises(RuntimeError, match="kv_cache already mapped"):
        engine.wake()
    assert llm.calls[-1] == ("sleep", 2) and engine.residency is Residency.HOST

    def broken_sleep(level: int = 1) -> None:
        raise RuntimeError("driver gone")

    llm.mapped.add("kv_cache")
    llm.sleep = broken_sleep
    with pytest.raises(RuntimeError, match="kv_cache already mapped") as info:
        engine.wake()
    assert any("back to sleep failed too: RuntimeError: driver gone" in note for note in info.value.__notes__)


def test_device_bytes_come_from_the_free_memory_count():
    free = iter([10, 70, 70, 20])  # sleep: 10 -> 70 free (60 back); wake: 70 -> 20 (50 taken)
    engine = VllmEngineState(RecordingLLM(), level=1, measure=lambda: next(free))
    assert engine.sleep().device_bytes == 60
    assert engine.wake().device_bytes == 50
    assert engine.summary()["sleep"]["device_gb_median"] == 60 / 1e9


@pytest.mark.parametrize("kwargs, field", [
    ({"level": 0}, "level"), ({"level": 3}, "level"), ({"level": True}, "level"),
    ({"level": 2}, "load_weights"), ({"level": 1, "load_weights": "weights/"}, "load_weights"),
])
def test_bad_arguments_are_refused_naming_the_field_before_any_call(kwargs, field):
    llm = RecordingLLM()
    with pytest.raises(FrameworkConfigError) as info:
        VllmEngineState(llm, **kwargs)
    assert info.value.field == field and llm.calls == []


def test_an_engine_without_sleep_mode_is_refused():
    llm = RecordingLLM(sleep_mode=False)
    assert not sleep_mode_enabled(llm)
    with pytest.raises(FrameworkConfigError, match="enable_sleep_mode"):
        VllmEngineState(llm)
    assert llm.calls == []


def test_switching_twice_the_same_way_is_refused():
    llm = RecordingLLM()
    engine = VllmEngineState(llm, measure=lambda: None)
    with pytest.raises(CacheStateError):
        engine.wake()
    engine.sleep()
    with pytest.raises(CacheStateError):
        engine.sleep()
    assert llm.calls == [("sleep", 1)]


def test_engines_overlap_finds_exactly_the_intervals_that_intersect():
    def records(*spans):
        out = []
        for start, end in spans:
            out += [{"direction": "wake", "at": start, "seconds": 0.1},
                    {"direction": "sleep", "at": end, "seconds": 0.1}]
        return out
    apart = {"a": {"engine_records": records((0, 1), (4, 5))}, "b": {"engine_records": records((2, 3), (6, 7))}}
    assert engines_overlap(apart) == []
    crossing = {"a": {"engine_records": records((0, 1), (4, 5))}, "b": {"engine_records": records((2, 4.05))}}
    assert engines_overlap(crossing) == [{"jobs": ["b", "a"], "at": 4}]


def test_learner_rewards_logprob_gap_and_update_on_cpu():
    learner = GRPOLearner(VllmJob("t", shift=1, seed=3, prompts=3, num_generations=2), "tiny-qwen2", "cpu")
    prompts, targets = learner.batch()
    assert len(prompts) == 3 and all(len(p) == 2 for p in prompts)
    tok = learner.tokenizer
    for p, t in zip(prompts, targets):  # target = (prompt digit + 1) mod 10
        digit = tok.convert_ids_to_tokens(p[0])
        assert tok.convert_ids_to_tokens(t) == str((int(digit) + 1) % 10)
    completions = [[[t] * 8, [t] * 4 + [tok.eos_token_id]] for t in targets]
    assert learner.rewards(completions[0], targets[0]) == [1.0, 0.5]
    with torch.no_grad():
        logp, mask = learner.token_logprobs(prompts, completions)
    assert mask.sum(dim=1).tolist() == [8, 5] * 3
    engine = [[float(x) for x in logp.sum(dim=1)[2 * i:2 * i + 2]] for i in range(3)]
    before = [p.detach().clone() for p in learner.model.parameters()]
    out = learner.step(prompts, targets, completions, engine)
    assert out["reward"] == pytest.approx(0.75) and out["logprob_gap"] == pytest.approx(0.0, abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    shifted = [[x + 0.8 for x in group] for group in engine]  # 0.8 nats more per completion
    gap = learner.step(prompts, targets, completions, shifted)["logprob_gap"]
    assert gap > 0.05


def test_export_writes_what_a_loader_reads_back(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    learner = GRPOLearner(JOBS[0], "tiny-qwen2", "cpu")
    learner.export(tmp_path / "w")
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "w" / "model.safetensors"))
    assert "lm_head.weight" not in saved and all(t.dtype == torch.bfloat16 for t in saved.values())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "w", dtype=torch.float32)
    ids = torch.tensor([learner.batch()[0][0]])
    with torch.no_grad():
        a, b = learner.model(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert torch.allclose(a, b, atol=0.05), (a - b).abs().max()
    assert not list(tmp_path.glob("w/*.tmp"))


@pytest.mark.parametrize("kwargs, field", [
    ({"iterations": 0}, "iterations"), ({"iterations": True}, "iterations"), ({"utilization": 1.0}, "utilization"),
    ({"utilization": 0.0}, "utilization"), ({"policy": "gpt-9"}, "policy"),
])
def test_run_two_jobs_refuses_bad_arguments_before_starting(tmp_path: Path, kwargs, field):
    with pytest.raises(SpecError) as info:
        run_two_jobs(tmp_path / "out", **kwargs)
    assert info.value.field == field and not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_run_two_jobs_needs_a_gpu(tmp_path: Path):
    with pytest.raises(DeviceUnavailableError, match="CUDA"):
        run_two_jobs(tmp_path / "out", iterations=1)


needs_vllm_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or __import__("importlib").util.find_spec("vllm") is None,
    reason="needs a CUDA GPU and vLLM")


@needs_vllm_gpu
def test_real_engine_sleeps_gives_memory_back_and_wakes_to_the_same_outputs(tmp_path: Path):
    import os

    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rollmux.integrations.vllm_jobs import start_engine

    learner = GRPOLearner(JOBS[0], "smollm2-135m", "cpu")
    folder = tmp_path / "w"
    learner.export(folder)
    llm = start_engine(folder, JOBS[0], 0.3)
    try:
        assert sleep_mode_enabled(llm)
        params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in learner.batch()[0]]

        def greedy():
            return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        reference = greedy()
        for level in (1, 2):
            engine = VllmEngineState(llm, level=level, load_weights=None if level == 1 else (
                lambda x: x.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})))
            record = engine.park()
            assert record.device_bytes > 10e9  # the weights and the KV cache went back
            with engine.resident():
                assert greedy() == reference
            engine.wake()  # awake again for the next level's state
    finally:
        llm.llm_engine.engine_core.shutdown()


class ToyEngine(RecordingLLM):
    """An engine stand-in for the two-job run on CPU: the exported policy, loaded with
    transformers; a level-2 sleep poisons its weights (NaN), so that only a reload through
    ``load_weights`` brings them back."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM

        super().__init__()
        self.folder = folder
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.awake = True
        self.llm_engine.engine_core = SimpleNamespace(shutdown=lambda: self.calls.append(("shutdown",)))

    def sleep(self, level: int = 1) -> None:
        super().sleep(level)
        assert self.awake, "slept twice"
        self.awake = False
        if level == 2:
            with torch.no_grad():
                for param in self.model.parameters():
                    param.fill_(float("nan"))

    def wake_up(self, tags=None) -> None:
        super().wake_up(tags)
        self.awake = True

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        from safetensors.torch import load_file

        assert method == "reload_weights" and Path(kwargs["weights_path"]) == self.folder
        state = load_file(str(self.folder / "model.safetensors"))
        self.model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        self.model.tie_weights()


def toy_sample(llm: ToyEngine, prompts, n):
    """``vllm_jobs.sample`` on the stand-in: n sampled completions per prompt and their summed log-probabilities."""
    assert llm.awake, "sampled while asleep"
    completions, logprobs = [], []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p] * n)
            out = llm.model.generate(ids, do_sample=True, max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
            group = out[:, len(p):].tolist()
            logits = llm.model(input_ids=out).logits[:, len(p) - 1:-1].log_softmax(-1)
            lp = logits.gather(-1, out[:, len(p):].unsqueeze(-1)).squeeze(-1).sum(-1)
            completions.append(group)
            logprobs.append([float(x) for x in lp])
    return completions, logprobs


def test_two_jobs_run_on_cpu_with_stand_in_engines(tmp_path: Path, monkeypatch):
    """The whole run around the engines (control plane, grants, level-2 reloads, trainer
    state cache, summary, plots) with engines that only answer correctly when the
    trainer's latest weights were pushed into them at each wake."""
    from rollmux.integrations import vllm_jobs

    monkeypatch.setattr(vllm_jobs, "_check_machine", lambda: None)
    engines: list[ToyEngine] = []
    monkeypatch.setattr(vllm_jobs, "start_engine",
                        lambda folder, job, utilization: engines.append(ToyEngine(folder)) or engines[-1])
    monkeypatch.setattr(vllm_jobs, "sample", toy_sample)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (60e9, 80e9))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    lines: list[str] = []
    summary = run_two_jobs(tmp_path / "out", iterations=3, policy="tiny-qwen2", log=lines.append,
                           trainer_device="cpu")
    assert summary["checks"]["ok"] and summary["engines_awake_together"] == []
    for job_id, j in summary["jobs"].items():
        assert j["service_state"] == "done" and j["service_iterations_done"] == 3
        assert len(j["rewards"]) == 3 and len(j["logprob_gap"]) == 3
        assert j["logprob_gap_max"] < 1e-2, (job_id, j["logprob_gap"])  # sampled with the trainer's weights
        assert [r["direction"] for r in j["engine_records"]] == ["sleep"] + ["wake", "sleep"] * 3
    assert summary["reserved_fraction"] == pytest.approx(1.1)
    assert [e.calls[-1] for e in engines] == [("shutdown",)] * 2
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"summary.json", "gantt.png", "rewards.png"}
    assert any("phases alternate: True" in line for line in lines)


def test_summed_logprob_uses_the_cumulative_figure_else_the_per_token_entries():
    from rollmux.integrations.vllm_jobs import _summed_logprob

    entry = lambda x: SimpleNamespace(logprob=x)  # noqa: E731
    with_total = SimpleNamespace(cumulative_logprob=-1.5, logprobs=None, token_ids=[4, 5])
    per_token = SimpleNamespace(cumulative_logprob=None, token_ids=[4, 5],
                                logprobs=[{4: entry(-0.25), 9: entry(-3.0)}, {5: entry(-0.5)}])
    assert _summed_logprob(with_total) == -1.5
    assert _summed_logprob(per_token) == -0.75
