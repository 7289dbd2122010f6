"""Phase times from RL framework logs, as RollMux jobs (worst-case rollout and training).

A RollMux job is profiled by two phase times, ``t_roll_s`` (the rollout pool's part of
an iteration) and ``t_train_s`` (the training pool's part). The importers below read
the per-step timings a framework logged and turn each run into one ``Job``; write them
with ``rollmux.traces.format.write_trace``.

Worst case. The scheduler plans on worst-case phases, so each phase is taken as the
``percentile`` (nearest rank: the ``ceil(p / 100 * n)``-th smallest of the run's n
per-iteration values) of that phase over the run's iterations; the default 100 is the
maximum. The two phases are taken separately, so they may come from different
iterations (a bound at least as pessimistic as any single iteration's).

Common mapping. ``iterations`` = the run's iteration count; ``arrival_s`` = 0;
``rollout_gpus`` = ``train_gpus`` = ``gpus`` (an int for every run or a mapping run ->
GPUs naming every run of the file and no other); ``slo`` as given; host memory 0 (the
logs hold none). Every defect of a file (bytes that are not UTF-8 included) raises
``TraceFormatError`` naming the file, the line and the column (or key); a bad argument
raises ``SpecError`` naming it; a job the file's times make invalid raises ``SpecError``
naming the file and the run (or job), its name quoted as ``repr`` writes it (a name's
control characters cannot reach a terminal).

veRL (``from_verl_timings``)
----------------------------
A CSV with one row per (run, step): columns ``run, step, t_gen, t_update_actor``
(required) and any of ``t_reward, t_ref, t_values, t_adv, t_update_critic``
(optional; other columns are ignored), in seconds, as veRL's ``timing_s/*`` metrics
(``gen``, ``reward``, ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``).

* rollout phase = ``t_gen + t_reward``: what runs on the rollout pool (sampling and
  scoring the responses);
* training phase = ``t_ref + t_values + t_adv + t_update_critic + t_update_actor``:
  reference and critic forward passes, advantages and both updates, which need the
  trained models and so run on the training pool.

An optional column absent from the header counts 0; a present one needs a value on every
row. A line whose first non-blank character is ``#`` is a comment (as in the trace format;
a run named ``#...`` is quoted: ``"#r",0,...``). ``step`` is ASCII digits (an integer >= 0);
times are ASCII numbers without ``_`` (``1_0`` and other scripts' digits are refused).
veRL ran both phases on the same GPUs, so the times are co-located ones: they are also
written as ``t_roll_colo_s`` / ``t_train_colo_s`` (the disaggregated times are
taken equal to them: same GPU type in both pools, weight transfer not counted).
``model`` = the run name (its size, e.g. ``0.5B``, picks the switch-cost column);
``job_id`` = the run name made a job id (``job_id_for``: ``my run/1`` is ``my-run-1``).
Runs come out in order of first appearance.

TRL (``from_trl_log``)
----------------------
A log of TRL ``GRPOTrainer`` records: a JSON document (``trainer_state.json``, whose
``log_history`` list is read, or a bare list) or JSON lines (one object per line, e.g. a
Weights & Biases or Trackio history export; it is JSON lines when its first value ends on
the line it starts on and more follows, and its lines end at LF, CR LF or CR only; a
syntax error in a document names the line and column where ``json`` found it). A leading
``train/`` on a key is ignored (how W&B and Trackio prefix the Trainer's logs). Keys read
(TRL >= 0.26, checked against the installed 1.16):

* rollout: ``profiling/Time taken: <Trainer>.<name>`` for ``<name>`` one of
  ``vLLM.generate``, ``transformers.generate``, ``transformers.generate_batch``
  (sampling), ``_calculate_rewards`` (scoring) and ``sync_weights`` (pushing weights to
  vLLM). TRL sends these only to W&B / MLflow / Trackio (``report_to``), not to
  ``log_history``;
* ``step_time``: seconds of one optimizer step's ``training_step`` calls, averaged over
  the logging window; the generation of the step that generates runs inside it;
* ``step`` / ``global_step`` (optional): the record's global step, an integer from 0 to
  2**53 (exact as a float, so a step time times the steps it covers is a number), so a
  record covers ``step - previous step`` optimizer steps (1 without these keys).

An integer too long for Python's ``int`` (over its 4300-digit limit) is read as
``inf`` (``-inf``), which every key read refuses as out of range, naming the line.

Records are read in order. An iteration starts at a rollout key that follows a
``step_time`` (or opens the log); its rollout phase is the sum of the rollout keys up to
the next ``step_time``, and its training phase is the total step time of the
``step_time`` records up to the next rollout key (each ``step_time`` x the steps its
record covers) minus the rollout phase (which the first of those steps contains).
``step_time`` records before the first rollout key are skipped. ``job_id`` defaults to
the file's stem (its directory's name for ``trainer_state.json``) made a job id
(``job_id_for``), ``model`` to the job id (a name without a size, e.g. ``7B``, is planned
on the largest switch-cost column).
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import JOB_ID_PATTERN, Job
from rollmux.text_file import read_text

VERL_REQUIRED = ("run", "step", "t_gen", "t_update_actor")
VERL_ROLLOUT = ("t_gen", "t_reward")
VERL_TRAIN = ("t_ref", "t_values", "t_adv", "t_update_critic", "t_update_actor")
TRL_PROFILE = re.compile(r"profiling/Time taken: \w+\.(.+)")
TRL_ROLLOUT = frozenset({"vLLM.generate", "transformers.generate", "transformers.generate_batch",
                         "_calculate_rewards", "sync_weights"})
TRL_STEP_KEYS = ("step", "global_step")
TRL_MAX_STEP = 2 ** 53


def worst_case(values: list[float], percentile: float) -> float:
    """The nearest-rank ``percentile`` of ``values``: the ceil(p/100 * n)-th smallest."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percentile / 100 * len(ordered))) - 1]


def _check_args(percentile: float, slo: float) -> None:
    if not (isinstance(percentile, (int, float)) and 0 < percentile <= 100):
        raise SpecError("percentile", percentile, "a percentile in (0, 100]")
    if not (isinstance(slo, (int, float)) and math.isfinite(slo) and slo >= 1.0):
        raise SpecError("slo", slo, "a slowdown tolerance >= 1.0")


def _check_gpu_map(gpus: int | Mapping[str, int], runs: Collection[str]) -> None:
    """A per-run ``gpus`` mapping names every run in ``runs`` and no other (else SpecError
    naming the runs missing from it and those that are not runs of the file)."""
    if not isinstance(gpus, Mapping):
        return
    missing = [run for run in runs if run not in gpus]
    unknown = [run for run in gpus if run not in runs]
    if missing or unknown:
        said = [f"{', '.join(map(repr, missing))} missing from the map" if missing else "",
                f"{', '.join(map(repr, unknown))} not a run of the file" if unknown else ""]
        raise SpecError("gpus", ",".join(f"{run}={n}" for run, n in gpus.items()),
                        f"a GPU count for each run of the file and no other ({'; '.join(filter(None, said))})")


def _gpus_for(gpus: int | Mapping[str, int], run: str) -> int:
    value = gpus.get(run) if isinstance(gpus, Mapping) else gpus
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError("gpus", value, f"a positive GPU count for run {run!r}")
    return value


def job_id_for(name: str, taken: set[str] = frozenset()) -> str:
    """The job id of a run or file named ``name``: ``name`` itself when it is one
    (``rollmux.model.JOB_ID_PATTERN``); else each run of other characters becomes ``-``,
    what does not start with a letter or digit is dropped from the front, a ``-`` from the
    end (``run`` if nothing is left), and it is cut at 128 characters. ``-2``, ``-3``, ... is added while
    the id is in ``taken`` (another run's)."""
    if re.fullmatch(JOB_ID_PATTERN, name):
        base = name
    else:
        base = re.sub(r"^[^A-Za-z0-9]+", "", re.sub(r"[^A-Za-z0-9._-]+", "-", name)).rstrip("-")[:128] or "run"
    job_id, n = base, 1
    while job_id in taken:
        n += 1
        job_id = f"{base[:128 - len(str(n)) - 1]}-{n}"
    return job_id


def _seconds(value: object, path: str, line: int, column: str) -> float:
    """A logged duration: a finite number >= 0 (text is parsed: ASCII, no '_'), else TraceFormatError."""
    if isinstance(value, str):
        if not value.isascii() or "_" in value:  # float() reads '1_0' as 10 and other scripts' digits
            raise TraceFormatError(path, line, column, f"{value!r} is not a number of seconds (ASCII digits, no '_')")
        try:
            value = float(value) if value.strip() else None
        except ValueError:
            raise TraceFormatError(path, line, column, f"{value!r} is not a number of seconds") from None
    if value is None:
        raise TraceFormatError(path, line, column, "empty value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TraceFormatError(path, line, column, f"{value!r} is not a duration >= 0 seconds")
    return float(value)


def from_verl_timings(path: str | Path, *, gpus: int | Mapping[str, int] = 8,
                      percentile: float = 100.0, slo: float = 1.5) -> list[Job]:
    """One job per run of a veRL step-timings CSV (mapping in the module docstring)."""
    _check_args(percentile, slo)
    name = str(path)
    runs: dict[str, dict[int, tuple[float, float]]] = {}
    spans: dict[str, tuple[int, int]] = {}  # run -> its first and last line
    with io.StringIO(read_text(path), newline="") as handle:
        # a comment line reaches the csv reader blank (its quotes cannot open a field; line numbers hold)
        rows = csv.reader("\n" if raw.lstrip().startswith("#") else raw for raw in handle)
        header: list[str] | None = None
        try:
            for fields in rows:
                line = rows.line_num
                if not fields or not "".join(fields).strip():
                    continue
                if header is None:
                    header = [f.strip() for f in fields]
                    twice = sorted({c for c in header if c and header.count(c) > 1})
                    if twice:
                        raise TraceFormatError(name, line, twice[0], "the column appears twice in the header")
                    for column in VERL_REQUIRED:
                        if column not in header:
                            raise TraceFormatError(name, line, column, "required column missing from the header")
                    continue
                if len(fields) != len(header):
                    raise TraceFormatError(name, line, "", f"expected {len(header)} fields as in the header, "
                                                           f"got {len(fields)}")
                row = dict(zip(header, (f.strip() for f in fields)))
                run = row["run"]
                if not run:
                    raise TraceFormatError(name, line, "run", "empty value")
                if not (row["step"].isascii() and row["step"].isdigit()):  # int() took '1_000', '-5', '\u0663'
                    raise TraceFormatError(name, line, "step", f"{row['step']!r} is not a step number "
                                                               f"(ASCII digits 0-9)")
                step = int(row["step"])
                phases = tuple(sum(_seconds(row[c], name, line, c) for c in cols if c in row)
                               for cols in (VERL_ROLLOUT, VERL_TRAIN))
                steps = runs.setdefault(run, {})
                if step in steps:
                    raise TraceFormatError(name, line, "step", f"step {step} of run {run!r} appears twice")
                steps[step] = phases
                spans[run] = (spans.get(run, (line, line))[0], line)
        except csv.Error as err:  # a field over the csv module's limit
            raise TraceFormatError(name, rows.line_num, "", f"not a CSV row ({err})") from None
    if header is None:
        raise TraceFormatError(name, 1, VERL_REQUIRED[0], "no header: the file holds no rows")
    if not runs:
        raise TraceFormatError(name, rows.line_num, "", "no step rows after the header")
    _check_gpu_map(gpus, runs)
    jobs: list[Job] = []
    for run, steps in runs.items():
        roll = worst_case([r for r, _ in steps.values()], percentile)
        train = worst_case([t for _, t in steps.values()], percentile)
        n = _gpus_for(gpus, run)
        job = Job(job_id_for(run, {j.job_id for j in jobs}), roll, train, rollout_gpus=n, train_gpus=n, slo=slo,
                  model=run, iterations=len(steps), t_roll_colo_s=roll, t_train_colo_s=train)
        first, last = spans[run]
        job.validate(where=f"{name}: run {run!r} (" + (f"line {first}" if first == last
                                                       else f"lines {first}-{last}") + ")")
        jobs.append(job)
    return jobs


def _json_int(digits: str) -> int | float:
    """A JSON integer as ``int``; one past Python's digit limit for ``int`` as a float (``inf``
    or ``-inf``), where ``json`` raised ValueError (see the module docstring)."""
    try:
        return int(digits)
    except ValueError:
        return float(digits)


def _trl_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line, record) pairs: physical lines for JSON lines, 1-based entries for a document.

    The text is JSON lines when its first value ends on the line it starts on and more follows;
    otherwise it is one document, whose syntax error names the line and column where ``json``
    found it. Lines end at LF, CR LF or a lone CR, as the trace reader cuts them: never inside
    a JSON string, which may hold U+2028 or U+0085 raw."""
    name = str(path)
    text = read_text(path)
    try:
        document = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        first = text[:exc.pos].strip()
        json_lines = exc.msg == "Extra data" and "\n" not in first and "\r" not in first
        if text.strip() and not json_lines:  # (an empty log: no record holds step_time, below)
            raise TraceFormatError(name, exc.lineno, "", f"not JSON ({exc.msg} at column {exc.colno})") from None
        document = None
    except RecursionError:
        document = None
    if isinstance(document, dict) and "log_history" in document:
        document = document["log_history"]
    if isinstance(document, list):
        for index, record in enumerate(document, 1):
            if not isinstance(record, dict):
                raise TraceFormatError(name, index, "", f"log_history entry {index} is not a JSON object")
            yield index, record
        return
    for line, raw in enumerate(io.StringIO(text, newline=""), 1):  # (str.splitlines() also cut at U+2028)
        if not raw.strip():
            continue
        try:
            record = json.loads(raw, parse_int=_json_int)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(name, line, "", f"not JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise TraceFormatError(name, line, "", "JSON nested too deep for a log record") from None
        if not isinstance(record, dict):
            raise TraceFormatError(name, line, "", "not a JSON object")
        yield line, record


@dataclass(slots=True)
class _Iteration:
    """One TRL iteration being read: where it starts, its rollout and total step seconds."""

    line: int
    rollout_s: float = 0.0
    step_s: float = 0.0


def from_trl_log(path: str | Path, *, job_id: str | None = None, gpus: int = 8, percentile: float = 100.0,
                 slo: float = 1.5, model: str | None = None) -> Job:
    """One job from a TRL GRPOTrainer log (keys and mapping in the module docstring)."""
    _check_args(percentile, slo)
    name, p = str(path), Path(path)
    job_id = job_id or job_id_for(p.parent.name if p.name == "trainer_state.json" and p.parent.name else p.stem)
    _gpus_for(gpus, job_id)
    iterations: list[_Iteration] = []
    in_rollout, saw_step_time, last_step = False, False, 0
    for line, record in _trl_records(path):
        record = {k.removeprefix("train/"): v for k, v in record.items()}
        rollout = [_seconds(v, name, line, k) for k, v in record.items()
                   if (m := TRL_PROFILE.fullmatch(k)) and m.group(1) in TRL_ROLLOUT]
        if rollout:
            if not in_rollout:
                iterations.append(_Iteration(line))
                in_rollout = True
            iterations[-1].rollout_s += sum(rollout)
        covered = 1
        step_key = next((k for k in TRL_STEP_KEYS if k in record), None)
        if step_key is not None:
            step = record[step_key]
            if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= TRL_MAX_STEP:
                raise TraceFormatError(name, line, step_key, f"{step!r} is not a step number from 0 to 2**53")
            if "step_time" in record:
                covered = step - last_step
                if covered < 1:
                    raise TraceFormatError(name, line, step_key, f"step {step} does not follow step {last_step}")
            last_step = step
        if "step_time" in record:
            seconds = _seconds(record["step_time"], name, line, "step_time")
            saw_step_time, in_rollout = True, False
            if iterations:
                iterations[-1].step_s += seconds * covered
    if not saw_step_time:
        raise TraceFormatError(name, 1, "step_time", "no record holds step_time (TRL >= 0.26 GRPOTrainer)")
    if not iterations:
        raise TraceFormatError(name, 1, "profiling/Time taken: <Trainer>.vLLM.generate",
                               "no record holds a generation time (profiling/Time taken: <Trainer>."
                               "{vLLM.generate, transformers.generate, transformers.generate_batch}); "
                               "TRL logs them only to W&B / MLflow / Trackio: import that run's history")
    for it in iterations:
        if it.step_s <= it.rollout_s:
            raise TraceFormatError(name, it.line, "step_time",
                                   f"the iteration's step time ({it.step_s:g} s) does not exceed the "
                                   f"rollout it contains ({it.rollout_s:g} s)")
    roll = worst_case([it.rollout_s for it in iterations], percentile)
    train = worst_case([it.step_s - it.rollout_s for it in iterations], percentile)
    job = Job(job_id, roll, train, rollout_gpus=gpus, train_gpus=gpus, slo=slo, model=model or job_id,
              iterations=len(iterations))
    job.validate(where=f"{name}: job {job_id!r}")
    return job
