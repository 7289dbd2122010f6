"""Warm switches of a sharded trainer's state, on every rank at once (FSDP2 and plain modules).

A sharded trainer (``torch.distributed.fsdp.fully_shard``, "FSDP2") keeps on each rank
only its shard of every parameter, of every gradient and of the optimizer state. The
:class:`rollmux.runtime.state_cache.StateCache` cannot park such a trainer: it swaps each
parameter's ``.data``, while FSDP2 all-gathers from its own flat shard buffers, which
would stay on the device. :class:`ShardedTrainerState` parks the *storage* instead:

* ``offload()`` (collective: every rank of ``group`` calls it at the same step
  boundary) reshards every FSDP module, drops the gradients, copies each distinct
  device storage behind the local shards (parameters, buffers, optimizer state) into
  host buffers, then shrinks those storages to zero bytes, returns the freed blocks to
  the driver and waits at a barrier of ``group``;
* ``load()`` (collective) grows each storage back to its size on the same device,
  copies the bytes in and waits at the barrier.

Why storages: every view of a storage (the DTensor's local tensor, FSDP2's padded flat
shard, a tied weight) sees it shrink and grow, so no object changes, the optimizer and
FSDP2's internal references stay valid, and a round trip is bit-identical. Tensors on
another device than the trainer's (Adam's CPU ``step`` counter next to CUDA shards) stay
where they are.

Host buffers are allocated on the first offload (one arena; pinned on CUDA) and reused;
storages created later (optimizer state after the first step) get one more arena. The
host bytes are bounded by ``budget_bytes``: an offload that would exceed it raises
:class:`~rollmux.runtime.state_cache.CacheBudgetError` before anything changes (on that
rank: a caller whose ranks can disagree should size the budget for the largest shard).

Every storage parked must be resizable: one that is not (a CPU model loaded with
``from_pretrained`` lies on memory-mapped safetensors, ``torch.from_numpy`` borrows
numpy's memory) is refused with a SpecError naming its slot, on construction and again
on each offload, before anything is copied or freed. Give such tensors storage of their
own first (``t.data = t.data.clone()`` for every parameter and buffer).

While the state is parked the trainer must not run: reading a shrunk storage would read
freed memory. A forward pre-hook on the module and a step pre-hook on the optimizer
raise :class:`~rollmux.runtime.state_cache.CacheStateError` instead. Without
``torch.distributed`` initialised (or with a one-rank group) there is no barrier, so the
same class parks a plain single-process module too.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rollmux.errors import SpecError
from rollmux.runtime.state_cache import (
    CacheBudgetError,
    CacheStateError,
    HostArena,
    Layout,
    Residency,
    arena_bytes,
    entry_tensor,
    state_slots,
    synchronize,
)

__all__ = ["ShardSwitchRecord", "ShardedTrainerState"]


@dataclass(frozen=True)
class ShardSwitchRecord:
    """One rank's part of a collective switch.

    ``bytes`` moved by this rank, ``copy_seconds`` for its copies (synchronised),
    ``barrier_seconds`` spent waiting for the other ranks, ``rank`` in the group.
    """

    key: str
    direction: str
    rank: int
    bytes: int
    copy_seconds: float
    barrier_seconds: float

    @property
    def seconds(self) -> float:
        """Wall time of the switch on this rank: copies, then the barrier."""
        return self.copy_seconds + self.barrier_seconds


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class ShardedTrainerState:
    """The parked or resident state of one rank's shard of a trainer (see the module doc).

    ``module``: the trainer's model, FSDP2-wrapped or not; ``optimizer``: the optimizer
    over its parameters, or None; ``budget_bytes``: host bytes this rank may hold;
    ``group``: the process group whose ranks switch together (default: the world, when
    ``torch.distributed`` is initialised); ``key``: a name for records and errors;
    ``release_device_cache``: after an offload on CUDA, return the freed blocks to the
    driver (``torch.cuda.empty_cache``), for another process to use; False when the next
    tenant runs in this process.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        budget_bytes: int,
        group: dist.ProcessGroup | None = None,
        key: str = "trainer",
        release_device_cache: bool = True,
    ) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise SpecError("budget_bytes", budget_bytes, "an int >= 0", "ShardedTrainerState")
        first = entry_tensor(module, optimizer, key)
        self.module = module
        self.optimizer = optimizer
        self.budget_bytes = budget_bytes
        self.group = group
        self.key = key
        self.release_device_cache = release_device_cache
        self.device = _local(first).device
        self.residency = Residency.DEVICE
        self._arenas: list[HostArena] = []
        self._host: dict[str, torch.Tensor] = {}
        self._parked: dict[str, torch.UntypedStorage] = {}
        self._device_storages()  # refuses a storage that cannot be parked
        self._hooks = [module.register_forward_pre_hook(self._refuse_while_parked, prepend=True)]
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(self._refuse_while_parked))

    @property
    def reserved_bytes(self) -> int:
        """Host bytes this rank's buffers hold (alignment and page rounding included)."""
        return sum(arena.nbytes for arena in self._arenas)

    def host_buffers(self) -> dict[str, torch.Tensor]:
        """This rank's host buffers by slot name (read them, never write them)."""
        return dict(self._host)

    def close(self) -> None:
        """Remove the guard hooks and free the host buffers; refused while parked."""
        if self.residency is Residency.HOST:
            raise CacheStateError(self.key, "close", self.residency, "'device' (load first)")
        for hook in self._hooks:
            hook.remove()
        for arena in self._arenas:
            arena.release()
        self._arenas, self._host = [], {}

    # ------------------------------------------------------------------ switches
    def offload(self) -> ShardSwitchRecord:
        """Park this rank's shard in host memory, then wait for the group (collective)."""
        self._expect("offload", Residency.DEVICE)
        start = time.perf_counter()
        storages = self._device_storages()
        missing: Layout = {
            name: (torch.Size([s.nbytes()]), torch.uint8)
            for name, s in storages.items()
            if name not in self._host or self._host[name].numel() != s.nbytes()
        }
        if missing:
            needed = arena_bytes(missing)
            left = self.budget_bytes - self.reserved_bytes
            if needed > left:
                raise CacheBudgetError(self.key, needed, left)
            arena = HostArena(missing, pin=self.device.type == "cuda")
            self._arenas.append(arena)
            self._host.update(arena.views)
        for fsdp_module in self._fsdp_modules():
            fsdp_module.reshard()
        for param in self.module.parameters():
            param.grad = None
        for name, storage in storages.items():
            self._host[name].copy_(_byte_view(storage), non_blocking=True)
        synchronize(self.device)
        for storage in storages.values():
            storage.resize_(0)
        self._parked = storages
        if self.release_device_cache and self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.residency = Residency.HOST
        return self._finish("offload", storages, start)

    def load(self) -> ShardSwitchRecord:
        """Bring this rank's shard back onto its device, then wait for the group (collective)."""
        self._expect("load", Residency.HOST)
        start = time.perf_counter()
        storages = self._parked
        for name, storage in storages.items():
            storage.resize_(self._host[name].numel())
            _byte_view(storage).copy_(self._host[name], non_blocking=True)
        synchronize(self.device)
        self._parked = {}
        self.residency = Residency.DEVICE
        return self._finish("load", storages, start)

    @contextlib.contextmanager
    def resident(self, key: object = None, device: torch.device | str | None = None
                 ) -> Iterator[ShardSwitchRecord | None]:
        """Hold the state on the device for the ``with`` body, then park it (also on error).

        Yields the load's record, or None when the state was already resident. ``key`` and
        ``device`` make it the state hook of the SDK's ``job.phase(name, state=...)``
        (which passes both): the key is not used, and ``device`` must be the trainer's
        own device type (a shard is parked and reloaded where it lives).
        """
        if device is not None and torch.device(device).type != self.device.type:
            raise CacheStateError(self.key, f"resident(device={str(device)!r})", self.residency,
                                  f"the trainer's device type, {self.device.type!r}")
        record = self.load() if self.residency is Residency.HOST else None
        try:
            yield record
        finally:
            self.offload()

    # ------------------------------------------------------------------ internals
    def _fsdp_modules(self) -> list[FSDPModule]:
        return [m for m in self.module.modules() if isinstance(m, FSDPModule)]

    def _device_storages(self) -> dict[str, torch.UntypedStorage]:
        """Each distinct storage on the trainer's device, named by its first slot; a SpecError
        names the first one that cannot be resized (so cannot be parked)."""
        found: dict[str, torch.UntypedStorage] = {}
        seen: set[int] = set()
        for name, tensor in state_slots(self.module, self.optimizer).items():
            local = _local(tensor)
            if local.device != self.device:
                continue
            storage = local.untyped_storage()
            if storage.nbytes() == 0 or storage._cdata in seen:
                continue
            if not storage.resizable():
                raise SpecError(name, "a tensor on storage that cannot be resized (memory-mapped: from_pretrained "
                                "on CPU; borrowed: torch.from_numpy)", "storage of its own: clone it first "
                                "(t.data = t.data.clone() for every parameter and buffer)",
                                f"ShardedTrainerState {self.key!r}")
            seen.add(storage._cdata)
            found[name] = storage
        return found

    def _finish(self, direction: str, storages: dict[str, torch.UntypedStorage], start: float) -> ShardSwitchRecord:
        copied = time.perf_counter()
        rank, waited = 0, 0.0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.barrier(group=self.group)
            rank, waited = dist.get_rank(self.group), time.perf_counter() - copied
        moved = sum(self._host[name].numel() for name in storages)
        return ShardSwitchRecord(self.key, direction, rank, moved, copied - start, waited)

    def _expect(self, operation: str, residency: Residency) -> None:
        if self.residency is not residency:
            raise CacheStateError(self.key, operation, self.residency, repr(residency.value))

    def _refuse_while_parked(self, *_: object) -> None:
        if self.residency is Residency.HOST:
            raise CacheStateError(self.key, "run the trainer", self.residency, "'device' (load first)")
