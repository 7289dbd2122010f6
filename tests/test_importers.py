"""Importers of framework phase timings into RollMux jobs (rollmux.importers)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.errors import SpecError, TraceFormatError
from rollmux.importers import from_trl_log, from_verl_timings, job_id_for, worst_case
from rollmux.model import JOB_ID_PATTERN
from rollmux.runtime.api_models import JobSpec
from rollmux.traces.format import read_trace, write_trace

SHARED_VERL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "verl_ppo_step_timings.csv"
GEN = "profiling/Time taken: GRPOTrainer.transformers.generate"
REWARD = "profiling/Time taken: GRPOTrainer._calculate_rewards"
SYNC = "profiling/Time taken: GRPOTrainer.sync_weights"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_worst_case_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert worst_case(values, 100) == 100 and worst_case(values, 95) == 95 and worst_case(values, 0.5) == 1
    assert worst_case([3.0], 50) == 3.0


# --- veRL ---------------------------------------------------------------------------

VERL = """run,step,t_gen,t_ref,t_values,t_adv,t_update_critic,t_update_actor,response_length_mean
a,0,10,1,2,0.5,3,4,300
a,1,12,1,2,0.5,3,5,301
b,0,20,2,0,0,0,6,100
a,2,11,1,2,0.5,9,4,299
"""


def test_verl_mapping_and_worst_case(tmp_path):
    jobs = from_verl_timings(write(tmp_path, "v.csv", VERL), gpus={"a": 1, "b": 2})
    a, b = jobs
    assert (a.job_id, a.iterations, a.rollout_gpus, a.train_gpus, a.model) == ("a", 3, 1, 1, "a")
    assert a.t_roll_s == 12  # max of t_gen
    assert a.t_train_s == pytest.approx(1 + 2 + 0.5 + 9 + 4)  # max per-step sum of the training columns
    assert (a.t_roll_colo_s, a.t_train_colo_s) == (a.t_roll_s, a.t_train_s)
    assert (b.job_id, b.iterations, b.t_roll_s, b.t_train_s, b.rollout_gpus) == ("b", 1, 20, 8, 2)
    p50 = from_verl_timings(write(tmp_path, "v.csv", VERL), percentile=50)[0]
    assert (p50.t_roll_s, p50.rollout_gpus) == (11, 8)


def test_verl_run_names_become_job_ids_the_service_takes(tmp_path):
    """A run name is free text; a job id is letters, digits, . _ - (the API's rule, now every
    trace's): "my run/1" was written as the id and only the live service refused it."""
    text = "run,step,t_gen,t_update_actor\nmy run/1,0,3,2\nmy run 1,0,3,2\n(x),0,3,2\nok-id_2.0,0,3,2\n"
    jobs = from_verl_timings(write(tmp_path, "v.csv", text))
    assert [(j.job_id, j.model) for j in jobs] == [("my-run-1", "my run/1"), ("my-run-1-2", "my run 1"),
                                                   ("x", "(x)"), ("ok-id_2.0", "ok-id_2.0")]
    for job in jobs:
        JobSpec.model_validate({"job_id": job.job_id, "t_roll_s": job.t_roll_s, "t_train_s": job.t_train_s})
    write_trace(jobs, tmp_path / "t.csv")
    assert read_trace(tmp_path / "t.csv") == jobs


@pytest.mark.parametrize("name, taken, expected", [
    ("a", set(), "a"), ("a b", set(), "a-b"), ("..a", set(), "a"), ("???", set(), "run"), ("a", {"a"}, "a-2"),
    ("a", {"a", "a-2"}, "a-3"), ("x" * 200, set(), "x" * 128), ("x" * 128, {"x" * 128}, "x" * 126 + "-2"),
    ("wandb export (1)", set(), "wandb-export-1"), ("café", set(), "caf")])
def test_job_id_for(name, taken, expected):
    assert job_id_for(name, taken) == expected
    assert re.fullmatch(JOB_ID_PATTERN, expected)


def test_verl_reward_column_counts_as_rollout(tmp_path):
    path = write(tmp_path, "v.csv", "run,step,t_gen,t_reward,t_update_actor\nx,0,3,1.5,2\n")
    job, = from_verl_timings(path)
    assert (job.t_roll_s, job.t_train_s) == (4.5, 2)


def test_verl_jobs_round_trip_through_the_trace_format(tmp_path):
    jobs = from_verl_timings(write(tmp_path, "v.csv", VERL))
    write_trace(jobs, tmp_path / "t.csv")
    assert read_trace(tmp_path / "t.csv") == jobs


@pytest.mark.skipif(not SHARED_VERL.exists(), reason="../shared/traces is absent")
def test_verl_on_the_shared_file(tmp_path):
    jobs = from_verl_timings(SHARED_VERL)
    assert [j.iterations for j in jobs] == [435, 435, 106]
    assert jobs[0].job_id.startswith("Qwen2.5-0.5B") and jobs[2].job_id.startswith("gemma-2-2b")
    for job in jobs:
        assert 0 < job.t_roll_s < job.t_train_s  # these small PPO runs spend ~30% in generation
    p95 = from_verl_timings(SHARED_VERL, percentile=95)
    assert all(q.t_roll_s <= j.t_roll_s and q.t_train_s <= j.t_train_s for q, j in zip(p95, jobs))
    assert jobs[0].t_roll_s == 20.434  # the first run's slowest generation step
    write_trace(jobs, tmp_path / "verl.csv")
    assert read_trace(tmp_path / "verl.csv") == jobs


@pytest.mark.parametrize("text, line, column", [
    ("run,step,t_gen\nx,0,1\n", 1, "t_update_actor"),
    ("# comment\n\nrun,t_gen,t_update_actor\n", 3, "step"),
    ("run,step,t_gen,t_update_actor\nx,0,1,2\nx,1,,2\n", 3, "t_gen"),
    ("run,step,t_gen,t_update_actor\nx,0,1,2\nx,1,fast,2\n", 3, "t_gen"),
    ("run,step,t_gen,t_update_actor\nx,0,1,-2\n", 2, "t_update_actor"),
    ("run,step,t_gen,t_update_actor\nx,0,1,nan\n", 2, "t_update_actor"),
    ("run,step,t_gen,t_update_actor\nx,zero,1,2\n", 2, "step"),
    ("run,step,t_gen,t_update_actor\nx,0,1,2\nx,0,1,2\n", 3, "step"),
    ("run,step,t_gen,t_update_actor\n,0,1,2\n", 2, "run"),
    ("run,step,t_gen,t_update_actor\nx,0,1\n", 2, ""),
    ("", 1, "run"),
])
def test_verl_hostile_input_names_line_and_column(tmp_path, text, line, column):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceFormatError) as info:
        from_verl_timings(path)
    assert (info.value.path, info.value.line, info.value.column) == (str(path), line, column)
    assert str(path) in str(info.value) and f"line {line}" in str(info.value)


def test_verl_zero_rollout_is_rejected_as_a_job_naming_the_run_s_lines(tmp_path):
    with pytest.raises(SpecError, match=r"run 'x' \(line 2\): t_roll_s"):
        from_verl_timings(write(tmp_path, "v.csv", "run,step,t_gen,t_update_actor\nx,0,0,2\n"))
    text = "run,step,t_gen,t_update_actor\ny,0,3,2\n# a comment\nx,0,0,2\ny,1,3,2\nx,1,0,2\n"
    with pytest.raises(SpecError, match=r"run 'x' \(lines 4-6\): t_roll_s"):
        from_verl_timings(write(tmp_path, "v.csv", text))


@pytest.mark.parametrize("kw, field", [({"percentile": 0}, "percentile"), ({"percentile": 101}, "percentile"),
                                       ({"slo": 0.5}, "slo"), ({"gpus": 0}, "gpus"), ({"gpus": {"a": 1}}, "gpus")])
def test_verl_bad_arguments(tmp_path, kw, field):
    with pytest.raises(SpecError) as info:
        from_verl_timings(write(tmp_path, "v.csv", VERL), **kw)
    assert info.value.field == field


@pytest.mark.parametrize("gpus, said", [
    ({"b": 2}, "'a' missing from the map"),
    ({"a": 1, "b": 2, "c": 4}, "'c' not a run of the file"),
    ({"b": 2, "A": 1}, "'a' missing from the map; 'A' not a run of the file"),
])
def test_verl_gpu_map_names_every_run_of_the_file_and_no_other(tmp_path, gpus, said):
    """A run missing from the map read "gpus=None: expected a positive GPU count"; a run
    of the map that is not in the file was ignored."""
    with pytest.raises(SpecError) as info:
        from_verl_timings(write(tmp_path, "v.csv", VERL), gpus=gpus)
    assert info.value.field == "gpus" and said in str(info.value), str(info.value)
    assert info.value.value == ",".join(f"{run}={n}" for run, n in gpus.items())


# --- TRL ----------------------------------------------------------------------------

def trl_iteration(step: int, gen: float, reward: float, step_time: float) -> list[dict]:
    """What a W&B history export holds for one generating optimizer step (one row per log call)."""
    return [{SYNC: 0.5}, {GEN: gen}, {REWARD: reward},
            {"train/step_time": step_time, "train/global_step": step, "train/loss": 0.1}]


def jsonl(records: list[dict]) -> str:
    return "\n".join(json.dumps(r) for r in records) + "\n"


def test_trl_jsonl_export(tmp_path):
    records = trl_iteration(1, 4.0, 1.0, 10.0) + trl_iteration(2, 6.0, 1.0, 11.0) + trl_iteration(3, 5.0, 0.5, 12.0)
    job = from_trl_log(write(tmp_path, "run7.jsonl", jsonl(records)), gpus=16, model="Qwen2.5-7B")
    assert (job.job_id, job.iterations, job.rollout_gpus, job.model) == ("run7", 3, 16, "Qwen2.5-7B")
    assert job.t_roll_s == 7.5  # 0.5 + 6 + 1 in step 2
    assert job.t_train_s == 6.0  # step 3: 12 - (0.5 + 5 + 0.5)
    p50 = from_trl_log(write(tmp_path, "run7.jsonl", jsonl(records)), percentile=50)
    assert (p50.t_roll_s, p50.t_train_s) == (6.0, 4.5)


def test_trl_iteration_spans_non_generating_steps_and_logging_windows(tmp_path):
    """steps_per_generation = 4 optimizer steps, logged every 2 steps: step_time is a window mean."""
    records = [{GEN: 3.0}, {"step_time": 5.0, "step": 2}, {"step_time": 2.0, "step": 4},
               {GEN: 4.0}, {"step_time": 6.0, "step": 6}, {"step_time": 2.0, "step": 8},
               {"train_runtime": 99.0, "step": 8}]
    job = from_trl_log(write(tmp_path, "w.jsonl", jsonl(records)))
    assert job.iterations == 2
    assert (job.t_roll_s, job.t_train_s) == (4.0, 2 * 6 + 2 * 2 - 4.0)  # max(14 - 3, 16 - 4)


def test_trl_trainer_state_json(tmp_path):
    """A log_history whose entries carry the profiling keys (e.g. put there by a callback)."""
    history = [{GEN: 2.0, "step_time": 5.0, "step": 1}, {GEN: 3.0, "step_time": 5.5, "step": 2}]
    run = tmp_path / "my-run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": history}))
    job = from_trl_log(run / "trainer_state.json")
    assert (job.job_id, job.iterations, job.t_roll_s, job.t_train_s) == ("my-run", 2, 3.0, 3.0)
    write_trace([job], tmp_path / "t.csv")
    assert read_trace(tmp_path / "t.csv") == [job]


def test_trl_plain_log_history_has_no_generation_time(tmp_path):
    """TRL's own log_history holds step_time but no generation time: a clear error."""
    history = [{"loss": 0.1, "step_time": 5.0, "step": 1}, {"train_runtime": 9.0, "step": 1}]
    path = write(tmp_path, "trainer_state.json", json.dumps({"log_history": history}))
    with pytest.raises(TraceFormatError, match="W&B / MLflow / Trackio") as info:
        from_trl_log(path)
    assert info.value.column.startswith("profiling/Time taken")


@pytest.mark.parametrize("text, line, column", [
    (jsonl([{GEN: 1.0}, {"loss": 1}]), 1, "step_time"),
    (jsonl([{GEN: 1.0}, {"step_time": "slow"}]), 2, "step_time"),
    (jsonl([{GEN: -1.0}, {"step_time": 3}]), 1, GEN),
    (jsonl([{GEN: 1.0}, {"step_time": 3, "step": 2}, {GEN: 1.0}, {"step_time": 3, "step": 2}]), 4, "step"),
    (jsonl([{GEN: 1.0}, {"step_time": 3, "step": "2"}]), 2, "step"),
    (jsonl([{GEN: 4.0}, {"step_time": 3}]), 1, "step_time"),  # step contains less than its rollout
    (jsonl([{GEN: 1.0}, {"step_time": 3}, {GEN: 1.0}]), 3, "step_time"),  # last rollout never trained
    (jsonl([{GEN: 1.0}]) + "{not json\n", 2, ""),
    (jsonl([{GEN: 1.0}]) + "[1, 2]\n", 2, ""),
    (json.dumps({"log_history": [{GEN: 1.0, "step_time": 2}, 7]}), 2, ""),
])
def test_trl_hostile_input_names_line_and_key(tmp_path, text, line, column):
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(TraceFormatError) as info:
        from_trl_log(path)
    assert (info.value.line, info.value.column) == (line, column)


def test_trl_bad_arguments(tmp_path):
    path = write(tmp_path, "ok.jsonl", jsonl(trl_iteration(1, 1.0, 1.0, 5.0)))
    for kw, field in [({"gpus": 0}, "gpus"), ({"percentile": -5}, "percentile"), ({"slo": 0.9}, "slo")]:
        with pytest.raises(SpecError) as info:
            from_trl_log(path, **kw)
        assert info.value.field == field


def test_verl_timings_refuse_a_column_given_twice_a_file_without_steps_and_an_oversized_field(tmp_path):
    twice = tmp_path / "twice.csv"
    twice.write_text("run,step,t_gen,t_gen,t_update_actor\nr1,1,10,5,20\n")
    with pytest.raises(TraceFormatError, match="line 1, column 't_gen': the column appears twice"):
        from_verl_timings(twice)
    empty = tmp_path / "empty.csv"
    empty.write_text("run,step,t_gen,t_update_actor\n")
    with pytest.raises(TraceFormatError, match="no step rows"):
        from_verl_timings(empty)
    long = tmp_path / "long.csv"
    long.write_text("run,step,t_gen,t_update_actor\n" + "r" * 200_000 + ",1,10,20\n")
    with pytest.raises(TraceFormatError, match="line 2.*not a CSV row"):
        from_verl_timings(long)


def test_a_trl_log_nested_too_deep_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TraceFormatError, match="line 1: JSON nested too deep"):
        from_trl_log(path)


@pytest.mark.parametrize("command, name, data, said", [
    ("from-verl", "badutf.csv", b"run,step,t_gen,t_update_actor\nr1,1,1.0,2.0\nr1,2,\xff\xfe,2.0\n",
     "line 3: not UTF-8 text: byte 0xff at character 6"),
    ("from-trl", "badutf.jsonl", b'{"a": "\xff"}\n', "line 1: not UTF-8 text: byte 0xff at character 8"),
])
def test_a_file_that_is_not_utf8_is_refused_naming_its_line(tmp_path, command, name, data, said):
    """Bytes that are not UTF-8 ended both commands with a UnicodeDecodeError traceback (exit 1)."""
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "o.csv"
    r = CliRunner().invoke(app, ["trace", command, str(src), "--out", str(out)])
    assert r.exit_code == 2 and name in r.output and said in r.output, r.output
    assert not out.exists()


@pytest.mark.parametrize("name, text, line", [
    ("long.jsonl", jsonl([{GEN: 1.0}]) + '{"step_time": 3.0, "step": ' + "9" * 5000 + "}\n", 2),
    ("long.json", json.dumps([{GEN: 1.0}, {"step_time": 3.0, "step": 1}]).replace("1}]", "9" * 5000 + "}]"), 2),
    ("long-time.jsonl", jsonl([{GEN: 1.0}]) + '{"step_time": ' + "9" * 5000 + "}\n", 2),
    ("huge-step.jsonl", jsonl([{GEN: 1.0}, {"step_time": 3.0, "step": 10 ** 400}]), 2),
])
def test_trl_an_integer_out_of_range_is_refused_naming_its_line(tmp_path, name, text, line):
    """An integer of over 4300 digits raised json's ValueError (exit 1); a step of 400 digits
    an OverflowError when multiplied by the step time."""
    path = write(tmp_path, name, text)
    with pytest.raises(TraceFormatError) as info:
        from_trl_log(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert info.value.column in ("step", "step_time")
    r = CliRunner().invoke(app, ["trace", "from-trl", str(path), "--out", str(tmp_path / "o.csv")])
    assert r.exit_code == 2 and f"{name}, line {line}" in r.output, r.output


def test_a_run_or_job_name_is_quoted_in_an_error(tmp_path):
    """A run name's escape sequence reached the terminal raw in the error's prefix."""
    path = write(tmp_path, "ctl.csv", 'run,step,t_gen,t_update_actor\n"r\x1b[31mX",1,1,1\n')
    with pytest.raises(SpecError) as info:
        from_verl_timings(path)
    assert "\x1b" not in str(info.value) and "run 'r\\x1b[31mX' (line 2)" in str(info.value), str(info.value)
    path = write(tmp_path, "ok.jsonl", jsonl(trl_iteration(1, 1.0, 1.0, 5.0)))
    with pytest.raises(SpecError) as info:
        from_trl_log(path, job_id="j\x1b[31m")
    assert "\x1b" not in str(info.value) and "job 'j\\x1b[31m'" in str(info.value), str(info.value)


@pytest.mark.parametrize("row, column, said", [
    ("x,1_000,1,2", "step", "'1_000' is not a step number"),   # (int() read 1000)
    ("x,\u0663,1,2", "step", "is not a step number"),          # (an Arabic-Indic 3 read as 3)
    ("x,-5,1,2", "step", "'-5' is not a step number"),          # (a negative step was taken)
    ("x,+5,1,2", "step", "'+5' is not a step number"),
    ("x,0,1_0,2", "t_gen", "'1_0' is not a number of seconds"),  # (float() read 10.0)
    ("x,0,1,\u0662", "t_update_actor", "is not a number of seconds"),
])
def test_verl_numbers_are_ascii_without_underscores_and_steps_not_negative(tmp_path, row, column, said):
    path = write(tmp_path, "v.csv", f"run,step,t_gen,t_update_actor\ny,0,1,2\n{row}\n")
    with pytest.raises(TraceFormatError) as info:
        from_verl_timings(path)
    assert (info.value.line, info.value.column) == (3, column) and said in str(info.value), str(info.value)


def test_verl_a_comment_is_a_line_that_starts_with_hash_not_a_quoted_run_name(tmp_path):
    """A row whose run is a quoted "#..." was dropped as a comment; a comment's quote no
    longer opens a field that swallows the rows after it."""
    text = ('# note, "an open quote\nrun,step,t_gen,t_update_actor\n  # indented comment\n'
            'x,0,1,2\n"#r",0,3,4\n#y,0,5,6\nx,1,2,2\n')
    jobs = from_verl_timings(write(tmp_path, "v.csv", text))
    assert [(j.model, j.job_id, j.iterations, j.t_roll_s) for j in jobs] == [("x", "x", 2, 2), ("#r", "r", 1, 3)]


def test_trl_json_lines_end_at_newline_only(tmp_path):
    """U+2028 and U+0085 are valid raw inside a JSON string: splitlines() cut the record there
    ("not JSON (Unterminated string)") and shifted every later line number."""
    records = [{GEN: 2.0, "note": "a\u2028b\u0085c"}, {"step_time": 5.0, "step": 1},
               {GEN: 3.0}, {"step_time": 6.0, "step": 2}]
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    job = from_trl_log(write(tmp_path, "u.jsonl", text + "\n"))
    assert (job.iterations, job.t_roll_s, job.t_train_s) == (2, 3.0, 3.0)
    for end in ("\r\n", "\r"):  # (as the trace reader cuts lines)
        (tmp_path / "cr.jsonl").write_bytes(text.replace("\n", end).encode())
        assert from_trl_log(tmp_path / "cr.jsonl", job_id="u") == job
    with pytest.raises(TraceFormatError) as info:
        from_trl_log(write(tmp_path, "u.jsonl", text + "\n{oops\n"))
    assert info.value.line == 5 and "not JSON (Expecting property name enclosed in double quotes at column 2)" \
        in str(info.value)


def test_trl_a_document_s_syntax_error_names_its_line_and_column(tmp_path):
    """A trailing comma deep in trainer_state.json was reported at line 1 (the document was
    then read as JSON lines, whose first line is a lone '{')."""
    text = json.dumps({"log_history": [{GEN: 1.0, "step_time": 3.0, "step": 1}] * 3}, indent=2)
    broken = text.replace('"step": 1\n    }\n  ]', '"step": 1,\n    }\n  ]')
    with pytest.raises(TraceFormatError) as info:
        from_trl_log(write(tmp_path, "trainer_state.json", broken))
    comma = broken.split("\n").index('      "step": 1,') + 1  # the comma's line; json stops at the '}' after it
    assert info.value.line == comma + 1 > 10 and "at column 5" in str(info.value), str(info.value)
    with pytest.raises(TraceFormatError) as info:  # a document with something after it
        from_trl_log(write(tmp_path, "trainer_state.json", text + "\n{}\n"))
    assert info.value.line == text.count("\n") + 2 and "Extra data" in str(info.value)
    with pytest.raises(TraceFormatError, match="no record holds step_time"):  # an empty log is no syntax error
        from_trl_log(write(tmp_path, "empty.jsonl", " \n"))
