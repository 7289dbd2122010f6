"""Cluster YAML files: defaults, overrides, errors, round trip through cluster_to_dict."""
from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.cluster_file import cluster_from_dict, cluster_to_dict, load_cluster
from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import Cluster, PoolSpec, SwitchCost


def _write(tmp_path, text: str):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_none_and_empty_file_give_defaults(tmp_path):
    assert load_cluster(None) == Cluster()
    assert load_cluster(_write(tmp_path, "")) == Cluster()


def test_overrides_and_price_defaults(tmp_path):
    cluster = load_cluster(_write(tmp_path, """
gpus_per_node: 8
rollout: {gpu: A100, nodes: 4}
train: {price_per_gpu_hour: 4.5, host_mem_gb: 1024}
switch_cost_s: {rollout: 1.5, train: 3}
max_group_size: 3
"""))
    assert cluster.rollout == PoolSpec("A100", 3.0, 2048.0, 4)
    assert cluster.train == PoolSpec("H800", 4.5, 1024.0, None)
    assert cluster.switch_cost == SwitchCost("fixed", 1.5, 3.0)
    assert cluster.max_group_size == 3


@pytest.mark.parametrize("value, expected", [
    ("cold", SwitchCost("cold")),
    ("warm", SwitchCost("warm")),
    ("0", SwitchCost("fixed", 0.0, 0.0)),
    ("2.5", SwitchCost("fixed", 2.5, 2.5)),
])
def test_switch_cost_forms(tmp_path, value, expected):
    assert load_cluster(_write(tmp_path, f"switch_cost_s: {value}\n")).switch_cost == expected


@pytest.mark.parametrize("text, field, needle", [
    ("rollout: {gpu: X100}\n", "rollout.gpu", "H20"),
    ("colour: red\n", "colour", "allowed keys: gpus_per_node"),
    ("train: {gpus: 8}\n", "train.gpus", "allowed keys: gpu, price_per_gpu_hour"),
    ("train: {price_per_gpu_hour: -1}\n", "train.price_per_gpu_hour", "price > 0"),
    ("rollout: {nodes: -2}\n", "rollout.nodes", "node count"),
    ("gpus_per_node: '8'\n", "gpus_per_node", "integer"),
    ("switch_cost_s: lukewarm\n", "switch_cost_s", "warm"),
    ("switch_cost_s: -1\n", "switch_cost_s", ">= 0"),
    ("rollout: 3\n", "rollout", "mapping"),
    ("switch_cost_s: .nan\n", "switch_cost_s", "finite"),    # (crashed the analysis)
    ("switch_cost_s: {rollout: .inf, train: 5}\n", "switch_cost_s", "finite"),
    ("train: {price_per_gpu_hour: .inf}\n", "train.price_per_gpu_hour", "finite"),  # (a bill of inf, NaN ratios)
    ("train: {nodes: 100000000}\n", "train.nodes", "100,000"),  # (hung without a word)
    ("train: {nodes: 0x10}\n", "train.nodes", "node count"),   # YAML 1.1 read 16
    ("train: {nodes: 1_0}\n", "train.nodes", "node count"),    # YAML 1.1 read 10
])
def test_errors_name_field_and_expectation(tmp_path, text, field, needle):
    with pytest.raises(SpecError) as info:
        load_cluster(_write(tmp_path, text))
    assert info.value.field == field
    assert needle in str(info.value)


def test_bad_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, "gpus_per_node: 8\nrollout: {gpu: [\n")
    with pytest.raises(TraceFormatError) as info:
        load_cluster(path)
    assert info.value.path == str(path) and info.value.line >= 2
    with pytest.raises(TraceFormatError):
        load_cluster(_write(tmp_path, "- 1\n- 2\n"))


@pytest.mark.parametrize("cluster", [
    Cluster(),
    Cluster(rollout=PoolSpec("H100", 4.0, 1000.0, 7), switch_cost=SwitchCost("fixed", 1.0, 2.0)),
    Cluster(switch_cost=SwitchCost("fixed", 3.0, 3.0), max_group_size=2),
])
def test_cluster_to_dict_round_trips(tmp_path, cluster):
    data = cluster_to_dict(cluster)
    json.dumps(data)
    assert load_cluster(_write(tmp_path, yaml.safe_dump(data))) == cluster


def test_real_node_lists_bound_the_pool_and_keep_their_ids(tmp_path):
    from rollmux.model import Job
    from rollmux.plan_state import PlanState
    from rollmux.planner import Planner

    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  nodes:\n    - {id: h20-a, gpus: 8, host_mem_gb: 1024}\n    - {id: h20-b}\n"
                    "train:\n  nodes: [{id: h800-a, host_mem_gb: 4096}]\nswitch_cost_s: 0\n")
    cluster = load_cluster(path)
    assert cluster.rollout.nodes == 2 and cluster.train.nodes == 1
    assert cluster.rollout.host_mem_gb == 2048 and cluster.train.host_mem_gb == 4096
    assert load_cluster_roundtrip(cluster, tmp_path) == cluster
    state, planner = PlanState(cluster), Planner()
    big = Job("big", 60, 40, mem_roll_gb=1500, mem_train_gb=100, slo=1.0, iterations=10)
    d = planner.decide(state, big)
    assert d.placement.rollout_nodes == ("h20-b",)  # h20-a has only 1024 GB
    state.apply(big, d.placement)
    assert state.pool_of("h800-a") == "train" and state.pool_of("nope") is None
    assert planner.decide(state, Job("next", 60, 40, slo=1.0, iterations=10)).outcome == "wait"


def load_cluster_roundtrip(cluster, tmp_path):
    import yaml

    from rollmux.cluster_file import cluster_to_dict

    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(cluster_to_dict(cluster)))
    return load_cluster(again)


@pytest.mark.parametrize("text,field", [
    ("rollout:\n  nodes: [{id: a, gpus: 4}]\n", "rollout.nodes[0].gpus"),
    ("rollout:\n  nodes: [{id: a}, {id: a}]\n", "rollout.nodes[1].id"),
    ("rollout:\n  nodes: [{id: a}]\ntrain:\n  nodes: [{id: a}]\n", "train.nodes"),
    # a listed id that the other pool, naming its nodes by count (bounded or not), gives too
    ("rollout: {nodes: 2}\ntrain:\n  nodes: [{id: R1}, {id: tB}]\n", "train.nodes[0].id"),
    ("rollout:\n  nodes: [{id: a}, {id: T12}]\n", "rollout.nodes[1].id"),
    ("rollout:\n  nodes: [{id: a, colour: red}]\n", "rollout.nodes[0].colour"),
])
def test_bad_node_lists_name_the_field(tmp_path, text, field):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_cluster(path)
    assert field in str(err.value)


def test_nodes_of_the_wrong_type_lists_the_accepted_forms(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  nodes: lots\n")
    with pytest.raises(SpecError, match=r"train.nodes='lots': expected a node count, a list"):
        load_cluster(path)


def test_h200_and_b200_are_known_types_with_default_prices(tmp_path):
    from rollmux.model import GPU_TYPES
    from rollmux.colocation import rollout_speed_factor

    cluster = load_cluster(_write(tmp_path, "rollout: {gpu: H200}\ntrain: {gpu: B200}\n"))
    assert (cluster.rollout.gpu, cluster.train.gpu) == ("H200", "B200")
    assert cluster.rollout.price_per_gpu_hour == GPU_TYPES["H200"][2] > GPU_TYPES["H100"][2]
    assert cluster.train.price_per_gpu_hour == GPU_TYPES["B200"][2] > GPU_TYPES["H200"][2]
    # rollout is bandwidth bound: on B200 (8.0 TB/s) it runs faster than on H200 (4.8 TB/s)
    assert rollout_speed_factor(cluster) == pytest.approx(4.8 / 8.0)
    assert GPU_TYPES["B200"][0] > GPU_TYPES["H200"][0] == GPU_TYPES["H100"][0]  # same Hopper compute


def test_yaml_reads_what_the_file_says_and_refuses_what_it_cannot_mean(tmp_path):
    """``nodes: 010`` is ten nodes (YAML 1.1 read octal 8); a key given twice, an alias
    (nine nested ones took gigabytes), an integer too long for Python (a ValueError came
    out) and bytes that are not UTF-8 are refused naming the file and line."""
    assert load_cluster(_write(tmp_path, "train: {nodes: 010}\n")).train.nodes == 10
    # an exponent without a sign is a number (YAML 1.1 read a string); '_' and '1:30' sexagesimal are not
    assert load_cluster(_write(tmp_path, "train: {price_per_gpu_hour: 5.28e0}\n")).train.price_per_gpu_hour == 5.28
    for text in ("train: {price_per_gpu_hour: 5_280.0}\n", "train: {price_per_gpu_hour: 1:30.0}\n"):
        with pytest.raises(SpecError, match="price_per_gpu_hour"):
            load_cluster(_write(tmp_path, text))
    for text, line, needle in (("train: {nodes: 4}\ntrain: {nodes: 40}\n", 2, "given twice"),
                               ("a0: &a0 [1, 2]\ntrain: {nodes: *a0}\n", 2, "aliases are not accepted"),
                               ("train:\n  nodes: " + "9" * 5000 + "\n", 2, "an integer of 5000 digits")):
        with pytest.raises(TraceFormatError) as err:
            load_cluster(_write(tmp_path, text))
        assert err.value.line == line and needle in str(err.value)
    path = tmp_path / "latin1.yaml"
    path.write_bytes("train: {gpu: H800}\nrollout: {gpu: H2\xd8}\n".encode("latin-1"))
    with pytest.raises(TraceFormatError) as err:
        load_cluster(path)
    assert err.value.line == 2 and "not UTF-8" in str(err.value)


@pytest.mark.parametrize("node_id", ["a/../b", "x\x1b[2J", "-lead", "a b", "[h20-r01]", "k" * 129])
def test_a_listed_node_id_is_one_that_admin_nodes_add_would_take(tmp_path, node_id):
    """(any string was accepted: an ESC reached terminals through status, and a node named
    a/../b could never be drained); a state file saved before keeps its ids"""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"train": {"nodes": [{"id": node_id}]}}))
    with pytest.raises(SpecError) as err:
        load_cluster(path)
    assert err.value.field == "train.nodes[0].id" and str(path) in str(err.value)
    assert cluster_from_dict({"train": {"nodes": [{"id": node_id}]}}).train.node_list[0].node_id == node_id


def test_a_cluster_file_nested_too_deep_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("rollout: " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(TraceFormatError, match="nested more than 64 levels deep"):
        load_cluster(path)


@pytest.mark.parametrize("text, field, key", [
    ("1: 2\n", "top-level key", 1),                      # (an IndexError ended simulate --cluster)
    ("true: x\n", "top-level key", True),
    ("rollout: {1: 2}\n", "rollout key", 1),              # (read "rollout[1]=1", an index)
    ("rollout: {nodes: [{id: a, 7: 2}]}\n", "rollout.nodes[0] key", 7),  # (read "expected a node count")
])
def test_a_key_that_is_not_a_string_is_refused_naming_the_key(tmp_path, text, field, key):
    with pytest.raises(SpecError) as err:
        load_cluster(_write(tmp_path, text))
    assert (err.value.field, err.value.value) == (field, key) and "keys are names" in str(err.value)


@pytest.mark.parametrize("command", [["simulate", "--trace", "production", "--policies", "rollmux"],
                                     ["fleet", "plan", "--jobs", "production"]])
@pytest.mark.parametrize("text, said", [
    ("? [a, b]\n: 1\n", "line 1: not valid YAML: found unhashable key"),  # (a TypeError traceback)
    ("rollout: {<<: {host_mem_gb: 100.0}}\n", "line 1: not valid YAML: YAML merge keys (<<) are not supported"),
    ("1: 2\n", "top-level key=1: expected a string"),                     # (an IndexError traceback)
])
def test_the_cli_refuses_a_cluster_file_with_a_key_it_cannot_read(tmp_path, command, text, said):
    path = _write(tmp_path, text)
    r = CliRunner().invoke(app, [*command, "--cluster", str(path)])
    assert r.exit_code == 2, r.output  # (an uncaught exception exits 1)
    assert said in " ".join(r.output.split()), r.output
