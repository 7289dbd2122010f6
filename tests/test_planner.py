"""The inter-group planner: outcomes, rejections, departures, bounded pools, bad input."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.errors import PlacementError, SpecError
from rollmux.intra import MemberProfile, analyze
from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, NOT_ADMITTED, PAPER_SPACE, SLO_EPS, Planner, _shared_pair_miss

FREE_SWITCH = SwitchCost("fixed", 0.0, 0.0)


def cluster(**kw):
    base = dict(switch_cost=FREE_SWITCH)
    base.update(kw)
    return Cluster(**base)


def job(jid, roll, train, slo=2.0, mem=100.0, gpus=8, iterations=1000):
    return Job(jid, roll, train, gpus, gpus, mem, mem, slo, "7B", iterations=iterations)


def place(state, planner, j):
    d = planner.decide(state, j)
    if d.placement is not None:
        state.apply(j, d.placement)
    return d


@pytest.fixture(params=["first", "best-fit"])
def planner(request):
    return Planner(request.param)


def test_first_job_opens_a_new_group(planner):
    state = PlanState(cluster())
    d = place(state, planner, job("a", 100, 100))
    assert d.outcome == "new-group"
    assert state.cost_per_hour() == pytest.approx(8 * 1.85 + 8 * 5.28)


def test_complementary_job_is_packed_at_zero_marginal_cost(planner):
    state = PlanState(cluster())
    place(state, planner, job("a", 100, 20))
    d = place(state, planner, job("b", 20, 100))
    assert d.outcome == "packed" and d.marginal_cost == 0
    assert len(state.groups) == 1


def test_rollout_heavy_pair_scales_the_rollout_side(planner):
    # Sharing R0 would stretch both to 200 s per iteration; a second rollout node keeps
    # both near their solo time for one more rollout node's price.
    state = PlanState(cluster())
    place(state, planner, job("a", 90, 10, slo=1.2))
    d = place(state, planner, job("b", 90, 10, slo=1.2))
    assert d.outcome == "scaled"
    assert d.marginal_cost == pytest.approx(8 * 1.85)
    g = state.group_of("b")
    assert len(g.rollout_nodes) == 2 and len(g.train_nodes) == 1


def test_slo_rejection_names_the_job_and_the_numbers(planner):
    state = PlanState(cluster())
    place(state, planner, job("a", 60, 40, slo=1.05))
    d = planner.decide(state, job("b", 60, 40), explain=True)
    reasons = [c.reason for c in d.candidates if c.verdict == "rejected"]
    assert any(r.startswith("SLO of job a: ") and "1.200 > 1.050" in r for r in reasons), reasons
    assert d.outcome == "scaled"


def test_residency_rejection_names_the_node():
    state = PlanState(cluster())
    pl = Planner()
    place(state, pl, job("a", 100, 20, mem=1500))
    d = pl.decide(state, job("b", 20, 100, mem=1000), explain=True)
    assert any("residency: node" in c.reason for c in d.candidates)
    assert d.outcome == "new-group"


def test_full_and_saturated_groups_are_skipped():
    state = PlanState(cluster(max_group_size=2))
    pl = Planner()
    place(state, pl, job("a", 100, 20, slo=2))
    place(state, pl, job("b", 20, 100, slo=2))
    d = pl.decide(state, job("c", 10, 10), explain=True)
    assert any(c.reason.startswith("group full") for c in d.candidates)
    state2 = PlanState(cluster())
    place(state2, pl, job("a", 100, 100))  # T_load == T_cycle: saturated at once? no, alone 100 < 200
    place(state2, pl, job("b", 100, 100))  # now T_load 200 >= T_cycle 200
    d2 = pl.decide(state2, job("c", 10, 10), explain=True)
    assert any(c.reason.startswith("saturated") for c in d2.candidates)


def test_every_accepted_plan_keeps_every_slo_and_residency(planner):
    import random

    rng = random.Random(7)
    cl = cluster(switch_cost=SwitchCost("fixed", 2.0, 3.0))
    state = PlanState(cl)
    for i in range(40):
        j = job(f"j{i}", rng.randint(50, 600), rng.randint(50, 600), slo=rng.uniform(1, 2), mem=rng.choice([113, 275, 445]))
        place(state, planner, j)
    for gid, g in state.groups.items():
        a = analyze([state.profile(m) for m in g.members])
        for m in g.members:
            assert a.slowdown[m.job.job_id] <= m.job.slo * (1 + 1e-9)
        for pool in ("rollout", "train"):
            for n in g.nodes(pool):
                assert g.mem_used(n, pool) <= 2048


def test_departure_releases_nodes_no_one_uses(planner):
    state = PlanState(cluster())
    place(state, planner, job("a", 90, 10, slo=1.2))
    place(state, planner, job("b", 90, 10, slo=1.2))
    before = state.cost_per_hour()
    rel = state.release("b")
    assert len(rel.released_nodes) == 1 and not rel.group_closed
    assert state.cost_per_hour() == pytest.approx(before - 8 * 1.85)
    rel = state.release("a")
    assert rel.group_closed and state.cost_per_hour() == 0 and not state.groups


def test_bounded_pool_makes_the_job_wait_instead_of_overcommitting():
    cl = cluster(rollout=PoolSpec("H20", 1.85, nodes=1), train=PoolSpec("H800", 5.28, nodes=1))
    state = PlanState(cl)
    pl = Planner()
    place(state, pl, job("a", 60, 40, slo=1.0))
    d = pl.decide(state, job("b", 60, 40, slo=1.0))
    assert d.outcome == "wait" and d.placement is None
    state.release("a")
    assert pl.decide(state, job("b", 60, 40, slo=1.0)).outcome == "new-group"


def test_job_larger_than_the_inventory_is_rejected():
    cl = cluster(train=PoolSpec("H800", 5.28, nodes=1))
    d = Planner().decide(PlanState(cl), job("big", 50, 50, gpus=16))
    assert d.outcome == "rejected" and "needs 2 train nodes" in d.reason


@pytest.mark.parametrize("field,value", [("t_roll_s", 0.0), ("t_train_s", -1.0), ("t_roll_s", 5e-324),
                                         ("t_train_s", 0.0009), ("t_roll_colo_s", 1e-7), ("slo", 0.9),
                                         ("rollout_gpus", 0), ("train_gpus", -8), ("mem_roll_gb", 4096.0)])
def test_bad_job_fields_raise_before_any_change(field, value):
    state = PlanState(cluster())
    pl = Planner()
    place(state, pl, job("a", 50, 50))
    snapshot = (dict(state.job_group), state.cost_per_hour())
    bad = dataclasses.replace(job("b", 50, 50), **{field: value})
    with pytest.raises(SpecError) as err:
        pl.decide(state, bad)
    assert field in str(err.value) and repr(value) in str(err.value)
    assert (dict(state.job_group), state.cost_per_hour()) == snapshot


def test_duplicate_job_id_is_refused():
    state = PlanState(cluster())
    pl = Planner()
    place(state, pl, job("a", 50, 50))
    with pytest.raises(PlacementError):
        pl.decide(state, job("a", 10, 10))


def test_explain_never_changes_the_choice(planner):
    import random

    rng = random.Random(3)
    s1, s2 = PlanState(cluster()), PlanState(cluster())
    for i in range(25):
        j = job(f"j{i}", rng.randint(50, 400), rng.randint(50, 400), slo=rng.uniform(1, 2))
        d1 = planner.decide(s1, j)
        d2 = planner.decide(s2, j, explain=True)
        assert d1.outcome == d2.outcome and d1.placement == d2.placement
        if d1.placement:
            s1.apply(j, d1.placement)
            s2.apply(j, d2.placement)


@pytest.mark.parametrize("space", [PAPER_SPACE, FULL_SPACE], ids=["paper", "full"])
@pytest.mark.parametrize("seed", [3, 4])
def test_admit_takes_the_first_feasible_candidate_it_accepts(space, seed):
    """The oracle: the explained decision's candidates, in order, the first feasible one
    (chosen or feasible) that the test accepts. The fast path must find the same one and
    must not evaluate what the test refused after the first feasible candidate."""
    import random

    rng = random.Random(seed)
    pl = Planner(space=space)
    state = PlanState(cluster())
    refused_seen = 0
    for i in range(30):
        j = job(f"j{i}", rng.randint(50, 400), rng.randint(50, 400), slo=rng.uniform(1.1, 2))
        # a test a caller might make: refuse every placement on an odd-numbered rollout node
        def admit(p):
            return not any(int(n[1:]) % 2 for n in p.rollout_nodes)

        explained = pl.decide(state, j, explain=True)
        feasible = [c for c in explained.candidates if c.verdict in ("chosen", "feasible")]
        want = next((c.placement for c in feasible if admit(c.placement)), None)
        fast = pl.decide(state, j, admit=admit)
        slow = pl.decide(state, j, explain=True, admit=admit)
        assert fast.placement == want and slow.placement == want
        refused = [c for c in fast.candidates if c.reason == NOT_ADMITTED]
        assert all(not admit(c.placement) for c in refused)
        refused_seen += len(refused)
        plain = pl.decide(state, j)
        if plain.placement is not None:
            state.apply(j, plain.placement)
    assert refused_seen  # the test did spare some evaluations


def test_admit_is_refused_with_the_lifetime_objective():
    with pytest.raises(ValueError, match="rate objective"):
        Planner(objective="lifetime").decide(PlanState(cluster()), job("a", 50, 50), admit=lambda p: True)


def test_unknown_gpu_type_in_cluster_is_an_error():
    with pytest.raises(SpecError, match="rollout.gpu"):
        Cluster(rollout=PoolSpec("TPU", 1.0)).validate()


def test_short_job_is_not_packed_where_start_up_wait_breaks_its_slo():
    state = PlanState(cluster())
    pl = Planner()
    place(state, pl, job("a", 100, 20))
    assert place(state, pl, job("long", 20, 100, slo=1.1)).outcome == "packed"
    state.release("long")
    d = pl.decide(state, job("short", 20, 100, slo=1.1, iterations=1), explain=True)
    assert d.outcome != "packed"
    assert any("with start-up" in c.reason for c in d.candidates)


def test_departure_that_would_break_a_remaining_slo_blocks_the_placement():
    # c packs fine while b is present, but if b left, a would take the shared training
    # node twice per turn of c and c would miss its SLO; the planner must see that.
    from rollmux.planner import _departure_miss
    from rollmux.intra import MemberProfile as M

    a = M("a", 27.6, 159.6, ("R0",), ("T0",), 1.8, 4.7)
    c = M("c", 195.9, 31.2, ("R1",), ("T0",), 1.8, 4.7)
    b = M("b", 188.1, 40.3, ("R2",), ("T0",), 1.8, 4.7)
    miss = _departure_miss([a, b, c], {"a": 1.5, "b": 1.5, "c": 1.22})
    assert miss.startswith("SLO of job c") and "if only a and c remain" in miss


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(1, 400), st.sampled_from([0.0, 0.7, 3.0, 19.5]),
                          st.sampled_from([0.0, 1.3, 4.0, 21.0])), min_size=2, max_size=5),
       st.floats(1.0, 3.0))
def test_one_node_per_pool_members_take_turns(phases, slo):
    """The claim behind ``_shared_pair_miss``, checked on the analysis itself: on one node
    per pool every member has the same iteration time, at least the bound; and the bound
    rejects only groups the analysis rejects."""
    members = [MemberProfile(f"m{i}", float(r), float(t), ("R0",), ("T0",), sr, stt)
               for i, (r, t, sr, stt) in enumerate(phases)]
    a = analyze(members)
    iters = list(a.iteration_s.values())
    assert max(iters) - min(iters) < 1e-6
    bound = max(max(m.t_roll + m.switch_roll + m.t_train + m.switch_train for m in members),
                sum(m.t_roll + m.switch_roll for m in members), sum(m.t_train + m.switch_train for m in members))
    assert iters[0] >= bound - 1e-6
    slos = {m.job_id: slo for m in members}
    if _shared_pair_miss(members, slos):
        assert any(a.slowdown[m.job_id] > slo * (1 + 1e-9) for m in members)


def test_repack_keeps_every_target_member_within_its_whole_run_slo():
    from rollmux.plan_state import Placement

    planner, state = Planner(), PlanState(cluster())
    a, b = job("a", 100, 20), job("b", 20, 100)
    state.apply(a, Placement(None, ("R0",), ("T0",), ("R0",), ("T0",)))
    state.apply(b, Placement(None, ("R1",), ("T1",), ("R1",), ("T1",)))
    roomy = planner.repack(state, "b", 10, 1e9, progress=lambda k: (500, 1e9))
    assert roomy is not None and roomy.outcome == "repacked" and roomy.placement.group_id == "g0"
    assert roomy.marginal_cost < 0  # b's own nodes come back
    # a has no spare time left: at 500 iterations it must run at solo pace from now on
    assert planner.repack(state, "b", 10, 1e9, progress=lambda k: (500, 500 * 120.0)) is None
    assert planner.repack(state, "b", 10, 1e9) is not None  # without progress only b's own time counts


def _share_oracle(j, partners, need, c, train_scaling):
    """``Planner.shared_cost`` from its docstring, pool by pool: for each partner (the job
    itself included) and each pinning, both iterations are at least the larger of each
    one's solo iteration plus its switches on the shared pools and, on each shared pool,
    the two phases plus both switches; the pair must keep both SLOs and fit in memory."""
    def phase(k, p):
        return k.t_roll_s if p == "rollout" else k.t_train_s

    sharings = [{"rollout", "train"}, {"train"}] + ([{"rollout"}] if train_scaling else [])
    sw = c.switch_cost
    best = float("inf")
    for other in [j, *partners]:
        for shared in sharings:
            if any(j.mem(p) + other.mem(p) > c.pool(p).host_mem_gb for p in shared):
                continue
            turn = max(phase(j, p) + phase(other, p) + sw.seconds(j.model, p) + sw.seconds(other.model, p)
                       for p in shared)
            slow = [max(k.t_solo + sum(sw.seconds(k.model, p) for p in shared), turn) / k.t_solo for k in (j, other)]
            if slow[0] > j.slo * (1 + SLO_EPS) or slow[1] > other.slo * (1 + SLO_EPS):
                continue
            pair = sum((1 if p in shared else 2) * need[p] * c.node_price(p) for p in ("rollout", "train"))
            best = min(best, pair / 2 * slow[0])
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(10, 300), st.integers(10, 300), st.floats(1.05, 2.0), st.sampled_from(
    ["3B", "7B", "14B", "32B"]), st.sampled_from([100.0, 600.0, 1100.0])), min_size=1, max_size=6),
    st.booleans())
def test_prospect_test_matches_its_formula_and_follows_departures(rows, train_scaling):
    # the prospect test of co-location against an independent reading of its docstring,
    # with the running jobs as partners, and again after each one leaves (the partners'
    # shapes are kept per group version, so a departure must drop the leaver's)
    c = Cluster(switch_cost=SwitchCost("warm"))
    planner = Planner(space=FULL_SPACE if train_scaling else PAPER_SPACE)
    state = PlanState(c)
    running = []
    for i, (roll, train, slo, model, mem) in enumerate(rows[1:]):
        k = Job(f"r{i}", roll, train, 8, 8, mem, mem, slo, model, iterations=1000)
        d = Planner().decide(state, k)
        if d.placement is not None and not d.placement.colocated:
            state.apply(k, d.placement)
            running.append(k)
    roll, train, slo, model, mem = rows[0]
    j = Job("j", roll, train, 8, 8, mem, mem, slo, model, iterations=1000)
    need = {"rollout": 1, "train": 1}
    while True:
        assert planner.shared_cost(state, j, need) == pytest.approx(
            _share_oracle(j, running, need, c, train_scaling), rel=1e-12)
        if not running:
            break
        state.release(running.pop(0).job_id)
