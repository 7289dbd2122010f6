"""``rollmux demo --policy rollmux-consolidate`` / ``rollmux-regroup``: real GRPO jobs
moved live between groups.

``rollmux-regroup`` runs the same three jobs on an *unbounded* cluster, so that the new
group opens on fresh nodes while the old ones drain (on bounded pools it would reuse the
nodes they give back, ``rollmux.reservation``). The
service mints node ids in order, R0, R1, ... and T0, T1, ..., so the Ray cluster is
pre-created with ``REGROUP_NODES`` nodes per pool (one CPU each) for the fresh ones; the
profile runs go through a separate bounded control plane over R0+T0 first, so that they
mint no ids. Then ``sort-t`` + ``reverse-t`` open a group on R0+T0 and ``reverse-r`` one on
R1+T1, as below; when ``reverse-t`` departs, ``improve.plan_regroup`` re-solves the two
groups exactly: one group of ``sort-t`` and ``reverse-r`` costs one node pair less. Both
stop at their next iteration boundary; once both have stopped, the new group opens on
fresh nodes (R2+T2), each gets its move directive and hands its state over through
``on_move`` (the hand-off below); the group admits them together once both have
acknowledged. ``summary.json``'s ``moves`` then lists both jobs, ``regroups`` the
service's decision (members, cost per hour before and after).

The scenario (``rollmux.grpo.profiles.MOVE_PROFILES``), on 2 rollout nodes (R0, R1)
and 2 training nodes (T0, T1), each its own Ray node:

1. Warm-up and profile as in the plain demo: each job alone for
   ``PROFILE_ITERATIONS`` iterations; its mean measured phase times become the spec's
   ``t_roll_s`` / ``t_train_s``, which is all the planner knows about it.
2. Three jobs are submitted, in this order, with iteration targets N, N/3 and 3N:
   ``sort-t`` opens a group on R0+T0; ``reverse-t`` (short) packs next to it; the two
   are train-heavy, so that group is saturated and ``reverse-r`` opens a second group
   on R1+T1.
3. ``reverse-t`` finishes. The service offers ``sort-t`` a move; at its next iteration
   boundary ``Planner.repack`` moves it next to ``reverse-r`` (complementary phases,
   every whole-run SLO kept) and R0+T0 go back to the pool.
4. ``sort-t``'s next ``phase()`` gets the move directive and calls the driver's
   ``on_move`` (``rollmux.grpo.driver._Workers.move``): the old workers export their
   parked state (StateCache host buffers: policy, reference, AdamW moments and step
   counts, plus the update counter) into the Ray object store; a new ``RayJobRunner``
   starts the workers on R1+T1; they import that state; the old workers go. The SDK
   acknowledges and the phase is granted on the new nodes.
The SLOs: ``slo`` (3.0) on the iterations, plus a start-up allowance. The service
judges a move against each job's whole-run budget, ``slo x t_solo x iterations``,
counted from its placement, and on this 2-core machine starting a job's two worker
processes (importing torch and transformers) takes several seconds, and the three
jobs start together: about 25 s in all, more than a CI-sized run's iterations. So
each job's SLO is ``slo + allowance / (t_solo x iterations)``, the allowance being
``STARTUP_MARGIN`` x the sum of the start-ups measured in the profile runs (submit to
first phase) plus the planned pause of one move (``migration_s``): a move is checked
against the moved job's whole-run budget with that pause in it, and without it in the
allowance a CI-sized run on a loaded 2-core machine had spent the spare seconds by the
time the short job left (no move in five tries). With long runs the allowance fades.

5. Check: the moved job is replayed in this process without Ray, the service or the
   move (same seeds, data order and number of updates); its rewards and its final
   training state (every parameter, buffer and optimizer tensor) must be equal,
   compared with ``torch.equal``: the hand-off copies bytes and the computation is the
   same single-threaded CPU code, so anything short of bit equality is a bug.

Written to ``out_dir``: ``summary.json`` (``moves``: job, from and to group, seconds as
the service measured them from decision to acknowledgement, the driver's hand-off
seconds and bytes; ``jobs``: per job iterations done and targeted, groups, rewards
before and after the move), ``results.json`` (every span, reward, switch), ``gantt.png``
(measured phases per node, moves marked), ``rewards.png`` and ``final_state/<job>.pt``
for each moved job (its training worker's exported state after the last iteration).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rollmux.errors import SpecError
from rollmux.model import ROLLOUT, TRAIN

POLICY = "rollmux-consolidate"
REGROUP = "rollmux-regroup"
POLICIES = (POLICY, REGROUP)
#: The start-up allowance under rollmux-regroup: a regrouping is checked against each
#: member's whole-run budget *including* the wait until the other member stops, the
#: two hand-offs and the new group's settling periods, and on a loaded 2-core machine
#: the start-ups alone ate most of a 1.5x allowance (then the policy fell back to a
#: plain move of one job). So: this margin on the start-ups plus two planned pauses.
REGROUP_STARTUP_MARGIN = 3.0
REGROUP_NODES = 3  # Ray nodes per pool for the unbounded cluster: two groups, then the regrouped one
QUICK_N = 9
SLO = 3.0
STARTUP_MARGIN = 1.5
ROLLOUT_NODES = ("R0", "R1")
TRAIN_NODES = ("T0", "T1")


def iteration_targets(n: int) -> dict[str, int]:
    """Iterations per job for N: N for the job that moves, N/3 (at least 2) for the short
    one, 3N for the one it joins."""
    from rollmux.grpo.profiles import MOVE_ITERATION_SHARES

    return {name: max(2, round(share * n)) for name, share in MOVE_ITERATION_SHARES.items()}


def run_move_demo(out_dir: Path, minutes: float = 3.0, iterations: int | None = None, quick: bool = False,
                  migration_s: float = 8.0, verify: bool = True, log: Callable[[str], None] = print,
                  policy: str = POLICY) -> dict:
    """Run the live-move scenario and write its report to ``out_dir``; returns the summary dict.

    ``iterations``: N (targets N, N/3, 3N); else as many as fit ``minutes`` of the
    multiplexed run. ``quick``: a quarter of the prompts, N = ``QUICK_N`` unless
    given, and one Ray node for all RollMux nodes (tests; ``ray_adapter.demo_ray``).
    ``migration_s``: the pause the service plans a move with until it has measured one. ``verify``: replay each moved job without the move and compare.
    ``policy``: ``rollmux-consolidate`` (bounded 2 + 2 nodes, one job moves) or
    ``rollmux-regroup`` (unbounded, both remaining jobs regroup on fresh nodes).
    Raises ``SpecError`` before any work on a bad ``policy``, ``iterations``, ``minutes``
    (not a positive, finite number) or ``migration_s``.
    """
    from rollmux.demo import PROFILE_ITERATIONS, _control_plane, _phase_means, _shrunk
    from rollmux.grpo.profiles import MOVE_PROFILES

    if policy not in POLICIES:
        raise SpecError("policy", policy, f"one of {POLICIES}")
    if iterations is not None and iterations < 3:
        raise SpecError("iterations", iterations, "an integer >= 3 or None")
    if not (math.isfinite(minutes) and minutes > 0):
        raise SpecError("minutes", minutes, "a positive, finite number of minutes")
    if not (math.isfinite(migration_s) and migration_s >= 0):
        raise SpecError("migration_s", migration_s, "a number of seconds >= 0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    import torch

    from rollmux.grpo.driver import warm_start_weights
    from rollmux.runtime.ray_adapter import demo_ray

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    profiles = MOVE_PROFILES
    if quick:
        profiles = tuple(_shrunk(p) for p in profiles)
        iterations = iterations or QUICK_N
    by_name = {p.name: p for p in profiles}
    t_start = time.time()
    log(f"warm-up: supervised pretraining of {len(profiles)} policies")
    weights = {p.name: warm_start_weights(p) for p in profiles}
    regroup = policy == REGROUP
    ray_rollout, ray_train = ROLLOUT_NODES, TRAIN_NODES
    if regroup:
        ray_rollout = tuple(f"R{i}" for i in range(REGROUP_NODES))
        ray_train = tuple(f"T{i}" for i in range(REGROUP_NODES))
    log(f"starting Ray: rollout pool {list(ray_rollout)}, training pool {list(ray_train)}; "
        f"control plane: {policy} ({'unbounded pools' if regroup else 'bounded'}), "
        f"planned move pause {migration_s:g} s" + ("; one Ray node" if quick else ""))
    finals: dict[str, dict] = {}
    with demo_ray(ray_rollout, ray_train, one_node=quick), contextlib.ExitStack() as stack:
        from rollmux.runtime.sdk import Client

        if regroup:  # profiles on a bounded plane over R0+T0, so that they mint no node ids
            url, token = stack.enter_context(_control_plane(1, 1, out_dir))
        else:
            url, token = stack.enter_context(_control_plane(len(ROLLOUT_NODES), len(TRAIN_NODES), out_dir,
                                                            policy=policy, migration_s=migration_s))
        client = Client(url, token=token)
        try:
            log(f"profile: each job alone for {PROFILE_ITERATIONS} iterations")
            profiled = {p.name: _profile_alone(client, p, weights[p.name], log) for p in profiles}
            times = {name: _phase_means(run) for name, (run, _) in profiled.items()}
            startup = {name: start_s for name, (_, start_s) in profiled.items()}
            if regroup:
                client.close()
                url, token = stack.enter_context(_control_plane(None, None, out_dir, policy=policy,
                                                                migration_s=migration_s))
                client = Client(url, token=token)
            if iterations is None:
                slowest = max(r + t for r, t in times.values())
                iterations = max(6, math.floor(minutes * 60 / (3 * 2.0 * slowest)))
            targets = iteration_targets(iterations)
            # start-ups, and the one move the scenario is about (planned at migration_s)
            allowance = STARTUP_MARGIN * sum(startup.values()) + migration_s
            if regroup:  # the regrouped jobs also wait for each other's stop and two hand-offs
                allowance = REGROUP_STARTUP_MARGIN * sum(startup.values()) + 2 * migration_s
            profiles = tuple(replace(p, slo=round(SLO + allowance / (sum(times[p.name]) * targets[p.name]), 2))
                             for p in profiles)
            log("iterations: " + ", ".join(f"{k} {v}" for k, v in targets.items()) + f"; start-up allowance "
                f"{allowance:.1f} s; SLOs " + ", ".join(f"{p.name} {p.slo:g}" for p in profiles))
            runs, placements = _run_together(client, profiles, times, targets, weights, finals, log)
            events = client.events()
            views = {name: client.job(name) for name in targets}
        finally:
            client.close()
    assert not ray.is_initialized()
    moves = _moves(runs, events)
    replay = {}
    if verify:
        from rollmux.grpo.driver import replay_job

        for job_id in sorted({m["job_id"] for m in moves}):
            log(f"verify: replaying {job_id} in-process without the service or the move")
            rewards, state = replay_job(by_name[job_id], targets[job_id], weights[job_id])
            replay[job_id] = _compare(runs[job_id], finals[job_id], rewards, state)
    (out_dir / "final_state").mkdir(exist_ok=True)
    for job_id in {m["job_id"] for m in moves}:
        torch.save({k: v for k, v in finals[job_id].items() if k != "profile"},
                   out_dir / "final_state" / f"{job_id}.pt")
    summary = _summary(profiles, times, targets, runs, placements, moves, replay, migration_s,
                       time.time() - t_start, policy)
    summary["regroups"] = [{"regroup": e["detail"].get("regroup"), "members": e["job_id"].split(","),
                            "replaced": e["detail"].get("replaced"), "cost_before": e["detail"].get("cost_before"),
                            "cost_after": e["detail"].get("cost_after"), "at": e["at"]}
                           for e in events if e["kind"] == "regroup"]
    for name, view in views.items():
        summary["jobs"][name].update({"service_state": view["state"], "service_iterations_done":
                                      view["iterations_done"], "service_moves": view["moves"]})
    summary.update({"slo_base": SLO, "startup_s": startup, "startup_allowance_s": allowance})
    _write(summary, runs, events, out_dir)
    for line in summary_lines(summary):
        log(line)
    return summary


def summary_lines(summary: dict) -> list[str]:
    """The human-readable report of a move demo's summary."""
    lines = [f"move demo ({summary['policy']}): {len(summary['jobs'])} jobs, {summary['wall_s']:.0f} s in all; "
             f"placed: " + "; ".join(summary["placements"])]
    lines.append(f"{'job':<11}{'t_roll':>7}{'t_train':>8}{'SLO':>5}{'iters':>9}  groups        reward first -> last")
    for job_id, j in summary["jobs"].items():
        lines.append(f"{job_id:<11}{j['t_roll_s']:>7.2f}{j['t_train_s']:>8.2f}{j['slo']:>5.1f}"
                     f"{j['iterations_done']:>4}/{j['iterations_target']:<4}  {' -> '.join(j['groups']):<13} "
                     f"{j['reward_first']:.3f} -> {j['reward_last']:.3f}")
    for r in summary.get("regroups", ()):
        lines.append(f"regroup {r['regroup']}: {', '.join(r['members'])} (replacing {', '.join(r['replaced'] or ())}): "
                     f"{r['cost_before']:.2f} -> {r['cost_after']:.2f} $/h")
    if not summary["moves"]:
        lines.append("no move happened (the planner found none feasible; see the service's explanation)")
    for m in summary["moves"]:
        lines.append(
            f"move: {m['job_id']} {m['from_group']} {'+'.join(m['from_nodes'])} -> {m['to_group']} "
            f"{'+'.join(m['to_nodes'])} after iteration {m['after_iteration']}: "
            f"{m['seconds'] or float('nan'):.2f} s decision to acknowledgement (hand-off {m['handoff_s']:.2f} s, {m['state_bytes'] / 1e6:.1f} MB of state); "
            f"reward {m['reward_before']:.3f} before, {m['reward_after']:.3f} after")
    for job_id, r in summary["replay"].items():
        lines.append(f"verify {job_id}: rewards equal to the unmoved replay: {r['rewards_equal']}; final state "
                     f"({r['tensors']} tensors) torch.equal: {r['state_equal']}")
    return lines


# --- runs -------------------------------------------------------------------------------

def _profile_alone(client, profile, weights, log):
    from rollmux.grpo.driver import job_spec, run_job
    from rollmux.demo import PROFILE_ITERATIONS

    spec = {**job_spec(f"{profile.name}-profile", profile, 1.0, 1.0), "movable": False}
    submitted = time.time()
    run = run_job(client.submit(spec), profile, PROFILE_ITERATIONS, weights)
    startup = run.start - submitted
    log(f"  {profile.name}: rollout {_mean(run, ROLLOUT):.2f} s, train {_mean(run, TRAIN):.2f} s, "
        f"start-up {startup:.1f} s")
    return run, startup


def _mean(run, pool: str) -> float:
    return statistics.fmean(s.end - s.start for s in run.spans if s.pool == pool)


def _run_together(client, profiles, times, targets, weights, finals, log):
    from rollmux.grpo.driver import job_spec, run_job, run_together

    handles, placements = [], []
    for p in profiles:
        h = client.submit(job_spec(p.name, p, *times[p.name], iterations=targets[p.name]))
        where = h.placement
        placements.append(f"{p.name} -> " + ("waiting" if where is None else
                          f"{where['group_id']} {'+'.join(where['rollout_nodes'] + where['train_nodes'])}")
                          + f" ({h.view.get('outcome', '')})")
        handles.append(h)
    log("multiplexed: " + "; ".join(placements))

    def note(job_id, i, reward):
        if (i + 1) % 5 == 0 or i + 1 == targets[job_id]:
            log(f"  {job_id} it {i + 1}/{targets[job_id]}: reward {reward:.3f}")

    def one(profile, handle):
        run = run_job(handle, profile, targets[profile.name], weights[profile.name], on_iteration=note,
                      movable=True, final_state=finals)
        for m in run.moves:
            log(f"  {profile.name} moved {m['from_group']} -> {m['to_group']} "
                f"({'+'.join(m['to_nodes'])}), hand-off {m['handoff_s']:.2f} s")
        return run

    return run_together(profiles, handles, one), placements


# --- numbers ----------------------------------------------------------------------------

def _moves(runs: dict, events: list[dict]) -> list[dict]:
    """Each move the drivers carried out, with the service's measured seconds (its ``moved`` event)."""
    moved = {}
    for e in events:
        if e["kind"] == "moved":
            moved.setdefault(e["job_id"], []).append(e)
    out = []
    for job_id, run in runs.items():
        acks = moved.get(job_id, [])
        for k, m in enumerate(run.moves):
            ack = acks[k] if k < len(acks) else None
            after = next((s.iteration for s in run.spans if s.start >= m["at"]), run.iterations)
            before = run.rewards[max(0, after - 3):after]
            later = run.rewards[after:after + 3]
            out.append({**m, "seconds": None if ack is None else ack["detail"]["seconds"],
                        "service_from_group": None if ack is None else ack["detail"]["from_group"],
                        "after_iteration": after,
                        "reward_before": statistics.fmean(before) if before else float("nan"),
                        "reward_after": statistics.fmean(later) if later else float("nan")})
    return sorted(out, key=lambda m: m["at"])


def _compare(run, final: dict, rewards: list[float], state: dict) -> dict:
    import torch

    slots = final["slots"]
    same_keys = sorted(slots) == sorted(state["slots"])
    equal = same_keys and all(torch.equal(slots[k], state["slots"][k]) for k in slots)
    same_state = bool(equal and final["updates"] == state["updates"])
    return {"rewards_equal": run.rewards == rewards, "state_equal": same_state,
            "tensors": len(slots), "updates": final["updates"]}


def _edge(values: list[float], first: bool) -> float:
    k = max(1, min(3, len(values) // 4))
    return statistics.fmean(values[:k] if first else values[-k:])


def _summary(profiles, times, targets, runs, placements, moves, replay, migration_s, wall_s,
             policy: str = POLICY) -> dict:
    jobs = {}
    for p in profiles:
        r = runs[p.name]
        groups = [r.placement["group_id"]] + [m["to_group"] for m in r.moves]
        jobs[p.name] = {
            "iterations_done": r.iterations_done, "iterations_target": targets[p.name],
            "iterations_logged": len(r.rewards), "t_roll_s": times[p.name][0], "t_train_s": times[p.name][1],
            "slo": p.slo, "groups": groups, "moved": bool(r.moves), "params": r.params,
            "mean_iteration_s": r.mean_iteration_s, "reward_first": _edge(r.rewards, True),
            "reward_last": _edge(r.rewards, False), "rewards": r.rewards,
        }
    return {"policy": policy, "migration_s_planned": migration_s, "wall_s": wall_s, "placements": placements,
            "moves": [{k: m[k] for k in ("job_id", "from_group", "to_group", "seconds", "handoff_s", "state_bytes",
                                         "from_nodes", "to_nodes", "after_iteration", "reward_before",
                                         "reward_after", "at")} for m in moves],
            "jobs": jobs, "replay": replay}


def _write(summary: dict, runs: dict, events: list[dict], out_dir: Path) -> None:
    from rollmux.report.demo_plots import measured_gantt, reward_curves

    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    full = {"summary": summary, "runs": {k: r.to_dict() for k, r in runs.items()}, "events": events}
    (out_dir / "results.json").write_text(json.dumps(full, indent=1, default=list))
    spans = [{"job_id": s.job_id, "pool": s.pool, "nodes": s.nodes, "start": s.start, "end": s.end}
             for r in runs.values() for s in r.spans]
    measured_gantt(spans, out_dir / "gantt.png",
                   f"GRPO jobs under {summary['policy']}: measured phases per node (solid: rollout, hatched: "
                   "train; dashed: a move)", moves=summary["moves"])
    reward_curves({k: {"multiplexed": r.rewards} for k, r in runs.items()}, out_dir / "rewards.png")
