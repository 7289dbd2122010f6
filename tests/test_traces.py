"""Trace files: the job-trace format, builtin traces, the Philly mapping, generation."""
from __future__ import annotations

import math
import string
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import (JOB_ID_PATTERN, MAX_JOB_GPUS, MAX_JOB_ITERATIONS, MAX_MEM_GB, MAX_PHASE_S, MAX_PRICE,
                           MAX_SLO, MAX_STALENESS, MAX_TIME_S, REWARD_PRICE_PER_HOUR, Cluster, Job, PoolSpec)
from rollmux.traces.builtin import BUILTIN, load_trace
from rollmux.traces.format import KNOWN, read_trace, write_trace
from rollmux.traces.generate import generate
from rollmux.traces.philly import (PROFILES, TABLE2_MEM_GB, PhillyStats, convert_philly,
                                   mix_from_segment, model_size, phase_gpus, read_philly)

HEADER = ("job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,"
          "mem_roll_gb,mem_train_gb,slo,model")
ROW_A = "a,0,3600,8,8,100,50,275.7,240,1.5,7B"
ROW_B = "b,10,7200,16,16,200,80,490.3,520.4,1.2,32B"


def _trace(tmp_path, *lines: str):
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _error(path, cluster=None) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, cluster)
    return info.value


# --- job-trace format -------------------------------------------------------------

def test_reads_comments_whitespace_and_sorts_by_arrival(tmp_path):
    path = _trace(tmp_path, "# a comment", " job_id , arrival_s,duration_s,rollout_gpus,"
                  "train_gpus,t_roll_s,t_train_s,mem_roll_gb,mem_train_gb,slo,model ",
                  "late, 50 ,100,8,8,10,10,0,0,1,m", "# another", "",
                  "first,5,100,8,8,10,10,0,0,1,m", "tie,50,100,8,8,10,10,0,0,1,m")
    assert [j.job_id for j in read_trace(path)] == ["first", "late", "tie"]


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    """Spreadsheet programs save CSV as UTF-8 with a BOM; the header must still read."""
    plain = read_trace(_trace(tmp_path, HEADER, ROW_A, ROW_B))
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([HEADER, ROW_A, ROW_B]).encode())
    assert read_trace(path) == plain


def test_a_byte_order_mark_before_a_philly_header_is_skipped(tmp_path):
    src = tmp_path / "philly.csv"
    src.write_bytes(b"\xef\xbb\xbf" + f"{RFOLD_HEADER}\n7,100.0,CLOS,1,1,500.0\n".encode())
    assert [r.gpus for r in read_philly(src)] == [1]


def test_iterations_replace_duration_and_colo_may_be_empty(tmp_path):
    path = _trace(tmp_path, HEADER.replace("duration_s", "iterations") + ",t_roll_colo_s,t_train_colo_s",
                  "a,0,12,8,8,100,50,0,0,1.5,7B,,", "b,1,3,8,8,100,50,0,0,1.5,7B,80,40")
    a, b = read_trace(path)
    assert a.iterations == 12 and a.duration_s is None and a.t_roll_colo_s is None
    assert (b.t_roll_colo_s, b.t_train_colo_s) == (80.0, 40.0)


def test_row_needs_duration_or_iterations(tmp_path):
    path = _trace(tmp_path, HEADER + ",iterations", "a,0,,8,8,100,50,0,0,1.5,7B,")
    err = _error(path)
    assert (err.line, err.column) == (2, "duration_s")


@pytest.mark.parametrize("row, line, column", [
    ("a,0,3600,8,8,1o0,50,0,0,1.5,7B", 3, "t_roll_s"),       # bad float
    ("a,0,3600,8.5,8,100,50,0,0,1.5,7B", 3, "rollout_gpus"),  # bad int
    ("a,0,-5,8,8,100,50,0,0,1.5,7B", 3, "duration_s"),        # negative duration
    ("a,0,3600,8,8,100,50,0,0,0.9,7B", 3, "slo"),             # SLO below 1
    (",0,3600,8,8,100,50,0,0,1.5,7B", 3, "job_id"),            # empty required value
    ("a,0,3600,8,8,100,50,0,0,1001,7B", 3, "slo"),            # above MAX_SLO (the API's bound too)
    ("a,0,3600,8,8,100,50,2e6,0,1.5,7B", 3, "mem_roll_gb"),   # above MAX_MEM_GB
    ("a,0,3600,8,8,100,50,0,1e300,1.5,7B", 3, "mem_train_gb"),
    ("a,0,3600,8,8,100,50,0,0,1.5," + "m" * 129, 3, "model"),  # longer than MAX_MODEL_CHARS
    ("a,0,3600,8,8,100,50,0,0,1.5,a​b", 3, "model"),     # an invisible character
    ("a,0,3600,8,8,0,50,0,0,1.5,7B", 3, "t_roll_s"),          # zero phase
    ("a,0,3600,8,8,100,50,0,0,nan,7B", 3, "slo"),             # not finite
    ("a,0,3600,8,8,100,50,0,0,1.5", 3, ""),                   # short row
    ("a,0,3600,8,8,0.0005,50,0,0,1.5,7B", 3, "t_roll_s"),     # below 1 ms (the analysis's ticks)
    ("a,0,1e25,8,8,100,50,0,0,1.5,7B", 3, "duration_s"),      # past any replay's precision
    ("a,0,3e8,8,8,100,50,0,0,1.5,7B", 3, "duration_s"),       # 2 million solo iterations: hours of replay
    ("a,1e20,3600,8,8,100,50,0,0,1.5,7B", 3, "arrival_s"),    # gave negative bubbles
    ("a\x1b[2J,0,3600,8,8,100,50,0,0,1.5,7B", 3, "job_id"),  # a control character, raw into reports
    ("gpt\u202eab,0,3600,8,8,100,50,0,0,1.5,7B", 3, "job_id"),  # a bidi override: shows another id
    ("a,0,3600,8,800000,100,50,0,0,1.5,7B", 3, "train_gpus"),  # hung the planner
])
def test_bad_values_name_line_and_column(tmp_path, row, line, column):
    err = _error(_trace(tmp_path, "# comment", HEADER, row))
    assert (err.line, err.column) == (line, column)
    assert str(tmp_path) in str(err) and f"line {line}" in str(err)


def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes((HEADER + "\n" + ROW_A + "\n").encode() + "j\xf6b,0,3600,8,8,100,50,0,0,1.5,7B\n".encode("latin-1"))
    err = _error(path)
    assert err.line == 3 and "not UTF-8" in str(err) and str(path) in str(err)


def test_a_file_named_like_a_builtin_trace_is_not_read_silently_in_its_place(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "production").write_text(HEADER + "\n" + ROW_A + "\n")
    with pytest.warns(UserWarning, match=r"\./production for the file"):
        jobs, _ = load_trace("production")
    assert len(jobs) == 200
    assert [j.job_id for j in load_trace("./production")[0]] == ["a"]


def test_missing_column_is_reported_on_the_header(tmp_path):
    err = _error(_trace(tmp_path, HEADER.replace(",slo", ""), ROW_A.replace(",1.5", "")))
    assert (err.line, err.column) == (1, "slo")
    err = _error(_trace(tmp_path, HEADER.replace("duration_s,", ""), "a,0,8,8,100,50,0,0,1.5,7B"))
    assert (err.line, err.column) == (1, "duration_s")


def test_duplicate_id_names_both_lines(tmp_path):
    err = _error(_trace(tmp_path, HEADER, ROW_A, ROW_B, ROW_A.replace(",0,", ",5,", 1)))
    assert (err.line, err.column) == (4, "job_id")
    assert "line 2" in err.args[0]


def test_memory_larger_than_node(tmp_path):
    small = Cluster(train=PoolSpec("H800", 5.28, host_mem_gb=500.0))
    path = _trace(tmp_path, HEADER, ROW_A, ROW_B)
    err = _error(path, small)
    assert (err.line, err.column) == (3, "mem_train_gb")
    assert len(read_trace(path)) == 2


def test_extra_columns_warn_and_are_kept(tmp_path):
    path = _trace(tmp_path, HEADER + ",team, note", ROW_A + ",rl,x", ROW_B + ",rl,y")
    with pytest.warns(UserWarning, match="team"):
        jobs = read_trace(path)
    assert jobs[0].extra == {"team": "rl", "note": "x"}


def test_empty_file_is_an_error(tmp_path):
    assert _error(_trace(tmp_path, "# nothing")).line == 1


_TEXT = st.text(string.ascii_letters + string.digits + "_-.", min_size=1, max_size=8)
_POS = st.floats(0.5, 1e6, allow_nan=False)
#: extra column text: any characters but CR and LF, without surrounding whitespace (write_trace refuses those)
_EXTRA_TEXT = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
                      max_size=6).filter(lambda t: t == t.strip())


@st.composite
def _jobs(draw):
    """Jobs anywhere inside Job.validate's bounds, every field drawn (extras in every job, as a
    column some job lacks reads back as an empty string)."""
    ids = draw(st.lists(st.from_regex(JOB_ID_PATTERN, fullmatch=True), min_size=1, max_size=6, unique=True))
    extra_names = draw(st.lists(_EXTRA_TEXT.filter(lambda n: n not in KNOWN), max_size=2, unique=True))
    jobs = []
    for job_id in ids:
        use_iterations = draw(st.booleans())
        rollout_gpus = draw(st.integers(1, MAX_JOB_GPUS))
        staleness = draw(st.integers(0, MAX_STALENESS))
        mem_roll = draw(st.floats(0, MAX_MEM_GB))
        t_roll, t_train = draw(_POS), draw(_POS)
        t_solo = max(t_roll, t_train) if staleness else t_roll + t_train
        jobs.append(Job(
            job_id=job_id, t_roll_s=t_roll, t_train_s=t_train,
            rollout_gpus=rollout_gpus, train_gpus=draw(st.integers(1, MAX_JOB_GPUS)),
            mem_roll_gb=mem_roll, mem_train_gb=draw(st.floats(0, MAX_MEM_GB)),
            slo=draw(st.floats(1.0, MAX_SLO)),
            model=draw(_TEXT | st.just("Qwen, 7B") | st.just('a "quoted" name') | st.just("")),
            arrival_s=draw(st.floats(0, MAX_TIME_S)),
            duration_s=None if use_iterations else draw(st.floats(1e-3, min(MAX_TIME_S, MAX_JOB_ITERATIONS * t_solo))),
            iterations=draw(st.integers(1, MAX_JOB_ITERATIONS)) if use_iterations else draw(
                st.none() | st.integers(1, 100)),
            t_roll_colo_s=draw(st.none() | _POS), t_train_colo_s=draw(st.none() | _POS),
            tail_workers=draw(st.none() | st.integers(1, rollout_gpus)), staleness=staleness,
            reward_s=draw(st.just(0.0) | st.floats(0, MAX_PHASE_S)),
            reward_price_per_hour=draw(st.just(REWARD_PRICE_PER_HOUR) | st.floats(0, MAX_PRICE)),
            reward_mem_gb=draw(st.floats(0, mem_roll)), colocate=not staleness and draw(st.booleans()),
            extra={name: draw(_EXTRA_TEXT) for name in extra_names}))
    return jobs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=_jobs())
def test_write_read_round_trip(tmp_path, jobs):
    """Any jobs inside the bounds read back equal (every field, extras included)."""
    path = tmp_path / "round.csv"
    write_trace(jobs, path)
    expected = sorted(jobs, key=lambda j: j.arrival_s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the extra columns' warning
        assert read_trace(path) == expected


def test_an_empty_model_and_tail_workers_read_back(tmp_path):
    """Job(model="") is the default (the API's too) and read back refused ("required value is
    empty"); tail_workers read back as None (no column)."""
    jobs = [Job("a", 10.0, 20.0, duration_s=1000.0), Job("b", 10.0, 20.0, duration_s=1000.0, model="7B",
                                                         tail_workers=2)]
    write_trace(jobs, tmp_path / "t.csv")
    assert read_trace(tmp_path / "t.csv") == jobs
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert "tail_workers" in header
    bad = _trace(tmp_path, HEADER + ",tail_workers", ROW_A + ",9")
    err = _error(bad)
    assert (err.line, err.column) == (2, "tail_workers") and "rollout_gpus (8)" in str(err)


@pytest.mark.parametrize("jobs, field", [
    ([Job("a", 1.0, 1.0, duration_s=10.0, extra={"note": "a\nb"})], "extra['note']"),
    ([Job("a", 1.0, 1.0, duration_s=10.0, extra={"note": "a\rb"})], "extra['note']"),
    ([Job("a", 1.0, 1.0, duration_s=10.0, extra={" note": "x"})], "extra"),
    ([Job("a", 1.0, 1.0, duration_s=10.0, extra={"a": "1", "a ": "2"})], "extra"),
    ([Job("a", 1.0, 1.0, duration_s=10.0, extra={"no\nte": "x"})], "extra"),
    ([Job("a", 1.0, 1.0, duration_s=10.0), Job("a", 2.0, 2.0, duration_s=10.0, arrival_s=5.0)], "job_id"),
])
def test_write_refuses_what_read_would_refuse_or_change_and_writes_nothing(tmp_path, jobs, field):
    """These were written, then refused by read_trace or read back changed (' note' as 'note')."""
    path = tmp_path / "sub" / "t.csv"
    with pytest.raises(SpecError) as info:
        write_trace(jobs, path)
    assert info.value.field == field
    assert not (tmp_path / "sub").exists()


def test_write_refuses_unreadable_jobs(tmp_path):
    with pytest.raises(SpecError):
        write_trace([Job("#x", 1.0, 1.0, duration_s=5.0)], tmp_path / "x.csv")
    with pytest.raises(SpecError):
        write_trace([Job("x", 1.0, 1.0)], tmp_path / "x.csv")


# --- builtin traces ---------------------------------------------------------------

def test_production_builtin():
    jobs, info = load_trace("production")
    assert len(jobs) == 200 == info["jobs"]
    assert info["name"] == "production" and "wutianyuan1/ROLL" in info["source"]
    cluster = Cluster()
    for job in jobs:
        job.validate(cluster)
        assert job.duration_s and job.t_roll_colo_s and job.t_train_colo_s
        assert 1.1 <= job.slo <= 2.0
    assert jobs[0].arrival_s == 0


def _in_profile(job: Job) -> bool:
    for rolls, trains in PROFILES.values():
        for (rlo, rhi), (tlo, thi) in zip(rolls, trains):
            if rlo <= job.t_roll_s <= rhi and tlo <= job.t_train_s <= thi:
                return True
    return False


def test_philly_mix_builtin():
    jobs, info = load_trace("philly-mix", seed=3)
    mapping = info["mapping"]
    assert len(jobs) == 300 - mapping["zero_length"] - mapping["malformed"] - mapping["duplicate"]
    assert jobs[0].arrival_s == 0 and 579 < info["span_hours"] < 581
    for job in jobs:
        job.validate(Cluster())
        assert _in_profile(job) and 1.0 <= job.slo <= 2.0
        assert job.rollout_gpus == job.train_gpus and job.rollout_gpus % 8 == 0
        assert (job.mem_roll_gb, job.mem_train_gb) == TABLE2_MEM_GB[int(job.model[:-1])]
    assert load_trace("philly-mix", seed=3)[0] == jobs
    assert load_trace("philly-mix", seed=4)[0] != jobs


def test_builtins_listed_and_unknown_spec(tmp_path):
    assert BUILTIN == ("production", "philly-mix")
    with pytest.raises(SpecError, match="philly-mix"):
        load_trace(str(tmp_path / "no-such-trace"))
    path = _trace(tmp_path, HEADER, ROW_A)
    jobs, info = load_trace(str(path))
    assert len(jobs) == 1 and info["name"] == "trace"


# --- Philly mapping ---------------------------------------------------------------

RFOLD_HEADER = "#job id,arrival time (sec),topology,shape,size,duration (sec)"


def test_from_philly_counts_odd_rows(tmp_path):
    src = tmp_path / "philly.csv"
    src.write_text("\n".join([
        RFOLD_HEADER,
        "7,100.0,CLOS,1,1,500.0",
        "8,150.0,CLOS,8+8,16,0.0",            # zero length: dropped
        "9,160.0,CLOS,8+8+8+8+8+8+8+8+8+8+8+8+8+8+8+8,128,900.0",  # huge: capped
        "10,abc,CLOS,1,1,5",                  # unparsable: skipped
        "11,170.0,CLOS,1",                    # short row: skipped
        "12,180.0,CLOS,2,2,-3",               # negative duration: skipped
        "13,190.0,CLOS,0,0,5",                # no GPUs: skipped
        "7,200.0,CLOS,1,1,5",                 # repeated id: dropped
        "14,120.0,CLOS,4+4,8,60.0",
        "15,5e9,CLOS,1,1,5",                  # an arrival no job can hold: skipped
        "16\x1b[2J,195.0,CLOS,1,1,5",         # a control character in its id: skipped
        "17,196.0,CLOS,1,1," + "9" * 200_000,  # a field over the csv module's limit: skipped
        "",
    ]))
    out = tmp_path / "out.csv"
    stats = convert_philly(src, out, limit=None, seed=1, mix="balanced", slo_range=(1.2, 1.4))
    assert stats == {"rows": 12, "malformed": 7, "outside_window": 0, "below_min_gpus": 0, "zero_length": 1,
                     "duplicate": 1, "capped": 1, "rounded_up": 2, "beyond_limit": 0, "kept": 3,
                     "widths": {"8+8": 2, "32+32": 1}, "models": {"7B": 2, "32B": 1}}
    jobs = read_trace(out)
    assert [j.job_id for j in jobs] == ["7", "14", "9"]
    assert [j.arrival_s for j in jobs] == [0.0, 20.0, 60.0]
    assert jobs[2].rollout_gpus == 32 and jobs[2].model == "32B"
    assert jobs[1].rollout_gpus == 8 and jobs[1].model == "7B" and jobs[1].duration_s == 60.0
    for job in jobs:
        assert 1.2 <= job.slo <= 1.4
        assert 50 <= job.t_roll_s <= 300 and 50 <= job.t_train_s <= 300
    limited = convert_philly(src, out, limit=1, seed=1, mix="balanced", slo_range=(1.2, 1.4))
    assert limited["kept"] == 1 and limited["beyond_limit"] == 4


def test_segment_format_and_bad_header(tmp_path):
    src = tmp_path / "seg.csv"
    src.write_text("# note\njob_id,arrival_s,gpus,node_shape,duration_s,orig_arrival_s\n"
                   "1,0,16,8+8,50,9\n2,5,32,8+8+8+8,70,14\n")
    stats = PhillyStats()
    assert [r.gpus for r in read_philly(src, stats)] == [16, 32]
    assert stats.rows == 2 and stats.malformed == 0
    src.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceFormatError):
        read_philly(src)


def test_gpu_split_and_model_rule():
    assert [phase_gpus(g) for g in (1, 8, 16, 20, 32, 64, 65)] == [
        (8, False), (8, False), (8, False), (16, False), (16, False), (32, False), (32, True)]
    assert [model_size(g) for g in (1, 8, 16, 24, 128)] == [7, 7, 14, 32, 32]


@pytest.mark.parametrize("mix", ["rollout-heavy", "train-heavy"])
def test_single_profile_mix(mix):
    jobs = generate(30, seed=2, mix=mix)
    heavy, light = (0, 1) if mix == "rollout-heavy" else (1, 0)
    for job in jobs:
        times = (job.t_roll_s, job.t_train_s)
        assert times[heavy] >= 100 and times[light] <= 200 and times[heavy] >= times[light]


def test_bad_mix_and_slo_range():
    with pytest.raises(SpecError, match="mix"):
        generate(3, seed=0, mix="compute-heavy")
    with pytest.raises(SpecError, match="slo_range"):
        generate(3, seed=0, slo_range=(0.5, 2.0))


# --- generation -------------------------------------------------------------------

def test_generate_is_seeded_and_valid():
    jobs = generate(50, seed=7, slo_range=(1.0, 1.5), mean_interarrival_s=100.0)
    assert len(jobs) == 50 and jobs == generate(50, seed=7, slo_range=(1.0, 1.5),
                                                 mean_interarrival_s=100.0)
    assert jobs != generate(50, seed=8, slo_range=(1.0, 1.5), mean_interarrival_s=100.0)
    assert jobs[0].arrival_s == 0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(jobs, jobs[1:]))
    for job in jobs:
        job.validate(Cluster())
        assert _in_profile(job) and 1.0 <= job.slo <= 1.5 and math.isfinite(job.duration_s)
    assert generate(0, seed=1) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SpecError, match="count"):
            generate(-1, seed=1)


# --- from-philly: filters, the report, the bundled segment rebuilt ------------------------

RAW_PHILLY = Path(__file__).resolve().parents[2] / "shared" / "traces" / "rfold_philly_trace.csv"


def test_from_philly_filters_and_reports_what_it_changed(tmp_path):
    from typer.testing import CliRunner

    from rollmux.cli import app

    src = tmp_path / "philly.csv"
    src.write_text("#job id,arrival time (sec),topology,shape,size,duration (sec)\n"
                   "a,0,CLOS,1,1,100\nb,3600,CLOS,1,1,100\nc,7200,CLOS,8,8,100\nd,10800,CLOS,8+8,16,100\n"
                   "e,12000,CLOS,8+8+8+8,32,0\nf,14400,CLOS,8+8+8+8,32,100\n")
    out, seg = tmp_path / "rl.csv", tmp_path / "seg.csv"
    r = CliRunner().invoke(app, ["trace", "from-philly", str(src), "--out", str(out), "--min-gpus", "8",
                                 "--window", "0.5:3.5", "--segment-out", str(seg)])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "2 jobs kept of 6 rows" in flat and "2 outside --window" in flat and "1 below --min-gpus" in flat
    assert "1 zero length" in flat and "1 jobs (50.0%) rounded up" in flat and "8+8 2" in flat
    assert "7B 1, 14B 1" in flat
    assert [j.job_id for j in read_trace(out)] == ["c", "d"]
    assert [(r.job_id, r.arrival_s, r.shape) for r in read_philly(seg)] == [("c", 0.0, "8"), ("d", 3600.0, "8+8")]
    for bad in (["--window", "3:1"], ["--min-gpus", "0"], ["--window", "x"]):
        r = CliRunner().invoke(app, ["trace", "from-philly", str(src), "--out", str(tmp_path / "n.csv"), *bad])
        assert r.exit_code == 2 and bad[0] in r.output and not (tmp_path / "n.csv").exists()


@pytest.mark.skipif(not RAW_PHILLY.exists(), reason="the raw Philly trace (shared/traces) is not beside the repo")
def test_the_bundled_philly_mix_rebuilds_from_the_raw_file(tmp_path):
    """docs/traces.md's command gives a segment that maps to the same philly-mix jobs."""
    seg = tmp_path / "seg300.csv"
    stats = convert_philly(RAW_PHILLY, tmp_path / "rl.csv", limit=300, min_gpus=16,
                           window=(1533.82 * 3600, 100000 * 3600), segment_path=seg)
    assert stats["kept"] == 300
    for seed in (0, 5):
        assert load_trace("philly-mix", seed=seed)[0] == mix_from_segment(seg, seed)


def test_a_field_over_the_csv_limit_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "long.csv"
    head = "job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,mem_train_gb,slo,model\n"
    row = ",0,3600,8,8,100,120,300,300,1.5,7B\n"
    path.write_text(head + "a" + row + "b" * 200_000 + row)
    with pytest.raises(TraceFormatError, match="line 3.*not a CSV row"):
        read_trace(path)


@pytest.mark.parametrize("cells, error", [
    ('"a\nb",0,3600', "line 2: a quoted cell does not close on this line"),  # a line break in a quoted id
    ('a,0,3600,8,8,100,120,300,300,1.5,"7B\n"', "line 2: a quoted cell does not close"),
    ('"a"b,0,3600', "line 2: not a CSV row"),  # text after a closing quote (it read 'ab')
])
def test_quoting_that_does_not_close_on_its_line_is_named(tmp_path, cells, error):
    """A quoted cell holding a line break was reported as "expected 11 fields, got 1"."""
    path = tmp_path / "quoted.csv"
    head = "job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,mem_train_gb,slo,model\n"
    path.write_text(head + cells + "\n")
    with pytest.raises(TraceFormatError, match=error):
        read_trace(path)
    path.write_text(head + 'a,0,3600,8,8,100,120,300,300,1.5,"Qwen ""7B"""\n')  # quotes done right still read
    assert read_trace(path)[0].model == 'Qwen "7B"'


def test_a_model_name_with_control_characters_is_refused():
    with pytest.raises(SpecError, match="model"):
        Job("a", 10.0, 10.0, duration_s=100.0, model="7B\x00").validate()


def test_a_trace_write_that_fails_half_way_leaves_the_old_file(tmp_path, monkeypatch):
    """Written beside and renamed over (a full disk cut the file in the middle of a row)."""
    import rollmux.traces.format as fmt

    path = tmp_path / "trace.csv"
    old = generate(5, seed=1)
    write_trace(old, path)
    before = path.read_bytes()
    calls = {"n": 0}
    real = fmt._format

    def failing(value):
        calls["n"] += 1
        if calls["n"] > 40:
            raise OSError(28, "No space left on device")
        return real(value)

    monkeypatch.setattr(fmt, "_format", failing)
    with pytest.raises(OSError):
        write_trace(generate(50, seed=2), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["trace.csv"]


# --- hostile input: positions, long cells, the Philly reader, generate's options ----------------------

@pytest.mark.parametrize("data, said", [
    (HEADER.encode() + b"\n" + "j\u00e9\u20ac".encode() + b"\xff,0,3600,8,8,100,50,0,0,1.5,7B\n",
     "line 2: not UTF-8 text: byte 0xff at character 4 "),
    (HEADER.encode() + b"\r" + ROW_A.encode() + b"\rj\xff,0,3600,8,8,100,50,0,0,1.5,7B\r",  # CR-only lines
     "line 3: not UTF-8 text: byte 0xff at character 2 "),
    (b"\xef\xbb\xbf" + HEADER.encode() + b"\n\xe9b,0,3600,8,8,100,50,0,0,1.5,7B\n",  # after a byte-order mark
     "line 2: not UTF-8 text: byte 0xe9 at character 1 "),
])
def test_a_byte_that_is_not_utf8_is_placed_as_the_reader_counts(tmp_path, data, said):
    """The position counted bytes ('character 7' for the 4th), only LF ended a line (a CR-only
    file said line 1), and after a byte-order mark it named the wrong byte and line."""
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    assert said in str(_error(path))


def test_a_huge_cell_is_not_echoed_whole_and_the_error_says_the_bounds(tmp_path):
    for cell in ("5" * 5000, "5" * 4000):  # beyond int()'s digit limit, and within it (then Job.validate's error)
        err = _error(_trace(tmp_path, HEADER, f"a,0,3600,{cell},8,100,50,0,0,1.5,7B"))
        assert err.column == "rollout_gpus" and "an integer from 1 to 100,000" in str(err)
        assert len(str(err)) < 200 + len(str(tmp_path)), str(err)


def _cli(*args: str):
    from typer.testing import CliRunner

    from rollmux.cli import app

    return CliRunner().invoke(app, list(args))


def test_from_philly_on_a_file_that_is_not_utf8_names_its_line_and_writes_nothing(tmp_path):
    """It ended in a UnicodeDecodeError traceback and left --out's folder behind."""
    src = tmp_path / "latin1.csv"
    src.write_bytes(b"job_id,arrival_s,gpus,node_shape,duration_s\nj\xe9,0,16,8+8,100\n")
    r = _cli("trace", "from-philly", str(src), "--out", str(tmp_path / "new" / "sub" / "rl.csv"))
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "line 2: not UTF-8 text: byte 0xe9 at character 2" in flat, r.output
    assert "Traceback" not in r.output and not (tmp_path / "new").exists()


def test_a_philly_row_no_rl_job_can_hold_is_counted_malformed_and_the_rest_converted(tmp_path):
    """A duration of 5e8 s passed read_philly, then write_trace refused the drawn job and the whole
    conversion stopped (an error naming neither file nor line), leaving an empty --out folder."""
    from rollmux.traces.philly import MAX_DURATION_S

    src = tmp_path / "long.csv"
    src.write_text("job_id,arrival_s,gpus,node_shape,duration_s\na,0,16,8+8,100\nb,10,16,8+8,500000000\n"
                   f"c,20,16,8+8,{MAX_DURATION_S}\n")
    out = tmp_path / "new" / "rl.csv"
    r = _cli("trace", "from-philly", str(src), "--out", str(out))
    assert r.exit_code == 0 and "1 malformed rows" in r.output, r.output
    assert [j.job_id for j in read_trace(out)] == ["a", "c"]
    for seed in range(20):  # the bound holds whatever the draws: the shortest phases give 1e6 iterations exactly
        jobs = mix_from_segment(src, seed, mix="balanced")
        for job in jobs:
            job.validate()


@pytest.mark.parametrize("args, option", [
    (["--reward-s", "2e6"], "--reward-s"),
    (["--reward-price", "2e6"], "--reward-price"),
    (["--async-share", "0.5", "--staleness", "9"], "--staleness"),
    (["--slo-max", "2000"], "--slo-min/--slo-max"),
])
def test_generate_names_the_option_out_of_bounds_and_writes_nothing(tmp_path, args, option):
    """--reward-s 2e6 said 'job gen-0000: reward_s=2000000.0: ...' and left --out's folder behind."""
    r = _cli("trace", "generate", "--out", str(tmp_path / "new" / "g.csv"), "--count", "3", *args)
    assert r.exit_code == 2 and f"error: {option} " in r.output and "gen-0" not in r.output, r.output
    assert not (tmp_path / "new").exists()


def test_generate_keeps_arrivals_and_durations_inside_a_job():
    with pytest.raises(SpecError) as info:
        generate(5, seed=0, mean_interarrival_s=1e9)
    assert info.value.field == "count"
    from rollmux.traces.philly import MAX_DURATION_S

    jobs = generate(30, seed=1, mean_duration_s=1e12)
    assert max(j.duration_s for j in jobs) == MAX_DURATION_S
    for job in jobs:
        job.validate()
