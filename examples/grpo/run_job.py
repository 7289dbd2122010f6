"""Run one GRPO job against a running ``rollmux serve`` and a Ray cluster whose nodes
carry the RollMux node resources (see docs/ray.md).

    RAY_AUTH_MODE=disabled python examples/grpo/run_job.py --url http://127.0.0.1:8470 \
        --ray-address auto --profile reverse-r --iterations 30 --t-roll 0.8 --t-train 0.3

The job registers, waits for its placement, starts its rollout and training workers on
the pinned Ray nodes, runs its phases under RollMux grants with its state switched
through the warm-start cache, and prints the reward of every iteration.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402

from rollmux import Client  # noqa: E402
from rollmux.grpo.driver import job_spec, run_job, warm_start_weights  # noqa: E402
from rollmux.grpo.profiles import DEMO_PROFILES  # noqa: E402

PROFILES = {p.name: p for ps in DEMO_PROFILES.values() for p in ps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ROLLMUX_URL", "http://127.0.0.1:8470"))
    parser.add_argument("--ray-address", default="auto")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="reverse-r")
    parser.add_argument("--job-id", default=None, help="defaults to the profile name")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--t-roll", type=float, default=1.0, help="declared rollout seconds (planner input)")
    parser.add_argument("--t-train", type=float, default=1.0, help="declared training seconds (planner input)")
    args = parser.parse_args()

    profile = PROFILES[args.profile]
    job_id = args.job_id or profile.name
    ray.init(address=args.ray_address)
    client = Client(args.url)
    try:
        job = client.submit(job_spec(job_id, profile, args.t_roll, args.t_train))
        run = run_job(job, profile, args.iterations, warm_start_weights(profile),
                      on_iteration=lambda j, i, r: print(f"{j} iteration {i}: reward {r:.3f}", flush=True))
    finally:
        client.close()
        ray.shutdown()
    loads = [s.seconds * 1e3 for s in run.switches if s.direction == "load"]
    print(f"{job_id}: {run.mean_iteration_s:.2f} s/iteration on {run.placement}, "
          f"reward {run.rewards[0]:.3f} -> {run.rewards[-1]:.3f}, warm load mean {sum(loads) / len(loads):.1f} ms")


if __name__ == "__main__":
    main()
