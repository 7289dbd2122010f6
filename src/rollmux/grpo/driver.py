"""One GRPO job's driver: register with the control plane, start the pinned Ray
workers, run the phases under RollMux grants, and record what happened.

``run_job`` is the whole life of a job::

    Client.submit(job_spec(...)) -> wait_placed -> RayJobRunner(placement).start() -> setup workers
    repeat `iterations` times:
        with job.phase("rollout", state=RemoteState(rollout worker)):   # grant, then load
            weight sync: training worker -> rollout worker(s)             # after an update
            batch = rollout(step, None)                                   # samples with the synced weights
        with job.phase("train", state=RemoteState(train worker)):        # then offload
            train(batch)                                                  # the weights stay on the trainer
    job.complete(); workers shut down

Weight sync (``_Workers.sync_weights``, ``rollmux.weight_sync``): the updated weights go
from the training worker (a ``WeightSender``) straight to the job's rollout workers
(``WeightReceiver``s: the rollout worker and, with ``tail``, its helpers), never through
this driver: ``scatter_broadcast_sync`` with several rollout workers (one model copy
across the pools, the rest an all-gather among the rollout workers), ``naive_sync`` with
one (the same single copy). It runs at the start of the next rollout phase, inside its
grant, once the rollout state is loaded, not at the end of the train phase: a grant
covers the nodes of its own pool only, and while this job trains, its rollout nodes
belong to whichever job the group scheduler granted them (the point of multiplexing),
so bytes sent to them then would land during another job's grant, and the rollout
worker's state is parked in its cache outside its own phases. The training side only
serves the host copy its train phase kept (``TrainWorker.state``), no device work on a
node this job holds no grant on. Each sync is verified (``verify_weights``: SHA-256 per
tensor, every receiver against the trainer), and the rollout worker checks that its
policy holds the received weights bit for bit before sampling. ``JobRun.weight_syncs``
records each sync (bytes across the pools, inside the rollout pool, seconds, the model
digest); the sync's seconds fall inside the rollout phase's span. The last update of a
run is not sent (no rollout follows it), as before.

Moves (``movable=True``, a consolidating control plane): the handle's ``on_move``
is ``_Workers.move``. At the iteration boundary where the service moved the job, the
old workers export their parked state (the StateCache host buffers, the optimizer's
non-tensor state and the update counter) into the Ray object store, a new
``RayJobRunner`` starts the workers on the directive's nodes, they import that state,
and the old workers go. The next phase is granted on the new nodes and the run goes
on where it left off; ``JobRun.moves`` records each hand-off and its duration. A move
whose new nodes do not take the workers restarts them where they were, with the same
state, and fails; the service then places the job afresh, and at the next iteration
boundary its workers follow it there (``_Workers.follow``).
``replay_job`` runs the same job in this process without Ray or the control plane,
for checking that a moved run is bit for bit the run without the move.

``warm_start_weights`` runs the supervised warm-up once, in the calling process, so
that every run of a profile (solo or multiplexed) starts from the same weights.
Everything measured comes back in a ``JobRun``: phase spans as the SDK saw them
(grant arrival to release, wall-clock), per-iteration rewards and training stats,
and the cache's switch records.
"""
from __future__ import annotations

import threading

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from typing import Any

import ray
import torch

from rollmux.grpo.policy import build_policy, warm_up
from rollmux.grpo.profiles import JobProfile
from rollmux.grpo.task import get_task
from rollmux.grpo.workers import RolloutWorker, TrainWorker
from rollmux.model import ROLLOUT, TRAIN
from rollmux.plan_state import Placement
from rollmux.runtime.ray_adapter import RayJobRunner, WorkerInfo
from rollmux.runtime.sdk import JobHandle
from rollmux.weight_sync import naive_sync, scatter_broadcast_sync, verify_weights


@dataclass(slots=True)
class PhaseSpan:
    """One granted phase as the job's SDK measured it (wall-clock seconds)."""

    job_id: str
    pool: str
    nodes: tuple[str, ...]
    iteration: int
    start: float
    end: float
    share: float = 1.0  # the grant's share (< 1: a long-tail slice of another job's node)
    #: Long-tail rollouts: [start, end, gpus, service_gpus] per stretch of the phase on
    #: each of its nodes; ``gpus`` is what the job's active rollout workers stand for
    #: (workers x GPUs per worker), ``service_gpus`` what the service accounts it (the
    #: GPUs a donor keeps, a recipient's share x GPUs per node). Empty: the whole node.
    segments: list = field(default_factory=list)


@dataclass(slots=True)
class Switch:
    """One warm switch of a worker's state (a StateCache SwitchRecord, flattened)."""

    job_id: str
    pool: str
    direction: str
    path: str
    bytes: int
    seconds: float


@dataclass(slots=True)
class JobRun:
    """Everything one run of one job measured."""

    job_id: str
    profile: str
    iterations: int
    placement: dict
    params: int
    spans: list[PhaseSpan] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    exact: list[float] = field(default_factory=list)
    train_stats: list[dict] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    moves: list[dict] = field(default_factory=list)
    iterations_done: int = 0
    #: One record per weight sync (``_Workers.sync_weights``), keyed by the iteration
    #: whose rollout it fed (the weights of the update before it).
    weight_syncs: list[dict] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.spans[0].start

    @property
    def end(self) -> float:
        return self.spans[-1].end

    @property
    def mean_iteration_s(self) -> float:
        """Wall time from the first grant to the last release, per iteration (waits included)."""
        return (self.end - self.start) / self.iterations

    def phase_seconds(self, pool: str, gpus_per_node: int = 8) -> float:
        """Node-seconds this job held in ``pool`` (a long-tail stretch counts its GPUs' fraction)."""
        total = 0.0
        for s in self.spans:
            if s.pool != pool:
                continue
            if s.segments:
                total += sum((b - a) * g / gpus_per_node for a, b, g, _ in s.segments) * len(s.nodes)
            else:
                total += (s.end - s.start) * len(s.nodes)
        return total

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_iteration_s": self.mean_iteration_s}

    def weight_sync_summary(self) -> dict:
        """The run's weight syncs: protocol, endpoints, model bytes, totals and per iteration
        (bytes across the pools, bytes inside the rollout pool, seconds)."""
        syncs = self.weight_syncs
        first = syncs[0] if syncs else {}
        return {"method": first.get("method"), "receivers": first.get("receivers"),
                "senders": first.get("senders"), "model_bytes": first.get("model_bytes"), "syncs": len(syncs),
                "cross_pool_bytes": sum(x["cross_pool_bytes"] for x in syncs),
                "intra_pool_bytes": sum(x["intra_pool_bytes"] for x in syncs),
                "seconds": sum(x["seconds"] for x in syncs),
                "per_iteration": [{k: x[k] for k in ("iteration", "cross_pool_bytes", "intra_pool_bytes", "seconds")}
                                  for x in syncs]}


class _Workers:
    """A job's two worker actors and the runner that placed them; ``move`` re-places them.

    The driver reaches its workers only through this object, so a move between two
    phases swaps them for every later phase.
    """

    def __init__(self, job_id: str, profile: JobProfile, placement: dict, weights: dict[str, torch.Tensor],
                 timeout_s: float = 120.0, rollout_workers: int = 1) -> None:
        self.job_id = job_id
        self.profile = profile
        self.timeout_s = timeout_s
        self.runner: RayJobRunner | None = None
        self.helpers: list[Any] = []
        self.where = (tuple(placement["rollout_nodes"]), tuple(placement["train_nodes"]))
        self._start(placement["group_id"])
        if rollout_workers > 1:
            self._start_helpers(rollout_workers - 1)
        self.params, _, *_ = ray.get([self.roll.setup.remote(profile, weights),
                                      self.train.setup.remote(profile, weights),
                                      *(h.setup.remote(profile, weights) for h in self.helpers)])
        self.moves: list[dict] = []
        self.repeated = 0  # move directives received again after the move was done (see ``move``)

    def _start_helpers(self, count: int) -> None:
        """More rollout workers of the job on its (first) rollout node, for chunked rollouts.

        The adapter's runner starts as many workers per node in both pools, so the extra
        rollout workers are plain actors pinned by the node's resource (no CPU or GPU
        claimed, as the runner's); they go with ``shutdown``.
        """
        from rollmux.runtime.ray_adapter import node_resource

        node = self.where[0][0]
        actor = ray.remote(RolloutWorker)
        self.helpers = [actor.options(num_cpus=0, num_gpus=0, resources={node_resource(node): 0.01})
                        .remote(WorkerInfo(self.job_id, ROLLOUT, node, k + 1)) for k in range(count)]

    @property
    def rollers(self) -> list[Any]:
        """The job's rollout workers: the runner's first, then the helpers."""
        return [self.roll, *self.helpers]

    def _start(self, group_id: str) -> None:
        self.group_id = group_id
        plan = Placement(group_id, *self.where)
        self.runner = RayJobRunner(self.job_id, plan, RolloutWorker, TrainWorker, timeout_s=self.timeout_s).start()
        self.roll, self.train = self.runner.workers(ROLLOUT)[0], self.runner.workers(TRAIN)[0]

    def actor(self, pool: str) -> Any:
        return self.roll if pool == ROLLOUT else self.train

    def sync_weights(self) -> dict:
        """Send the training worker's latest weights to every rollout worker of the job.

        Scatter + broadcast with several rollout workers, one pull with one; then every
        receiver is checked against the trainer (``verify_weights``). Call it inside the
        rollout phase's grant (see the module docstring). Returns the sync's record: the
        ``SyncReport`` fields, ``verify_s`` and the model ``digest``.
        """
        receivers = self.rollers
        protocol = scatter_broadcast_sync if len(receivers) > 1 else naive_sync
        report = protocol([self.train], receivers)
        t0 = time.perf_counter()
        digest = verify_weights([self.train], receivers)
        return {"method": report.method, "receivers": report.rollout_nodes, "senders": report.train_nodes,
                "model_bytes": report.model_bytes, "cross_pool_bytes": report.cross_pool_bytes,
                "intra_pool_bytes": report.intra_pool_bytes, "seconds": report.seconds,
                "stages": dict(report.stages), "verify_s": time.perf_counter() - t0, "digest": digest}

    def move(self, directive: dict) -> None:
        """``on_move``: hand the job's parked state to new workers on the directive's nodes
        (``_relocate``)."""
        if (self.moves and self.moves[-1]["to_group"] == directive["to_group"]
                and self.where == (tuple(directive["rollout_nodes"]), tuple(directive["train_nodes"]))):
            # Already there. The service repeats a regrouped member's directive after its
            # acknowledgement until every member of the new group has acknowledged (its
            # pending_move still returns it); the SDK then calls on_move again. Nothing
            # to do; wait a little so that the SDK's acquire/moved loop does not spin.
            self.repeated += 1
            time.sleep(0.25)
            return
        t0, wall0, old = time.perf_counter(), time.time(), self.where
        size = self._relocate(directive["to_group"], (tuple(directive["rollout_nodes"]),
                                                      tuple(directive["train_nodes"])))
        self.moves.append({"job_id": self.job_id, "from_group": directive["from_group"],
                           "to_group": directive["to_group"], "from_nodes": list(old[0] + old[1]),
                           "to_nodes": list(self.where[0] + self.where[1]), "state_bytes": size,
                           "at": wall0, "handoff_s": time.perf_counter() - t0})

    def follow(self, placement: dict) -> None:
        """Bring the workers to ``placement``, the job's nodes now, when they are elsewhere:
        a move that failed (or that the service undid) has the job placed afresh, and its
        workers must run where its grants are. Call it between iterations."""
        where = (tuple(placement["rollout_nodes"]), tuple(placement["train_nodes"]))
        if where != self.where:
            self._relocate(placement["group_id"], where)

    def _relocate(self, group_id: str, where: tuple[tuple[str, ...], tuple[str, ...]]) -> int:
        """New workers on ``where`` with the old ones' parked state; returns its bytes.

        The exports are objects in the Ray object store, owned by this driver, so they
        outlive the old actors; the old runner goes first (its reservation bears the
        job's name), then the new one starts and its workers import the state. When the
        new nodes do not take the workers (a node Ray does not know, a reservation that
        times out), workers start again where they were, with the same state, and the
        error is raised: the job loses no state (before, its workers were gone).
        """
        if self.helpers:
            raise RuntimeError(f"{self.job_id}: a job with several rollout workers does not move")
        exports = [self.roll.export_state.remote(), self.train.export_state.remote()]
        ray.wait(exports, num_returns=2, timeout=self.timeout_s, fetch_local=False)
        sizes = ray.get([self.roll.__ray_call__.remote(_state_bytes, exports[0]),
                         self.train.__ray_call__.remote(_state_bytes, exports[1])])
        old, old_group = self.where, self.group_id
        self.runner.shutdown()
        try:
            self._land(group_id, where, exports)
        except Exception:
            if self.runner is not None:
                self.runner.shutdown()
            self._land(old_group, old, exports)
            raise
        return sum(sizes)

    def _land(self, group_id: str, where: tuple[tuple[str, ...], tuple[str, ...]], exports: list[Any]) -> None:
        """Workers on ``where`` that import ``exports`` (the old workers' parked state)."""
        self.where = where
        self._start(group_id)
        ray.get([self.roll.import_state.remote(self.profile, exports[0]),
                 self.train.import_state.remote(self.profile, exports[1])], timeout=self.timeout_s)

    def export_train_state(self) -> dict:
        return ray.get(self.train.export_state.remote())

    def shutdown(self) -> None:
        helpers, self.helpers = self.helpers, []
        if helpers and ray.is_initialized():
            for h in helpers:
                ray.kill(h, no_restart=True)
        if self.runner is not None:
            self.runner.shutdown()


def _state_bytes(_actor: Any, state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state["slots"].values())


def warm_start_weights(profile: JobProfile) -> dict[str, torch.Tensor]:
    """The policy after the profile's supervised warm-up (deterministic for a profile)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_policy(profile.model, profile.seed)
        warm_up(model, get_task(profile.task), profile.warmup_steps, 64, profile.warmup_lr, profile.seed)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


class RemoteState:
    """The SDK's ``state=`` object for a worker actor: ``resident`` loads the actor's
    cached state when the phase is granted and offloads it before the grant goes back,
    recording both switches."""

    def __init__(self, actor: Any, job_id: str, pool: str, log: list[Switch]) -> None:
        self.actor = actor  # an actor handle, or a ``_Workers`` (the job's current worker of ``pool``)
        self.job_id = job_id
        self.pool = pool
        self.log = log

    @contextlib.contextmanager
    def resident(self, key: str, device: str) -> Iterator[None]:
        actor = self.actor.actor(self.pool) if isinstance(self.actor, _Workers) else self.actor
        self._note(ray.get(actor.switch_in.remote()))
        try:
            yield
        finally:
            self._note(ray.get(actor.switch_out.remote()))

    def _note(self, record: Any) -> None:
        self.log.append(Switch(self.job_id, self.pool, record.direction, record.path, record.bytes, record.seconds))


def job_spec(job_id: str, profile: JobProfile, t_roll_s: float, t_train_s: float,
             iterations: int | None = None, tail_workers: int | None = None) -> dict:
    """The control-plane spec of a job (one node per pool; the demo's nodes stand for 8-GPU machines).

    ``iterations``: the job's target, which the service counts (it departs the job after
    its last iteration) and which the whole-run SLO check of a move needs.
    ``tail_workers``: the GPUs its rollout keeps once its tail begins (the service's
    default is an eighth of its rollout GPUs).
    """
    spec = {"job_id": job_id, "t_roll_s": t_roll_s, "t_train_s": t_train_s, "slo": profile.slo,
            "model": profile.name}
    if iterations is not None:
        spec["iterations"] = iterations
    if tail_workers is not None:  # GPUs the rollout keeps in its long tail
        spec["tail_workers"] = tail_workers
    return spec


def run_job(job: JobHandle, profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor],
            placed_timeout_s: float = 300.0, on_iteration: Any = None, movable: bool = False,
            final_state: dict | None = None, tail: TailConfig | None = None) -> JobRun:
    """Run a submitted job to completion (``Client.submit`` made ``job``); returns its measurements.

    ``on_iteration(job_id, iteration, reward)``, if given, is called after every train phase.
    ``movable``: the handle's ``on_move`` hands the workers and their state to the nodes
    of a move directive (``_Workers.move``). ``final_state``, if given, receives the
    training worker's exported state after the last iteration (key ``job_id``).
    ``tail``: chunked rollouts over ``tail.workers`` rollout workers with the long-tail
    report (``_tail_rollout``); each rollout span then carries its ``segments``.
    The job is cancelled (and its workers stopped) if anything raises.
    """
    job_id = job.job_id
    workers = None
    shapes: dict[int, dict] = {}
    try:
        with job.lifetime():
            placement = job.wait_placed(timeout_s=placed_timeout_s)
            workers = _Workers(job_id, profile, placement, weights, rollout_workers=tail.workers if tail else 1)
            if movable:
                job.on_move = workers.move
            run = JobRun(job_id, profile.name, iterations, placement, workers.params, moves=workers.moves)
            states = {pool: RemoteState(workers, job_id, pool, run.switches) for pool in (ROLLOUT, TRAIN)}
            updated = False  # the trainer holds weights the rollout workers do not have yet
            for step in range(iterations):
                if job.placement is not None and job.view.get("move") is None:  # (no move under way: after
                    workers.follow(job.placement)                              # one that failed, placed afresh)
                with job.phase(ROLLOUT, state=states[ROLLOUT], device="cpu") as ph:
                    if updated:  # inside the rollout grant, rollout state loaded (module docstring)
                        run.weight_syncs.append({"iteration": step, **workers.sync_weights()})
                        updated = False
                    if tail is None:
                        batch, stats_ref = workers.roll.rollout.options(num_returns=2).remote(step, None)
                        stats = ray.get(stats_ref)
                    else:
                        batch, stats, shapes[step] = _tail_rollout(job, ph, workers, step, None, tail)
                with job.phase(TRAIN, state=states[TRAIN], device="cpu"):
                    run.train_stats.append(ray.get(workers.train.update.remote(batch)))
                    updated = True
                run.rewards.append(stats["reward"])
                run.exact.append(stats["exact"])
                run.iterations_done = step + 1
                if on_iteration is not None:
                    on_iteration(job_id, step, stats["reward"])
            if final_state is not None:
                final_state[job_id] = workers.export_train_state()
    finally:
        if workers is not None:
            workers.shutdown()
    run.spans = [PhaseSpan(job_id, name, nodes, i // 2, start, end)
                 for i, (name, nodes, _seq, start, end) in enumerate(job.history)]
    for span in run.spans:
        shape = shapes.get(span.iteration) if span.pool == ROLLOUT else None
        if shape is not None:
            span.share = shape["share"]
            points = shape["points"]
            times = [span.start] + [max(span.start, min(span.end, t)) for t, _, _ in points[1:]] + [span.end]
            span.segments = [[times[k], times[k + 1], g, sg] for k, (_, g, sg) in enumerate(points)
                             if times[k + 1] > times[k]]
    return run


@dataclass(frozen=True, slots=True)
class TailConfig:
    """The long-tail demo's rollout: ``workers`` rollout workers per job, each standing
    for ``gpus_per_node / workers`` GPUs of the job's rollout node; the rollout reports
    its fraction of sequences done once it reaches ``threshold``."""

    workers: int = 2
    threshold: float = 0.8
    gpus_per_node: int = 8

    @property
    def gpus_per_worker(self) -> int:
        return self.gpus_per_node // self.workers


def _tail_rollout(job: JobHandle, ph: Any, workers: _Workers, step: int, latest: Any,
                  tail: TailConfig) -> tuple[dict, dict, dict]:
    """One rollout in rounds of ``gen_batch`` chunks over the job's active rollout workers.

    A full grant starts on every worker; a slice (``share`` < 1) on ``share x workers``
    of them (at least 1). Rounds are lock-step (every active worker gets one chunk, then
    all are awaited), so between rounds no worker has work in flight. A full grant whose
    finished fraction reaches the threshold reports its tail (``Phase.tail``) and shrinks
    to the workers covering the GPUs the service lets it keep (ceil(keep / GPUs per
    worker)); the others are released (get no more chunks) and the rest continue on the
    kept ones. A slice polls its grant between rounds and grows to every worker once the
    donor's rollout has ended (share 1). Returns (batch, stats, shape), ``shape`` being
    the grant's share and the change points (time, gpus, service_gpus).
    """
    t0 = time.perf_counter()
    p = workers.profile
    rollers = workers.rollers
    total, per = len(rollers), tail.gpus_per_worker
    share = float(ph.grant.get("share", 1.0))
    active = total if share >= 1.0 else max(1, min(total, int(share * total + 1e-9)))
    points = [(None, active * per, share * tail.gpus_per_node)]
    helpers = rollers[1:]
    ray.get([h.switch_in.remote() for h in helpers])
    try:
        sizes = ray.get([r.prepare.remote(step, latest) for r in rollers])
        n = sizes[0]
        starts = list(range(0, n, p.gen_batch))
        parts: dict[int, dict] = {}
        k, tailed, sliced = 0, False, share < 1.0
        while k < len(starts):
            batch_starts = starts[k:k + active]
            for s, part in zip(batch_starts, ray.get([rollers[i].chunk.remote(step, s)
                                                      for i, s in enumerate(batch_starts)])):
                parts[s] = part
            k += len(batch_starts)
            if k >= len(starts):
                break
            done = sum(len(part["rewards"]) for part in parts.values())
            if not sliced and not tailed and done / n >= tail.threshold:
                at = time.time()
                keep = ph.tail(done / n)
                if 0 < keep < tail.gpus_per_node:
                    tailed = True
                    active = max(1, min(active, -(-keep // per)))
                    points.append((at, active * per, float(keep)))
            elif sliced:
                view = job.client.call("GET", f"/jobs/{job.job_id}", token=job.token)
                grant = view.get("grant") or {}
                if float(grant.get("share", 0.0)) >= 1.0:
                    sliced, active = False, total
                    points.append((time.time(), active * per, float(tail.gpus_per_node)))
    finally:
        ray.get([h.switch_out.remote() for h in helpers])
    ordered = [parts[s] for s in starts]
    rewards = torch.cat([part["rewards"] for part in ordered])
    batch = {"prompts": torch.cat([part["prompts"] for part in ordered]),
             "completions": torch.cat([part["completions"] for part in ordered]), "rewards": rewards}
    stats = {"reward": float(rewards.mean()), "exact": float((rewards == 1.0).float().mean()),
             "samples": len(rewards), "compute_s": time.perf_counter() - t0}
    return batch, stats, {"share": share, "points": points}


def replay_job(profile: JobProfile, iterations: int, weights: dict[str, torch.Tensor]) -> tuple[list[float], dict]:
    """The same job run in this process: no Ray, no control plane, no move.

    Same workers, seeds, data order and number of updates, with the same warm switch
    around every phase, one torch thread. Returns (reward per iteration, the training
    worker's exported state after the last iteration).
    """
    from rollmux.runtime.ray_adapter import WorkerInfo

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        roll = RolloutWorker(WorkerInfo(profile.name, ROLLOUT, "replay", 0))
        train = TrainWorker(WorkerInfo(profile.name, TRAIN, "replay", 0))
        roll.setup(profile, weights)
        train.setup(profile, weights)
        rewards, latest = [], None
        for step in range(iterations):
            roll.switch_in()
            batch, stats = roll.rollout(step, latest)
            roll.switch_out()
            train.switch_in()
            latest, _ = train.train(batch)
            train.switch_out()
            rewards.append(stats["reward"])
        return rewards, train.export_state()
    finally:
        torch.set_num_threads(threads)


def run_together(profiles: list, handles: list, run: Callable) -> dict:
    """``run(profile, handle)`` for every job at once, one thread each; returns their results
    by job name and re-raises the first error once all have stopped."""
    runs, errors = {}, []

    def drive(profile, handle) -> None:
        try:
            runs[profile.name] = run(profile, handle)
        except Exception as exc:  # re-raised below, after every thread has stopped
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(p, h), name=f"demo-{p.name}") for p, h in zip(profiles, handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {p.name: runs[p.name] for p in profiles}
