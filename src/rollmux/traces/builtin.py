"""Named traces shipped with RollMux, and one entry point for names or files.

Contract
--------
* ``load_trace(spec, cluster, seed)`` takes a builtin name from ``BUILTIN`` or a path to
  a job-trace CSV (format.py) and returns ``(jobs, info)``. ``info`` holds ``name``,
  ``source`` (one line naming where the data comes from), ``jobs`` (count) and
  ``span_hours`` (first to last arrival); "philly-mix" adds ``mapping`` (the PhillyStats
  counts).
* "production": the RollMux paper's 200-job trace, read as is (``seed`` is unused: its
  SLOs were drawn when it was converted).
* "philly-mix": the packaged 300-job Philly segment mapped to RL jobs with
  ``philly.mix_from_segment(..., seed, mix="mixed")``.
* Every job is validated against ``cluster`` (when given): a file raises
  TraceFormatError, a builtin SpecError. A spec that is neither a builtin nor an
  existing file raises SpecError listing the builtins.
"""
from __future__ import annotations

import warnings
from importlib import resources
from pathlib import Path

from rollmux.errors import SpecError
from rollmux.model import Cluster, Job
from rollmux.traces.format import read_trace
from rollmux.traces.philly import PhillyStats, mix_from_segment

BUILTIN = ("production", "philly-mix")

_SOURCES = {
    "production": "RollMux paper authors' production trace (github wutianyuan1/ROLL, "
                  "global_scheduler/trace), 200 RL jobs",
    "philly-mix": "Microsoft Philly (Jeon et al., USENIX ATC 2019; msr-fiddle/philly-traces, "
                  "CC-BY-4.0, flattened by RFold), 300-job segment mapped to RL jobs",
}
_FILES = {"production": "production.csv", "philly-mix": "philly_seg300.csv"}


def _span_hours(jobs: list[Job]) -> float:
    if not jobs:
        return 0.0
    arrivals = [job.arrival_s for job in jobs]
    return (max(arrivals) - min(arrivals)) / 3600.0


def load_trace(spec: str, cluster: Cluster | None = None, seed: int = 0
               ) -> tuple[list[Job], dict]:
    """Load a builtin trace or a trace file; see the module contract."""
    info: dict = {"name": spec}
    if spec in BUILTIN and Path(spec).exists():
        warnings.warn(f"{spec!r} names the builtin trace, which is used, not the file {spec!r} here: give "
                      f"./{spec} for the file", stacklevel=2)
    if spec in BUILTIN:
        data = resources.files("rollmux.traces") / "data" / _FILES[spec]
        with resources.as_file(data) as path:
            if spec == "production":
                jobs = read_trace(path, cluster)
            else:
                stats = PhillyStats()
                jobs = mix_from_segment(path, seed, stats=stats)
                for job in jobs:
                    job.validate(cluster)
                info["mapping"] = stats.as_dict()
        info["source"] = _SOURCES[spec]
    elif Path(spec).is_file():
        jobs = read_trace(spec, cluster)
        info["name"] = Path(spec).stem
        info["source"] = f"file {spec}"
    else:
        raise SpecError("trace", spec, f"a builtin trace {list(BUILTIN)} or an existing trace file")
    info["jobs"] = len(jobs)
    info["span_hours"] = round(_span_hours(jobs), 1)
    return jobs, info
