"""RollArt's trajectory-level asynchrony on the demo's real GRPO job (CPU, local Ray).

Same task and budget for every run: synchronous GRPO (k = 0), asynchronous with staleness
k = 1 and k = 2 (``rollmux.grpo.async_grpo``), and the multi-turn task with a per-turn
barrier and with trajectory-level scheduling (``rollmux.grpo.agentic``). Writes
``summary.json``, ``rewards.png`` and, with ``--reward-service``, ``replicas.png`` to
``--out`` (see ``rollmux.demo_rollart``).

Usage::

    RAY_AUTH_MODE=disabled python benchmarks/rollart_async.py --out /tmp/rollart
    RAY_AUTH_MODE=disabled python benchmarks/rollart_async.py --out /tmp/rollart-rs --reward-service
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rollmux.demo_rollart import run_rollart  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("rollart-demo"))
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--agentic-iterations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--env-workers", type=int, default=3)
    ap.add_argument("--env-delay-s", type=float, default=0.03)
    ap.add_argument("--reward-service", action="store_true")
    ap.add_argument("--max-replicas", type=int, default=2)
    a = ap.parse_args()
    run_rollart(a.out, a.iterations, (1, 2), a.agentic_iterations, a.turns, a.env_workers, a.env_delay_s,
                a.reward_service, a.max_replicas)
    print(f"wrote {a.out / 'summary.json'}")


if __name__ == "__main__":
    main()
