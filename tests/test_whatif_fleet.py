"""rollmux whatif on a fleet file: --vary on pools (by index and by name), rows equal to
serial fleet replays (``engine.simulate``), owned vs used cost, the Ray fan-out, the
command, and a two-pool cluster file as before."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from rollmux.accounting import OURS
from rollmux.cluster_file import cluster_to_dict, read_mapping
from rollmux.errors import SpecError
from rollmux.fleet import load_profiles
from rollmux.fleet_file import fleet_from_dict
from rollmux.policies.fleet import fleet_policies
from rollmux.sim.engine import simulate
from rollmux.traces.format import read_trace
from rollmux.whatif import choose, frontier, grid, nearest_rank, parse_vary, run_config, variable_fields, with_values
from rollmux.whatif_fleet import fleet_dict, fleet_policy, policy_names, run_fleet_config
from rollmux.whatif_ray import run_grid
from whatif_app import whatif_app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fleet"
FLEET_FILE, JOBS, PROFILES = EXAMPLE / "three_types.yaml", EXAMPLE / "jobs.csv", EXAMPLE / "profiles.csv"
BASE = fleet_dict(read_mapping(FLEET_FILE, "fleet"))
#: Four configurations: H200 owned (0 or 2 nodes), H20 rented or 4 nodes owned.
VARY = ["pools[H200].nodes=0,2", "pools[0].nodes=unbounded,4"]


@pytest.fixture(scope="module")
def trace():
    """The example's ten jobs and their measured profiles."""
    return read_trace(JOBS), load_profiles(PROFILES, fleet_from_dict(BASE))


def test_fleet_dict_fills_the_defaults_and_is_the_same_fleet():
    assert [p["name"] for p in BASE["pools"]] == ["H20", "H800", "H200"]
    assert BASE["pools"][2]["price_per_gpu_hour"] == 6.305 and BASE["pools"][2]["nodes"] is None
    assert fleet_from_dict(BASE) == fleet_from_dict(read_mapping(FLEET_FILE, "fleet"))
    assert list(variable_fields(BASE)) == ["gpus_per_node", "max_group_size"] + [
        f"pools[{p}].{leaf}" for p in ("H20", "H800", "H200") for leaf in ("price_per_gpu_hour", "host_mem_gb", "nodes")]


@pytest.mark.parametrize("spec, field, values", [
    ("pools[H200].nodes=0,2,4", "pools[H200].nodes", (0, 2, 4)),
    ("pools[2].nodes=0:4:2", "pools[H200].nodes", (0, 2, 4)),
    (" pools[0].nodes = 2, unbounded ", "pools[H20].nodes", (2, None)),
    ("pools[1].price_per_gpu_hour=2.5,3.0", "pools[H800].price_per_gpu_hour", (2.5, 3.0)),
    ("pools[H800].host_mem_gb=1024", "pools[H800].host_mem_gb", (1024.0,)),
    ("gpus_per_node=4,8", "gpus_per_node", (4, 8)),
    ("max_group_size=1:3:1", "max_group_size", (1, 2, 3)),
])
def test_parse_vary_on_a_fleet(spec, field, values):
    vary = parse_vary(spec, BASE)
    assert (vary.field, vary.values) == (field, values)
    fleet_from_dict(with_values(BASE, {field: values[-1]}))  # the fleet file takes it


def test_index_and_name_set_the_same_pool():
    by_index, by_name = parse_vary("pools[2].nodes=3", BASE), parse_vary("pools[H200].nodes=3", BASE)
    assert by_index.field == by_name.field
    fleet = fleet_from_dict(with_values(BASE, {by_index.field: 3}))
    assert [p.nodes for p in fleet.pools] == [None, None, 3]


@pytest.mark.parametrize("spec, expected", [
    ("pools[H100].nodes=1", "a pool name (H20, H800, H200) or index 0..2"),
    ("pools[3].nodes=1", "a pool index 0..2 or a pool name (H20, H800, H200)"),
    ("pools[H200].tflops=900", "a pool field: one of nodes, price_per_gpu_hour, host_mem_gb"),
    ("pools[H200].nodes=1.5", "integers: '1.5' is not one"),
    ("pools[H200].nodes=-1", "values the fleet file accepts (pools[2].nodes=-1: expected a node count from 0 to "
                             "100,000 or null (unbounded))"),
    ("pools[H800].price_per_gpu_hour=0", "values the fleet file accepts (pools[1].price_per_gpu_hour=0.0: "
                                         "expected a number > 0 and <= 1e+06)"),
    ("pools[H800].price_per_gpu_hour=2,unbounded", "numbers ('unbounded' is a value of a pool's nodes only)"),
    ("pools[H200].nodes", "FIELD=VALUES, e.g. pools[H200].nodes=0:4:2 or pools[0].nodes=2,unbounded"),
])
def test_bad_fleet_specs_name_the_spec(spec, expected):
    with pytest.raises(SpecError) as err:
        parse_vary(spec, BASE)
    assert str(err.value) == f"vary={spec!r}: expected {expected}"


def test_a_two_pool_field_is_not_a_fleet_field():
    with pytest.raises(SpecError, match=r"expected a numeric fleet field: one of gpus_per_node, max_group_size, "
                                        r"pools\[H20\]\.price_per_gpu_hour"):
        parse_vary("train.nodes=1", BASE)


def test_one_field_by_index_and_by_name_is_varied_twice():
    varies = [parse_vary("pools[2].nodes=1", BASE), parse_vary("pools[H200].nodes=2", BASE)]
    with pytest.raises(SpecError) as err:
        grid(varies)
    assert str(err.value) == "vary='pools[2].nodes=1 pools[H200].nodes=2': expected each field varied once"


def _direct(jobs, profiles, values, policy):
    """A serial fleet replay of one configuration, as `rollmux fleet simulate` runs it."""
    fleet = fleet_from_dict(with_values(BASE, values))
    named = next(p for p in fleet_policies(fleet, profiles) if p.name == policy)
    return simulate(jobs, fleet.views()[0].cluster, named)


def test_rows_equal_serial_fleet_replays(trace):
    jobs, profiles = trace
    configs = grid([parse_vary(spec, BASE) for spec in VARY])
    assert configs == [{"pools[H200].nodes": h200, "pools[H20].nodes": h20} for h200 in (0, 2) for h20 in (None, 4)]
    for values in configs:
        for policy in ("rollmux", "gavel+"):
            row = run_config(jobs, BASE, values, policy, 0, "worst", OURS, profiles)
            direct = _direct(jobs, profiles, values, policy)
            assert row.error is None and row.never_ran == len(direct.rejected)
            assert (row.cost_per_hour, row.total_cost, row.makespan_h, row.slo_met) == (
                direct.cost_per_hour, direct.total_cost, direct.span_s / 3600.0, direct.slo_attainment)
            # the replay's "rollout"/"train" names no pool of a fleet: the limits column is "-"
            assert row.limiting_pool is None
            waits = [j.wait_s / 3600.0 for j in direct.jobs] + [math.inf] * len(direct.rejected)
            assert (row.p50_wait_h, row.p95_wait_h) == (nearest_rank(waits, 0.5), nearest_rank(waits, 0.95))
            assert row.owned_total >= row.total_cost - 1e-6
            if values["pools[H200].nodes"] == 0 and values["pools[H20].nodes"] is None:
                # the only bounded pool holds no node: owned is what was used
                assert row.owned_total == pytest.approx(row.total_cost)


def test_owned_charges_a_bounded_pools_idle_nodes(tmp_path):
    """One job alone on one H20 rollout node and one H800 training node, the H800 pool
    owning 3 nodes: owned = 3 H800 nodes + the 1 rented H20 node, both for the whole span."""
    one = tmp_path / "one.csv"
    one.write_text("\n".join(JOBS.read_text().splitlines()[:2]) + "\n")
    base = fleet_dict({"pools": [{"gpu": "H20"}, {"gpu": "H800", "nodes": 3}]})
    row = run_fleet_config(read_trace(one), base, {}, "solo-d on H20/H800", 0, "worst")
    assert row.error is None and row.p95_wait_h == 0.0
    span_h = row.makespan_h
    assert row.total_cost == pytest.approx((8 * 1.85 + 8 * 5.28) * span_h)
    assert row.owned_total == pytest.approx((8 * 1.85 + 3 * 8 * 5.28) * span_h)
    assert row.owned_per_hour == pytest.approx(row.owned_total / row.hours)


def test_unknown_fleet_policy_lists_the_valid_ones(trace):
    jobs, profiles = trace
    names = policy_names(BASE, profiles)
    assert names[:2] == ["rollmux", "rollmux-full"] and names[-1] == "gavel+" and "rollmux on H20/H800" in names
    with pytest.raises(SpecError) as err:
        run_config(jobs, BASE, {}, "solo-d", 0, "worst", OURS, profiles)
    assert str(err.value) == f"policy='solo-d': expected a fleet policy: one of {', '.join(names)}"
    assert fleet_policy(fleet_from_dict(BASE), profiles, "gavel+").name == "gavel+"


def test_a_policy_that_serves_no_job_is_an_error_row(trace):
    jobs, profiles = trace
    row = run_config(jobs, BASE, {}, "rollmux on H20/H20", 0, "worst", OURS, profiles)
    assert row.error and math.isnan(row.p95_wait_h) and row.never_ran == 0


def test_grid_on_ray_equals_serial_runs(trace):
    jobs, profiles = trace
    configs = grid([parse_vary(spec, BASE) for spec in VARY])
    rows = run_grid(jobs, BASE, configs, ["rollmux", "gavel+"], num_cpus=2, profiles=profiles)
    assert not ray.is_initialized()
    serial = [run_config(jobs, BASE, values, policy, 0, "worst", OURS, profiles)
              for values in configs for policy in ("rollmux", "gavel+")]
    assert [r.to_dict() for r in rows] == [r.to_dict() for r in serial]


def _serial_grid(jobs, base, configs, policies, *, seed=0, duration_model="worst", accounting=OURS, profiles=None,
                 on_row=None, **_):
    """``run_grid`` without Ray (the Ray path is checked against it above)."""
    rows = []
    for values in configs:
        for policy in policies:
            rows.append(run_config(jobs, base, values, policy, seed, duration_model, accounting, profiles))
            if on_row is not None:
                on_row(rows[-1], len(rows), len(configs) * len(policies))
    return rows


def test_command_on_a_fleet(trace, tmp_path, monkeypatch):
    jobs, profiles = trace
    monkeypatch.setattr("rollmux.whatif_ray.run_grid", _serial_grid)
    out = tmp_path / "w.json"
    args = ["whatif", "--trace", str(JOBS), "--cluster", str(FLEET_FILE), "--profiles", str(PROFILES),
            "--vary", VARY[0], "--vary", VARY[1], "--policies", "rollmux", "--policy", "gavel+", "--json", str(out),
            "--csv", str(tmp_path / "w.csv")]
    result = CliRunner().invoke(whatif_app(), args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "10 jobs; 4 configurations x 2 policies = 8 runs" in text and "whatif: 8 runs" in text
    assert "pools[H200] ┃" in result.output and "chosen: pools[H200].nodes=" in text
    data = json.loads(out.read_text())
    rows = [run_config(jobs, BASE, values, policy, 0, "worst", OURS, profiles)
            for values in grid([parse_vary(spec, BASE) for spec in VARY]) for policy in ("rollmux", "gavel+")]
    assert data["cluster"] == BASE and data["policies"] == ["rollmux", "gavel+"]
    assert data["rows"] == [json.loads(json.dumps(r.to_dict())) for r in rows]
    assert data["chosen"] == rows.index(choose(rows, "owned"))
    assert data["frontier"] == [rows.index(r) for r in frontier(rows, "owned")]
    lines = (tmp_path / "w.csv").read_text().splitlines()
    assert lines[0].startswith("pools[H200].nodes,pools[H20].nodes,policy,") and lines[1].startswith("0,unbounded,")


@pytest.mark.parametrize("args, message", [
    (["--cluster", str(FLEET_FILE), "--vary", "pools[H200].nodes=1", "--policy", "solo-d"],
     "--policy 'solo-d': expected one of rollmux, rollmux-full, rollmux-lifetime, rollmux-full-lifetime,"),
    (["--cluster", str(FLEET_FILE), "--vary", "pools[H300].nodes=1"],
     "--vary 'pools[H300].nodes=1': expected a pool name (H20, H800, H200) or index 0..2"),
    (["--cluster", str(FLEET_FILE), "--vary", "pools[H200].nodes=1", "--accounting", "paper"],
     "--accounting 'paper': expected ours with a fleet file"),
    (["--vary", "train.nodes=1", "--profiles", str(PROFILES)], "measured phase times per GPU type are for a fleet"),
    (["--vary", "train.nodes=1", "--policy", "gavel+"], "--policy 'gavel+': expected one of rollmux, "),
    (["--vary", "pools[0].nodes=1"], "--vary 'pools[0].nodes=1': expected a numeric cluster field"),
])
def test_command_misuse_on_fleets_and_clusters(args, message):
    result = CliRunner().invoke(whatif_app(), ["whatif", "--trace", str(JOBS), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not ray.is_initialized()


def test_a_two_pool_cluster_runs_as_before(tmp_path):
    """The same rows as a two-pool replay (``make_policy``), owned cost from ``owned_cost``."""
    from rollmux.cluster_file import cluster_from_dict
    from rollmux.policies import make_policy

    base = cluster_to_dict(cluster_from_dict({"rollout": {"nodes": 2}, "train": {"nodes": 2}}))
    assert "pools" not in base and parse_vary("train.nodes=1,2", base).field == "train.nodes"
    jobs = read_trace(JOBS)[:4]
    row = run_config(jobs, base, {"train.nodes": 2}, "rollmux", 0, "worst", OURS)
    direct = simulate(jobs, cluster_from_dict(with_values(base, {"train.nodes": 2})), make_policy("rollmux"))
    assert (row.total_cost, row.slo_met) == (direct.total_cost, direct.slo_attainment)
    assert row.owned_total == pytest.approx((2 * 8 * 1.85 + 2 * 8 * 5.28) * direct.span_s / 3600.0)


def test_a_fleet_runs_under_our_accounting_only(trace):
    from rollmux.accounting import PAPER

    jobs, profiles = trace
    with pytest.raises(SpecError, match="accounting='paper': expected ours with a fleet file"):
        run_config(jobs, BASE, {}, "rollmux", 0, "worst", PAPER, profiles)


def test_the_waiting_line_order_reaches_a_fleet_run():
    """On a bounded two-pool fleet, ``backfill=False`` replays the line strictly in order
    (the same replay as ``simulate(backfill=False)``), which makes a packing job wait."""
    from test_queue_backfill import _line

    base = fleet_dict({"pools": [{"gpu": "H20", "nodes": 2}, {"gpu": "H800", "nodes": 2}], "switch_cost_s": 0})
    rows = {b: run_fleet_config(_line(), base, {}, "rollmux", 0, "worst", backfill=b) for b in (True, False)}
    for backfill, row in rows.items():
        fleet = fleet_from_dict(base)
        direct = simulate(_line(), fleet.views()[0].cluster, fleet_policy(fleet, None, "rollmux"), backfill=backfill)
        waits = [j.wait_s / 3600.0 for j in direct.jobs]
        assert row.error is None and row.p50_wait_h == nearest_rank(waits, 0.5)
    assert rows[False].p50_wait_h > rows[True].p50_wait_h


def test_profile_rows_never_read_are_named_and_a_grid_of_too_many_runs_is_refused(tmp_path):
    """(an auditor's case) a typo in a profile's job id planned on the roofline estimate
    without a word (``fleet simulate`` warns); 10,000 configurations x 2 policies started
    20,000 runs (about a day on two cores). Both said before any run: no Ray starts."""
    profiles = tmp_path / "profiles.csv"
    profiles.write_text("job_id,gpu,t_roll_s,t_train_s\nno-such-job,H200,250,\nlong_a,H200,1,\n")
    result = CliRunner().invoke(whatif_app(), ["whatif", "--trace", str(JOBS), "--cluster", str(FLEET_FILE),
                                               "--profiles", str(profiles), "--vary", "pools[H200].nodes=1:5000:1",
                                               "--vary", "pools[H20].nodes=1,2", "--policy", "rollmux",
                                               "--policy", "rollmux-regroup"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "2 job id(s) not in the trace: long_a, no-such-job (rows not used)" in said
    assert "10,000 configurations x 2 policies x 1 line order = 20,000 runs; expected at most 10,000" in said
    assert not ray.is_initialized()


@pytest.mark.parametrize("h200", [None, 2])
def test_fleet_owned_cost_adds_the_reward_bill(trace, h200):
    """(an audit's case) every pool unbounded, owned was $497.60/h against $756.31/h used:
    the reward pool's bill was left out of owned. Now owned = used there, and with an
    owned H200 pool it is the nodes' ``fleet_owned_cost`` plus that bill."""
    import dataclasses

    from rollmux.whatif_fleet import fleet_owned_cost

    jobs, profiles = trace
    jobs = [dataclasses.replace(j, reward_s=60.0, reward_price_per_hour=400.0) for j in jobs]
    values = {"pools[H200].nodes": h200}
    row = run_config(jobs, BASE, values, "rollmux", 0, "worst", OURS, profiles)
    direct = _direct(jobs, profiles, values, "rollmux")
    assert direct.reward_cost > 0 and row.total_cost == direct.used_cost
    nodes = fleet_owned_cost(fleet_from_dict(with_values(BASE, values)), direct.span_s, direct.pool_gpu_seconds)
    assert row.owned_total == pytest.approx(nodes + direct.reward_cost)
    if h200 is None:
        assert row.owned_total == pytest.approx(row.total_cost)
    else:
        assert row.owned_total > row.total_cost


def test_a_pool_named_by_an_integer_is_not_offered_as_a_name():
    """(an audit's case) pools named "7" and "0": an integer in the brackets is an index, yet
    the refusal listed "7, 0" among the names to use."""
    base = fleet_dict({"pools": [{"gpu": "H20", "name": "7"}, {"gpu": "H800", "name": "0"}, {"gpu": "H200"}]})
    for spec, expected in (("pools[7].nodes=1", "a pool index 0..2 or a pool name (H200)"),
                           ("pools[H100].nodes=1", "a pool name (H200) or index 0..2")):
        with pytest.raises(SpecError) as err:
            parse_vary(spec, base)
        assert str(err.value) == f"vary={spec!r}: expected {expected}"
    assert parse_vary("pools[0].nodes=1", base).field == "pools[7].nodes"  # the index, as documented
    digits = fleet_dict({"pools": [{"gpu": "H20", "name": "1"}, {"gpu": "H800", "name": "2"}]})
    with pytest.raises(SpecError, match=r"expected a pool index 0\.\.1$"):
        parse_vary("pools[5].nodes=1", digits)
