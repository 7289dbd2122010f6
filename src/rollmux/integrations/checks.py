"""Checks of the phases jobs ran under RollMux grants, from their recorded spans.

A span is a dict with ``pool`` (``rollout`` / ``train``), ``nodes`` (list of node ids),
``start`` and ``end`` (wall-clock seconds); a job's spans are in the order it ran them.
"""
from __future__ import annotations

import statistics

from rollmux.model import ROLLOUT, TRAIN


def history_spans(history: list[tuple]) -> list[dict]:
    """A job's spans from its SDK handle's ``history`` ((pool, nodes, seq, start, end) per
    phase, in the order it ran them), each with its iteration (two phases per iteration)."""
    return [{"pool": pool, "nodes": list(nodes), "iteration": i // 2, "start": start, "end": end}
            for i, (pool, nodes, _seq, start, end) in enumerate(history)]


def span_report(spans: list[dict]) -> dict:
    """A job's mean rollout and train phase seconds, and its spans one per node (``phase_spans``)."""
    return {"mean_rollout_s": statistics.fmean(s["end"] - s["start"] for s in spans if s["pool"] == ROLLOUT),
            "mean_train_s": statistics.fmean(s["end"] - s["start"] for s in spans if s["pool"] == TRAIN),
            "phase_spans": [{"node": node, "pool": s["pool"], "iteration": s["iteration"], "start": s["start"],
                             "end": s["end"]} for s in spans for node in s["nodes"]]}


def phases_wall(spans_by_job: dict[str, list[dict]]) -> float:
    """Seconds from the first grant to the last release, over every job."""
    spans = [s for job_spans in spans_by_job.values() for s in job_spans]
    return max(s["end"] for s in spans) - min(s["start"] for s in spans)


def phase_checks(spans_by_job: dict[str, list[dict]], iterations: dict[str, int]) -> dict:
    """``{"alternates": {job: bool}, "overlaps": [...], "ok": bool}``.

    A job alternates when its spans are exactly rollout, train repeated
    ``iterations[job]`` times and each starts no earlier than the previous one ended.
    ``overlaps`` lists every pair of spans of different jobs that share a node and
    overlap in time (``{"node", "jobs", "at"}``); ``ok``: every job alternates and
    there is no overlap.
    """
    alternates = {}
    for job, spans in spans_by_job.items():
        pools = [s["pool"] for s in spans]
        ordered = all(a["end"] <= b["start"] for a, b in zip(spans, spans[1:]))
        alternates[job] = ordered and pools == [ROLLOUT, TRAIN] * iterations[job]
    by_node: dict[str, list[tuple[float, float, str]]] = {}
    for job, spans in spans_by_job.items():
        for s in spans:
            for node in s["nodes"]:
                by_node.setdefault(node, []).append((s["start"], s["end"], job))
    overlaps = []
    for node, items in sorted(by_node.items()):
        items.sort()
        for i, (start, end, job) in enumerate(items):
            for other_start, _other_end, other in items[i + 1:]:
                if other_start >= end:
                    break
                if other != job:
                    overlaps.append({"node": node, "jobs": [job, other], "at": other_start})
    return {"alternates": alternates, "overlaps": overlaps,
            "ok": all(alternates.values()) and not overlaps}
