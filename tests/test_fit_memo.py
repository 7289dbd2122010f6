"""The memo of group searches (``rollmux.fit_memo``): it never changes an answer.

Oracle: the same search without a memo. Each case asks one memo a shuffled sequence of
budgets around the group's own objective (the acceptance edge, the solver's relative
tolerance either side of it, far above and below, none), so that every kind of entry (a
group, a None under a lower or higher limit) answers queries it must and must not.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.exact import SearchCounter, group_fit, solve
from rollmux.fit_memo import NOT_SEARCHED, FitMemo
from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.planner import Space
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate

MEM = {"7B": (275.7, 240.0), "14B": (445.4, 456.1), "32B": (490.3, 520.4)}  # GB per node


def _jobs(rng: random.Random, n: int) -> list[Job]:
    jobs = []
    for i in range(n):
        model = rng.choice(list(MEM))
        jobs.append(Job(f"j{i}", float(rng.randint(30, 300)), float(rng.randint(30, 300)),
                        rollout_gpus=rng.choice([8, 8, 16]), train_gpus=rng.choice([8, 8, 16]),
                        mem_roll_gb=MEM[model][0], mem_train_gb=MEM[model][1],
                        slo=round(rng.uniform(1.0, 2.2), 3), model=model, arrival_s=float(i)))
    return jobs


def _cluster(rng: random.Random) -> Cluster:
    mem = rng.choice([1024.0, 2048.0])
    return Cluster(rollout=PoolSpec("H20", 1.85, mem), train=PoolSpec("H800", 5.28, mem),
                   switch_cost=rng.choice([SwitchCost("warm"), SwitchCost("fixed", 0.0, 0.0)]))


def _budgets(rng: random.Random, best: float | None) -> list[float]:
    """Budgets around ``best`` (the answer with no budget), in a random order."""
    if best is None:
        out = [math.inf, 1e6, 100.0, 10.0, -50.0]
    else:
        tol = 1e-9 * max(1.0, abs(best))
        out = [math.inf, best, best + tol, best + 2 * tol, best + tol / 2, best - tol, best * 1.5 + 1,
               best - abs(best) * 0.5 - 1, best + 1e-3, rng.uniform(-100, 400)]
    out = out * 2  # each again, after the memo has seen it
    rng.shuffle(out)
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 3), st.booleans(), st.booleans(), st.sampled_from(["cost", "waste"]))
def test_answers_with_a_memo_equal_the_search_without(seed, n, robust, train_scaling, objective):
    rng = random.Random(seed)
    cluster, members = _cluster(rng), _jobs(rng, n)
    space = Space(train_scaling=train_scaling, all_orders=False)
    search = partial(group_fit, cluster, members, robust=robust, counter=SearchCounter(), space=space,
                     colocation=False, objective=objective)
    best = search(math.inf)
    memo = FitMemo()
    for budget in _budgets(rng, best.cost if best else None):
        assert search(budget, memo=memo) == search(budget), (budget, best)
    assert memo.hits and memo.misses


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 4))
def test_a_solve_with_a_memo_equals_one_without(seed, n):
    rng = random.Random(seed)
    cluster, jobs = _cluster(rng), _jobs(rng, n)
    memo = FitMemo()
    plain = solve(cluster, jobs, robust=True, objective="waste")
    for _ in range(2):  # the second time every search is answered by the memo
        memoed = solve(cluster, jobs, robust=True, objective="waste", memo=memo)
        assert (memoed.cost_per_hour, memoed.objective, memoed.groups) == (
            plain.cost_per_hour, plain.objective, plain.groups)
    assert memoed.stats.subsets_searched == 0 and memoed.stats.analyze_calls == 0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 3))
def test_the_fields_left_out_of_the_key_do_not_change_a_search(seed, n):
    rng = random.Random(seed)
    cluster, members = _cluster(rng), _jobs(rng, n)
    other = [replace(j, job_id=f"other{i}", arrival_s=rng.uniform(0, 1e6), duration_s=rng.uniform(1, 1e6),
                     iterations=rng.randint(1, 999), extra={"note": str(i)}) for i, j in enumerate(members)]
    assert {"job_id", "arrival_s", "duration_s", "iterations", "extra"} == NOT_SEARCHED
    for robust in (False, True):
        fits = [group_fit(cluster, m, math.inf, robust, SearchCounter(), Space(), colocation=False)
                for m in (members, other)]
        assert fits[0] == fits[1]
    assert FitMemo.key(cluster, members, ()) == FitMemo.key(cluster, other, ())
    changed = [replace(members[0], slo=members[0].slo + 0.1), *members[1:]]
    assert FitMemo.key(cluster, changed, ()) != FitMemo.key(cluster, members, ())


class _Fit:
    def __init__(self, cost: float) -> None:
        self.cost = cost


def test_a_group_answers_every_limit_and_none_only_the_limits_searched():
    memo = FitMemo()
    memo.put("g", 50.0, _Fit(40.0))
    assert memo.get("g", math.inf)[1].cost == 40.0
    assert memo.get("g", 40.0) == (True, None)  # not below the limit: refused, and known
    assert memo.get("g", 40.0000001)[1].cost == 40.0
    memo.put("n", 30.0, None)
    assert memo.get("n", 30.0) == (True, None) and memo.get("n", 10.0) == (True, None)
    assert memo.get("n", 30.5) == (False, None)  # a higher limit may find a group
    memo.put("n", 20.0, None)  # a lower limit learns nothing more
    assert memo.get("n", 25.0) == (True, None)
    memo.put("n", math.inf, None)
    assert memo.get("n", 1e12) == (True, None)
    memo.put("g", 60.0, None)  # never overwrites a group
    assert memo.get("g", 45.0)[1].cost == 40.0
    assert (memo.hits, memo.misses) == (8, 1)


def test_the_least_recently_used_entries_go_first():
    memo = FitMemo(max_entries=2)
    memo.put("a", 1.0, None)
    memo.put("b", 1.0, None)
    memo.get("a", 0.5)
    memo.put("c", 1.0, None)
    assert len(memo) == 2
    assert memo.get("a", 0.5)[0] and memo.get("c", 0.5)[0] and not memo.get("b", 0.5)[0]
    with pytest.raises(ValueError, match="max_entries"):
        FitMemo(max_entries=0)


@pytest.mark.parametrize("name", ["rollmux-hedge", "rollmux-regroup"])
def test_a_policy_decides_the_same_with_its_memo(name):
    cluster = Cluster()
    jobs = generate(40, 5)
    policy = make_policy(name, cluster=cluster)
    bare = make_policy(name, cluster=cluster)
    bare.regroup = partial(bare.regroup.func, *bare.regroup.args, **{**bare.regroup.keywords, "memo": None})
    seen = [[], []]
    for p, log in zip((policy, bare), seen):
        result = simulate(jobs, cluster, p, on_change=lambda now, state, log=log: log.append(
            (now, sorted((g, tuple(m.job.job_id for m in grp.members)) for g, grp in state.groups.items()))))
        log.append({k: v for k, v in result.summary().items() if k != "wall_s"})
    assert seen[0] == seen[1]
    memo = policy.regroup.keywords["memo"]
    assert memo.hits > 0
