"""Weight synchronisation from the training pool to the rollout pool, over Ray.

After every update the rollout pool needs the trainer's new weights. Training and
rollout nodes sit in different pools joined by a slow link, so what matters is how many
bytes cross that link. Two protocols with one interface:

* ``naive_sync``: every rollout node pulls the whole model from the training nodes
  (veRL-style). Bytes across the pools: ``R x M`` (R rollout nodes, M model bytes).
* ``scatter_broadcast_sync`` (the RollMux paper's scheme): the model is cut into R
  disjoint shards; rollout node i pulls shard i from the training side, so exactly one
  model copy, ``M`` bytes, crosses the pools; then the rollout nodes all-gather the
  shards among themselves, ``(R - 1) x M`` bytes inside the rollout pool.

Contract
--------
* Endpoints. Train-side actors are ``WeightSender``s, rollout-side actors are
  ``WeightReceiver``s (or subclasses), one rollout actor per rollout node. Every sender
  holds the same state dict (replicas after the update, e.g. data-parallel ranks);
  ``plan_sync`` checks that their manifests (names, dtypes, shapes, bytes) agree and
  raises ``WeightSyncError`` otherwise.
* Sharding (``plan_shards``): the flat tensor list (state-dict order) is cut into R
  contiguous, disjoint ranges that together cover every tensor. Boundary k is the
  prefix end whose cumulative bytes are nearest ``k * M / R`` (ties: the lower index),
  so each shard holds ``M / R`` bytes give or take the largest tensor. Shard k is sent
  by sender ``k mod T``; with T > R some senders send nothing.
* Measurement. "Bytes" are tensor payload bytes (``Tensor.nbytes``; Ray's
  serialisation framing is not counted). A receiver counts a fetch as *across the
  pools* when the object it reads was created on a training node and as *inside the
  rollout pool* when it was created on a rollout node. Each protocol makes that
  classification physical: an object created on a training node is read by exactly one
  receiver (naive: every receiver gets fresh result objects from ``WeightSender.shard``;
  scatter: each published shard goes to one receiver), so Ray cannot serve it from a
  rollout node's copy; an object a receiver re-publishes is created on its rollout node
  and only rollout nodes ever hold it. ``seconds`` is the driver's wall time from
  planning to every receiver holding the assembled state dict.
* Result. On return every receiver's ``weights()`` is bit-equal to the senders' state
  dict, in the senders' key order. ``verify=True`` checks this by per-tensor SHA-256
  digests computed on both sides and raises ``WeightSyncError`` on a mismatch
  (``verify_weights`` runs that check on its own and returns the ``model_digest``).
"""
from __future__ import annotations

import bisect
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from rollmux.errors import RollMuxError

#: One tensor of a manifest: (name, dtype, shape, payload bytes).
Entry = tuple[str, str, tuple[int, ...], int]


class WeightSyncError(RollMuxError):
    """A sync cannot run or did not deliver: no endpoints, senders holding different
    state dicts, or a receiver whose weights differ from the senders' after the sync."""


def plan_shards(sizes: Sequence[int], parts: int) -> list[range]:
    """Cut tensors of byte sizes ``sizes`` (in order) into ``parts`` contiguous ranges.

    Returns ``parts`` ranges of tensor indices, disjoint, in order, covering
    ``range(len(sizes))`` (some may be empty). With prefix sums ``P[0] = 0``,
    ``P[j] = sizes[0] + ... + sizes[j-1]`` and total ``M = P[n]``, boundary k
    (0 < k < parts) is the index j minimising ``|P[j] - k * M / parts|``, the lowest
    such j on a tie; boundary 0 is 0 and boundary ``parts`` is n. As each boundary lies
    within half the largest size of its target, every shard holds between
    ``M / parts - max(sizes)`` and ``M / parts + max(sizes)`` bytes.
    """
    if not isinstance(parts, int) or parts < 1:
        raise WeightSyncError(f"parts={parts!r}: expected a shard count >= 1")
    if any(not isinstance(s, int) or s < 0 for s in sizes):
        raise WeightSyncError("sizes: expected byte counts >= 0")
    scaled = [0]  # prefix sums times ``parts``: exact integer comparisons with k * M
    for size in sizes:
        scaled.append(scaled[-1] + size * parts)
    total = scaled[-1] // parts
    bounds = [0]
    for k in range(1, parts):
        target = k * total
        j = bisect.bisect_left(scaled, target)  # first prefix >= target
        if j > 0 and target - scaled[j - 1] <= scaled[j] - target:
            j = bisect.bisect_left(scaled, scaled[j - 1])  # lowest index of the lower prefix
        bounds.append(j)
    bounds.append(len(sizes))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def manifest_of(weights: dict[str, torch.Tensor]) -> list[Entry]:
    """The manifest of a state dict: (name, dtype, shape, nbytes) per tensor, in order."""
    return [(k, str(t.dtype), tuple(t.shape), t.nbytes) for k, t in weights.items()]


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and raw bytes (equal digests: bit-equal tensors)."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors.values())


class WeightSender:
    """Train-side endpoint: holds the state dict to broadcast and serves its shards.

    Accepts the Ray adapter's ``WorkerInfo`` (or nothing), so it can be a
    ``RayJobRunner`` train worker. Subclasses set ``self.state`` to their latest weights.
    """

    def __init__(self, info: Any = None) -> None:
        torch.set_num_threads(1)
        self.info = info
        self.state: dict[str, torch.Tensor] = {}

    def set_weights(self, weights: dict[str, torch.Tensor]) -> int:
        """Replace the state dict; returns its payload bytes."""
        self.state = {k: v.detach().contiguous() for k, v in weights.items()}
        return _nbytes(self.state)

    def random_weights(self, shapes: Sequence[tuple[str, tuple[int, ...]]], dtype: str, seed: int) -> int:
        """Fill the state dict with seeded random tensors (the same on every sender for
        the same arguments); returns its payload bytes."""
        gen = torch.Generator().manual_seed(seed)
        kind = getattr(torch, dtype)
        self.state = {name: torch.randn(shape, generator=gen).to(kind) for name, shape in shapes}
        return _nbytes(self.state)

    def manifest(self) -> list[Entry]:
        return manifest_of(self.state)

    def shard(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The named tensors (returned from an actor call: a fresh object on this node)."""
        return {n: self.state[n] for n in names}

    def publish(self, names: Sequence[str]) -> list[ray.ObjectRef]:
        """``ray.put`` the named tensors once on this node; returns ``[ref]`` (wrapped so
        Ray hands the reference, not the value, to whoever receives it)."""
        return [ray.put(self.shard(names))]

    def digests(self) -> dict[str, str]:
        return {k: digest(t) for k, t in self.state.items()}


class WeightReceiver:
    """Rollout-side endpoint: fetches shards, counts bytes by source, assembles weights.

    Accepts the Ray adapter's ``WorkerInfo`` (or nothing). Each fetch method returns the
    payload bytes it read, across the pools or inside the rollout pool.
    """

    def __init__(self, info: Any = None) -> None:
        torch.set_num_threads(1)
        self.info = info
        self.state: dict[str, torch.Tensor] = {}
        self._parts: dict[str, torch.Tensor] = {}

    def pull(self, sources: Sequence[tuple[Any, Sequence[str]]], order: Sequence[str]) -> int:
        """Naive: ask each ``(sender, names)`` for its shard and assemble the state dict
        in ``order``. Returns the bytes read across the pools."""
        shards = ray.get([sender.shard.remote(list(names)) for sender, names in sources])
        parts = {k: v for s in shards for k, v in s.items()}
        self._assemble(parts, order)
        return _nbytes(parts)

    def take_shard(self, published: list[ray.ObjectRef]) -> tuple[list[ray.ObjectRef], int]:
        """Scatter step: read the shard a sender published, keep it, and re-publish it on
        this node. Returns (``[ref]`` of the local copy, bytes read across the pools)."""
        self._parts = ray.get(published[0])
        return [ray.put(self._parts)], _nbytes(self._parts)

    def gather(self, peers: Sequence[list[ray.ObjectRef]], mine: int, order: Sequence[str]) -> int:
        """All-gather step: read every peer's re-published shard except ``peers[mine]``
        (this receiver's own), assemble in ``order``. Returns bytes read inside the pool."""
        others = ray.get([p[0] for i, p in enumerate(peers) if i != mine])
        parts = dict(self._parts)
        for shard in others:
            parts.update(shard)
        self._assemble(parts, order)
        self._parts = {}
        return sum(_nbytes(s) for s in others)

    def _assemble(self, parts: dict[str, torch.Tensor], order: Sequence[str]) -> None:
        if set(parts) != set(order):
            missing = sorted(set(order) - set(parts))[:4]
            raise WeightSyncError(f"receiver {self.info}: assembled state lacks {missing} "
                                  f"or holds unknown tensors")
        self.state = {k: parts[k] for k in order}

    def weights(self) -> dict[str, torch.Tensor]:
        return self.state

    def digests(self) -> dict[str, str]:
        return {k: digest(t) for k, t in self.state.items()}


@dataclass(slots=True, frozen=True)
class SyncPlan:
    """Who sends what: the shared manifest, shard k's tensor names and its sender index."""

    manifest: tuple[Entry, ...]
    shards: tuple[tuple[str, ...], ...]
    senders: tuple[int, ...]

    @property
    def model_bytes(self) -> int:
        return sum(e[3] for e in self.manifest)

    @property
    def order(self) -> list[str]:
        return [e[0] for e in self.manifest]


@dataclass(slots=True, frozen=True)
class SyncReport:
    """What one sync moved and how long it took (definitions in the module docstring).

    ``stages`` holds named wall-time sub-intervals in seconds (scatter / gather)."""

    method: str
    rollout_nodes: int
    train_nodes: int
    model_bytes: int
    cross_pool_bytes: int
    intra_pool_bytes: int
    seconds: float
    stages: tuple[tuple[str, float], ...] = ()


def plan_sync(senders: Sequence[Any], receivers: Sequence[Any]) -> SyncPlan:
    """Check the endpoints and cut the senders' state dict into one shard per receiver."""
    if not senders or not receivers:
        raise WeightSyncError(f"need >= 1 sender and >= 1 receiver, got {len(senders)} and {len(receivers)}")
    manifests = ray.get([s.manifest.remote() for s in senders])
    for i, m in enumerate(manifests[1:], 1):
        if m != manifests[0]:
            raise WeightSyncError(f"sender {i} holds a state dict other than sender 0's "
                                  "(names, dtypes, shapes or sizes differ)")
    manifest = tuple(tuple(e) for e in manifests[0])
    if not manifest:
        raise WeightSyncError("senders hold an empty state dict")
    ranges = plan_shards([e[3] for e in manifest], len(receivers))
    shards = tuple(tuple(manifest[j][0] for j in r) for r in ranges)
    return SyncPlan(manifest, shards, tuple(k % len(senders) for k in range(len(receivers))))


def model_digest(digests: dict[str, str]) -> str:
    """One SHA-256 for a whole state dict from its per-tensor ``digests`` (names and order
    included): equal model digests mean bit-equal state dicts in the same key order."""
    h = hashlib.sha256()
    for name, d in digests.items():
        h.update(f"{name}\0{d}\0".encode())
    return h.hexdigest()


def verify_weights(senders: Sequence[Any], receivers: Sequence[Any]) -> str:
    """Check that every receiver's ``weights()`` is bit-equal to sender 0's state dict, in
    its key order (per-tensor SHA-256 on both sides; ``WeightSyncError`` otherwise).
    Returns the ``model_digest`` of the senders' state dict."""
    want = ray.get(senders[0].digests.remote())
    for i, got in enumerate(ray.get([r.digests.remote() for r in receivers])):
        if got != want or list(got) != list(want):
            bad = [k for k in want if got.get(k) != want[k]][:4]
            raise WeightSyncError(f"receiver {i}: weights differ from the senders' after sync ({bad})")
    return model_digest(want)


_verify = verify_weights


def naive_sync(senders: Sequence[Any], receivers: Sequence[Any], *, verify: bool = False) -> SyncReport:
    """Every receiver pulls every shard from its sender: ``R x M`` bytes across the pools."""
    t0 = time.perf_counter()
    plan = plan_sync(senders, receivers)
    sources = [(senders[s], list(names)) for s, names in zip(plan.senders, plan.shards)]
    cross = sum(ray.get([r.pull.remote(sources, plan.order) for r in receivers]))
    seconds = time.perf_counter() - t0
    if verify:
        _verify(senders, receivers)
    return SyncReport("naive", len(receivers), len(senders), plan.model_bytes, cross, 0, seconds)


def scatter_broadcast_sync(senders: Sequence[Any], receivers: Sequence[Any], *, verify: bool = False) -> SyncReport:
    """Receiver k pulls shard k from sender ``k mod T`` (``M`` bytes across the pools),
    then the receivers all-gather their shards (``(R - 1) x M`` bytes inside the pool)."""
    t0 = time.perf_counter()
    plan = plan_sync(senders, receivers)
    published = ray.get([senders[s].publish.remote(list(names)) for s, names in zip(plan.senders, plan.shards)])
    taken = ray.get([r.take_shard.remote(p) for r, p in zip(receivers, published)])
    t1 = time.perf_counter()
    peers = [refs for refs, _ in taken]
    intra = sum(ray.get([r.gather.remote(peers, i, plan.order) for i, r in enumerate(receivers)]))
    seconds = time.perf_counter() - t0
    if verify:
        _verify(senders, receivers)
    return SyncReport("scatter_broadcast", len(receivers), len(senders), plan.model_bytes,
                      sum(b for _, b in taken), intra, seconds,
                      (("scatter", t1 - t0), ("gather", seconds - (t1 - t0))))
