"""rollmux whatif: --vary parsing, the grid, the choice and the frontier (against brute
force), a real grid on Ray (each row equal to a serial simulation), and the command."""
from __future__ import annotations

import json
import math
import random

import pytest
import ray
from typer.testing import CliRunner

from rollmux.accounting import OURS
from rollmux.cluster_file import cluster_from_dict, cluster_to_dict
from rollmux.errors import SpecError
from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.format import read_trace, write_trace
from rollmux.traces.generate import generate
from rollmux.whatif import MAX_CONFIGS, Row, choose, frontier, grid, nearest_rank, parse_vary, qualifies, run_config
from rollmux.whatif_ray import run_grid
from whatif_app import whatif_app

BASE = cluster_to_dict(Cluster())
BOUNDED = {"rollout": {"nodes": 4}, "train": {"nodes": 4}}
#: Four configurations: train.nodes=0 can place nothing (two error rows).
VARY = ["train.nodes=0,2", "rollout.nodes=2,unbounded"]


@pytest.mark.parametrize("spec, field, values", [
    ("train.nodes=10:20:2", "train.nodes", (10, 12, 14, 16, 18, 20)),
    ("rollout.nodes=8,12,16", "rollout.nodes", (8, 12, 16)),
    (" rollout.nodes = 8, unbounded ", "rollout.nodes", (8, None)),
    ("train.nodes=3:3:5", "train.nodes", (3,)),
    ("train.price_per_gpu_hour=4:5:0.5", "train.price_per_gpu_hour", (4.0, 4.5, 5.0)),
    ("rollout.price_per_gpu_hour=0.1:0.3:0.1", "rollout.price_per_gpu_hour", (0.1, 0.2, 0.3)),
    ("max_group_size=1,5", "max_group_size", (1, 5)),
    ("rollout.host_mem_gb=1024", "rollout.host_mem_gb", (1024.0,)),
])
def test_parse_vary(spec, field, values):
    vary = parse_vary(spec, BASE)
    assert (vary.spec, vary.field, vary.values) == (spec, field, values)


def test_switch_cost_varies_only_when_the_file_gives_seconds():
    assert parse_vary("switch_cost_s=0,30", {**BASE, "switch_cost_s": 10.0}).values == (0.0, 30.0)
    assert parse_vary("switch_cost_s.train=5", {**BASE, "switch_cost_s": {"rollout": 1.0, "train": 2.0}}).values \
        == (5.0,)
    with pytest.raises(SpecError, match="numeric cluster field"):
        parse_vary("switch_cost_s=0,30", BASE)  # "warm"


@pytest.mark.parametrize("spec", [
    "", "train.nodes", "=4", "train.nodes=", "bogus=1", "train.gpu=4", "train=4", "train.nodes.x=4",
    "train.nodes=1.5", "train.nodes=a", "train.nodes=0x10", "train.nodes=1e3", "train.nodes=True",
    "train.nodes=5:1:1", "train.nodes=1:5:0", "train.nodes=1:5:-1", "train.nodes=1:5", "train.nodes=1:2:3:4",
    "train.nodes=:5:1", "train.nodes=unbounded:9:1", "train.nodes=4,4", "train.nodes=4,,5", "train.nodes=4,",
    "train.nodes=-1", "train.nodes=-3:3:1", "train.nodes=0:100000000:1",
    "train.price_per_gpu_hour=nan", "train.price_per_gpu_hour=inf", "train.price_per_gpu_hour=-inf:1:1",
    "train.price_per_gpu_hour=0", "train.price_per_gpu_hour=unbounded", "train.price_per_gpu_hour=1:2:1e-9",
    "train.price_per_gpu_hour=-1e308:1e308:1", "gpus_per_node=0", "max_group_size=0:2:1",
    "rollout.nodes=[1]", "rollout.nodes=8;rm -rf /", "rollout.nodes=\x00",
    "rollout.price_per_gpu_hour=1:1.000000001:1e-12",  # 1001 values of 1.0 once rounded
    "train.nodes=\u0663", "train.nodes=1:\u0663:1", "rollout.price_per_gpu_hour=\u0663.5",  # Arabic-Indic 3
])
def test_hostile_specs_name_the_spec(spec):
    with pytest.raises(SpecError) as info:
        parse_vary(spec, BASE)
    assert (info.value.field, info.value.value) == ("vary", spec)


def test_a_fleet_pool_named_with_an_equals_sign_can_be_varied():
    """The spec was split at its first '=': ``pools[a=b].nodes=2,3`` named field ``pools[a``."""
    from rollmux.whatif_fleet import fleet_dict

    base = fleet_dict({"pools": [{"gpu": "H20", "name": "a=b", "nodes": 2}, {"gpu": "H800", "nodes": 2}]})
    vary = parse_vary("pools[a=b].nodes=2,3", base)
    assert (vary.field, vary.values) == ("pools[a=b].nodes", (2, 3))
    assert parse_vary("pools[0].nodes=2,3", base).field == "pools[a=b].nodes"


def test_a_listed_pool_cannot_vary_its_count():
    base = cluster_to_dict(cluster_from_dict({"train": {"nodes": [{"id": "T0"}, {"id": "T1"}]}}))
    with pytest.raises(SpecError, match="real nodes"):
        parse_vary("train.nodes=1,2", base)


def test_grid_is_the_cartesian_product_last_spec_fastest():
    configs = grid([parse_vary("train.nodes=10:14:2", BASE), parse_vary("rollout.nodes=8,unbounded", BASE)])
    assert configs == [{"train.nodes": t, "rollout.nodes": r} for t in (10, 12, 14) for r in (8, None)]
    assert grid([]) == [{}]


def test_grid_refuses_a_field_twice_and_too_many_configurations():
    with pytest.raises(SpecError, match="each field varied once"):
        grid([parse_vary("train.nodes=1,2", BASE), parse_vary("train.nodes=3", BASE)])
    big = [parse_vary("train.nodes=1:101:1", BASE), parse_vary("rollout.nodes=1:100:1", BASE)]
    assert 101 * 100 > MAX_CONFIGS
    with pytest.raises(SpecError, match="at most 10,000 configurations; these make 10,100"):
        grid(big)
    assert len(grid([parse_vary("train.nodes=1:100:1", BASE), parse_vary("rollout.nodes=1:100:1", BASE)])) \
        == MAX_CONFIGS


def test_nearest_rank():
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    assert nearest_rank([float(i) for i in range(1, 21)], 0.95) == 19.0
    assert nearest_rank([0.0] * 19 + [math.inf], 0.95) == 0.0
    assert nearest_rank([0.0] * 18 + [math.inf] * 2, 0.95) == math.inf
    assert math.isnan(nearest_rank([], 0.5))


def _random_rows(rng: random.Random, n: int) -> list[Row]:
    rows = []
    for i in range(n):
        row = Row({"train.nodes": i}, "rollmux", cost_per_hour=rng.choice([1.0, 2.0, 3.0, 4.0]),
                  owned_per_hour=rng.choice([5.0, 6.0, 7.0]), p95_wait_h=rng.choice([0.0, 1.0, 2.0, 5.0]),
                  slo_met=rng.choice([0.5, 0.99, 1.0]), never_ran=int(rng.random() < 0.1))
        if rng.random() < 0.1:
            row = Row(row.values, "rollmux", error="cannot place")
        rows.append(row)
    return rows


def test_choice_and_frontier_match_brute_force():
    rng = random.Random(7)
    for _ in range(300):
        rows = _random_rows(rng, rng.randint(0, 12))
        for basis in ("owned", "used"):
            ran = [r for r in rows if r.error is None and not r.never_ran]
            dominated = {id(r) for r in ran for s in ran
                         if s.cost(basis) <= r.cost(basis) and s.p95_wait_h <= r.p95_wait_h
                         and (s.cost(basis), s.p95_wait_h) != (r.cost(basis), r.p95_wait_h)}
            front = frontier(rows, basis)
            assert {id(r) for r in front} == {id(r) for r in ran} - dominated
            assert [r.cost(basis) for r in front] == sorted(r.cost(basis) for r in front)
            for target, slo in ((None, None), (1.0, None), (None, 0.99), (2.0, 0.99)):
                ok = [r for r in ran
                      if (target is None or r.p95_wait_h <= target) and (slo is None or r.slo_met >= slo)]
                assert [r for r in rows if qualifies(r, target, slo)] == ok
                best = min(ok, key=lambda r: (r.cost(basis), r.p95_wait_h), default=None)
                got = choose(rows, basis, target, slo)
                assert (got is None) == (best is None)
                if best is not None:
                    assert (got.cost(basis), got.p95_wait_h) == (best.cost(basis), best.p95_wait_h)
                    assert got is next(r for r in ok if (r.cost(basis), r.p95_wait_h) == (best.cost(basis),
                                                                                          best.p95_wait_h))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 15-job trace file and a bounded cluster dict."""
    path = tmp_path_factory.mktemp("whatif") / "t15.csv"
    write_trace(generate(15, 1, "mixed", (1.0, 2.0)), path)
    return path, cluster_to_dict(cluster_from_dict(BOUNDED))


def test_grid_on_ray_equals_serial_simulations(small):
    path, base = small
    jobs = read_trace(path)
    configs = grid([parse_vary(spec, base) for spec in VARY])
    seen = []
    rows = run_grid(jobs, base, configs, ["rollmux"], num_cpus=2, on_row=lambda r, d, n: seen.append((d, n)))
    assert not ray.is_initialized()
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [r.values for r in rows] == configs
    for row, values in zip(rows, configs):
        serial = run_config(jobs, base, values, "rollmux", 0, "worst", OURS)
        assert row.to_dict() == serial.to_dict()
        if values["train.nodes"] == 0:
            assert "could place none" in row.error and math.isnan(row.p95_wait_h)
            continue
        from rollmux.whatif import with_values

        direct = simulate(jobs, cluster_from_dict(with_values(base, values)), make_policy("rollmux"))
        assert row.error is None and row.never_ran == len(direct.rejected)
        assert (row.cost_per_hour, row.total_cost, row.makespan_h, row.slo_met, row.limiting_pool) == (
            direct.cost_per_hour, direct.total_cost, direct.span_s / 3600.0, direct.slo_attainment,
            direct.limiting_pool)
        waits = sorted(j.wait_s / 3600.0 for j in direct.jobs) + [math.inf] * len(direct.rejected)
        assert row.p95_wait_h == waits[math.ceil(0.95 * len(waits)) - 1]
        # owned: both bounded pools held for the whole run, over the same hours as used
        if values["rollout.nodes"] is not None:
            held = (2 * 8 * 5.28 + 2 * 8 * 1.85) * direct.span_s / 3600.0
            assert row.owned_total == pytest.approx(held) and row.owned_per_hour >= row.cost_per_hour


def test_command_end_to_end(small, tmp_path):
    path, base = small
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("rollout: {nodes: 4}\ntrain: {nodes: 4}\n")
    out = tmp_path / "out"
    args = ["whatif", "--trace", str(path), "--cluster", str(cluster), "--vary", VARY[0], "--vary", VARY[1],
            "--workers", "2", "--max-p95-wait-h", "1000", "--json", str(out / "w.json"), "--csv",
            str(out / "w.csv"), "--plot", str(out / "f.png")]
    result = CliRunner().invoke(whatif_app(), args)
    assert result.exit_code == 0, result.output
    assert not ray.is_initialized()
    assert "[4/4]" in result.stderr and "ETA" in result.stderr and "chosen: train.nodes=2" in result.stdout
    assert "[1/4]" not in result.stdout and "ETA -" in result.stderr  # progress on stderr; no ETA after one run
    data = json.loads((out / "w.json").read_text())
    jobs = read_trace(path)
    rows = [run_config(jobs, base, values, "rollmux", 0, "worst", OURS)
            for values in grid([parse_vary(spec, base) for spec in VARY])]
    assert data["rows"] == [json.loads(json.dumps(r.to_dict())) for r in rows]
    assert data["chosen"] == rows.index(choose(rows, "owned", 1000.0))
    assert data["frontier"] == [rows.index(r) for r in frontier(rows, "owned")]
    lines = (out / "w.csv").read_text().splitlines()
    assert lines[0].startswith("train.nodes,rollout.nodes,policy,queue,cost_per_hour") and len(lines) == 5
    assert lines[1].startswith("0,2,rollmux,backfill,,") and lines[2].startswith("0,unbounded,")
    assert (out / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_no_configuration_meeting_the_target_exits_1(small, tmp_path, monkeypatch):
    path, _ = small
    rows = [Row({"train.nodes": 1}, "rollmux", cost_per_hour=1.0, owned_per_hour=2.0, total_cost=3.0,
                owned_total=4.0, hours=1.0, p50_wait_h=1.0, p95_wait_h=9.0, makespan_h=2.0, slo_met=1.0)]
    monkeypatch.setattr("rollmux.whatif_ray.run_grid", lambda *a, **k: rows)
    result = CliRunner().invoke(whatif_app(), ["whatif", "--trace", str(path), "--vary", "train.nodes=1",
                                         "--max-p95-wait-h", "2"])
    assert result.exit_code == 1
    assert "no configuration meets the targets (every job ran, p95 wait <= 2 h)" in result.output


@pytest.mark.parametrize("args, message", [
    (["--vary", "train.nodes=1:5:0"], "--vary 'train.nodes=1:5:0': expected a range lo:hi:step"),
    (["--vary", "train.nodes=[red]x[/red]"], "--vary 'train.nodes=[red]x[/red]': expected integers"),
    (["--vary", "train.nodes=1", "--vary", "train.nodes=2"], "each field varied once"),
    (["--vary", "train.nodes=1", "--policy", "solo-d", "--policy", "solo-d"], "--policy solo-d: given twice"),
    (["--vary", "train.nodes=1", "--workers", "2", "--address", "auto"], "--workers sizes the local Ray"),
    (["--vary", "train.nodes=1", "--trace", "nope"], "--trace 'nope': expected a builtin trace"),
    (["--vary", "train.nodes=1", "--json", "{tmp}/file/y.json"], "--json {tmp}/file/y.json: cannot make the file"),
    (["--vary", "train.nodes=1", "--csv", "{tmp}"], "--csv {tmp}: is a folder"),
    (["--vary", "rollout.price_per_gpu_hour=1,2", "--accounting", "paper"],
     "--vary 'rollout.price_per_gpu_hour=1,2': expected a field that --accounting paper leaves as the cluster "
     "file gives it"),
])
def test_command_errors_name_the_option(args, message, tmp_path):
    (tmp_path / "file").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    message = message.replace("{tmp}", str(tmp_path))
    result = CliRunner().invoke(whatif_app(), ["whatif", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not ray.is_initialized()


def test_choices_are_checked_by_typer():
    result = CliRunner().invoke(whatif_app(), ["whatif", "--vary", "train.nodes=1", "--policy", "optimal"])
    assert result.exit_code == 2 and "optimal" in result.output


def test_the_waiting_line_order_reaches_every_run(tmp_path):
    """``--queue fifo --queue backfill`` replays every configuration in both orders, each
    row as ``run_config(backfill=...)`` gives it; on this trace the order changes the waits."""
    from dataclasses import replace

    from test_queue_backfill import _line

    path, cluster = tmp_path / "line.csv", tmp_path / "c.yaml"
    write_trace([replace(j, model="7B") for j in _line()], path)
    cluster.write_text("rollout: {nodes: 2}\ntrain: {nodes: 2}\nswitch_cost_s: 0\n")
    jobs = read_trace(path)
    base = cluster_to_dict(cluster_from_dict({"rollout": {"nodes": 2}, "train": {"nodes": 2}, "switch_cost_s": 0}))
    values = {"train.nodes": 2}
    fifo = run_config(jobs, base, values, "rollmux", 0, "worst", OURS, backfill=False)
    passing = run_config(jobs, base, values, "rollmux", 0, "worst", OURS)
    assert (fifo.queue, passing.queue) == ("fifo", "backfill")
    assert fifo.p50_wait_h > passing.p50_wait_h  # `small` waits behind `big` only in order
    result = CliRunner().invoke(whatif_app(), ["whatif", "--trace", str(path), "--cluster", str(cluster), "--vary",
                                               "train.nodes=2", "--queue", "fifo", "--queue", "backfill",
                                               "--workers", "1", "--json", str(tmp_path / "w.json")])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "1 configuration x 1 policy x 2 line orders = 2 runs" in flat
    assert "waiting line on bounded pools: fifo and backfill" in flat and "queue=fifo" in flat
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["queues"] == ["fifo", "backfill"]
    assert data["rows"] == [json.loads(json.dumps(r.to_dict())) for r in (fifo, passing)]
    for args, message in ((["--queue", "lifo"], "lifo"), (["--queue", "fifo", "--queue", "fifo"],
                                                          "--queue fifo: given twice")):
        bad = CliRunner().invoke(whatif_app(), ["whatif", "--vary", "train.nodes=1", *args])
        assert bad.exit_code == 2 and message in " ".join(bad.output.split())


def test_the_frontier_plot_shows_a_dollar_in_a_pool_name_literally(tmp_path):
    """A fleet pool named ``cheap$\\frac$``: its label went to matplotlib as mathtext and the
    plot failed with a ValueError after the whole sweep."""
    from rollmux.report.whatif_plot import frontier_plot

    rows = [Row({"pools[cheap$\\frac$].nodes": n}, "rollmux", owned_per_hour=100.0 + n, cost_per_hour=90.0 + n,
                p95_wait_h=1.0 / n, slo_met=1.0) for n in (6, 8)]
    path = frontier_plot(rows, rows, rows[0], "owned", tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_progress_line_is_one_line_in_a_log(capsys):
    """Without a terminal, stderr's console wrapped progress at 80 columns: a long line came
    out as two or three lines of a log."""
    from rollmux.cli_whatif import _Progress

    row = Row({"pools[a-long-pool-name].nodes": 12, "rollout.price_per_gpu_hour": 1.85}, "rollmux",
              error="rollmux could place none of the 200 jobs: the train pool (train.nodes = 0) cannot host them")
    _Progress("owned", (True, False))(row, 1, 8)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and len(err) > 100, err
    assert err.startswith("[1/8] pools[a-long-pool-name].nodes=12 rollout.price_per_gpu_hour=1.85 rollmux: ")


def test_the_eta_counts_the_mean_time_per_run_since_the_start(capsys, monkeypatch):
    """With runs in parallel they end in batches: the ETA came from the gap since the first run
    ended (two of a batch, 0.2 s apart, said 'ETA 0 s' with two runs of 30 s left)."""
    from rollmux import cli_whatif
    from rollmux.cli_whatif import _Progress

    clock = iter([0.0, 56.0, 56.2])
    monkeypatch.setattr(cli_whatif.time, "perf_counter", lambda: next(clock))
    progress = _Progress("owned", (False, False))
    row = Row({"train.nodes": 4}, "rollmux", owned_per_hour=100.0, cost_per_hour=90.0, p95_wait_h=0.5, slo_met=1.0)
    progress(row, 1, 4)
    progress(row, 2, 4)
    first, second = capsys.readouterr().err.splitlines()
    assert first.endswith("ETA -)") and second.endswith("(56 s elapsed, ETA 56 s)"), second


def test_a_grid_still_running_says_so_every_quiet_spell(capsys, monkeypatch):
    """(One run of the production trace takes minutes: the command said nothing between its
    header and the first run's end.) ``waiting`` prints after QUIET_S seconds without a
    line, with the ETA once two runs ended, and a run's line restarts the spell."""
    from rollmux import cli_whatif
    from rollmux.cli_whatif import QUIET_S, _Progress

    clock = iter([0.0, QUIET_S - 1, QUIET_S + 1, QUIET_S + 2, 40.0, 41.0, 40.0 + QUIET_S + 1])
    monkeypatch.setattr(cli_whatif.time, "perf_counter", lambda: next(clock))
    progress = _Progress("owned", (False, False))
    row = Row({"train.nodes": 4}, "rollmux", owned_per_hour=100.0, cost_per_hour=90.0, p95_wait_h=0.5, slo_met=1.0)
    progress.waiting(0, 4)  # 14 s: quiet
    progress.waiting(0, 4)  # 16 s: says so
    progress.waiting(0, 4)  # 17 s: only 1 s since
    progress(row, 1, 4)     # 40 s
    progress(row, 2, 4)     # 41 s
    progress.waiting(2, 4)  # 56 s: 15 s since the last line
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and lines[1].startswith("[1/4] ") and lines[2].startswith("[2/4] "), lines
    assert lines[0] == f"[0/4] running, no run finished yet ({QUIET_S + 1:.0f} s elapsed, ETA -)"
    assert lines[3] == f"[2/4] running ({40 + QUIET_S + 1:.0f} s elapsed, ETA {40 + QUIET_S + 1:.0f} s)"


def _scored(jobs):
    """``jobs`` scoring on the shared reward service: 60 busy seconds an iteration at $400/h."""
    import dataclasses

    return [dataclasses.replace(j, reward_s=60.0, reward_price_per_hour=400.0) for j in jobs]


def test_owned_is_what_pricing_owned_charges_reward_bill_included():
    """(an audit's case) owned left out the reward pool's bill that used and ``pricing: owned``
    both charge: on 4 + 4 owned nodes $636.11/h owned against $756.31/h used, where
    ``simulate`` with ``pricing: owned`` charged $894.82/h. Unbounded pools: owned is used."""
    from pathlib import Path

    jobs = _scored(read_trace(Path(__file__).resolve().parents[1] / "examples" / "fleet" / "jobs.csv"))
    base = cluster_to_dict(cluster_from_dict(BOUNDED))
    row = run_config(jobs, base, {}, "rollmux", 0, "worst", OURS)
    owned = simulate(jobs, cluster_from_dict({**base, "pricing": "owned"}), make_policy("rollmux"))
    assert owned.reward_cost > 0 and row.error is None
    assert row.owned_total == pytest.approx(owned.total_cost)
    assert row.owned_per_hour == pytest.approx(owned.cost_per_hour) and row.owned_per_hour >= row.cost_per_hour
    # with `pricing: owned` in the base file, `used` is still the pay-per-use figure
    priced = run_config(jobs, {**base, "pricing": "owned"}, {}, "rollmux", 0, "worst", OURS)
    assert (priced.total_cost, priced.owned_total) == (row.total_cost, row.owned_total)
    assert priced.total_cost < owned.total_cost
    rented = run_config(jobs, base, {"rollout.nodes": None, "train.nodes": None}, "rollmux", 0, "worst", OURS)
    assert rented.owned_total == pytest.approx(rented.total_cost) and rented.total_cost > owned.reward_cost


def test_a_field_the_accounting_sets_is_refused_naming_it():
    """(an audit's case) under --accounting paper, a varied rollout price, host memory or
    switch cost gave identical rows: the accounting sets them. Refused, naming the
    accounting; the fields it leaves alone still vary, and under ours everything does."""
    from rollmux.accounting import PAPER

    seconds = {**BASE, "switch_cost_s": 10.0}
    jobs = generate(4, 3, "mixed", (1.0, 2.0))
    for spec in ("rollout.price_per_gpu_hour=1.0,1.85,5.0", "rollout.price_per_gpu_hour=5", "rollout.host_mem_gb=100",
                 "train.host_mem_gb=100,2048", "switch_cost_s=0,30"):
        rows = {run_config(jobs, seconds, c, "rollmux", 0, "worst", PAPER).total_cost
                for c in grid([parse_vary(spec, seconds)])}
        assert len(rows | {run_config(jobs, seconds, {}, "rollmux", 0, "worst", PAPER).total_cost}) == 1
        with pytest.raises(SpecError) as err:
            parse_vary(spec, seconds, PAPER)
        assert (err.value.field, err.value.value) == ("vary", spec)
        assert f"--accounting paper leaves as the cluster file gives it: it sets {spec.split('=')[0]}" \
               in err.value.expected
        assert parse_vary(spec, seconds, OURS).field == spec.split("=")[0]
    for spec in ("train.price_per_gpu_hour=4,6", "train.nodes=2,unbounded", "gpus_per_node=4", "max_group_size=2"):
        assert parse_vary(spec, seconds, PAPER).field == spec.split("=")[0]
