"""Commands that bring real RL frameworks' jobs to RollMux: log importers and ``profile``.

* ``rollmux trace from-verl FILE --out T.csv``: one job per run of a veRL step-timings CSV
  (``rollmux.importers.from_verl_timings``).
* ``rollmux trace from-trl LOG --out T.csv``: one job from a TRL GRPOTrainer log
  (``rollmux.importers.from_trl_log``).
* ``rollmux profile MODULE:FUNCTION --out spec.yaml``: run a job alone for a few iterations
  through its adapter (``rollmux.integrations.profile.profile_job``) and write the job spec
  ``rollmux submit`` takes, with the worst-case phase times measured.

Errors (a missing column, a bad target, an unwritable output) print one line naming the
file, field or option, exit with status 2 and write nothing.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from rollmux.errors import RollMuxError, SpecError

_OPTIONS = {"percentile": "--percentile", "slo": "--slo", "gpus": "--gpus", "iterations": "--iterations",
            "target": "TARGET", "job_id": "--job-id"}


_PERCENTILE = typer.Option(100.0, help="Phase time kept per job: this nearest-rank percentile of its steps "
                                        "(100: the worst step).")
_SLO = typer.Option(1.5, help="Slowdown tolerance written for every job.")
_OUT = typer.Option(..., help="Where to write the job trace CSV.")


def _gpus(value: str) -> int | dict[str, int]:
    """``--gpus 8`` (every run) or ``--gpus runA=1,runB=2`` (per run, each run once; the
    importer refuses a map that misses a run of the file or names another)."""
    try:
        if "=" not in value:
            return int(value)
        pairs = [(k.strip(), int(v)) for k, v in (part.split("=", 1) for part in value.split(","))]
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected a GPU count or RUN=COUNT,... pairs") from None
    runs = [run for run, _ in pairs]
    twice = next((run for run in runs if runs.count(run) > 1), None)
    if twice is not None:
        raise typer.BadParameter(f"{value!r}: run {twice!r} given twice; expected each run once")
    return dict(pairs)


def _target(spec: str):
    """``module:function`` -> the function (SpecError naming what is missing or what the
    module raised on import). The current folder is searched first, as ``python -m`` would:
    ``rollmux profile myjob:run_one`` beside ``myjob.py`` works."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SpecError("target", spec, "MODULE:FUNCTION, e.g. mypkg.jobs:run_one")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, "")
    try:
        loaded = importlib.import_module(module)
    except ImportError as err:
        raise SpecError("target", spec, f"an importable module ({err})") from None
    except Exception as err:  # (the module's own code failed: a traceback and exit 1 before)
        raise SpecError("target", spec, f"a module that imports ({module} raised {type(err).__name__}: "
                                        f"{err})") from None
    try:
        fn = getattr(loaded, name)
    except AttributeError:
        raise SpecError("target", spec, f"a function {name!r} in module {module!r}") from None
    if not callable(fn):
        raise SpecError("target", spec, "a callable taking (job, iterations)")
    return fn


def _job_spec(job_id: str, slo: float, t_roll_s: float, t_train_s: float):
    """The ``JobSpec`` that ``profile`` writes. A value it refuses raises ``RollMuxError`` naming
    the option (``--job-id``, ``--slo``) or the measured field, and what the spec takes."""
    from pydantic import ValidationError

    from rollmux.runtime.api_models import JobSpec

    try:
        return JobSpec(job_id=job_id, t_roll_s=t_roll_s, t_train_s=t_train_s, slo=slo)
    except ValidationError as err:
        first = err.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "spec"
        name = _OPTIONS.get(field, f"measured {field}")
        raise RollMuxError(f"{name} {first.get('input')!r}: {first['msg']}") from None


def register(app: typer.Typer, trace_app: typer.Typer, console: Console, fail) -> None:
    """Add ``trace from-verl``, ``trace from-trl`` and ``profile``; ``fail(err, options)``
    prints an error in the CLI's words and exits."""

    def write(jobs, out: Path) -> None:
        from rollmux.traces.format import write_trace

        out.parent.mkdir(parents=True, exist_ok=True)
        write_trace(jobs, out)
        for job in jobs:
            console.print(f"  {escape(job.job_id)}: t_roll_s {job.t_roll_s:.3f}, t_train_s {job.t_train_s:.3f}, "
                          f"{job.iterations} iterations, {job.rollout_gpus}+{job.train_gpus} GPUs", highlight=False)
        console.print(f"wrote {escape(str(out))}: {len(jobs)} job{'s' if len(jobs) != 1 else ''}")

    @trace_app.command("from-verl")
    def from_verl(
        src: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                   help="veRL step timings CSV: run, step, t_gen, t_update_actor (+ t_reward, "
                                        "t_ref, t_values, t_adv, t_update_critic)."),
        out: Path = _OUT,
        gpus: str = typer.Option("8", callback=_gpus,
                                 help="GPUs per phase: one count for every run, or RUN=COUNT,..."),
        percentile: float = _PERCENTILE,
        slo: float = _SLO,
    ) -> None:
        """Turn veRL's per-step timings into RollMux jobs (rollout = generation + reward, training = the rest)."""
        from rollmux.importers import from_verl_timings
        from rollmux.report.paths import check_outputs

        try:
            check_outputs({"--out": out}, inputs={"SRC": src})
            write(from_verl_timings(src, gpus=gpus, percentile=percentile, slo=slo), out)
        except (RollMuxError, OSError) as err:
            fail(err, _OPTIONS)

    @trace_app.command("from-trl")
    def from_trl(
        src: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                   help="A TRL log with generation timings: trainer_state.json, a JSON list or "
                                        "JSON lines (e.g. a W&B export); docs/importers.md."),
        out: Path = _OUT,
        job_id: Optional[str] = typer.Option(None, help="Job id (default: the run's directory or file name)."),
        gpus: int = typer.Option(8, min=1, help="GPUs per phase."),
        percentile: float = _PERCENTILE,
        slo: float = _SLO,
        model: Optional[str] = typer.Option(None, help="Model name written to the trace (default: the job id)."),
    ) -> None:
        """Turn a TRL GRPOTrainer log into a RollMux job (rollout = generation + reward, training = the rest of a step)."""
        from rollmux.importers import from_trl_log
        from rollmux.report.paths import check_outputs

        try:
            check_outputs({"--out": out}, inputs={"SRC": src})
            write([from_trl_log(src, job_id=job_id, gpus=gpus, percentile=percentile, slo=slo, model=model)], out)
        except (RollMuxError, OSError) as err:
            fail(err, _OPTIONS)

    @app.command("profile")
    def profile(
        target: str = typer.Argument(..., help="MODULE:FUNCTION taking (job, iterations): drives that many "
                                               "rollout/train phase pairs of the job through its adapter, e.g. "
                                               "rollmux.integrations.trl_jobs:profile_toy."),
        out: Path = typer.Option(..., help="Where to write the job spec YAML (what `rollmux submit` takes)."),
        job_id: str = typer.Option("profile", help="The job id written in the spec."),
        iterations: int = typer.Option(3, min=1, help="Iterations to run alone."),
        slo: float = typer.Option(1.5, min=1.0, help="Slowdown tolerance written in the spec."),
    ) -> None:
        """Run a job alone for a few iterations under a private control plane; write its spec with the
        worst-case phase times measured (grant to release, warm switches included)."""
        from rollmux import strict_yaml
        from rollmux.integrations.profile import profile_job
        from rollmux.report.paths import check_writable, write_text

        try:
            _job_spec(job_id, slo, 1.0, 1.0)  # --job-id and --slo, before the job runs (phase times stand-ins)
            check_writable(out, "--out")
            run = _target(target)
            prof = profile_job(run, iterations, job_id)
            spec = _job_spec(job_id, slo, prof.t_roll_s, prof.t_train_s)
            # (strict_yaml quotes a job id such as 1e3, which `rollmux submit` would otherwise read as a number)
            write_text(out, strict_yaml.dump({**spec.model_dump(exclude_defaults=True), "slo": slo}), "--out")
        except (RollMuxError, OSError) as err:
            fail(err, _OPTIONS)
        console.print(f"{escape(job_id)}: {iterations} iterations alone; rollout worst {prof.t_roll_s:.3f} s "
                      f"(mean {prof.mean_roll_s:.3f}), train worst {prof.t_train_s:.3f} s "
                      f"(mean {prof.mean_train_s:.3f})", highlight=False)
        console.print(f"wrote {escape(str(out))}")
