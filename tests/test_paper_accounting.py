"""Fixed departures (``--accounting paper``) give true numbers: no work after a job's
recorded departure, busy GPU-seconds cut exactly where the phase stood (tail, hand-off
slice), the run's span ending at the last departure, and an ``optimal`` bound held to the
same terms as the policies it bounds (rollmux.sim.engine, rollmux.sim.optimal_curve)."""
import pytest

from rollmux.accounting import OURS, PAPER, PAPER_WIDTHS, departure_span_s, leave_after_s
from rollmux.model import ROLLOUT, TRAIN, Cluster, Job, PoolSpec
from rollmux.policies import make_policy
from rollmux.sim.durations import DurationModel
from rollmux.sim.engine import MIGRATION_S, simulate
from rollmux.sim.optimal_curve import optimal_curve
from rollmux.traces.builtin import load_trace
from rollmux.traces.generate import generate


def _run(jobs, policy, accounting=PAPER, cluster=None, seed=0, **kw):
    cl = accounting.apply_cluster(cluster or Cluster())
    return simulate(jobs, cl, make_policy(policy, seed, accounting, cl), seed=seed, accounting=accounting, **kw)


def _busy(result, pool=ROLLOUT):
    return result.utilization[pool] * result.gpu_seconds[pool]


def _no_work_after_departure(jobs, result):
    """Every span ends by its job's departure, and the iterations counted are the training
    spans that ended before it (and one that ended at it, if not cut there)."""
    due = {j.job_id: j.arrival_s + leave_after_s(j) for j in jobs}
    assert all(s[6] <= due[s[1]] + 1e-6 for s in result.spans)
    for o in result.jobs:
        assert o.end_s == pytest.approx(due[o.job_id])
        ends = [s[6] for s in result.spans if s[1] == o.job_id and s[2] == TRAIN]
        before = sum(e < o.end_s - 1e-9 for e in ends)
        assert before <= o.iterations <= before + sum(abs(e - o.end_s) <= 1e-9 for e in ends)


@pytest.mark.parametrize("policy, iterations, group", [("rollmux-regroup", 21, "g7"),
                                                      ("rollmux-full-regroup", 22, "g11")])
def test_a_job_marked_for_a_regrouping_leaves_its_group_at_its_departure(policy, iterations, group):
    """(gen-0007 used to run an iteration past its departure in its old group, then migrate
    and 'leave' once admitted: one iteration too many counted, its old nodes held, its
    departure late.) It is marked for a regrouping when its departure comes: it leaves its
    group at once; rollmux-regroup's new group g9 opens with its other member gen-0016
    once that one stopped, rollmux-full-regroup's (gen-0007 alone) does not open."""
    jobs = generate(20, 8, mean_interarrival_s=1500.0, mean_duration_s=20000.0)
    r = _run(jobs, policy, seed=8, duration_model="worst", record_spans=True)
    _no_work_after_departure(jobs, r)
    o = next(o for o in r.jobs if o.job_id == "gen-0007")
    assert (o.end_s, o.iterations, o.group_id) == (pytest.approx(23287.9), iterations, group)
    assert o.last_iteration_s < o.end_s
    if policy == "rollmux-regroup":
        mine = [s for s in r.spans if s[1] == "gen-0016"]
        stopped = max(s[6] for s in mine if s[0] == "g3")
        assert min(s[4] for s in mine if s[0] == "g9") == pytest.approx(stopped + MIGRATION_S)
        assert not [s for s in r.spans if s[0] == "g9" and s[1] == "gen-0007"]


def test_on_bounded_pools_the_regrouping_opens_without_the_job_that_left():
    """The same on bounded pools, where a reservation holds nodes for the new group: the
    nodes gen-0007 gives back count for it, and no regrouped job is left stopped for good
    (``simulate`` raises if one is)."""
    jobs = generate(20, 8, mean_interarrival_s=1500.0, mean_duration_s=20000.0)
    bounded = Cluster(rollout=PoolSpec("H20", 1.85, nodes=8), train=PoolSpec("H800", 5.28, nodes=8))
    r = _run(jobs, "rollmux-regroup", cluster=bounded, seed=8, duration_model="worst", record_spans=True)
    _no_work_after_departure(jobs, r)
    assert len(r.jobs) + len(r.rejected) == len(jobs)


@pytest.mark.parametrize("handoff", [False, True])
def test_a_departure_in_a_rollouts_tail_takes_off_only_the_kept_gpus_time_left(handoff):
    """(Busy was short by 7 freed GPUs x the tail left: they were taken off at the tail report
    and again at the departure.) One job, stochastic, tail on, leaving half-way through its
    second rollout's tail: 8 GPUs busy until each tail, 1 in it, none after the departure."""
    model = DurationModel("stochastic", 0, True, 0.8)  # the job's own draws, in its order
    phases, t = [], 0.0
    for _ in range(2):
        body, head, train = model.draw(1000.0, ROLLOUT, "j"), model.head("j"), model.draw(100.0, TRAIN, "j")
        phases.append((t, body, head))
        t += body + train
    (_, body1, head1), (start2, body2, head2) = phases
    assert head1 < 1 and head2 < 1
    tail_at = start2 + head2 * body2
    leave = (tail_at + start2 + body2) / 2
    job = Job("j", 1000.0, 100.0, 8, 8, model="Qwen2.5-7B", slo=10.0, arrival_s=0.0, duration_s=leave)
    r = _run([job], "rollmux", duration_model="stochastic", tail=True, handoff=handoff)
    by_hand = 8 * head1 * body1 + (1 - head1) * body1 + 8 * (tail_at - start2) + (leave - tail_at)
    assert _busy(r) == pytest.approx(by_hand, rel=1e-12)


def test_a_departure_during_a_hand_off_slice_takes_off_the_work_left_at_its_share():
    """(Busy was short by 1 GPU x (t_e - D): the slice was taken as running at full rate.)
    A and B share one node pair; B's rollout gets a slice of A's 7 freed GPUs at A's tail
    report t_h and B leaves at D, before A's rollout ends at t_e."""
    t_h, t_e = DurationModel("worst", 0, True, 0.8).head("A") * 1000.0, 1000.0
    leave = (t_h + t_e) / 2
    a = Job("A", 1000.0, 100.0, 8, 8, model="Qwen2.5-7B", slo=10.0, arrival_s=0.0, duration_s=1050.0)
    b = Job("B", 1000.0, 100.0, 8, 8, model="Qwen2.5-7B", slo=10.0, arrival_s=0.0, duration_s=leave)
    r = _run([a, b], "most-idle", duration_model="worst", tail=True)
    assert r.outcomes["hand-offs"] == 1
    assert _busy(r) == pytest.approx(8 * t_h + (t_e - t_h) + 7 * (leave - t_h), rel=1e-12)


@pytest.mark.parametrize("pricing", ["pay-per-use", "owned"])
def test_the_run_ends_at_the_last_departure_not_at_the_end_of_the_phase_it_cut(pricing):
    """(The stale end of the cut rollout, at 2100 s, moved the clock: 0.5833 h, and owned
    nodes billed for them.) One job on 2 + 2 owned nodes leaves at 1500 s, mid-rollout."""
    job = Job("A", 1000.0, 100.0, 8, 8, model="Qwen2.5-7B", slo=10.0, arrival_s=0.0, duration_s=1500.0)
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2), pricing=pricing)
    r = _run([job], "rollmux", cluster=cluster)
    assert r.span_s == 1500.0 and r.avg_gpus[ROLLOUT] == pytest.approx(8.0)
    if pricing == "owned":
        per_hour = 2 * sum(PAPER.apply_cluster(cluster).node_price(p) for p in (ROLLOUT, TRAIN))
        assert r.total_cost == pytest.approx(per_hour * 1500.0 / 3600.0)


def test_the_optimal_bound_runs_rollmux_widths_and_departures_under_the_papers_accounting():
    """(It solved the 32B jobs on 2 + 2 nodes, kept them for their solo run time and divided
    by the solo span: $12,646, twice rollmux's $6,328.) The first four 32B jobs of production:
    one node per pool and the trace's departures, so rollmux, one job per group here, reaches
    the bound; $/h over the same hours."""
    cl = PAPER.apply_cluster(Cluster())
    jobs = [j for j in load_trace("production", cl)[0] if j.train_gpus > 8][:4]
    bound = optimal_curve(jobs, cl, accounting=PAPER)
    r = _run(jobs, "rollmux", duration_model="worst")
    assert bound.total_cost == pytest.approx(r.total_cost, rel=1e-9)
    assert bound.reference_span_s == r.reference_span_s == departure_span_s(jobs)
    assert bound.accounting == "paper" and bound.cost_per_hour == pytest.approx(r.cost_per_hour, rel=1e-9)


@pytest.mark.parametrize("accounting", [OURS, PAPER, PAPER_WIDTHS], ids=lambda a: a.name)
@pytest.mark.parametrize("seed", [0, 2])
def test_the_optimal_bound_is_below_every_policy_that_keeps_slos_in_its_space(accounting, seed):
    jobs = generate(8, seed, mean_interarrival_s=1500.0, mean_duration_s=12000.0)
    cl = accounting.apply_cluster(Cluster())
    bound = optimal_curve(jobs, cl, accounting=accounting)
    assert not bound.note.startswith("skipped") and bound.total_cost > 0
    for policy in ("rollmux", "rollmux-consolidate", "rollmux-regroup", "solo-d"):
        r = _run(jobs, policy, accounting, seed=seed, duration_model="worst")
        assert bound.total_cost <= r.total_cost * (1 + 1e-9), policy
        assert bound.reference_span_s == r.reference_span_s


def test_the_optimal_bound_bills_the_reward_of_the_iterations_run_before_the_departure():
    """Under fixed departures a job runs at solo speed until it leaves: 2 whole iterations of
    100 s in 270 s (``solo_iterations`` would say 3)."""
    job = Job("j", 50.0, 50.0, 8, 8, model="Qwen2.5-7B", duration_s=270.0, reward_s=10.0,
              reward_price_per_hour=36.0)
    assert job.solo_iterations() == 3
    ours = optimal_curve([job], Cluster(), accounting=OURS)
    paper = optimal_curve([job], PAPER.apply_cluster(Cluster()), accounting=PAPER)
    assert (ours.reward_cost, paper.reward_cost) == (pytest.approx(0.3), pytest.approx(0.2))


def test_a_tail_frees_the_gpus_of_the_nodes_a_job_is_pinned_to_under_one_node_per_pool():
    """(Without hand-offs the tail's idle GPUs were the trace's width less those kept: 16 - 2
    for a 32B job pinned to one 8-GPU node, so busy fell by 14 GPUs a tail where the rule
    frees 6.) Alone, the job hands nothing off either way: the same busy GPU-seconds."""
    job = Job("big", 900.0, 300.0, 16, 16, model="Qwen2.5-32B", slo=10.0, arrival_s=0.0, duration_s=20000.0)
    on, off = (_run([job], "rollmux", duration_model="stochastic", tail=True, handoff=h) for h in (True, False))
    assert on.outcomes.get("hand-offs", 0) == 0 and on.peak_gpus[ROLLOUT] == 8
    assert _busy(off) == pytest.approx(_busy(on), rel=1e-12) and _busy(off) > 0
