"""Checks of the phases jobs ran under RollMux grants, from their recorded spans.

A span is a mapping with ``pool`` (``rollout`` / ``train``), ``nodes`` (a non-empty list
of node ids, non-empty strings), ``start`` and ``end`` (wall-clock seconds, finite
numbers, ``start <= end``); a job's spans are in the order it ran them, and a job may
have run none, or no training phase (a run that failed before it).

Every function refuses what is not so with ``SpecError`` naming the field, e.g.
``history[2].nodes`` (a node id given as a bare string is refused, not split into its
characters), ``spans_by_job['a'][0].end`` (an end before the start) or
``iterations['a']`` (a job without its iteration count).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

from rollmux.errors import SpecError
from rollmux.model import ROLLOUT, TRAIN

_HISTORY_ENTRY = "a (pool, nodes, seq, start, end) tuple"


def _seconds(value: object, field: str) -> float:
    """``value`` if it is a finite number (not a bool), else SpecError naming ``field``."""
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return value
    except OverflowError:  # (an int too large for a float)
        pass
    raise SpecError(field, value, "a finite number of wall-clock seconds")


def _checked(span: object, field: str) -> Mapping:
    """``span`` if it is a span (module docstring), else SpecError naming ``field`` or its key."""
    if not isinstance(span, Mapping):
        raise SpecError(field, span, "a span: a mapping with pool, nodes, start and end")
    if span.get("pool") not in (ROLLOUT, TRAIN):
        raise SpecError(f"{field}.pool", span.get("pool"), f"{ROLLOUT!r} or {TRAIN!r}")
    nodes = span.get("nodes")
    if not isinstance(nodes, (list, tuple)) or not nodes or not all(isinstance(n, str) and n for n in nodes):
        raise SpecError(f"{field}.nodes", nodes, "a non-empty list of node ids (non-empty strings)")
    start, end = _seconds(span.get("start"), f"{field}.start"), _seconds(span.get("end"), f"{field}.end")
    if end < start:
        raise SpecError(f"{field}.end", end, f"a time no earlier than the span's start ({start!r})")
    return span


def _job_spans(spans: object, field: str) -> list | tuple:
    """``spans`` if it is a list of spans, else SpecError naming ``field`` or the bad span's field."""
    if not isinstance(spans, (list, tuple)):
        raise SpecError(field, spans, "a list of spans")
    for i, span in enumerate(spans):
        _checked(span, f"{field}[{i}]")
    return spans


def _by_job(spans_by_job: object) -> Mapping:
    """``spans_by_job`` if it maps each job to a list of spans, else SpecError naming the field."""
    if not isinstance(spans_by_job, Mapping):
        raise SpecError("spans_by_job", spans_by_job, "a mapping job -> its list of spans")
    for job, spans in spans_by_job.items():
        _job_spans(spans, f"spans_by_job[{job!r}]")
    return spans_by_job


def history_spans(history: list[tuple]) -> list[dict]:
    """A job's spans from its SDK handle's ``history`` ((pool, nodes, seq, start, end) per
    phase, in the order it ran them), each with its iteration (two phases per iteration).
    A malformed entry raises SpecError naming it (``history[i]``) or its field."""
    if not isinstance(history, (list, tuple)):
        raise SpecError("history", history, f"a list, {_HISTORY_ENTRY} per phase")
    spans = []
    for i, entry in enumerate(history):
        if not isinstance(entry, (list, tuple)) or len(entry) != 5:
            raise SpecError(f"history[{i}]", entry, _HISTORY_ENTRY)
        pool, nodes, _seq, start, end = entry
        _checked({"pool": pool, "nodes": nodes, "start": start, "end": end}, f"history[{i}]")
        spans.append({"pool": pool, "nodes": list(nodes), "iteration": i // 2, "start": start, "end": end})
    return spans


def _mean_s(spans: list | tuple, pool: str) -> float | None:
    """Mean seconds of the spans on ``pool``; None when there is none."""
    seconds = [s["end"] - s["start"] for s in spans if s["pool"] == pool]
    return statistics.fmean(seconds) if seconds else None


def span_report(spans: list[dict]) -> dict:
    """A job's mean rollout and train phase seconds (``mean_rollout_s``, ``mean_train_s``:
    None for a pool the job ran no phase on, e.g. a run that failed before its first
    training phase), and its spans one per node (``phase_spans``). ``spans`` as
    ``history_spans`` gives them (each with its ``iteration``); SpecError names a bad one."""
    _job_spans(spans, "spans")
    for i, s in enumerate(spans):
        iteration = s.get("iteration")
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise SpecError(f"spans[{i}].iteration", iteration, "an iteration number >= 0 (as history_spans gives)")
    return {"mean_rollout_s": _mean_s(spans, ROLLOUT), "mean_train_s": _mean_s(spans, TRAIN),
            "phase_spans": [{"node": node, "pool": s["pool"], "iteration": s["iteration"], "start": s["start"],
                             "end": s["end"]} for s in spans for node in s["nodes"]]}


def seconds_text(value: float | None, spec: str) -> str:
    """A ``span_report`` mean as a report writes it: ``value`` formatted by ``spec`` with " s",
    or "-" for None (a pool the job ran no phase on)."""
    return "-" if value is None else f"{value:{spec}} s"


def phases_wall(spans_by_job: dict[str, list[dict]]) -> float:
    """Seconds from the first grant to the last release, over every job; 0.0 when no job
    ran a phase (no job, or none with a span)."""
    spans = [s for job_spans in _by_job(spans_by_job).values() for s in job_spans]
    if not spans:
        return 0.0
    return max(s["end"] for s in spans) - min(s["start"] for s in spans)


def phase_checks(spans_by_job: dict[str, list[dict]], iterations: dict[str, int]) -> dict:
    """``{"alternates": {job: bool}, "overlaps": [...], "ok": bool}``.

    A job alternates when its spans are exactly rollout, train repeated
    ``iterations[job]`` times and each starts no earlier than the previous one ended
    (a job of 0 iterations alternates when it ran no phase). ``overlaps`` lists every
    pair of spans of different jobs that share a node and overlap in time (``{"node",
    "jobs", "at"}``); ``ok``: every job alternates and there is no overlap.
    ``iterations`` names every job of ``spans_by_job`` (an integer >= 0 each), else
    SpecError naming ``iterations[job]``.
    """
    _by_job(spans_by_job)
    if not isinstance(iterations, Mapping):
        raise SpecError("iterations", iterations, "a mapping job -> its iteration count")
    alternates = {}
    for job, spans in spans_by_job.items():
        count = iterations.get(job)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SpecError(f"iterations[{job!r}]", count, "the job's iteration count, an integer >= 0")
        pools = [s["pool"] for s in spans]
        ordered = all(a["end"] <= b["start"] for a, b in zip(spans, spans[1:]))
        alternates[job] = ordered and pools == [ROLLOUT, TRAIN] * count
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
