"""Planner decision latency against the number of jobs already running.

For each N, jobs are placed one at a time until N are present; then ``--probes``
further arrivals are timed
(each decision is made and not applied, so every probe sees the same N). Prints the
median and p99 decision latency next to the paper's figures (facts section 9) and the
speed-up ratio. Then the exact solver's time per instance size (jobs present at once),
next to the paper's brute force (113 ms at 5 jobs, over a minute at 9).

Workloads (``--workload``):
* ``synthetic`` (default): ``rollmux trace generate`` jobs, the paper's simulation mix
  (balanced, rollout-heavy and train-heavy profiles, S/M/L, every phase time drawn
  uniformly, so no two jobs share a profile; SLO uniform in [1, 2]; 8 or 16 GPUs per
  pool; Table 2 memory). The planner's analysis memo never hits: the worst case.
* ``production``: jobs resampled from the paper's production trace (13 job types, as a
  platform runs a few model and length configurations again and again), each with a
  fresh SLO drawn uniformly in [1.1, 2.0]. Group shapes repeat and the memo hits.

``--space full`` times the planner in the placement space beyond the paper (training
scaling and co-location, ``rollmux.planner.FULL_SPACE``), the plan built in that space too;
``paper-one-order`` and ``full-one-order`` time each space without the check of every
order of a group's members (``Space.all_orders``), as before it. ``--objective lifetime``
times the lifetime objective (``rollmux.lifetime``): every candidate evaluated, each
running job with a remaining iteration count drawn once (uniform in 1..500).

``--passes P`` (default 3) decides each probe P times, each time from the caches as a
single pass would find them, and keeps the fastest: the analysis memo
(``rollmux.kernel.memo_snapshot``/``memo_restore``: what the plan's construction and the
earlier probes analysed, nothing of this probe's other passes), and, since 2026-11-28,
the planner and the plan as they were before the probe (each pass decides on a deep copy
of both, made before the clock starts): the planner's and the plan's own caches (a
group's node choices per need, the pair memo, a job's Gavel+ option) were kept from pass
to pass before, so every pass after the first found the probe's own work done. The work
is the same every pass; on a shared machine (a third of the CPU stolen by neighbours at
times, 2026-11-27) the fastest pass is the decision's own cost, the others add the
neighbours'. ``--passes 1`` is one pass per probe, on the plan itself.

``--policy rollmux-hedge`` times that policy's arrival decision instead (the fleet planner on
the paper's testbed as a fleet of one view, ``rollmux.policies.fleet``): its placement
(``place``), plus, when the arrival opens a group, the regrouping ``rollmux-hedge`` asks for
at once (gathering it with jobs alone, ``fleet_exact.plan_fleet_regroup``). The N running
jobs are placed the same way, each regrouping applied. For the regrouping the probe is
pinned, then unpinned after; every running job is taken half-way through its run at
exactly its SLO's pace, with a pause of its iteration plus 300 s. ``place ms`` and
``regroup ms`` are the medians of each part over the probes that ran it. ``median ms`` and
``speed-up`` count both. ``answer ms`` and ``answer x`` count the placement only (the
median of the draws' medians): what a submit waits for, since the live control plane
answers with the placement and runs the regrouping after (``ControlPlane.gather``), and
the simulator's move it leads to starts at the job's first iteration's end.

``--repeats K`` draws K independent workloads per N (seeds ``--seed`` to ``--seed`` + K - 1,
each its own plan and probes) and reports the median of their K medians: at small N one
draw's median moves by half from run to run on a shared machine, with the workload's
mix of outcomes and with the machine.

    python benchmarks/planner_latency.py [--sizes 5,9,13,100,500,1000,2000] [--probes 50]
                                         [--space paper|full|paper-one-order|full-one-order]
                                         [--exact-sizes 4,5,6,7,8,9,10] [--objective rate|lifetime]
                                         [--repeats 1] [--passes 3] [--policy rollmux-hedge]
"""
from __future__ import annotations

import argparse
import copy
import random
from dataclasses import replace
import statistics
import time

from rollmux import kernel, native
from rollmux.exact import solve
from rollmux.model import Cluster
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, PAPER_SPACE, Planner
from rollmux.traces.builtin import load_trace
from rollmux.traces.generate import generate

#: "...-one-order": the space as it was before the check of every order of a group's
#: members (``Space.all_orders``), to measure that check's price in the same run
SPACES = {"paper": PAPER_SPACE, "full": FULL_SPACE, "paper-one-order": replace(PAPER_SPACE, all_orders=False),
          "full-one-order": replace(FULL_SPACE, all_orders=False)}
PAPER_MS = {5: 5.6, 9: 6.5, 13: 7.6, 100: 41.9, 500: 198.0, 1000: 318.0, 2000: 591.0}


def workload(name: str, count: int, seed: int) -> list:
    if name == "synthetic":
        return generate(count, seed)
    rows, _ = load_trace("production")
    rng = random.Random(seed)
    return [replace(rng.choice(rows), job_id=f"p{i}", slo=round(rng.uniform(1.1, 2.0), 3)) for i in range(count)]


def build(n: int, seed: int, tie_break: str = "first", name: str = "synthetic",
          space: str = "paper") -> tuple[PlanState, list]:
    jobs = workload(name, n + 200, seed)
    state = PlanState(Cluster())
    planner = Planner(tie_break, space=SPACES[space])
    for job in jobs[:n]:
        d = planner.decide(state, job)
        state.apply(job, d.placement)
    return state, jobs[n:]


MIGRATION_S = 300.0  # the pause a regrouping charges each moved job, after its current iteration


def hedge_build(n: int, seed: int, name: str = "synthetic"):
    """``rollmux-hedge`` with ``n`` jobs placed one at a time (each regrouping applied) and
    the jobs left for probes; returns (policy, state, probes)."""
    from rollmux.policies import make_policy

    policy = make_policy("rollmux-hedge")
    state = policy.new_state()
    jobs = workload(name, n + 200, seed)
    for job in jobs[:n]:
        d = policy.place(state, job)
        gid = state.apply(job, d.placement)
        if d.placement.group_id is None:
            plan = _hedge_regroup(policy, state, gid)
            if plan is not None:
                hedge_apply(state, plan)
    return policy, state, jobs[n:]


def _hedge_regroup(policy, state, gid: str):
    """The regrouping ``rollmux-hedge`` asks for after an arrival opened ``gid``; every job
    half-way through its run at its SLO's pace."""
    def progress(k: str) -> tuple[int, float]:
        job = state.originals[k]
        left = max(1, job.solo_iterations() // 2)
        return left, job.slo * job.t_solo * left

    def pause(k: str) -> float:
        return state.analysis(state.job_group[k]).iteration_s[k] + MIGRATION_S

    return policy.regroup(state, gid, progress, pause)


def hedge_apply(state, plan) -> None:
    """Move a regrouping's jobs at once (the simulator waits for each one's iteration end)."""
    from rollmux.improve import open_regrouped

    originals = {m.job.job_id: state.originals[m.job.job_id] for g in plan.groups for m in g.members}
    for job_id in originals:
        state.release(job_id)
    for group in plan.groups:
        open_regrouped(state, group, plan.view, originals)


def fresh(objects, passes: int):
    """What one pass decides on: ``objects`` themselves for a single pass, else a deep copy
    (every pass from the caches the probe found; the module docstring)."""
    return objects if passes == 1 else copy.deepcopy(objects)


def hedge_probe(policy, state, job, passes: int) -> tuple[float, float | None]:
    """ms of the probe's placement and, when it opens a group, of the regrouping then
    asked for (the fastest of ``passes`` each, from the same memo and caches); the state
    is left as it was."""
    memo = kernel.memo_snapshot()
    place, regroup = float("inf"), float("inf")
    for _ in range(passes):
        p, s = fresh((policy, state), passes)
        kernel.memo_restore(memo)
        t = time.perf_counter()
        d = p.place(s, job)
        place = min(place, (time.perf_counter() - t) * 1e3)
    if d.placement is None or d.placement.group_id is not None:
        return place, None
    gid = state.apply(job, d.placement)
    after = kernel.memo_snapshot()
    for _ in range(passes):
        p, s = fresh((policy, state), passes)
        kernel.memo_restore(after)
        t = time.perf_counter()
        _hedge_regroup(p, s, gid)
        regroup = min(regroup, (time.perf_counter() - t) * 1e3)
    state.release(job.job_id)
    return place, regroup


def summarize(n: int, medians: list[float], every: list[float]) -> tuple[float, float, str]:
    """The row's median (of the draws' medians), p99 (over every probe) and speed-up text."""
    every = sorted(every)
    med = statistics.median(medians)
    paper = PAPER_MS.get(n)
    return med, every[min(len(every) - 1, int(0.99 * len(every)))], f"{paper / med:8.1f}x" if paper else "       -"


def hedge_table(args) -> None:
    """The ``--policy rollmux-hedge`` table (see the module's docstring)."""
    print(f"policy: rollmux-hedge (fleet planner, full space), kernel: {native.status()}, "
          f"simulation loop: {native.simulator_status()}")
    print(f"{'N':>6} {'groups':>7} {'median ms':>10} {'p99 ms':>9} {'paper ms':>9} {'speed-up':>9} "
          f"{'place ms':>9} {'regroup ms':>11} {'regroups':>9} {'answer ms':>10} {'answer x':>9} {'build s':>8}")
    for n in [int(x) for x in args.sizes.split(",")]:
        total, places, regroups, medians, answers, built = [], [], [], [], [], 0.0
        for r in range(args.repeats):
            t0 = time.perf_counter()
            policy, state, probes = hedge_build(n, args.seed + r, args.workload)
            built += time.perf_counter() - t0
            one, placed = [], []
            for job in probes[: args.probes]:
                place, regroup = hedge_probe(policy, state, job, args.passes)
                placed.append(place)
                if regroup is not None:
                    regroups.append(regroup)
                one.append(place + (regroup or 0.0))
            medians.append(statistics.median(one))
            answers.append(statistics.median(placed))
            total += one
            places += placed
        med, p99, ratio = summarize(n, medians, total)
        reg = f"{statistics.median(regroups):>11.3f}" if regroups else f"{'-':>11}"
        answer = statistics.median(answers)
        answer_x = f"{PAPER_MS[n] / answer:>8.1f}x" if n in PAPER_MS else f"{'-':>9}"
        groups = sum(len(s.groups) for _, s in state.views.values())
        print(f"{n:>6} {groups:>7} {med:>10.3f} {p99:>9.3f} {PAPER_MS.get(n, '-'):>9} {ratio} "
              f"{statistics.median(places):>9.3f} {reg} {len(regroups):>9} {answer:>10.3f} {answer_x} {built:>8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5,9,13,100,500,1000,2000")
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tie-break", default="first", help="the planner's tie break: first or best-fit")
    ap.add_argument("--workload", default="synthetic", choices=("synthetic", "production"))
    ap.add_argument("--space", default="paper", choices=tuple(SPACES), help="the planner's placement space")
    ap.add_argument("--exact-sizes", default="4,5,6,7,8,9,10")
    ap.add_argument("--objective", default="rate", choices=("rate", "lifetime"))
    ap.add_argument("--exact-instances", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3,
                    help="times each probe is decided, each from the memo one pass would find; the fastest counts")
    ap.add_argument("--repeats", type=int, default=1,
                    help="independent draws per N (seeds seed, seed+1, ...): the median is then the median of "
                         "the draws' medians, p99 is over every probe, and the draws' medians are listed")
    ap.add_argument("--policy", default="rollmux", choices=("rollmux", "rollmux-hedge"),
                    help="rollmux: the planner's decision (--space, --objective); rollmux-hedge: that policy's "
                         "placement plus the regrouping it asks for after an arrival that opens a group")
    args = ap.parse_args()
    if args.policy == "rollmux-hedge":
        hedge_table(args)
        return
    planner = Planner(args.tie_break, space=SPACES[args.space], objective=args.objective)
    draw = random.Random(args.seed)
    left: dict[str, int] = {}
    remaining = (lambda k: left.setdefault(k, draw.randint(1, 500))) if args.objective == "lifetime" else None
    print(f"placement space: {args.space}, objective: {args.objective}, kernel: {native.status()}, "
          f"simulation loop: {native.simulator_status()}")
    draws = "  draws' medians ms" if args.repeats > 1 else ""
    print(f"{'N':>6} {'groups':>7} {'median ms':>10} {'p99 ms':>9} {'paper ms':>9} {'speed-up':>9} {'build s':>8}{draws}")
    for n in [int(x) for x in args.sizes.split(",")]:
        lat, medians, built = [], [], 0.0
        for r in range(args.repeats):
            t0 = time.perf_counter()
            state, probes = build(n, args.seed + r, args.tie_break, args.workload, args.space)
            built += time.perf_counter() - t0
            one = []
            for job in probes[: args.probes]:
                fastest = float("inf")
                memo = kernel.memo_snapshot() if args.passes > 1 else None  # as one pass would find it
                for _ in range(args.passes):
                    p, s = fresh((planner, state), args.passes)  # nor what it cached in the plan
                    if memo is not None:
                        kernel.memo_restore(memo)  # no pass reuses what another analysed
                    t = time.perf_counter()
                    p.decide(s, job, remaining=remaining)
                    fastest = min(fastest, (time.perf_counter() - t) * 1e3)
                one.append(fastest)
            medians.append(statistics.median(one))
            lat += one
        med, p99, ratio = summarize(n, medians, lat)
        listed = "  " + " ".join(f"{m:.3f}" for m in medians) if args.repeats > 1 else ""
        print(f"{n:>6} {len(state.groups):>7} {med:>10.3f} {p99:>9.3f} {PAPER_MS.get(n, '-'):>9} {ratio} "
              f"{built:>8.1f}{listed}")
    if args.exact_sizes:
        exact_table([int(x) for x in args.exact_sizes.split(",")], args.exact_instances, args.seed)


def exact_table(sizes: list[int], instances: int, seed: int) -> None:
    print(f"\n{'jobs':>5} {'exact median s':>15} {'max s':>8} {'paper brute force':>18}")
    paper = {5: "0.113 s", 9: "> 60 s", 13: "> 5 h"}
    for n in sizes:
        times = []
        for k in range(instances):
            jobs = generate(n, seed + 100 * k + n)
            times.append(solve(Cluster(), jobs).stats.seconds)
        print(f"{n:>5} {statistics.median(times):>15.3f} {max(times):>8.3f} {paper.get(n, '-'):>18}")


if __name__ == "__main__":
    main()
