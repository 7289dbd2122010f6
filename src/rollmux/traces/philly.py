"""Microsoft Philly traces and their mapping onto RL post-training jobs.

Philly (Jeon et al., USENIX ATC 2019) records when a job arrived, how many GPUs it held
and how long it ran, but nothing about RL phases. The mapping below turns each Philly
job into an RL job as the RollMux simulation study does (facts section 9); every rule
is a modelling choice, stated here and in docs/traces.md.

Mapping contract (``to_rl_jobs``)
---------------------------------
* Records are taken in arrival order (ties in file order); arrivals are rebased so the
  first kept job arrives at 0; ``duration_s`` is the Philly duration.
* Dropped and counted, in this order: a job arriving outside ``window`` (start, end) in
  the file's seconds, start inclusive (``outside_window``); a job of fewer than
  ``min_gpus`` GPUs (``below_min_gpus``); a zero-length job (duration 0); a job whose id
  repeats an earlier one. ``limit`` stops after that many kept jobs.
* GPUs: a Philly job of G GPUs gets ``ceil(G / 2)`` GPUs per phase rounded up to whole
  8-GPU nodes, capped at ``max_phase_gpus`` (a job above the cap is kept
  at the cap and counted as capped). Rollout and training get the same count. A job
  whose ``ceil(G / 2)`` is not a whole number of nodes is counted as ``rounded_up`` (a
  1-GPU Philly job becomes an 8 + 8-GPU job: RL jobs hold whole nodes); ``widths``
  counts kept jobs per "rollout+train" GPUs and ``models`` per model size.
* Model size by G: up to 8 GPUs 7B, up to 16 GPUs 14B, larger 32B (the paper's testbed
  pairs 7B and 14B jobs with 8/8 GPUs and 32B jobs with 16/16). Host memory per node is
  the paper's Table 2 figure for that size.
* Phase times: the job's profile is drawn uniformly from the ``mix`` (one profile, or all
  three for "mixed"), its size class S/M/L uniformly, then each phase uniformly inside
  that profile's range for that class (rounded to 0.1 s); SLO uniformly inside
  ``slo_range`` (rounded to 0.001, clamped into the range). All draws come from one
  ``random.Random``, per job in arrival order: profile, class, t_roll, t_train, slo.

Reading contract (``read_philly``)
----------------------------------
Reads either the flattened RFold format (header ``#job id,arrival time (sec),topology,
shape,size,duration (sec)``) or the segment format (``job_id,arrival_s,gpus,
node_shape,duration_s``, optionally more columns). The header is the first line whose
names (after a leading ``#``) include the four columns needed; earlier ``#`` lines are
comments. A data row whose field count differs from the header's or whose arrival, GPU
count or duration does not parse, is not finite, is negative (GPU count: below 1), or
that no RL job can hold (an id with a control character, an arrival past ``MAX_TIME_S``,
a duration past ``MAX_DURATION_S``), is skipped and counted as malformed, never fatal.
The file is read as ``text_file.read_text`` reads it: bytes that are not UTF-8 raise
TraceFormatError naming the line, as does a file without a recognisable header.
"""
from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import CONTROL_CHARS, MAX_JOB_ITERATIONS, MAX_SLO, MAX_TIME_S, Job
from rollmux.report.paths import replacing
from rollmux.text_file import read_text
from rollmux.traces.format import write_trace

#: Phase-time ranges in seconds per size class S/M/L: profile -> (rollout, train).
PROFILES: dict[str, tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]] = {
    "balanced": (((50, 100), (100, 200), (200, 300)), ((50, 100), (100, 200), (200, 300))),
    "rollout-heavy": (((100, 200), (200, 400), (400, 600)), ((25, 50), (50, 100), (100, 200))),
    "train-heavy": (((25, 50), (50, 100), (100, 200)), ((100, 200), (200, 400), (400, 600))),
}
MIXES = ("mixed", *PROFILES)
#: The longest Philly duration an RL job can take: ``MAX_JOB_ITERATIONS`` solo iterations of
#: the shortest phases any profile draws (50 + 50 s: 1e8 s, about 3.2 years; the public
#: file's longest job ran 5.2e6 s). Whatever the draws, a job within it passes ``Job.validate``.
MAX_DURATION_S = MAX_JOB_ITERATIONS * min(roll[0] + train[0] for rolls, trains in PROFILES.values()
                                          for roll, train in zip(rolls, trains))
#: Host memory per 8-GPU node (GB) by model size, the paper's Table 2: (rollout, train).
TABLE2_MEM_GB = {3: (113.4, 156.2), 7: (275.7, 240.0), 14: (445.4, 456.1), 32: (490.3, 520.4)}
#: GPUs per node the mapping rounds up to.
NODE_GPUS = 8
#: Default cap on GPUs per phase: four 8-GPU nodes, twice the paper's largest RL job.
MAX_PHASE_GPUS = 32

_ALIASES = {
    "job_id": ("job id", "job_id"),
    "arrival_s": ("arrival time (sec)", "arrival_s"),
    "gpus": ("size", "gpus"),
    "duration_s": ("duration (sec)", "duration_s"),
}
_SHAPE = ("shape", "node_shape")  # optional


@dataclass(slots=True, frozen=True)
class PhillyJob:
    """One Philly job: when it arrived, how many GPUs it held, how long it ran."""

    job_id: str
    arrival_s: float
    gpus: int
    duration_s: float
    shape: str = ""  # GPUs per machine as Philly wrote it (e.g. "8+8"), when the file has it


@dataclass(slots=True)
class PhillyStats:
    """What happened to the rows of a Philly file.

    ``malformed`` counts rows skipped by ``read_philly`` over the whole file;
    ``zero_length``, ``duplicate`` and ``capped`` count among records considered before
    ``limit`` was reached; ``beyond_limit`` the records never considered. ``rounded_up``,
    ``widths`` and ``models`` describe the kept jobs (see the mapping contract).
    """

    rows: int = 0
    malformed: int = 0
    outside_window: int = 0
    below_min_gpus: int = 0
    zero_length: int = 0
    duplicate: int = 0
    capped: int = 0
    rounded_up: int = 0
    beyond_limit: int = 0
    kept: int = 0
    widths: dict[str, int] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def check_mix(mix: str, slo_range: tuple[float, float]) -> None:
    """Raise SpecError for an unknown mix or an SLO range outside 1 <= lo <= hi <= ``MAX_SLO``."""
    if mix not in MIXES:
        raise SpecError("mix", mix, f"one of {list(MIXES)}")
    lo, hi = slo_range
    if not 1.0 <= lo <= hi <= MAX_SLO:
        raise SpecError("slo_range", slo_range, f"a range 1.0 <= lo <= hi <= {MAX_SLO:g}")


def _find_columns(text: str) -> dict[str, int] | None:
    names = [n.strip().lower() for n in next(csv.reader([text.lstrip().lstrip("#")]), [])]
    columns = {}
    for key, aliases in _ALIASES.items():
        hits = [i for i, name in enumerate(names) if name in aliases]
        if not hits:
            return None
        columns[key] = hits[0]
    columns["shape"] = next((i for i, name in enumerate(names) if name in _SHAPE), -1)
    columns["width"] = len(names)
    return columns


def _parse_row(fields: list[str], columns: dict[str, int]) -> PhillyJob | None:
    if len(fields) != columns["width"]:
        return None
    try:
        arrival = float(fields[columns["arrival_s"]])
        duration = float(fields[columns["duration_s"]])
        gpus_f = float(fields[columns["gpus"]])
    except ValueError:
        return None
    job_id = fields[columns["job_id"]].strip()
    if not (job_id and math.isfinite(arrival) and math.isfinite(duration)
            and math.isfinite(gpus_f) and gpus_f.is_integer()):
        return None
    if arrival > MAX_TIME_S or duration > MAX_DURATION_S or CONTROL_CHARS.search(job_id):  # no job can hold it
        return None
    if arrival < 0 or duration < 0 or gpus_f < 1:
        return None
    shape = fields[columns["shape"]].strip() if columns["shape"] >= 0 else ""
    return PhillyJob(job_id, arrival, int(gpus_f), duration, shape)


def read_philly(path: str | Path, stats: PhillyStats | None = None) -> list[PhillyJob]:
    """Read a Philly file (either format) into records in file order; see the contract.

    ``stats`` (when given) gets ``rows`` and ``malformed`` added.
    """
    stats = stats if stats is not None else PhillyStats()
    columns: dict[str, int] | None = None
    records: list[PhillyJob] = []
    with io.StringIO(read_text(path), newline="") as handle:  # lines as read_trace cuts them
        for text in handle:
            if not text.strip():
                continue
            if columns is None:
                columns = _find_columns(text)
                if columns is None and not text.lstrip().startswith("#"):
                    break
                continue
            if text.lstrip().startswith("#"):
                continue
            stats.rows += 1
            try:
                record = _parse_row(next(csv.reader([text])), columns)
            except csv.Error:  # a field over the csv module's limit: an unusable row
                record = None
            if record is None:
                stats.malformed += 1
            else:
                records.append(record)
    if columns is None:
        raise TraceFormatError(str(path), 1, "", "no Philly header: expected columns "
                               + " / ".join(f"{a[0]!r} or {a[1]!r}" for a in _ALIASES.values()))
    return records


def phase_gpus(philly_gpus: int, max_phase_gpus: int = MAX_PHASE_GPUS) -> tuple[int, bool]:
    """GPUs per phase for a Philly job of ``philly_gpus`` GPUs, and whether it was capped."""
    half = -(-philly_gpus // 2)
    wanted = -(-half // NODE_GPUS) * NODE_GPUS
    return (max_phase_gpus, True) if wanted > max_phase_gpus else (wanted, False)


def model_size(philly_gpus: int) -> int:
    """Model size in billions of parameters assigned to a Philly job by its GPU count."""
    if philly_gpus <= 8:
        return 7
    return 14 if philly_gpus <= 16 else 32


def draw_phases(rng: random.Random, mix: str, slo_range: tuple[float, float]
                ) -> tuple[float, float, float]:
    """Draw (t_roll_s, t_train_s, slo) for one job; see the mapping contract."""
    profile = rng.choice(tuple(PROFILES) if mix == "mixed" else (mix,))
    size_class = rng.randrange(3)
    roll_ranges, train_ranges = PROFILES[profile]
    t_roll = round(rng.uniform(*roll_ranges[size_class]), 1)
    t_train = round(rng.uniform(*train_ranges[size_class]), 1)
    lo, hi = slo_range
    return t_roll, t_train, min(hi, max(lo, round(rng.uniform(lo, hi), 3)))


def select(records: list[PhillyJob], limit: int | None = None, stats: PhillyStats | None = None,
           min_gpus: int = 1, window: tuple[float, float] | None = None) -> list[PhillyJob]:
    """The records the mapping keeps, in arrival order: the drops of the mapping contract
    (window, GPUs, zero length, duplicates, limit), counted in ``stats``."""
    if limit is not None and limit < 0:
        raise SpecError("limit", limit, "a job count >= 0 or None")
    if not (isinstance(min_gpus, int) and min_gpus >= 1):
        raise SpecError("min_gpus", min_gpus, "a GPU count >= 1")
    if window is not None and not (0 <= window[0] < window[1]):
        raise SpecError("window", window, "start < end, both >= 0")
    stats = stats if stats is not None else PhillyStats()
    kept: list[PhillyJob] = []
    seen: set[str] = set()
    ordered = sorted(records, key=lambda r: r.arrival_s)
    for index, record in enumerate(ordered):
        if limit is not None and len(kept) >= limit:
            stats.beyond_limit += len(ordered) - index
            break
        if window is not None and not window[0] <= record.arrival_s < window[1]:
            stats.outside_window += 1
        elif record.gpus < min_gpus:
            stats.below_min_gpus += 1
        elif record.duration_s == 0:
            stats.zero_length += 1
        elif record.job_id in seen:
            stats.duplicate += 1
        else:
            seen.add(record.job_id)
            kept.append(record)
    return kept


def to_rl_jobs(records: list[PhillyJob], rng: random.Random, mix: str = "mixed",
               slo_range: tuple[float, float] = (1.0, 2.0), limit: int | None = None,
               stats: PhillyStats | None = None, max_phase_gpus: int = MAX_PHASE_GPUS,
               min_gpus: int = 1, window: tuple[float, float] | None = None) -> list[Job]:
    """Map Philly records to RL jobs; see the mapping contract. Updates ``stats``."""
    check_mix(mix, slo_range)
    stats = stats if stats is not None else PhillyStats()
    jobs: list[Job] = []
    chosen = select(records, limit, stats, min_gpus, window)
    origin = chosen[0].arrival_s if chosen else 0.0
    for record in chosen:
        gpus, capped = phase_gpus(record.gpus, max_phase_gpus)
        stats.capped += capped
        stats.rounded_up += not capped and -(-record.gpus // 2) % NODE_GPUS != 0
        size = model_size(record.gpus)
        stats.widths[f"{gpus}+{gpus}"] = stats.widths.get(f"{gpus}+{gpus}", 0) + 1
        stats.models[f"{size}B"] = stats.models.get(f"{size}B", 0) + 1
        mem_roll, mem_train = TABLE2_MEM_GB[size]
        t_roll, t_train, slo = draw_phases(rng, mix, slo_range)
        jobs.append(Job(job_id=record.job_id, t_roll_s=t_roll, t_train_s=t_train,
                        rollout_gpus=gpus, train_gpus=gpus, mem_roll_gb=mem_roll,
                        mem_train_gb=mem_train, slo=slo, model=f"{size}B",
                        arrival_s=record.arrival_s - origin, duration_s=record.duration_s))
    stats.kept += len(jobs)
    return jobs


def mix_from_segment(path: str | Path, seed: int, mix: str = "mixed",
                     slo_range: tuple[float, float] = (1.0, 2.0),
                     limit: int | None = None, stats: PhillyStats | None = None) -> list[Job]:
    """RL jobs from a Philly file: ``read_philly`` then ``to_rl_jobs`` seeded with ``seed``."""
    stats = stats if stats is not None else PhillyStats()
    records = read_philly(path, stats)
    return to_rl_jobs(records, random.Random(seed), mix, slo_range, limit, stats)


def write_segment(records: list[PhillyJob], path: str | Path, source: str) -> None:
    """Write kept Philly records in the segment format the bundled philly-mix uses:
    arrivals rebased to the first, the original arrival beside them, ``source`` as a
    leading comment line. Whole or untouched, as ``write_trace``."""
    origin = records[0].arrival_s if records else 0.0
    with replacing(Path(path)) as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        handle.write(f"# {source}\n")
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(["job_id", "arrival_s", "gpus", "node_shape", "duration_s", "orig_arrival_s"])
        for r in records:
            out.writerow([r.job_id, _plain(r.arrival_s - origin), r.gpus, r.shape, _plain(r.duration_s),
                          _plain(r.arrival_s)])


def _plain(x: float) -> str:
    """Seconds to the microsecond, without trailing zeros (the raw file's 7953.000000000001
    is written 7953)."""
    return f"{x:.6f}".rstrip("0").rstrip(".")


def convert_philly(in_path: str | Path, out_path: str | Path, limit: int | None = None,
                   seed: int = 0, mix: str = "mixed",
                   slo_range: tuple[float, float] = (1.0, 2.0), min_gpus: int = 1,
                   window: tuple[float, float] | None = None, segment_path: str | Path | None = None) -> dict:
    """Convert a Philly file into a job trace at ``out_path``; return the PhillyStats counts.
    ``segment_path``: also write the kept Philly records there (``write_segment``)."""
    stats = PhillyStats()
    records = read_philly(in_path, stats)
    jobs = to_rl_jobs(records, random.Random(seed), mix, slo_range, limit, stats, min_gpus=min_gpus, window=window)
    write_trace(jobs, out_path)
    if segment_path is not None:
        by_id = {r.job_id: r for r in select(records, limit, None, min_gpus, window)}
        write_segment([by_id[j.job_id] for j in jobs], segment_path,
                      f"Philly records kept from {Path(in_path).name}: min GPUs {min_gpus}, window {window}, "
                      f"limit {limit}; arrival rebased to 0")
    return stats.as_dict()
