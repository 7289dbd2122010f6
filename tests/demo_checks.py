"""Checks the live demo tests share."""
from __future__ import annotations


def assert_every_job_complete(summary: dict, runs: dict) -> None:
    """Every job at its target by the driver's and the service's count; its phases alternate
    and its iterations are contiguous (none lost or repeated) and never overlap."""
    for job_id, job in summary["jobs"].items():
        n = job["iterations_target"]
        assert job["iterations_done"] == n == job["service_iterations_done"] == len(job["rewards"]), job_id
        assert job["service_state"] == "done", job_id
        spans = runs[job_id]["spans"]
        assert [(s["pool"], s["iteration"]) for s in spans] == [(p, i) for i in range(n) for p in ("rollout", "train")]
        assert all(a["end"] <= b["start"] for a, b in zip(spans, spans[1:]))
