"""Two GRPO jobs whose rollouts run in vLLM engines sharing one GPU under RollMux: each
engine reserves more than half the GPU, so they cannot be awake together; RollMux's
rollout grants wake one at a time (sleep level 2, the trainer's latest weights loaded
at each wake), and each job's trainer takes its train grants on the same GPU.

    python examples/vllm/two_jobs.py --out vllm-out                   # 30 iterations per job
    python examples/vllm/two_jobs.py --out vllm-out --iterations 5 --utilization 0.6

Needs a CUDA GPU and vLLM (``benchmarks/gpu_vllm.sh`` runs it on the lent machine).
Writes ``<out>/summary.json`` (rewards, log-probability gap engine vs trainer, switch
times, phase spans, checks), ``gantt.png`` and ``rewards.png``, and prints a report.
Exits 1 if a check fails (phases out of order, two jobs on a node at once, engines
awake together), 2 on a bad argument or a machine without a GPU or vLLM.
See docs/integrations.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollmux.errors import RollMuxError
from rollmux.integrations.trl_toy import POLICIES
from rollmux.integrations.vllm_jobs import DEFAULT_ITERATIONS, DEFAULT_UTILIZATION, run_two_jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("vllm-out"), help="where summary.json goes")
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                        help=f"GRPO steps per job (default {DEFAULT_ITERATIONS})")
    parser.add_argument("--utilization", type=float, default=DEFAULT_UTILIZATION,
                        help=f"each engine's gpu_memory_utilization (default {DEFAULT_UTILIZATION}: "
                             "together more than the GPU)")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="smollm2-135m",
                        help="smollm2-135m (SmolLM2-135M's architecture, toy vocabulary: 106M parameters) "
                             "or tiny-qwen2 (75k)")
    args = parser.parse_args()
    try:
        summary = run_two_jobs(args.out, iterations=args.iterations, utilization=args.utilization,
                               policy=args.policy)
    except RollMuxError as exc:  # a bad argument or a missing GPU/vLLM: nothing was started
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if summary["checks"]["ok"] and not summary["engines_awake_together"] else 1


if __name__ == "__main__":
    sys.exit(main())
