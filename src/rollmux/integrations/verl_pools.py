"""veRL resource pools pinned to a RollMux placement.

veRL places each worker group through a ``RayResourcePool``: one Ray placement group
per node, one bundle per GPU process (``resource_pool_spec = {pool: [gpus, gpus, ...]}``,
one entry per node), and a ``ResourcePoolManager`` maps each ``Role`` to a pool. Its own
pools land on whichever nodes have free GPUs. Here each node's placement group also
asks, in every bundle, for a sliver (``CLAIM``) of the node's ``rollmux_node:<id>``
resource (``rollmux.runtime.ray_adapter``'s convention), so it can only be reserved on
that RollMux node.

Layouts (``verl_pools(placement)``):

* colocated (rollout nodes == training nodes; veRL's hybrid engine, the only mode of
  ``RayPPOTrainer``): one pool ``rollmux_colocated`` on those nodes; every role maps
  to it.
* disaggregated: ``rollmux_rollout`` on the rollout nodes and ``rollmux_train`` on the
  training nodes. ``Role.Rollout`` (standalone generation replicas) maps to the
  rollout pool; the trainer side (``Actor``, ``ActorRollout``, ``ActorRolloutRef``,
  ``Critic``, ``RefPolicy``, ``RewardModel``, ``TeacherModel``) to the training pool.
  veRL's hybrid ``ActorRollout`` group updates the policy, so it belongs with training.

Each bundle reserves one whole GPU, as veRL's own pools do, and the placement groups are
named after the job (``<job_id>:<pool>:<node>``), so two jobs' pools never clash by name.
Not built: two veRL jobs sharing the same GPUs (what a RollMux co-execution group does
with them, time-sliced by grants): the second job's pool would wait for GPUs the first
job's placement groups hold. That needs veRL workers that claim no Ray GPU and pick
their device themselves (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``); fractional
GPU bundles do not do it (Ray packs a job's fractional bundles onto one GPU).

``RollMuxResourcePoolManager.create_resource_pool`` checks, before reserving anything,
that every pinned node is alive and advertises its RollMux resource
(``UnknownNodeError``) and has the GPUs asked for (``FrameworkConfigError``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from verl.single_controller.ray.base import RayResourcePool, ResourcePoolManager, sort_placement_group_by_node_ip
from verl.trainer.ppo.utils import Role

from rollmux.errors import FrameworkConfigError
from rollmux.integrations.verl_config import COLOCATED, VerlPlacement
from rollmux.runtime.ray_adapter import UnknownNodeError, node_resource, rollmux_nodes

CLAIM = 0.001  # of a node's rollmux_node:<id> (capacity 1) per bundle: up to 1000 bundles per node
COLOCATED_POOL = "rollmux_colocated"
ROLLOUT_POOL = "rollmux_rollout"
TRAIN_POOL = "rollmux_train"
ROLLOUT_ROLES = (Role.Rollout,)
TRAIN_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef, Role.Critic, Role.RefPolicy, Role.RewardModel,
               Role.TeacherModel)


class RollMuxResourcePool(RayResourcePool):
    """A ``RayResourcePool`` whose i-th node placement group is pinned to RollMux node ``node_ids[i]``.

    ``process_on_nodes`` as veRL's (GPU processes per node). Each bundle holds
    ``max_colocate_count`` CPUs and one GPU (veRL's bundle), plus ``CLAIM`` of its
    node's RollMux resource.
    """

    def __init__(self, node_ids: Sequence[str], process_on_nodes: list[int], *, use_gpu: bool = True,
                 name_prefix: str | None = None, max_colocate_count: int = 3, detached: bool = False) -> None:
        if len(node_ids) != len(process_on_nodes):
            raise FrameworkConfigError("node_ids", list(node_ids),
                                       f"one node per entry of process_on_nodes ({len(process_on_nodes)})", "veRL pool")
        super().__init__(list(process_on_nodes), use_gpu, name_prefix, max_colocate_count, detached)
        self.node_ids = tuple(node_ids)

    def bundle(self, node_id: str, device_resource: str = "GPU") -> dict[str, float]:
        """The resources of one bundle on ``node_id``."""
        out: dict[str, float] = {"CPU": self.max_colocate_count, node_resource(node_id): CLAIM}
        if self.use_gpu:
            out[device_resource] = 1
        return out

    def get_placement_groups(self, strategy: str = "STRICT_PACK", name: str | None = None,
                             device_name: str = "cuda") -> list:
        if self.pgs is not None:
            return self.pgs
        from verl.plugin.platform import get_platform

        device_resource = get_platform().ray_resource_name()
        prefix = name or f"{self.name_prefix}:"
        pgs = [placement_group(bundles=[self.bundle(node, device_resource) for _ in range(count)],
                               strategy=strategy, name=f"{prefix}{node}",
                               lifetime="detached" if self.detached else None)
               for node, count in zip(self.node_ids, self._store)]
        try:
            ray.get([pg.ready() for pg in pgs])
        except BaseException:
            for pg in pgs:
                remove_placement_group(pg)
            raise
        self.pgs = sort_placement_group_by_node_ip(pgs)
        return self.pgs

    def remove(self) -> None:
        """Withdraw the pool's placement groups (idempotent)."""
        pgs, self.pgs = self.pgs, None
        for pg in pgs or ():
            remove_placement_group(pg)


@dataclass
class RollMuxResourcePoolManager(ResourcePoolManager):
    """veRL's ``ResourcePoolManager`` with every pool pinned: ``nodes[pool]`` lists its RollMux node ids.

    Build one with ``verl_pools(placement)``; pass it to ``RayPPOTrainer`` as
    ``resource_pool_manager`` (``mapping`` is role -> pool name, as veRL's).
    """

    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    job_id: str = "verl"
    use_gpu: bool = True

    def create_resource_pool(self) -> None:
        for name in self.resource_pool_spec:
            if len(self.nodes.get(name, ())) != len(self.resource_pool_spec[name]):
                raise FrameworkConfigError(f"nodes[{name!r}]", list(self.nodes.get(name, ())),
                                           f"{len(self.resource_pool_spec[name])} node ids", "veRL pools")
        self._check_resource_available()
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RollMuxResourcePool(
                self.nodes[name], process_on_nodes, use_gpu=self.use_gpu, name_prefix=f"{self.job_id}:{name}",
                max_colocate_count=self.max_colocate_count)

    def _check_resource_available(self) -> None:
        known = rollmux_nodes()
        wanted = list(dict.fromkeys(n for nodes in self.nodes.values() for n in nodes))
        missing = [n for n in wanted if n not in known]
        if missing:
            raise UnknownNodeError("veRL pools", missing, sorted(known))
        devices = ["CPU"]  # each bundle holds max_colocate_count CPUs, and a GPU with use_gpu
        if self.use_gpu:
            from verl.plugin.platform import get_platform

            devices.append(get_platform().ray_resource_name())
        alive = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        for device in devices:
            per_bundle = self.max_colocate_count if device == "CPU" else 1
            need: dict[str, float] = {}
            for name, nodes in self.nodes.items():
                for node, count in zip(nodes, self.resource_pool_spec[name]):
                    need[node] = need.get(node, 0) + count * per_bundle
            for node, amount in need.items():
                have = alive.get(known[node], {}).get(device, 0)
                if have + 1e-9 < amount:  # (the reservation would wait for good)
                    raise FrameworkConfigError("resource_pool_spec", dict(self.resource_pool_spec),
                                               f"at most the {have:g} {device} of node {node} ({amount:g} asked "
                                               f"there: {per_bundle:g} per process)", "veRL pools")

    def remove(self) -> None:
        """Withdraw every pool's placement groups (idempotent)."""
        for pool in self.resource_pool_dict.values():
            if isinstance(pool, RollMuxResourcePool):
                pool.remove()


def role_mapping(layout: str, roles: Sequence[Role] | None = None) -> dict[Role, str]:
    """Role -> pool name for ``layout`` (module docstring); ``roles`` limits it (default: all of them)."""
    roles = tuple(Role) if roles is None else tuple(roles)
    if layout == COLOCATED:
        return {r: COLOCATED_POOL for r in roles}
    return {r: ROLLOUT_POOL if r in ROLLOUT_ROLES else TRAIN_POOL for r in roles if r in ROLLOUT_ROLES + TRAIN_ROLES}


def verl_pools(placement: Any, gpus_per_node: int = 8, *, roles: Sequence[Role] | None = None,
               max_colocate_count: int = 3, job_id: str = "verl",
               use_gpu: bool = True) -> RollMuxResourcePoolManager:
    """The pinned ``ResourcePoolManager`` of a RollMux placement (``Placement``, the SDK's dict or ``VerlPlacement``)."""
    where = VerlPlacement.of(placement, gpus_per_node)
    g = where.gpus_per_node
    if where.layout == COLOCATED:
        spec = {COLOCATED_POOL: [g] * len(where.train_nodes)}
        nodes = {COLOCATED_POOL: where.train_nodes}
    else:
        spec = {ROLLOUT_POOL: [g] * len(where.rollout_nodes), TRAIN_POOL: [g] * len(where.train_nodes)}
        nodes = {ROLLOUT_POOL: where.rollout_nodes, TRAIN_POOL: where.train_nodes}
    return RollMuxResourcePoolManager(resource_pool_spec=spec, mapping=role_mapping(where.layout, roles),
                                      max_colocate_count=max_colocate_count, nodes=nodes,
                                      job_id=job_id, use_gpu=use_gpu)


def pool_nodes(manager: RollMuxResourcePoolManager) -> Mapping[str, list[str]]:
    """Where each created pool's placement groups were actually reserved: pool -> RollMux node per group."""
    by_ray_id = {ray_id: node for node, ray_id in rollmux_nodes().items()}
    out: dict[str, list[str]] = {}
    for name, pool in manager.resource_pool_dict.items():
        placed = []
        for pg in pool.get_placement_groups():
            table = ray.util.placement_group_table(pg)
            placed.append(by_ray_id.get(table["bundles_to_node_id"][0], "?"))
        out[name] = placed
    return out
