"""The shared reward service against rewards computed in each rollout worker.

Starts a local Ray (127.0.0.1, 2 CPUs) and the reward service (``rollmux.reward_service``:
autoscaling between 1 and ``--max-replicas`` replicas of 0.25 CPU). ``--clients`` Ray
actors stand for the jobs' rollout workers; each scores ``--calls`` batches of
``--batch`` random (task, prompt, completion) items, back to back, in two phases:

1. service: every batch through a ``RewardClient`` (a Serve ``DeploymentHandle``), all
   clients at once; then the service is left idle until it is back to one replica (at
   most ``--idle-s`` seconds), so the replica curve shows the scale-down too;
2. in-process: the same batches scored inside each actor (the demo's default), all
   clients at once.

Both phases score with ``--kind`` (``exact``: the tasks' verifiers; ``learned``: the
tiny reward model, the same weights in the service and the actors) and check that the
service's rewards equal the in-process ones. Prints, per phase, calls, p50 / p99 latency
per call and calls per second; for the service the ``summary.json["reward_service"]``
record (replicas max, replicas over time). Writes that record and the in-process one as
JSON to ``--out`` and the replica count over time (Matplotlib, Agg) to ``--plot``.

Usage::

    RAY_AUTH_MODE=disabled python benchmarks/reward_service.py
    RAY_AUTH_MODE=disabled python benchmarks/reward_service.py --clients 6 --calls 100 --kind exact
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")  # read when Serve is imported

import numpy as np  # noqa: E402
import ray  # noqa: E402

from rollmux.reward_model import (  # noqa: E402
    RewardModel, exact_rewards, model_rewards, train_reward_model, training_items)
from rollmux.reward_service import (  # noqa: E402
    ReplicaMonitor, RewardClient, running_replicas, running_service, summary)


@ray.remote(num_cpus=0)
class Client:
    """A rollout worker's reward scoring: through the service, or in its own process."""

    def __init__(self, weights: dict) -> None:
        import torch

        torch.set_num_threads(1)
        self.model = RewardModel()
        self.model.load_state_dict(weights)
        self.client = RewardClient()

    def run(self, batches: list, kind: str, where: str) -> tuple[list[float], list[list[float]]]:
        """Score every batch; returns (latency per call in ms, rewards per batch)."""
        latencies, rewards = [], []
        for items in batches:
            t0 = time.perf_counter()
            if where == "service":
                rewards.append(self.client.score(items, kind))
            elif kind == "exact":
                rewards.append(exact_rewards(items))
            else:
                rewards.append(model_rewards(self.model, items))
            latencies.append((time.perf_counter() - t0) * 1000.0)
        return latencies, rewards


def percentiles(latencies_ms: list[float], wall_s: float) -> dict:
    lat = np.asarray(latencies_ms)
    return {"calls": int(lat.size), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "calls_per_s": lat.size / wall_s}


def phase(actors: list, batches: list, kind: str, where: str) -> tuple[list[float], list, float]:
    t0 = time.perf_counter()
    results = ray.get([a.run.remote(b, kind, where) for a, b in zip(actors, batches)])
    wall = time.perf_counter() - t0
    return [ms for lat, _ in results for ms in lat], [r for _, r in results], wall


def plot(record: dict, windows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, n = zip(*record["replicas_over_time"])
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.step(t, n, where="post", color="tab:blue", label="running replicas")
    colours = {"service": "tab:orange", "in-process": "tab:green"}
    for name, (a, b) in windows.items():
        ax.axvspan(a, b, color=colours[name], alpha=0.2, label=f"{name} calls")
    ax.set_xlabel("seconds since the service was ready")
    ax.set_ylabel("replicas")
    ax.set_yticks(range(0, max(n) + 2))
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--batch", type=int, default=256, help="items per call")
    ap.add_argument("--kind", choices=("exact", "learned"), default="learned")
    ap.add_argument("--max-replicas", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=60.0, help="longest wait for the scale-down")
    ap.add_argument("--out", type=Path, default=Path("reward-service-out/summary.json"))
    ap.add_argument("--plot", type=Path, default=Path("reward-service-out/replicas.png"))
    args = ap.parse_args()

    rng = random.Random(0)
    batches = [[training_items(rng, args.batch) for _ in range(args.calls)] for _ in range(args.clients)]
    model, _ = train_reward_model()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with running_service(max_replicas=args.max_replicas, weights=weights):
        monitor = ReplicaMonitor().start()  # its clock: seconds since the service was ready
        try:
            actors = [Client.remote(weights) for _ in range(args.clients)]
            ray.get([a.run.remote([batches[0][0]], args.kind, "service") for a in actors])  # connect, warm up
            windows = {}
            t0 = monitor.elapsed()
            service_ms, service_rewards, service_wall = phase(actors, batches, args.kind, "service")
            windows["service"] = (t0, t0 + service_wall)
            deadline = time.monotonic() + args.idle_s
            while running_replicas() > 1 and time.monotonic() < deadline:
                time.sleep(0.5)
            t0 = monitor.elapsed()
            local_ms, local_rewards, local_wall = phase(actors, batches, args.kind, "in-process")
            windows["in-process"] = (t0, t0 + local_wall)
            time.sleep(1.0)
        finally:
            monitor.stop()  # before running_service shuts Serve and Ray down, even on failure
    same = service_rewards == local_rewards
    record = summary(service_ms, monitor)
    report = {"reward_service": record, "service": percentiles(service_ms, service_wall),
              "in_process": percentiles(local_ms, local_wall), "same_rewards": same,
              "windows_s": {name: [round(a, 2), round(b, 2)] for name, (a, b) in windows.items()},
              "config": {k: v for k, v in vars(args).items() if k not in ("out", "plot")}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    plot(record, windows, args.plot)
    print(f"{args.clients} clients x {args.calls} calls x {args.batch} items, kind={args.kind}, "
          f"max_replicas={args.max_replicas}; rewards identical: {same}")
    print(f"{'':<12}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>9}")
    for name in ("service", "in_process"):
        r = report[name]
        print(f"{name:<12}{r['calls']:>7}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['calls_per_s']:>9.1f}")
    print(f"replicas max {record['replicas_max']}; replicas over time (t s, n) at changes: "
          + ", ".join(f"({t:.1f}, {n})" for k, (t, n) in enumerate(record["replicas_over_time"])
                      if k == 0 or n != record["replicas_over_time"][k - 1][1]))
    print("calls (s since the service was ready): " + ", ".join(
        f"{name} {a:.1f}-{b:.1f}" for name, (a, b) in windows.items()))
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
