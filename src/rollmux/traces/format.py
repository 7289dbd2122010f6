"""The job-trace CSV format: one RL job per row.

Contract
--------
* UTF-8, with or without a byte-order mark (as spreadsheet programs write it). The
  first line that is neither blank nor a comment (a line starting with ``#``) is the
  header. Headers and values are stripped of surrounding whitespace.
* Required columns: ``job_id, arrival_s, rollout_gpus, train_gpus, t_roll_s,
  t_train_s, mem_roll_gb, mem_train_gb, slo, model`` and at least one of
  ``duration_s`` / ``iterations``. Optional: ``t_roll_colo_s``, ``t_train_colo_s``,
  ``tail_workers`` (GPUs a rollout keeps for its long tail, 1 to ``rollout_gpus``; empty
  or absent: an eighth of them, ``Job.tail_gpus``),
  ``staleness`` (an integer from 0 to ``MAX_STALENESS``, empty or absent: 0, a synchronous
  job; >= 1: an asynchronous one, rule 10 of ``rollmux.execution``), ``reward_s``,
  ``reward_price_per_hour``, ``reward_mem_gb`` (the shared reward service: seconds
  per iteration, 0 or empty or absent: none; $ per busy hour, empty or absent: the
  default ``rollmux.model.REWARD_PRICE_PER_HOUR``; GB of ``mem_roll_gb`` that is the
  job's own reward model, empty or absent: 0; docs/rollart.md), ``colocate`` (``true``/
  ``false`` or ``1``/``0``, empty or absent: false; a job that only runs co-located,
  ``Job.colocate``).
  Every row needs a non-empty value in each required column but ``model`` (empty: a job
  without a model name, as the API's default) and in at least one of ``duration_s`` /
  ``iterations``; optional values may be empty (None).
* Any other column is kept in ``Job.extra`` (as text) and reported once per file with
  ``warnings.warn``.
* Every defect raises TraceFormatError naming the file, the 1-based physical line and
  the column: a missing column (header line), a wrong field count, a value that does
  not parse, an empty required value, a duplicate job id (naming both lines), and every
  check of ``Job.validate(cluster)`` (column = the field SpecError names). A value the
  message repeats is cut to its first 20 characters.
* ``read_trace`` returns jobs sorted by arrival, ties in file order.
* ``write_trace`` writes a file ``read_trace`` reads back into equal jobs (an extra
  column some job lacks reads back as an empty string for that job), or raises SpecError
  before writing anything.
"""
from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Iterable
from pathlib import Path

from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import MAX_JOB_GPUS, MAX_JOB_ITERATIONS, MAX_STALENESS, REWARD_PRICE_PER_HOUR, Cluster, Job
from rollmux.report.paths import replacing
from rollmux.text_file import csv_fields, read_text

REQUIRED = ("job_id", "arrival_s", "rollout_gpus", "train_gpus", "t_roll_s", "t_train_s",
            "mem_roll_gb", "mem_train_gb", "slo", "model")
LENGTH = ("duration_s", "iterations")
OPTIONAL = ("t_roll_colo_s", "t_train_colo_s", "tail_workers", "staleness", "reward_s", "reward_price_per_hour",
            "reward_mem_gb", "colocate")
KNOWN = REQUIRED + LENGTH + OPTIONAL
#: Required columns whose value may be empty: ``model`` (a job without a model name, ``Job.model`` "").
MAY_BE_EMPTY = frozenset({"model"})
#: Integer columns and the integers they take (``Job.validate`` holds the same bounds).
INT_FIELDS = {"rollout_gpus": f"an integer from 1 to {MAX_JOB_GPUS:,}",
              "train_gpus": f"an integer from 1 to {MAX_JOB_GPUS:,}",
              "iterations": f"an integer from 1 to {MAX_JOB_ITERATIONS:,}",
              "staleness": f"an integer from 0 to {MAX_STALENESS}",
              "tail_workers": "an integer from 1 to rollout_gpus"}
TEXT_FIELDS = frozenset({"job_id", "model"})
BOOL_FIELDS = {"colocate": {"true": True, "1": True, "false": False, "0": False}}
#: Column order ``write_trace`` uses; optional columns only when some job has a value
#: other than the default (``UNSET``: None, staleness 0, the reward defaults).
WRITE_ORDER = ("job_id", "arrival_s", "duration_s", "rollout_gpus", "train_gpus", "t_roll_s",
               "t_train_s", "mem_roll_gb", "mem_train_gb", "slo", "model", "iterations",
               "t_roll_colo_s", "t_train_colo_s", "tail_workers", "staleness", "reward_s", "reward_price_per_hour",
               "reward_mem_gb", "colocate")
UNSET = {"staleness": 0, "reward_s": 0.0, "reward_price_per_hour": REWARD_PRICE_PER_HOUR, "reward_mem_gb": 0.0,
         "colocate": False}


def _shown(value: object) -> str:
    """``value`` as an error message repeats it: its repr, cut to 20 characters when longer
    than 24 (a cell of 5,000 digits is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "…"


def _parse(name: str, text: str, path: str, line: int) -> object:
    if name in TEXT_FIELDS:
        return text
    if name in BOOL_FIELDS:
        if text.lower() not in BOOL_FIELDS[name]:
            raise TraceFormatError(path, line, name, f"{_shown(text)} is not true, false, 1 or 0")
        return BOOL_FIELDS[name][text.lower()]
    kind = INT_FIELDS.get(name, "a number")
    if not text.isascii() or "_" in text:  # Python's int() and float() read '1_000' and other scripts' digits
        raise TraceFormatError(path, line, name, f"{_shown(text)} is not {kind} (ASCII digits, no '_')")
    try:
        return int(text) if name in INT_FIELDS else float(text)
    except ValueError:
        raise TraceFormatError(path, line, name, f"{_shown(text)} is not {kind}") from None


def _header(fields: list[str], path: str, line: int) -> list[str]:
    names = [f.strip() for f in fields]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise TraceFormatError(path, line, name, "column appears twice in the header")
        seen.add(name)
    for name in REQUIRED:
        if name not in seen:
            raise TraceFormatError(path, line, name, "required column missing from the header")
    if not seen.intersection(LENGTH):
        raise TraceFormatError(path, line, "duration_s",
                               "header needs a duration_s or an iterations column")
    return names


def _row_to_job(names: list[str], fields: list[str], path: str, line: int) -> Job:
    if len(fields) != len(names):
        raise TraceFormatError(path, line, "",
                               f"expected {len(names)} fields as in the header, got {len(fields)}")
    values: dict[str, object] = {}
    extra: dict[str, str] = {}
    for name, raw in zip(names, fields):
        text = raw.strip()
        if name not in KNOWN:
            extra[name] = text
        elif text:
            values[name] = _parse(name, text, path, line)
        elif name in REQUIRED and name not in MAY_BE_EMPTY:
            raise TraceFormatError(path, line, name, "required value is empty")
    if not any(name in values for name in LENGTH):
        raise TraceFormatError(path, line, "duration_s",
                               "each row needs a duration_s or an iterations value")
    return Job(extra=extra, **values)  # type: ignore[arg-type]


def read_trace(path: str | Path, cluster: Cluster | None = None) -> list[Job]:
    """Read and validate a job-trace CSV; see the module contract."""
    where = str(path)
    names: list[str] | None = None
    header_line = 0
    first_seen: dict[str, int] = {}
    order: list[Job] = []
    with io.StringIO(read_text(path), newline="") as handle:  # lines as the file's own reader would cut them
        for line_no, text in enumerate(handle, start=1):
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            fields = csv_fields(text, where, line_no)
            if names is None:
                names = _header(fields, where, line_no)
                header_line = line_no
                continue
            job = _row_to_job(names, fields, where, line_no)
            try:
                job.validate(cluster)
            except SpecError as err:
                message = f"{err.field}={_shown(err.value)}: expected {err.expected}"
                raise TraceFormatError(where, line_no, err.field,
                                       f"{err.where}: {message}" if err.where else message) from None
            if job.job_id in first_seen:
                raise TraceFormatError(where, line_no, "job_id",
                                       f"duplicate job id {job.job_id!r}, first on line "
                                       f"{first_seen[job.job_id]}")
            first_seen[job.job_id] = line_no
            order.append(job)
    if names is None:
        raise TraceFormatError(where, 1, "", "no header row: the file holds no data")
    unknown = [name for name in names if name not in KNOWN]
    if unknown:
        warnings.warn(f"{where}, line {header_line}: ignoring unknown columns {unknown} "
                      f"(kept as Job.extra)", stacklevel=2)
    return sorted(order, key=lambda job: job.arrival_s)


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def write_trace(jobs: Iterable[Job], path: str | Path) -> None:
    """Write jobs as a trace CSV that ``read_trace`` reads back into equal jobs.

    The file is whole or untouched (``report.paths.replacing``: a full disk leaves the old
    one). Raises SpecError, before writing anything, for a job that ``read_trace`` would
    refuse or read back changed: one that fails ``Job.validate()`` (its id included: never
    a ``#`` comment), that has neither ``duration_s`` nor ``iterations``, whose id repeats
    an earlier job's, whose text values or extra column names carry surrounding
    whitespace, hold a line break (CR or LF), or whose extra column is named like a known
    one.
    """
    jobs = list(jobs)
    seen: set[str] = set()
    for job in jobs:
        job.validate()
        where = f"job {job.job_id}"
        if job.duration_s is None and job.iterations is None:
            raise SpecError("duration_s", None, "duration_s or iterations set", where)
        if job.job_id in seen:
            raise SpecError("job_id", job.job_id, "an id no other job of the trace has")
        seen.add(job.job_id)
        texts = [("model", job.model), *(("extra", name) for name in job.extra),
                 *((f"extra[{name!r}]", value) for name, value in job.extra.items())]
        for field, text in texts:
            if text != text.strip() or "\n" in text or "\r" in text:
                raise SpecError(field, text, "text without surrounding whitespace or a line break", where)
        clash = set(job.extra).intersection(KNOWN)
        if clash:
            raise SpecError("extra", sorted(clash), "no extra column named like a known one", where)
    columns = [name for name in WRITE_ORDER
               if name in REQUIRED or name == "duration_s"
               or any(getattr(job, name) != UNSET.get(name) for job in jobs)]
    extras = list(dict.fromkeys(name for job in jobs for name in job.extra))
    with replacing(Path(path)) as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns + extras)
        for job in jobs:
            writer.writerow([_format(getattr(job, name)) for name in columns]
                            + [job.extra.get(name, "") for name in extras])
