"""The simulate plots label pools by the cluster's GPU types and nodes by the pool they are in."""
import pytest

from rollmux.model import Cluster, NodeSpec, PoolSpec
from rollmux.policies import make_policy
from rollmux.report import plots
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function finishes, kept open for inspection instead of saved."""
    kept = []
    monkeypatch.setattr(plots, "save", lambda fig, path: kept.append(fig) or path)
    yield kept
    for fig in kept:
        plots.plt.close(fig)


def _real_names_cluster():
    """Rollout nodes named like training nodes and the other way round: names say nothing."""
    rollout = tuple(NodeSpec(f"t-node-{i}", 2048.0) for i in range(6))
    train = tuple(NodeSpec(f"r-node-{i}", 2048.0) for i in range(6))
    return Cluster(rollout=PoolSpec("H200", 6.3, nodes=6, node_list=rollout),
                   train=PoolSpec("B200", 8.6, nodes=6, node_list=train))


def test_gantt_lanes_say_the_pool_each_node_is_in_with_its_gpu_type(figures):
    cluster = _real_names_cluster()
    r = simulate(generate(12, seed=2), cluster, make_policy("rollmux"), record_spans=True)
    plots.gantt(r.spans, "unused.png", {"rollout": "H200", "train": "B200"})
    labels = [t.get_text() for t in figures[0].axes[0].get_yticklabels()]
    assert labels
    for label in labels:
        node = label.split(" ")[0]
        in_rollout = node.startswith("t-node")
        assert label.endswith("(H200 rollout)" if in_rollout else "(B200 training)"), label
    assert any(label.endswith("(H200 rollout)") for label in labels)


def test_colocated_nodes_are_training_lanes():
    spans = [("g0", "j", "rollout", ("n1",), 0.0, 0.0, 5.0), ("g0", "j", "train", ("n1",), 5.0, 5.0, 9.0),
             ("g1", "k", "rollout", ("n2",), 0.0, 0.0, 5.0)]
    assert plots.lane_pools(spans) == {"n1": "train", "n2": "rollout"}


def test_pool_panels_name_the_configured_gpu_types(figures):
    r = simulate(generate(6, seed=1), Cluster(), make_policy("solo-d"))
    plots.gpus_in_use([r], "unused.png", {"rollout": "H200", "train": "B200"})
    ylabels = [ax.get_ylabel() for ax in figures[0].axes]
    assert ylabels == ["rollout (H200) GPUs", "training (B200) GPUs"]
    assert not any("H20 " in y or "H800" in y for y in ylabels)


def test_queue_plot_draws_each_policys_queue(figures):
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2))
    r = simulate(generate(20, seed=4), cluster, make_policy("solo-d"))
    plots.queue_length([r], "unused.png")
    (line,) = figures[0].axes[0].get_lines()
    assert max(line.get_ydata()) == r.max_queue > 0
