"""One definition of a job's bounds: a trace CSV row (``read_trace``, then ``Job.validate``) and the
service's job spec (``JobSpec``, what ``rollmux submit FILE`` and the API take) accept the same jobs.

The CSV took an SLO of 1001 or 1e300, 2e6 GB of memory, staleness 9 or 1e9 and a model name of
200 characters that the API refused, and refused a model holding U+200B that the API took (and
``Job.validate`` then refused inside the service)."""
from __future__ import annotations

import csv
import warnings

import pytest
from pydantic import ValidationError

from rollmux import model
from rollmux.errors import RollMuxError
from rollmux.model import Job
from rollmux.runtime import api_models
from rollmux.runtime.api_models import JobSpec
from rollmux.traces.format import read_trace

BASE = {"job_id": "j1", "rollout_gpus": 8, "train_gpus": 8, "t_roll_s": 10.0, "t_train_s": 20.0,
        "mem_roll_gb": 1.0, "mem_train_gb": 1.0, "slo": 1.5, "model": "7B", "iterations": 5}
CASES = [
    ("slo", 1000.0), ("slo", 1000.5), ("slo", 1001.0), ("slo", 1e300),
    ("mem_roll_gb", 1e6), ("mem_roll_gb", 2e6), ("mem_train_gb", 1e300),
    ("staleness", 8), ("staleness", 9), ("staleness", 10**9),
    ("model", ""), ("model", "m" * 128), ("model", "m" * 129), ("model", "m" * 200), ("model", "a\u200bb"),
    ("model", "a\x85b"), ("model", "a\u202eb"), ("model", "Qwen/Qwen2.5-7B, 32k"),
    ("reward_s", 1e6), ("reward_s", 2e6), ("reward_price_per_hour", 1e6), ("reward_price_per_hour", 2e6),
    ("reward_mem_gb", 1.0), ("reward_mem_gb", 2.0),
    ("tail_workers", 1), ("tail_workers", 8), ("tail_workers", 9), ("tail_workers", 0),
    ("iterations", 1_000_000), ("iterations", 1_000_001), ("rollout_gpus", 100_000), ("rollout_gpus", 100_001),
    ("t_roll_s", 1e-3), ("t_roll_s", 1e-4), ("t_train_s", 1e6), ("t_train_s", 1.5e6),
]


def _cell(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _csv_accepts(tmp_path, field: str, value: object) -> bool:
    row = {**BASE, "arrival_s": 0.0, field: value}
    path = tmp_path / "t.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle, lineterminator="\n").writerows([row, [_cell(v) for v in row.values()]])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a column read as an unknown (extra) one would not be the same job
            read_trace(path)
    except RollMuxError:
        return False
    return True


def _api_accepts(field: str, value: object) -> bool:
    try:
        JobSpec.model_validate({**BASE, field: value})
    except ValidationError:
        return False
    return True


def _job_accepts(field: str, value: object) -> bool:
    try:
        Job(**{**BASE, field: value}).validate()
    except RollMuxError:
        return False
    return True


@pytest.mark.parametrize("field, value", CASES, ids=[f"{f}={v!r:.20}" for f, v in CASES])
def test_the_trace_csv_the_api_and_job_validate_take_the_same_jobs(tmp_path, field, value):
    csv_ok, api_ok = _csv_accepts(tmp_path, field, value), _api_accepts(field, value)
    job_ok = _job_accepts(field, value)
    assert csv_ok == api_ok == job_ok, f"CSV {csv_ok}, API {api_ok}, Job.validate {job_ok}"


def test_the_api_takes_its_job_bounds_from_the_model():
    """The API had its own MAX_SLO, MAX_MEM_GB and price bound; the bounds live in rollmux.model."""
    for name in ("MAX_SLO", "MAX_MEM_GB", "MAX_STALENESS", "MAX_MODEL_CHARS", "MAX_PRICE", "MAX_PHASE_S"):
        assert getattr(api_models, name) is getattr(model, name)
    assert not hasattr(api_models, "MAX_PRICE_PER_HOUR")


def test_a_job_the_api_takes_passes_job_validate():
    """A spec JobSpec took with U+200B in its model was refused later, inside the service."""
    spec = JobSpec.model_validate({**BASE, "model": "", "tail_workers": 8, "staleness": 8, "slo": 1000.0,
                                   "mem_roll_gb": 1e6, "reward_mem_gb": 1e6, "reward_s": 1e6})
    spec.to_job().validate()
