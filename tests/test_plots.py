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


def _legend_dollars(label: str) -> float:
    """The $/h a legend entry gives ("rollmux used (mean \\$181/h)" -> 181.0)."""
    return float(label.split("\\$", 1)[1].split("/h", 1)[0].replace(",", ""))


def test_cost_legend_gives_the_drawn_curves_mean_and_owned_nodes_a_flat_line_of_their_own(figures):
    """With owned nodes the curve drawn is the used $/h: its legend gave the owned average,
    above every point of the curve. Now the curve is labelled with its own mean (the area
    under it over its span) and the owned $/h is a flat line labelled as such."""
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=4), train=PoolSpec("H800", 5.28, nodes=4),
                      pricing="owned")
    r = simulate(generate(8, seed=1), cluster, make_policy("rollmux"))
    plots.cost_over_time([r], "unused.png")
    ax = figures[0].axes[0]
    used, owned = ax.get_lines()
    used_label, owned_label = (t.get_text() for t in ax.get_legend().get_texts())
    xs, ys = used.get_xdata(), used.get_ydata()
    area = sum(y * (b - a) for a, b, y in zip(xs, xs[1:], ys))
    assert used_label.startswith("rollmux used (mean")
    assert _legend_dollars(used_label) == pytest.approx(area / (xs[-1] - xs[0]), abs=0.5)
    rate = r.total_cost / (r.span_s / 3600)
    assert owned_label.startswith("rollmux owned") and _legend_dollars(owned_label) == pytest.approx(rate, abs=0.5)
    assert list(owned.get_ydata()) == pytest.approx([rate, rate]) and rate >= max(ys)
    assert owned.get_linestyle() == ":" and owned.get_color() == used.get_color()


def test_time_series_figures_count_hours_from_the_first_arrival(figures):
    """A trace whose first job arrives at 10 h: cost and GPUs started at 10 h "since first
    arrival" while the queue started at 0."""
    jobs = generate(10, seed=4)
    for j in jobs:
        j.arrival_s += 36_000.0
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2))
    r = simulate(jobs, cluster, make_policy("solo-d"))
    assert r.max_queue > 0
    plots.cost_over_time([r], "unused.png")
    plots.gpus_in_use([r], "unused.png", {"rollout": "H20", "train": "H800"})
    plots.queue_length([r], "unused.png")
    lines = [line for fig in figures for ax in fig.axes for line in ax.get_lines()]
    assert len(lines) == 4  # cost, GPUs per pool (two panels), queue
    assert all(line.get_xdata()[0] == 0.0 for line in lines)
    assert figures[0].axes[0].get_lines()[0].get_xdata()[-1] == pytest.approx(r.span_s / 3600)


def test_the_default_gantt_frame_draws_a_phase_that_began_before_its_window():
    """The default window came from the spans starting in it, so a phase running across
    its left edge was left out (an idle lane for its first minutes), unlike an explicit
    window's frame. Every group's default frame now holds every span overlapping it."""
    r = simulate(generate(20, seed=0), Cluster(), make_policy("rollmux"), record_spans=True)
    straddling = 0
    for gid in sorted({s[0] for s in r.spans}):
        group, (lo, hi), shown = plots.gantt_frame(r.spans, gid)
        assert group == gid and shown == plots.gantt_frame(r.spans, gid, (lo, hi))[2]
        assert shown == sorted((s for s in r.spans if s[0] == gid and s[4] < hi and s[6] > lo), key=lambda s: s[4])
        straddling += sum(s[4] < lo < s[6] for s in shown)
    assert straddling > 0
