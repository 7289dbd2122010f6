"""rollmux trace from-verl / from-trl and rollmux profile, through the CLI."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.traces.format import read_trace

runner = CliRunner()
VERL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "verl_ppo_step_timings.csv"


def test_from_verl_writes_one_job_per_run(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("run,step,t_gen,t_reward,t_update_actor\nA,1,10,1,20\nA,2,12,1,19\nB,1,5,0,7\n")
    out = tmp_path / "jobs.csv"
    r = runner.invoke(app, ["trace", "from-verl", str(src), "--out", str(out), "--gpus", "A=16,B=8"])
    assert r.exit_code == 0, r.output
    jobs = {j.job_id: j for j in read_trace(out)}
    assert (jobs["A"].t_roll_s, jobs["A"].t_train_s, jobs["A"].iterations, jobs["A"].rollout_gpus) == (13, 20, 2, 16)
    assert (jobs["B"].t_roll_s, jobs["B"].train_gpus) == (5, 8)
    assert "wrote" in r.output and "2 jobs" in r.output


def test_from_verl_hostile_input_writes_nothing(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("run,step,t_gen\nA,1,10\n")
    out = tmp_path / "jobs.csv"
    r = runner.invoke(app, ["trace", "from-verl", str(src), "--out", str(out)])
    assert r.exit_code == 2 and "t_update_actor" in r.output and not out.exists()
    r = runner.invoke(app, ["trace", "from-verl", str(src), "--out", str(out), "--gpus", "A=x"])
    assert r.exit_code == 2 and "--gpus" in r.output and not out.exists()
    r = runner.invoke(app, ["trace", "from-verl", str(src), "--out", str(out), "--percentile", "0"])
    assert r.exit_code == 2 and "--percentile" in r.output


@pytest.mark.skipif(not VERL.exists(), reason="shared/traces is not beside the repo")
def test_from_verl_on_the_shared_runs_simulates(tmp_path):
    out = tmp_path / "verl.csv"
    assert runner.invoke(app, ["trace", "from-verl", str(VERL), "--out", str(out)]).exit_code == 0
    r = runner.invoke(app, ["simulate", "--trace", str(out), "--policies", "rollmux,solo-d"])
    assert r.exit_code == 0, r.output and "rollmux" in r.output


def test_from_trl_reads_a_jsonl_export(tmp_path):
    gen = "profiling/Time taken: GRPOTrainer.transformers.generate"
    rows = [{gen: 4.0}, {"train/step_time": 10.0, "train/global_step": 1},
            {gen: 6.0}, {"train/step_time": 9.0, "train/global_step": 2}]
    src = tmp_path / "run3.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    out = tmp_path / "jobs.csv"
    r = runner.invoke(app, ["trace", "from-trl", str(src), "--out", str(out), "--gpus", "16"])
    assert r.exit_code == 0, r.output
    (job,) = read_trace(out)
    assert (job.job_id, job.t_roll_s, job.t_train_s, job.rollout_gpus) == ("run3", 6.0, 6.0, 16)


LONE_JOB = """
import time

def _phases(job, iterations, rollout_s, train_s):
    for _ in range(iterations):
        with job.phase("rollout", device="cpu"):
            time.sleep(rollout_s)
        with job.phase("train", device="cpu"):
            time.sleep(train_s)

def run(job, iterations):
    _phases(job, iterations, 0.50, 0.30)

def quick(job, iterations):
    _phases(job, iterations, 0.01, 0.01)

def half(job, iterations):
    with job.phase("rollout", device="cpu"):
        pass

def boom(job, iterations):
    raise RuntimeError("CUDA out of memory in iteration 1")
"""


def test_profile_writes_a_spec_within_ten_percent_of_a_solo_run(tmp_path, monkeypatch):
    """The spec's phase times against a second lone run of the same job (fixed-length phases)."""
    from rollmux.integrations.profile import profile_job

    (tmp_path / "lone_job.py").write_text(textwrap.dedent(LONE_JOB))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "spec.yaml"
    r = runner.invoke(app, ["profile", "lone_job:run", "--out", str(out), "--iterations", "2", "--job-id", "lone"])
    assert r.exit_code == 0, r.output
    spec = yaml.safe_load(out.read_text())
    assert spec["job_id"] == "lone" and spec["slo"] == 1.5
    import lone_job

    solo = profile_job(lone_job.run, 2, "solo")  # the same job run alone again: its worst phases
    assert abs(spec["t_roll_s"] - solo.t_roll_s) <= 0.1 * solo.t_roll_s
    assert abs(spec["t_train_s"] - solo.t_train_s) <= 0.1 * solo.t_train_s
    assert spec["t_roll_s"] >= 0.50 and spec["t_train_s"] >= 0.30


def test_profile_refuses_bad_targets_and_wrong_phase_counts(tmp_path, monkeypatch):
    (tmp_path / "lone_job.py").write_text(textwrap.dedent(LONE_JOB))
    (tmp_path / "bad_import.py").write_text("raise ValueError('config missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "spec.yaml"
    for target, words in (("nosuchmodule:run", "importable module"), ("lone_job:nope", "function 'nope'"),
                          # (a module failing on import was a traceback, exit 1)
                          ("bad_import:run", "bad_import raised ValueError: config missing"),
                          ("lone_job", "MODULE:FUNCTION"), ("lone_job:half", "rollout/train pairs"),
                          # (a job that raised was a traceback, exit 1)
                          ("lone_job:boom", "boom raised RuntimeError: CUDA out of memory in iteration 1")):
        r = runner.invoke(app, ["profile", target, "--out", str(out)])
        assert r.exit_code == 2, (target, r.output)
        assert words in " ".join(r.output.split()) and not out.exists()


def test_profile_writes_a_job_id_that_reads_as_a_number_quoted(tmp_path, monkeypatch):
    """``--job-id 1e3`` was written plain; ``rollmux submit``'s reader (strict_yaml) took it
    for the float 1000.0, which the service's JobSpec refused."""
    from rollmux.cluster_file import read_mapping
    from rollmux.runtime.api_models import JobSpec

    (tmp_path / "lone_job.py").write_text(textwrap.dedent(LONE_JOB))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "spec.yaml"
    r = runner.invoke(app, ["profile", "lone_job:quick", "--out", str(out), "--iterations", "1", "--job-id", "1e3"])
    assert r.exit_code == 0, r.output
    spec = read_mapping(out, "job")  # what `rollmux submit` sends
    assert spec["job_id"] == "1e3" and JobSpec.model_validate(spec).job_id == "1e3"


def test_profile_finds_a_module_in_the_current_folder(tmp_path):
    """The console script does not put the current folder on sys.path: ``rollmux profile
    lone_job:quick`` run beside lone_job.py said "No module named 'lone_job'"."""
    (tmp_path / "lone_job.py").write_text(textwrap.dedent(LONE_JOB))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(Path(sys.executable).with_name("rollmux")), "profile", "lone_job:quick", "--out",
                        "spec.yaml", "--iterations", "1"], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "spec.yaml").read_text().startswith("job_id: profile")
