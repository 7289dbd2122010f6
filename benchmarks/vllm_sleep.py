"""vLLM's sleep and wake (``LLM.sleep(level)`` / ``wake_up``), as RollMux's rollout state hook uses them; CUDA only.

For each model, one engine (``enable_sleep_mode=True``, eager, ``--utilization`` of the
GPU) is put to sleep and woken ``--cycles`` + 1 times per level through
``rollmux.integrations.vllm_engine.VllmEngineState``; the first cycle is shown apart.

* ``toy-106m``: the GRPO demo's policy (SmolLM2-135M's architecture over the toy
  vocabulary, randomly initialised, written as bf16 safetensors). Level 2 wakes load
  the weights again from that folder (vLLM's ``reload_weights``).
* ``qwen2.5-1.5b``, ``qwen2.5-7b``: those models' configurations with vLLM's dummy
  weights (nothing to download). Level 2 is timed without loading weights (the dummy
  loader cannot reload), so its wake is only the pages mapped again.

Checked: greedy completions of 8 prompts are the same token for token after every
level-1 wake and, for ``toy-106m``, after every level-2 wake with its reload.

Columns: ``weights`` GB (bf16 parameters), ``freed`` the device GB the sleep gave
back (weights and KV cache, from the driver's free count), ``1st sleep`` / ``1st wake``,
then the medians of the other cycles; ``load`` the weight reload inside a level-2
wake; ``of memcpy`` = (weights / d2h + weights / h2d) of a plain pinned copy measured
in the same run, over (sleep + wake) at level 1: 100% would be the copy bound.

Usage::

    python benchmarks/vllm_sleep.py --json vllm_sleep.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from state_switch import device_name, memcpy_bound  # noqa: E402

QWEN = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
MODELS = ("toy-106m", *QWEN)
PROMPTS = [[5 + i, 4 + (i % 3)] for i in range(8)]


@dataclass(frozen=True)
class Row:
    model: str
    level: int
    weights_gb: float
    freed_gb: float
    start_s: float
    first_sleep_s: float
    first_wake_s: float
    sleep_s: float
    wake_s: float
    load_s: float
    of_memcpy: float | None
    same_outputs: bool | None


def write_model(label: str, folder: Path) -> tuple[str, int]:
    """The model's folder; returns vLLM's load format and the parameter count."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    if label == "toy-106m":
        from rollmux.integrations.vllm_jobs import GRPOLearner, VllmJob

        learner = GRPOLearner(VllmJob("bench", shift=0, seed=1), "smollm2-135m", "cpu")
        learner.export(folder)
        return "auto", sum(p.numel() for p in learner.model.parameters())
    config = Qwen2Config(**QWEN[label], max_position_embeddings=4096, rope_theta=1e6,
                         architectures=["Qwen2ForCausalLM"])
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return "dummy", params


def greedy(llm) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def measure(label: str, cycles: int, utilization: float, bound: tuple[float, float]) -> list[Row]:
    from vllm import LLM

    from rollmux.integrations.vllm_engine import VllmEngineState

    rows = []
    with tempfile.TemporaryDirectory(prefix="vllm-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        folder = Path(d) / label
        load_format, params = write_model(label, folder)
        weights = 2 * params
        t0 = time.perf_counter()
        llm = LLM(model=str(folder), load_format=load_format, dtype="bfloat16", enable_sleep_mode=True,
                  gpu_memory_utilization=utilization, enforce_eager=True, skip_tokenizer_init=True,
                  max_model_len=32, seed=0)
        start_s = time.perf_counter() - t0
        try:
            reference = greedy(llm)
            for level in (1, 2):
                reload = level == 2 and load_format == "auto"
                checked = level == 1 or reload

                def load(llm, reload=reload):  # dummy weights cannot be reloaded: the wake maps pages only
                    if reload:
                        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
                engine = VllmEngineState(llm, level=level, load_weights=load if level == 2 else None)
                same = True
                for _ in range(cycles + 1):
                    engine.sleep()
                    engine.wake()
                    if checked:
                        same = same and greedy(llm) == reference
                sleeps = [r for r in engine.records if r.direction == "sleep"]
                wakes = [r for r in engine.records if r.direction == "wake"]
                sleep_s = statistics.median(r.seconds for r in sleeps[1:])
                wake_s = statistics.median(r.seconds for r in wakes[1:])
                bound_s = weights / (bound[0] * 1e9) + weights / (bound[1] * 1e9)
                rows.append(Row(label, level, weights / 1e9,
                                statistics.median((r.device_bytes or 0) for r in sleeps) / 1e9, start_s,
                                sleeps[0].seconds, wakes[0].seconds, sleep_s, wake_s,
                                statistics.median(r.load_s for r in wakes[1:]),
                                bound_s / (sleep_s + wake_s) if level == 1 else None,
                                same if checked else None))
                print(f"  {label} level {level}: sleep {sleep_s:.3f} s, wake {wake_s:.3f} s, "
                      f"same outputs {rows[-1].same_outputs}", flush=True)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def format_table(rows: list[Row]) -> str:
    header = (f"{'model':>13} {'lvl':>3} {'weights':>7} {'freed':>7} {'start':>6} {'1st sleep':>9} {'1st wake':>8} "
              f"{'sleep':>7} {'wake':>7} {'load':>7} {'of memcpy':>9} {'same':>5}")
    lines = [header, "-" * len(header)]
    for r in rows:
        of = f"{r.of_memcpy:.0%}" if r.of_memcpy is not None else "-"
        same = "-" if r.same_outputs is None else ("yes" if r.same_outputs else "NO")
        lines.append(f"{r.model:>13} {r.level:>3} {r.weights_gb:>6.2f}G {r.freed_gb:>6.1f}G {r.start_s:>5.1f}s "
                     f"{r.first_sleep_s:>9.3f} {r.first_wake_s:>8.3f} {r.sleep_s:>7.3f} {r.wake_s:>7.3f} "
                     f"{r.load_s:>7.3f} {of:>9} {same:>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated of {list(MODELS)}")
    parser.add_argument("--cycles", type=int, default=3, help="steady sleep+wake cycles per level (after the first)")
    parser.add_argument("--utilization", type=float, default=0.5, help="each engine's gpu_memory_utilization")
    parser.add_argument("--json", default=None, help="also write the rows and the setup here")
    args = parser.parse_args(argv)
    labels = args.models.split(",")
    unknown = [label for label in labels if label not in MODELS]
    if unknown:
        parser.error(f"--models: unknown label(s) {unknown}; choose from {list(MODELS)}")
    if args.cycles < 1:
        parser.error("--cycles: at least 1")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    import vllm

    device = torch.device("cuda", torch.cuda.current_device())
    bound = memcpy_bound(1 << 31, device)
    print(f"device: {device_name(device)}; torch {torch.__version__}; vllm {vllm.__version__}; memcpy "
          f"{bound[0]:.1f} GB/s d2h, {bound[1]:.1f} GB/s h2d; cycles {args.cycles}", flush=True)
    rows = []
    for label in labels:
        rows.extend(measure(label, args.cycles, args.utilization, bound))
    print(format_table(rows))
    if args.json:
        setup = {"command": " ".join(["vllm_sleep.py", *(argv if argv is not None else sys.argv[1:])]),
                 "device": device_name(device), "torch": torch.__version__, "vllm": vllm.__version__,
                 "cycles": args.cycles, "utilization": args.utilization, "memcpy_gb_s": bound}
        Path(args.json).write_text(json.dumps({"setup": setup, "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
