"""Checks of the phases jobs ran under RollMux grants, from their recorded spans.

A span is a dict with ``pool`` (``rollout`` / ``train``), ``nodes`` (list of node ids),
``start`` and ``end`` (wall-clock seconds); a job's spans are in the order it ran them.
"""
from __future__ import annotations

from rollmux.model import ROLLOUT, TRAIN


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
