"""Run a placed job's workers on exactly the Ray nodes its RollMux placement pins.

Convention
----------
Every physical Ray node of a RollMux pool advertises one custom resource naming its
RollMux node id, ``rollmux_node:<id>`` with capacity 1, plus its pool's GPU count
(``node_resources``). A worker pinned to node ``R0`` asks for a small fraction
(``claim``, default 0.01) of ``rollmux_node:R0``; only the node carrying that resource
can host it, and up to ``1 / claim`` workers (of every job in a co-execution group)
fit there side by side. Workers claim no CPUs and no GPUs from Ray: the GPUs of a
shared node are time-multiplexed by the control plane's grants, not by Ray's
accounting.

Contract of ``RayJobRunner``
----------------------------
* Invalid arguments raise ``SpecError`` at construction, before anything touches Ray.
* ``start`` checks, before creating anything, that no other started runner has the job
  id, in this driver or another one connected to the cluster (``RayAdapterError``) and that every pinned node is alive in the Ray cluster and
  advertises its ``rollmux_node:<id>`` resource (``UnknownNodeError``).
* It then reserves one placement-group bundle per worker, each bundle requiring its
  node's resource, and waits at most ``timeout_s`` for the reservation; on timeout it
  removes the group and raises ``PlacementTimeout``. Either way nothing is left behind.
* One worker actor is created per bundle; its constructor receives a ``WorkerInfo``.
  If creating them fails, whatever was created is torn down before the error propagates.
* ``shutdown`` kills the actors and removes the placement group; it is idempotent and
  safe after the Ray connection is gone.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rollmux.errors import RollMuxError, SpecError
from rollmux.model import POOLS, ROLLOUT, TRAIN
from rollmux.plan_state import Placement
from rollmux.runtime.ray_start import start_ray

NODE_RESOURCE_PREFIX = "rollmux_node:"
MIN_CLAIM = 0.0001  # Ray's resource precision: a smaller fractional quantity is refused at scheduling
MAX_TIMEOUT_S = 86_400.0  # a reservation's wait: finite (Ray overflows on inf)
GPU_RESOURCE = {ROLLOUT: "rollout_gpu", TRAIN: "train_gpu"}


class RayAdapterError(RollMuxError):
    """Base of the errors raised while mapping a placement onto a Ray cluster."""


class UnknownNodeError(RayAdapterError):
    """Pinned RollMux node ids that no alive Ray node advertises; nothing was created."""

    def __init__(self, job_id: str, missing: Sequence[str], known: Sequence[str]) -> None:
        self.job_id = job_id
        self.missing = tuple(missing)
        self.known = tuple(known)
        super().__init__(
            f"job {job_id!r}: no alive Ray node advertises "
            f"{', '.join(node_resource(n) for n in self.missing)}; "
            f"known RollMux nodes: {', '.join(self.known) or 'none'}"
        )


class PlacementTimeout(RayAdapterError):
    """The workers' reservation was not granted in time; it has been withdrawn."""

    def __init__(self, job_id: str, timeout_s: float) -> None:
        self.job_id = job_id
        self.timeout_s = timeout_s
        super().__init__(
            f"job {job_id!r}: placement group not ready after {timeout_s:g} s "
            "(pinned nodes full or unreachable); reservation removed"
        )


def node_resource(node_id: str) -> str:
    """The custom resource name a Ray node carries to be RollMux node ``node_id``."""
    return f"{NODE_RESOURCE_PREFIX}{node_id}"


def node_resources(node_id: str, pool: str, gpus: int) -> dict[str, float]:
    """Custom resources a Ray node of ``pool`` advertises to be RollMux node ``node_id``.

    E.g. ``node_resources("R0", "rollout", 8) == {"rollmux_node:R0": 1, "rollout_gpu": 8}``.
    Raises ``SpecError`` on an empty id, an unknown pool or a negative GPU count.
    """
    if not node_id or NODE_RESOURCE_PREFIX in node_id:
        raise SpecError("node_id", node_id, "a non-empty RollMux node id such as 'R0'")
    if pool not in POOLS:
        raise SpecError("pool", pool, f"one of {POOLS}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise SpecError("gpus", gpus, "an integer >= 0")
    return {node_resource(node_id): 1, GPU_RESOURCE[pool]: gpus}


def rollmux_nodes() -> dict[str, str]:
    """Alive Ray nodes of the connected cluster that carry a RollMux id: RollMux id -> Ray node id."""
    found: dict[str, str] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        for name in node["Resources"]:
            if name.startswith(NODE_RESOURCE_PREFIX):
                found[name[len(NODE_RESOURCE_PREFIX):]] = node["NodeID"]
    return found


@contextmanager
def local_cluster(
    rollout_nodes: Sequence[str],
    train_nodes: Sequence[str],
    gpus_per_node: int = 8,
    *,
    num_cpus: int = 1,
    object_store_memory: int = 80 * 1024**2,
) -> Iterator[Cluster]:
    """A local multi-node Ray cluster for tests: one Ray node per RollMux node id.

    The first node is the head. Each node carries ``node_resources`` with
    ``gpus_per_node`` simulated GPUs. The driver is connected (``ray.init``) on entry;
    on exit it is disconnected and every node is stopped, even if the body raised.
    """
    specs = [(n, ROLLOUT) for n in rollout_nodes] + [(n, TRAIN) for n in train_nodes]
    if not specs:
        raise SpecError("nodes", [], "at least one rollout or train node id")
    ids = [n for n, _ in specs]
    if len(set(ids)) != len(ids):
        raise SpecError("nodes", ids, "distinct node ids")
    args = [
        {
            "num_cpus": num_cpus,
            "num_gpus": 0,
            "object_store_memory": object_store_memory,
            "resources": node_resources(node_id, pool, gpus_per_node),
        }
        for node_id, pool in specs
    ]
    def start() -> Cluster:
        cluster = Cluster(initialize_head=True, head_node_args={**args[0], "include_dashboard": False})
        try:
            for node_args in args[1:]:
                cluster.add_node(**node_args)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address)
        except BaseException:
            ray.shutdown()
            cluster.shutdown()
            raise
        return cluster

    cluster = start_ray(start)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextmanager
def demo_ray(rollout_nodes: Sequence[str], train_nodes: Sequence[str], one_node: bool,
             gpus_per_node: int = 8) -> Iterator[Cluster | None]:
    """The local Ray of the live demos: one Ray node per RollMux node (``local_cluster``,
    yielded), or with ``one_node`` (their quick runs, in tests) one Ray node on 127.0.0.1
    advertising every RollMux node's resources (None): the same pinning, since workers
    are placed by those resources, with one raylet instead of one per RollMux node.
    Shut down on exit."""
    if not one_node:
        with local_cluster(rollout_nodes, train_nodes, gpus_per_node, num_cpus=1) as cluster:
            yield cluster
        return
    resources: dict[str, float] = {}
    for pool, nodes in ((ROLLOUT, rollout_nodes), (TRAIN, train_nodes)):
        for node_id in nodes:
            resources.update(node_resources(node_id, pool, gpus_per_node))
        resources[GPU_RESOURCE[pool]] = gpus_per_node * len(nodes)
    start_ray(lambda: ray.init(address="local", num_cpus=2, resources=resources, include_dashboard=False,
                               log_to_driver=False, _node_ip_address="127.0.0.1"))
    try:
        yield None
    finally:
        ray.shutdown()


@dataclass(slots=True, frozen=True)
class WorkerInfo:
    """What a worker actor's constructor receives: who it is and where it was pinned."""

    job_id: str
    pool: str
    node_id: str
    index: int


@dataclass(slots=True, frozen=True)
class WorkerLocation:
    """Where a worker actually runs, as reported from inside the actor."""

    pool: str
    index: int
    planned_node: str
    ray_node_id: str
    # RollMux id of ``ray_node_id``: the planned node when that Ray node carries it (one Ray
    # node may carry several, as ``demo_ray(one_node=True)`` makes), else the one id the Ray
    # node carries; None if it carries none or several
    node_id: str | None


def _ray_node_id(_actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


def _as_actor_class(field: str, cls: type) -> Any:
    """``cls`` as a Ray actor class; raises ``SpecError`` naming ``field`` unless it is a class or one."""
    if isinstance(cls, ray.actor.ActorClass):
        return cls
    if not isinstance(cls, type):
        raise SpecError(field, cls, "a worker class or a Ray actor class (@ray.remote)")
    return ray.remote(cls)


def _placement_group_alive(name: str) -> bool:
    """Whether the connected cluster holds a placement group named ``name`` that is not
    removed, whichever driver and Ray namespace created it (the GCS's table of every group:
    ``get_placement_group`` looks in the caller's namespace only, and each ``ray.init``
    without one gets a namespace of its own)."""
    return any(info.get("name") == name and info.get("state") != "REMOVED"
               for info in placement_group_table().values())


class RayJobRunner:
    """One job's worker actors, pinned to the nodes of its placement.

    ``rollout_worker`` / ``train_worker`` are Ray actor classes (``@ray.remote``) or
    plain classes; their constructor takes one ``WorkerInfo``. ``workers_per_node``
    actors are started on each pinned node, each claiming ``claim`` of that node's
    ``rollmux_node:<id>`` resource and no CPU or GPU. ``actor_options`` are extra
    ``.options(...)`` for every worker (e.g. ``runtime_env``); scheduling keys are ours.

    Invalid arguments raise ``SpecError`` before anything touches Ray: a ``job_id`` that is
    not a non-empty string, a ``placement`` that is not a ``Placement`` or pins no node, a
    worker that is neither a class nor a Ray actor class, a ``claim`` outside
    [``MIN_CLAIM``, 1] (Ray cannot represent less), and a ``claim`` whose workers can never fit on one node
    (``claim`` x ``workers_per_node`` x the pools pinned to that node above 1).
    """

    def __init__(
        self,
        job_id: str,
        placement: Placement,
        rollout_worker: type,
        train_worker: type,
        *,
        workers_per_node: int = 1,
        claim: float = 0.01,
        timeout_s: float = 60.0,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(job_id, str) or not job_id:
            raise SpecError("job_id", job_id, "a non-empty string")
        if not isinstance(placement, Placement):
            raise SpecError("placement", placement, "a rollmux.plan_state.Placement")
        if isinstance(workers_per_node, bool) or not isinstance(workers_per_node, int) or workers_per_node < 1:
            raise SpecError("workers_per_node", workers_per_node, "an integer >= 1")
        if isinstance(claim, bool) or not isinstance(claim, (int, float)) or not MIN_CLAIM <= claim <= 1:
            raise SpecError("claim", claim, f"a fraction in [{MIN_CLAIM:g}, 1] (Ray's resource precision)")
        per_node = Counter((*placement.rollout_nodes, *placement.train_nodes))
        for node, pools in per_node.items():
            if claim * workers_per_node * pools > 1 + 1e-9:
                raise SpecError("claim", claim, f"at most 1/{workers_per_node * pools} so that the "
                                f"{workers_per_node * pools} workers pinned to node {node} fit there")
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not 0 < timeout_s <= MAX_TIMEOUT_S):
            raise SpecError("timeout_s", timeout_s, f"a positive number of seconds, at most {MAX_TIMEOUT_S:g}")
        if not (*placement.rollout_nodes, *placement.train_nodes):
            raise SpecError("placement", placement, "at least one rollout or train node")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise SpecError("actor_options", actor_options, "a dict of Ray actor options")
        reserved = {"resources", "num_cpus", "num_gpus", "scheduling_strategy", "placement_group"}
        clash = reserved.intersection(actor_options or {})
        if clash:
            raise SpecError("actor_options", sorted(clash), "no scheduling keys (the runner sets them)")
        self.job_id = job_id
        self.placement = placement
        self._classes = {pool: _as_actor_class(f"{pool}_worker", cls)
                         for pool, cls in ((ROLLOUT, rollout_worker), (TRAIN, train_worker))}
        self._nodes = {ROLLOUT: tuple(placement.rollout_nodes), TRAIN: tuple(placement.train_nodes)}
        self.workers_per_node = workers_per_node
        self.claim = claim
        self.timeout_s = timeout_s
        self.actor_options = dict(actor_options or {})
        self._pg: PlacementGroup | None = None
        self._actors: dict[str, list[Any]] = {ROLLOUT: [], TRAIN: []}
        self._infos: dict[str, list[WorkerInfo]] = {ROLLOUT: [], TRAIN: []}

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> RayJobRunner:
        """Reserve the pinned nodes and start the workers; returns self.

        Raises ``UnknownNodeError`` or ``PlacementTimeout`` with nothing left behind (also
        when interrupted while it waits), and ``RayAdapterError`` if already started, if
        another started runner has this job id (its placement group ``rollmux-<job_id>``
        is alive), or without a Ray connection.
        """
        if self._pg is not None:
            raise RayAdapterError(f"job {self.job_id!r}: already started")
        if not ray.is_initialized():
            raise RayAdapterError(f"job {self.job_id!r}: no Ray connection (ray.init first, to the cluster whose "
                                  f"nodes carry the rollmux_node:<id> resources)")
        name = f"rollmux-{self.job_id}"
        if _placement_group_alive(name):
            raise RayAdapterError(f"job {self.job_id!r}: another runner of this job id is started "
                                  f"(placement group {name!r} exists); shut it down first")
        self._check_nodes()
        infos = [
            WorkerInfo(self.job_id, pool, node, i * self.workers_per_node + k)
            for pool in POOLS
            for i, node in enumerate(self._nodes[pool])
            for k in range(self.workers_per_node)
        ]
        bundles = [{node_resource(info.node_id): self.claim} for info in infos]
        # The pin comes from each bundle's resource; "SPREAD" is only a soft tie-breaker,
        # so several workers (or both pools of a colocated job) may share one node.
        pg = placement_group(bundles, strategy="SPREAD", name=name)
        try:
            ready, _ = ray.wait([pg.ready()], timeout=self.timeout_s)
        except BaseException:  # (Ctrl-C while waiting): the reservation goes too
            remove_placement_group(pg)
            raise
        if not ready:
            remove_placement_group(pg)
            raise PlacementTimeout(self.job_id, self.timeout_s)
        self._pg = pg
        try:
            for index, info in enumerate(infos):
                actor = self._classes[info.pool].options(
                    **self.actor_options,
                    num_cpus=0,
                    num_gpus=0,
                    resources={node_resource(info.node_id): self.claim},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                ).remote(info)
                self._actors[info.pool].append(actor)
                self._infos[info.pool].append(info)
        except BaseException:
            self.shutdown()  # e.g. bad actor_options: leave nothing half-started
            raise
        return self

    def shutdown(self) -> None:
        """Kill the workers and withdraw the reservation. Idempotent; a no-op once
        the driver has disconnected (the cluster took everything down with it)."""
        actors = [a for pool in POOLS for a in self._actors[pool]]
        pg, self._pg = self._pg, None
        self._actors = {ROLLOUT: [], TRAIN: []}
        self._infos = {ROLLOUT: [], TRAIN: []}
        if not ray.is_initialized():
            return
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if pg is not None:
            remove_placement_group(pg)

    def __enter__(self) -> RayJobRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- queries ---------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._pg is not None

    @property
    def placement_group(self) -> PlacementGroup | None:
        """The job's reservation while started (one bundle per worker, pools in order)."""
        return self._pg

    def workers(self, pool: str) -> list[Any]:
        """The actor handles of ``pool``, in node order then index order."""
        if pool not in POOLS:
            raise SpecError("pool", pool, f"one of {POOLS}")
        return list(self._actors[pool])

    def where(self, timeout_s: float | None = None) -> list[WorkerLocation]:
        """Ask every worker which Ray node it runs on and map it back to a RollMux id
        (``WorkerLocation.node_id``).

        Blocks until the workers answer (their constructors have run); a worker that
        failed to start raises its Ray error here.
        """
        entries = [(info, actor) for pool in POOLS for info, actor in zip(self._infos[pool], self._actors[pool])]
        ray_ids = ray.get([actor.__ray_call__.remote(_ray_node_id) for _, actor in entries], timeout=timeout_s)
        known = rollmux_nodes()
        carried: dict[str, list[str]] = {}
        for node, ray_id in known.items():
            carried.setdefault(ray_id, []).append(node)

        def rollmux_id(planned: str, ray_id: str) -> str | None:
            if known.get(planned) == ray_id:
                return planned
            ids = carried.get(ray_id, [])
            return ids[0] if len(ids) == 1 else None

        return [WorkerLocation(info.pool, info.index, info.node_id, ray_id, rollmux_id(info.node_id, ray_id))
                for (info, _), ray_id in zip(entries, ray_ids)]

    def _check_nodes(self) -> None:
        known = rollmux_nodes()
        wanted = dict.fromkeys(n for pool in POOLS for n in self._nodes[pool])
        missing = [n for n in wanted if n not in known]
        if missing:
            raise UnknownNodeError(self.job_id, missing, sorted(known))
