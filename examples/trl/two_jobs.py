"""Two TRL GRPO jobs multiplexed by RollMux: a local Ray cluster (one rollout node, one
training node), the control plane on 127.0.0.1, and each job's ``GRPOTrainer``
(``rollmux.integrations.trl.RollMuxGRPOTrainer``) in a Ray actor pinned to its node.

    RAY_AUTH_MODE=disabled python examples/trl/two_jobs.py --out trl-out            # 60 steps per job
    RAY_AUTH_MODE=disabled python examples/trl/two_jobs.py --out trl-out --quick    # 8 steps per job
    RAY_AUTH_MODE=disabled python examples/trl/two_jobs.py --out trl-out --device cuda --policy smollm2-135m
    RAY_AUTH_MODE=disabled python examples/trl/two_jobs.py --out solo-out --alone trl-copy   # the baseline

Writes ``<out>/summary.json`` (steps done, reward before/after, phase spans per node,
checks: alternation per job, no overlap on a node) and prints a report. Exits 1 if a
check fails. See docs/integrations.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollmux.errors import RollMuxError
from rollmux.integrations.trl_jobs import DEFAULT_STEPS, DEVICES, JOBS, QUICK_STEPS, run_two_jobs
from rollmux.integrations.trl_toy import POLICIES


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trl-out"), help="where summary.json goes")
    parser.add_argument("--steps", type=int, default=None, help=f"optimizer steps per job (default {DEFAULT_STEPS})")
    parser.add_argument("--quick", action="store_true", help=f"a short run: {QUICK_STEPS} steps per job")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where the trainers run: cpu, or cuda (both jobs share the machine's first GPU)")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="tiny-qwen2",
                        help="tiny-qwen2 (75k parameters) or smollm2-135m (SmolLM2-135M's architecture, "
                             "toy vocabulary: 106M parameters; for a GPU)")
    parser.add_argument("--alone", choices=[j.job_id for j in JOBS], default=None,
                        help="run only this job, by itself under the same service (the solo baseline)")
    args = parser.parse_args()
    if args.out.exists() and not args.out.is_dir():
        print(f"error: --out {args.out}: a file; expected a folder (made if missing)", file=sys.stderr)
        return 2
    steps = args.steps if args.steps is not None else QUICK_STEPS if args.quick else DEFAULT_STEPS
    jobs = tuple(j for j in JOBS if args.alone in (None, j.job_id))
    try:
        summary = run_two_jobs(args.out, steps=steps, jobs=jobs, device=args.device, policy=args.policy)
    except RollMuxError as exc:  # a bad argument: nothing was started
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if summary["checks"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
