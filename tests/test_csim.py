"""The C simulation loop (``_csim.c``) against the kernel's own Python loop: the same
shapes, worst iterations, pairs consulted and joins, key for key.

``pure`` is a second copy of ``rollmux/kernel.py`` loaded with no C loop; ``rollmux.kernel``
uses the C loop where it is built and fresh (``rollmux kernel build``)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rollmux import kernel, native

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_native import random_keys  # noqa: E402

pytestmark = pytest.mark.skipif(kernel._csim is None, reason=f"no C loop here ({native.simulator_path()[1]})")


@pytest.fixture(scope="module")
def pure():
    spec = importlib.util.spec_from_file_location("rollmux_kernel_pure", native.SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._csim = None  # before any set-up: every key runs the Python loop
    return module


def test_every_key_of_the_property_set_runs_in_c():
    keys = random_keys(200, 11)
    kernel.memo_restore(({}, {}))
    assert not any(isinstance(kernel._prepare(key), kernel._Setup) for key in keys)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_shapes_from_every_start_agree(pure, seed):
    kernel.memo_restore(({}, {}))
    for key in random_keys(150, seed):
        n = len(key)
        for train_first in range(1 << n) if n <= 3 else (0, (1 << n) - 1, 1):
            pairs_c, pairs_py = set(), set()
            joins_c: dict = {}
            joins_py: dict = {}
            c = kernel._simulate(key, train_first, joins_c, pairs_c)
            py = pure._simulate(key, train_first, joins_py, pairs_py)
            assert c == py, (key, train_first)
            assert pairs_c == pairs_py, (key, train_first)
            assert {k: v[1:3] for k, v in joins_c.items()} == {k: v[1:3] for k, v in joins_py.items()}
            assert all(v[0] == c for v in joins_c.values())


@pytest.mark.parametrize("seed", [4, 5])
def test_worst_iterations_over_every_order_agree(pure, seed):
    kernel.memo_restore(({}, {}))
    for key in random_keys(80, seed):
        for orders in (False, True):
            assert kernel.worst_iterations(key, orders, None) == pure.worst_iterations(key, orders, None), key
            cap = [max(k[0] + k[1], 1.0) * 1.3 for k in key]
            assert kernel.worst_iterations(key, orders, cap) == pure.worst_iterations(key, orders, cap), key


def test_groups_too_wide_for_a_word_run_the_python_loop():
    members = 9  # nine members over eight nodes: 72 bits of "last"
    key = tuple((10.0 + i, 20.0, (i % 4,), (4 + i % 4,), 0.0, 0.0) for i in range(members))
    kernel.memo_restore(({}, {}))
    assert isinstance(kernel._prepare(key), kernel._Setup)
    shape = kernel.shape_of(key)
    assert len(shape.iteration_s) == members and all(x > 0 for x in shape.iteration_s)


def test_runs_without_a_repeat_give_the_python_fallback_shape(pure):
    """A run that finds no repeat within its limits measures the second half in C
    (``_csim.simulate``'s tag 2): the same shape as the Python loop's ``_fallback``,
    floors applied after, and the window kept from the start with all ready for rollout
    only."""
    kernel.memo_restore(({}, {}))
    found = 0
    for key in random_keys(150, 1) + random_keys(150, 2):
        prepared = kernel._csim.prepare(key, kernel.MAX_ITERATIONS, kernel.POOLS)
        if kernel._csim.simulate(prepared, 0, None, None)[0] != 2:
            continue
        found += 1
        for train_first in (0, 1, (1 << len(key)) - 1):
            c, py = kernel._simulate(key, train_first), pure._simulate(key, train_first)
            assert c == py, (key, train_first)
            assert (c.window == []) == (train_first != 0)
    assert found >= 5


def test_the_order_scan_refuses_what_it_cannot_take():
    def run(order, mask, collect):
        return (1.0, 1.0), set()

    part, ids, nodes = (0, 1), (0, 1), ((0,), (0,))
    with pytest.raises(ValueError, match="2 to 10 members"):
        kernel._csim.scan((0,), (0,), ((0,),), ((1,),), False, None, [0.0], run)
    with pytest.raises(ValueError, match="0..63"):
        kernel._csim.scan(part, ids, ((0,), (64,)), nodes, False, None, [0.0, 0.0], run)
    with pytest.raises(ValueError, match="iteration times"):
        kernel._csim.scan(part, ids, nodes, ((1,), (1,)), False, None, [0.0, 0.0], lambda o, m, c: ((1.0,), None))
    with pytest.raises(TypeError):
        kernel._csim.scan(part, ids, nodes, ((1,), (1,)), False, None, [0.0, 0.0], lambda o, m, c: (("x", 1.0), None))
    with pytest.raises(ZeroDivisionError):  # an error in a run reaches the caller
        kernel._csim.scan(part, ids, nodes, ((1,), (1,)), False, None, [0.0, 0.0], lambda o, m, c: 1 / 0)
    runs = []

    def counted(order, mask, collect):
        runs.append((order, mask))
        return (1.0, 1.0), set()

    worst = [0.0, 0.0]
    assert kernel._csim.scan(part, ids, nodes, ((1,), (1,)), False, (0.5, 9.0), worst, counted) is True
    assert worst == [1.0, 1.0] and runs == [((0, 1), 0)]  # the first run put member 0 above its cap
    runs.clear()
    assert kernel._csim.scan(part, ids, nodes, ((1,), (1,)), False, (9.0, 9.0), [0.0, 0.0], counted) is False
    # below the caps every start of the first order runs; of the second, only the starts
    # where the two meet at instant 0 (both in one queue on a shared node) and so are
    # ordered the other way: a start with them in different queues was settled already
    assert runs == [((0, 1), 0), ((0, 1), 1), ((0, 1), 2), ((0, 1), 3), ((1, 0), 0), ((1, 0), 3)]


def test_the_planners_own_checks_agree(pure, monkeypatch):
    """The keys the planner itself checks from every start in every order (a full-space
    plan of 20 jobs of the paper's mix, then 40 probes): the C scan and the Python loop
    give the same worst iterations, with the planner's caps and without."""
    from rollmux import intra
    from rollmux.model import Cluster
    from rollmux.plan_state import PlanState
    from rollmux.planner import FULL_SPACE, Planner
    from rollmux.traces.generate import generate

    calls = []

    class Recording:  # ``intra``'s view of the kernel, noting each check of every start
        shape_of = staticmethod(kernel.shape_of)
        key_of = staticmethod(kernel.key_of)

        @staticmethod
        def worst_iterations(key, orders, cap):
            calls.append((key, orders, cap))
            return kernel.worst_iterations(key, orders, cap)

    monkeypatch.setattr(intra, "kernel", Recording)
    jobs = generate(60, 7)
    state, planner = PlanState(Cluster()), Planner(space=FULL_SPACE)
    for job in jobs[:20]:
        state.apply(job, planner.decide(state, job).placement)
    for job in jobs[20:]:
        planner.decide(state, job)
    monkeypatch.undo()
    checked = [c for c in calls if c[1] and len(c[0]) > 1][:120]
    assert len(checked) >= 40 and any(len(key) >= 3 for key, _, _ in checked)
    for key, orders, cap in checked:
        for limit in (cap, None):
            kernel.memo_restore(({}, {}))
            pure.memo_restore(({}, {}))
            assert kernel.worst_iterations(key, orders, limit) == pure.worst_iterations(key, orders, limit), key
