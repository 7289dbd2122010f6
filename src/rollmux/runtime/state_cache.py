"""Warm and cold switching of a job's training state between a device and the host.

A :class:`StateCache` holds named entries (a key such as ``(job_id, phase)``), each a
``torch.nn.Module`` and optionally the ``torch.optim.Optimizer`` that steps it. The
*state* of an entry is every parameter, every buffer and every tensor in the
optimizer's per-parameter state, also those nested in lists, tuples and dicts there
(LBFGS's ``old_dirs``); :func:`state_slots` names each one. An entry is in one of three
residencies:

* ``DEVICE``: the state lives in device tensors and the job may run.
* ``HOST`` (warm): :meth:`StateCache.offload` copied the state into host buffers and
  freed the device storage; :meth:`StateCache.load` copies it back.
* ``DISK`` (cold): :meth:`StateCache.save_cold` wrote the state to a directory and freed
  both the device storage and the host buffers; :meth:`StateCache.load_cold` reads it.
  One directory holds one entry's cold state (another entry's save there is refused).

Host buffers are allocated once per entry, on its first offload, and reused by every
later offload (a slot that appeared or changed shape or dtype since gets a buffer of
its own, and an arena none of whose buffers is a slot's current buffer is freed then, so
shape changes do not accumulate host memory); they are pinned (``cudaHostRegister``) when
the entry lives on a CUDA device, so copies run at DMA speed. Their total size is
bounded by the cache's host-memory budget: an offload that would exceed it raises
:class:`CacheBudgetError` before anything changes.

What the cache moves, refused with a SpecError naming the slot before anything changes
(on register, and again on offload and save_cold for state created or replaced since):

* only dense tensors with data: not sparse or otherwise non-strided, not quantized, not
  on the ``meta`` device;
* no two slots sharing storage (a buffer that views a parameter, parameters carved from
  one flat buffer): a switch gives each slot storage of its own, so they would silently
  stop seeing each other's writes. Zero-size tensors share nothing, and a Parameter tied
  in two places is one slot (``named_parameters`` lists it once), so both are accepted;
* on save_cold, only dtypes safetensors can write (not ``complex128``), and only
  optimizer param groups and non-tensor state that ``torch.load(weights_only=True)`` reads
  back (plain Python numbers, str, bool, None, lists, tuples, dicts, tensors; not numpy
  values): the error names the value's place in ``state_dict()`` and its type.

Contracts kept by every switch:

* Round trips are bit-identical, dtypes included, and the Parameter and buffer objects
  the module and the optimizer hold stay the same Python objects (only their ``.data`` is
  swapped), so an optimizer built before the switch keeps working after it. The warm path
  also keeps the identity of the optimizer's state tensors (and of the lists holding
  them); the cold path replaces them through ``Optimizer.load_state_dict``, then undoes
  its casts (it turns state tensors into their parameter's floating dtype: an fp32 master
  copy of a bf16 parameter, an int64 counter), so each comes back in its saved dtype.
* Gradients are not state: a switch happens at a step boundary, and offloading sets
  every ``.grad`` to ``None``.
* Tensors that lived on the entry's device follow it to the device given to ``load``;
  tensors that lived elsewhere (Adam's CPU ``step`` counter next to CUDA parameters)
  return where they were.

The cache is not thread-safe: one caller (the job's phase driver) drives it.
"""
from __future__ import annotations

import contextlib
import copy
import enum
import functools
import io
import math
import mmap
import operator
import os
import time
import weakref
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save, save_file
from torch.nn.parameter import is_lazy

from rollmux.errors import RollMuxError, SpecError

Direction = Literal["offload", "load"]
SwitchPath = Literal["warm", "cold"]

TENSORS_FILE = "state.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
_ALIGN = 64  # byte alignment of every slot inside a host arena


class CacheBudgetError(RollMuxError):
    """An offload would need more host memory than the budget has left.

    Raised before any tensor is copied or freed: the entry stays resident on its device.
    """

    def __init__(self, key: Hashable, needed_bytes: int, left_bytes: int) -> None:
        self.key = key
        self.needed_bytes = needed_bytes
        self.left_bytes = left_bytes
        super().__init__(
            f"entry {key!r}: offload needs {needed_bytes} bytes of new host buffers, "
            f"budget has {left_bytes} bytes left: expected needed <= left"
        )


class CacheKeyError(RollMuxError, KeyError):
    """A key was used that is unknown (or, on register, already taken)."""

    def __init__(self, key: Hashable, expected: str) -> None:
        self.key = key
        super().__init__(f"key={key!r}: expected {expected}")

    def __str__(self) -> str:
        return str(self.args[0])


class CacheStateError(RollMuxError):
    """An operation was asked of an entry in a residency that does not allow it."""

    def __init__(self, key: Hashable, operation: str, residency: Residency, expected: str) -> None:
        self.key = key
        self.operation = operation
        self.residency = residency
        super().__init__(
            f"entry {key!r}: {operation} with residency={residency.value!r}: expected {expected}"
        )


class CacheFolderError(RollMuxError):
    """A cold save into a folder that holds another entry's cold state, its only copy (the
    files have fixed names: the save would overwrite it)."""

    def __init__(self, key: Hashable, folder: Path, holder: Hashable) -> None:
        self.key = key
        self.folder = folder
        self.holder = holder
        super().__init__(f"entry {key!r}: save_cold to {folder}: entry {holder!r}'s cold state is there, its only "
                         f"copy; expected a folder of its own")


class CheckpointMismatchError(RollMuxError):
    """A cold checkpoint does not fit the registered module or optimizer."""

    def __init__(self, path: Path, slot: str, found: str, expected: str) -> None:
        self.path = path
        self.slot = slot
        super().__init__(f"{path}: {slot}={found}: expected {expected}")


class Residency(enum.Enum):
    """Where an entry's state currently lives."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


@dataclass(frozen=True)
class SwitchRecord:
    """One completed switch: ``bytes`` of state moved along ``path`` in ``seconds``."""

    key: Hashable
    direction: Direction
    path: SwitchPath
    bytes: int
    seconds: float


@dataclass(frozen=True)
class SwitchTotals:
    """Sum over the switches of one (path, direction)."""

    count: int
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        """Achieved bandwidth in 1e9 bytes per second (0.0 when nothing was timed)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CacheStats:
    """Summary of a cache: budget, host bytes held, and totals per (path, direction)."""

    budget_bytes: int
    reserved_bytes: int
    entries: int
    totals: Mapping[tuple[SwitchPath, Direction], SwitchTotals]


Layout = dict[str, tuple[torch.Size, torch.dtype]]


def _nbytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def arena_bytes(layout: Layout) -> int:
    """Host bytes an arena for ``layout`` maps: aligned slots, rounded up to whole pages."""
    body = sum(_round_up(_nbytes(shape, dtype), _ALIGN) for shape, dtype in layout.values())
    return _round_up(max(body, 1), mmap.PAGESIZE)


def _unpin(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)


class HostArena:
    """One anonymous memory mapping carved into a contiguous, aligned view per slot.

    The mapping is page-aligned and shares its pages with nothing else, so when ``pin``
    is set it is registered with CUDA as a whole (``Tensor.is_pinned()`` then holds for
    every view); it is unregistered by :meth:`release` or when the arena is collected,
    always before the mapping itself goes away (the views keep it alive).
    """

    def __init__(self, layout: Layout, pin: bool) -> None:
        self.nbytes = arena_bytes(layout)
        raw = torch.frombuffer(mmap.mmap(-1, self.nbytes), dtype=torch.uint8)
        self._release = None
        if pin:
            err = int(torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), self.nbytes, 0))
            if err != 0:
                raise RuntimeError(f"cudaHostRegister({self.nbytes} bytes) failed with cudaError {err}")
            self._release = weakref.finalize(self, _unpin, raw.data_ptr())
            self._release.atexit = False
        self.views: dict[str, torch.Tensor] = {}
        offset = 0
        for name, (shape, dtype) in layout.items():
            size = _nbytes(shape, dtype)
            self.views[name] = raw[offset : offset + size].view(dtype).view(shape)
            offset += _round_up(size, _ALIGN)

    def release(self) -> None:
        """Unpin (if pinned) and drop the views; the mapping goes with the last reference."""
        if self._release is not None:
            self._release()
        self.views = {}


@dataclass
class _Entry:
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    device: torch.device
    residency: Residency = Residency.DEVICE
    arenas: list[HostArena] = field(default_factory=list)
    host: dict[str, torch.Tensor] = field(default_factory=dict)
    # Slots moved off by the last offload/save_cold: name -> (shape, dtype, home device).
    moved: dict[str, tuple[torch.Size, torch.dtype, torch.device]] = field(default_factory=dict)
    cold_dir: Path | None = None  # where the last save_cold wrote (resolved)
    holds: int = 0  # resident() bodies now running for this entry

    def reserved_bytes(self) -> int:
        return sum(arena.nbytes for arena in self.arenas)

    def release_host(self) -> None:
        for arena in self.arenas:
            arena.release()
        self.arenas = []
        self.host = {}


def state_slots(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, torch.Tensor]:
    """Every state tensor of an entry by a stable name.

    ``module.<name>`` for parameters and buffers, ``optim.<i>.<key>`` for the tensors in
    the optimizer state of the i-th parameter (the numbering of ``state_dict()``), and
    ``optim.<i>[<key>]`` followed by one ``[<index or key>]`` per level (each a Python
    ``repr``: ``optim.0['old_dirs'][3]``) for the tensors nested in lists, tuples and dicts
    there. A nested name has ``[`` where a direct one has ``.``, so no two names clash.
    """
    slots = {f"module.{name}": tensor for name, tensor in [*module.named_parameters(), *module.named_buffers()]}
    if optimizer is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {index: optimizer.state.get(param, {}) for index, param in enumerate(params)}
        slots |= {name: tensor for name, _, _, _, tensor in _optimizer_tensors(state)}
    return slots


def _optimizer_tensors(state: Mapping[int, Mapping]) -> Iterator[tuple[str, int, object, tuple, torch.Tensor]]:
    """(slot name, parameter index, key, path, tensor) of each tensor in an optimizer's
    per-parameter ``state`` (index -> key -> value); ``path`` holds the list indices and
    dict keys from the value down to a nested tensor, and is empty for a direct one."""
    for index, values in state.items():
        for key, value in values.items():
            base = f"optim.{index}.{key}" if isinstance(value, torch.Tensor) else f"optim.{index}[{key!r}]"
            for name, path, tensor in _walk(value, base, ()):
                yield name, index, key, path, tensor


def _walk(value: object, name: str, path: tuple) -> Iterator[tuple[str, tuple, torch.Tensor]]:
    """(name, path) of each tensor in ``value`` or nested in its lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield name, path, value
    elif isinstance(value, (list, tuple, dict)):
        for k, item in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _walk(item, f"{name}[{k!r}]", (*path, k))


def _check_slots(slots: Mapping[str, torch.Tensor], where: str) -> None:
    """SpecError naming the first slot the cache cannot move: a tensor that is not
    strided, is quantized, or has no data (on the meta device, a lazy module's
    uninitialized parameter), or one sharing storage with an earlier slot (named too).
    Zero-size tensors share nothing."""
    holders: dict[tuple[torch.device, int], str] = {}
    for name, tensor in slots.items():
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta or is_lazy(tensor):
            raise SpecError(name, f"{type(tensor).__name__} {tensor.layout} {tensor.dtype} on {tensor.device}",
                            "a dense (torch.strided), non-quantized tensor with data (not on the meta device, "
                            "not uninitialized)", where)
        if tensor.numel():
            holder = holders.setdefault((tensor.device, tensor.untyped_storage().data_ptr()), name)
            if holder != name:
                raise SpecError(name, f"a tensor sharing storage with {holder}", "slots that share no storage "
                                "(a switch gives each its own: they would stop seeing each other's writes)", where)


def entry_tensor(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, where: str) -> torch.Tensor:
    """The first tensor of a module whose state is to be switched, after the checks every
    holder of such state makes: the module holds a tensor, and every parameter the
    optimizer steps is the module's (else SpecError naming ``where``)."""
    tensors = [*module.parameters(), *module.buffers()]
    if not tensors:
        raise SpecError("module", type(module).__name__, "a module with at least one tensor", where)
    if optimizer is not None:
        owned = {id(p) for p in module.parameters()}
        foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned]
        if foreign:
            raise SpecError("optimizer", f"{len(foreign)} parameter(s) outside the module",
                            "an optimizer over the module's own parameters", where)
    return tensors[0]


def _resolve(device: torch.device | str) -> torch.device:
    """A device with its index filled in (``cuda`` -> ``cuda:<current>``)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def synchronize(*devices: torch.device) -> None:
    for device in {d for d in devices if d.type == "cuda"}:
        torch.cuda.synchronize(device)


def _placeholder(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


class StateCache:
    """Keyed entries whose state moves device <-> host (warm) or device <-> disk (cold).

    ``budget_bytes`` bounds the host memory all entries' buffers may hold together.
    ``release_device_cache``: after an offload or a cold save from a CUDA device, return
    the freed blocks to the driver (``torch.cuda.empty_cache``) so that another process
    can use them; set it to False when the next tenant runs in this same process.
    """

    def __init__(self, budget_bytes: int, release_device_cache: bool = True) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise SpecError("budget_bytes", budget_bytes, "an int >= 0", "StateCache")
        self.budget_bytes = budget_bytes
        self.release_device_cache = release_device_cache
        self._entries: dict[Hashable, _Entry] = {}
        self._records: list[SwitchRecord] = []

    # ----------------------------------------------------------------- registry
    def register(
        self,
        key: Hashable,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Add an entry, resident on the device of the module's first tensor.

        Every parameter the optimizer steps must belong to ``module`` (else SpecError),
        and the module must hold at least one tensor, none of which another entry holds
        (SpecError naming that entry: offloading one would empty the other's tensors
        while the cache still counted it as resident). Every slot must be a tensor the
        cache can move, sharing storage with no other slot (SpecError naming it, see the
        module doc).
        """
        if key in self._entries:
            raise CacheKeyError(key, "a key not yet registered")
        first = entry_tensor(module, optimizer, f"entry {key!r}")
        _check_slots(state_slots(module, optimizer), f"entry {key!r}")
        mine = {id(t) for t in [*module.parameters(), *module.buffers()]}
        for other, entry in self._entries.items():
            if any(id(t) in mine for t in [*entry.module.parameters(), *entry.module.buffers()]):
                raise SpecError("module", type(module).__name__, f"a module whose tensors no other entry holds "
                                f"(entry {other!r} holds some of them)", f"entry {key!r}")
        self._entries[key] = _Entry(module, optimizer, _resolve(first.device))

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def remove(self, key: Hashable) -> None:
        """Forget an entry and free its host buffers; refused while its only copy is on the host."""
        entry = self._entry(key)
        if entry.residency is Residency.HOST:
            raise CacheStateError(key, "remove", entry.residency, "'device' or 'disk' (load or save_cold first)")
        entry.release_host()
        del self._entries[key]

    def residency(self, key: Hashable) -> Residency:
        """Where the entry's state lives now."""
        return self._entry(key).residency

    def host_buffers(self, key: Hashable) -> Mapping[str, torch.Tensor]:
        """The entry's host buffers by slot name (read them, never write them)."""
        return dict(self._entry(key).host)

    @property
    def reserved_bytes(self) -> int:
        """Host bytes held by all entries' buffers (alignment and page rounding included)."""
        return sum(entry.reserved_bytes() for entry in self._entries.values())

    # ---------------------------------------------------------------- warm path
    def offload(self, key: Hashable) -> SwitchRecord:
        """Copy a DEVICE entry's state into its host buffers and free the device storage.

        Buffers missing for some slot (first offload, optimizer state created since, or a
        slot whose shape or dtype changed) are allocated in one new arena, and the arenas
        left with no slot's current buffer are freed; CacheBudgetError if the new arena does
        not fit the budget with those freed. SpecError for a slot the cache cannot move
        (see the module doc). Both are raised before anything changes.
        """
        entry = self._entry(key)
        self._expect(key, entry, "offload", (Residency.DEVICE,))
        start = time.perf_counter()
        slots = state_slots(entry.module, entry.optimizer)
        _check_slots(slots, f"entry {key!r}")
        missing: Layout = {
            name: (t.shape, t.dtype)
            for name, t in slots.items()
            if name not in entry.host
            or entry.host[name].shape != t.shape
            or entry.host[name].dtype != t.dtype
        }
        if missing:
            pin = entry.device.type == "cuda"
            kept = set(slots) - set(missing)  # slots whose buffers stay in use
            in_use = {id(entry.host[name]) for name in kept}  # an arena may still name a slot it no longer serves
            stale = [arena for arena in entry.arenas if not any(id(view) in in_use for view in arena.views.values())]
            needed = arena_bytes(missing)
            left = self.budget_bytes - self.reserved_bytes + sum(arena.nbytes for arena in stale)
            if needed > left:
                raise CacheBudgetError(key, needed, left)
            arena = HostArena(missing, pin)
            for old in stale:
                old.release()
            entry.arenas = [a for a in entry.arenas if a not in stale] + [arena]
            entry.host = {name: view for name, view in entry.host.items() if name in kept} | arena.views
        for name, tensor in slots.items():
            entry.host[name].copy_(tensor.detach(), non_blocking=True)
        synchronize(*(t.device for t in slots.values()))
        for param in entry.module.parameters():
            param.grad = None
        entry.moved = {name: (t.shape, t.dtype, t.device) for name, t in slots.items()}
        for tensor in slots.values():
            tensor.data = _placeholder(tensor)
        self._release_device_cache(entry.device)
        entry.residency = Residency.HOST
        return self._record(key, "offload", "warm", entry.moved, start)

    def load(self, key: Hashable, device: torch.device | str) -> SwitchRecord:
        """Copy a HOST entry's state into fresh tensors on ``device``; the buffers stay for reuse."""
        entry = self._entry(key)
        self._expect(key, entry, "load", (Residency.HOST,))
        start = time.perf_counter()
        target = _resolve(device)
        slots = state_slots(entry.module, entry.optimizer)
        fresh: dict[str, torch.Tensor] = {}
        for name, (shape, dtype, home) in entry.moved.items():
            where = target if home == entry.device else home
            fresh[name] = torch.empty(shape, dtype=dtype, device=where)
            fresh[name].copy_(entry.host[name], non_blocking=True)
        synchronize(*(t.device for t in fresh.values()))
        for name, tensor in fresh.items():
            slots[name].data = tensor
        entry.device = target
        entry.residency = Residency.DEVICE
        return self._record(key, "load", "warm", entry.moved, start)

    @contextlib.contextmanager
    def resident(self, key: Hashable, device: torch.device | str) -> Iterator[SwitchRecord | None]:
        """Hold the entry on ``device`` for the ``with`` body, then offload it.

        On enter: load from HOST (yielding the record), or yield None when the entry is
        already on ``device``; DISK entries need :meth:`load_cold` first. On exit the
        entry is offloaded, also when the body raised. Holds nest: a ``resident`` of the
        same entry inside the body (on the same device) yields None and does not offload
        on its exit; only the outermost exit does.
        """
        entry = self._entry(key)
        record = None
        if entry.residency is Residency.HOST:
            record = self.load(key, device)
        elif entry.residency is Residency.DISK or entry.device != _resolve(device):
            raise CacheStateError(key, f"resident(device={str(device)!r})", entry.residency,
                                  f"'host', or 'device' on {str(device)!r}")
        entry.holds += 1
        try:
            yield record
        finally:
            entry.holds -= 1
            if not entry.holds:
                self.offload(key)

    # ---------------------------------------------------------------- cold path
    def save_cold(self, key: Hashable, directory: str | os.PathLike[str]) -> SwitchRecord:
        """Write a DEVICE or HOST entry's state to ``directory`` and free it everywhere else.

        Tensors go to ``state.safetensors``; the optimizer's non-tensor state and param
        groups go to ``optimizer.pt`` (torch.save). Files are fsynced. The host buffers
        are released, giving their bytes back to the budget. Refused before anything is
        written or freed: a folder where another entry of this cache keeps its cold state
        (on disk only: ``CacheFolderError``, two entries in one folder overwrote each
        other); a slot the cache cannot move, a dtype safetensors cannot write, or an
        optimizer value ``torch.load(weights_only=True)`` cannot read back (SpecError
        naming the slot or the value's place, see the module doc).
        """
        entry = self._entry(key)
        self._expect(key, entry, "save_cold", (Residency.DEVICE, Residency.HOST))
        start = time.perf_counter()
        folder = Path(directory)
        where = folder.resolve()
        for other, held in self._entries.items():
            if other != key and held.residency is Residency.DISK and held.cold_dir == where:
                raise CacheFolderError(key, folder, other)
        slots = state_slots(entry.module, entry.optimizer)
        _check_slots(slots, f"entry {key!r}")
        host = entry.residency is Residency.HOST
        moved = entry.moved if host else {name: (t.shape, t.dtype, t.device) for name, t in slots.items()}
        for name, (_, dtype, _) in moved.items():
            if not _safetensors_writes(dtype):
                raise SpecError(name, dtype, "a dtype safetensors can write", f"entry {key!r}: save_cold")
        skeleton = None
        if entry.optimizer is not None:
            shapes = _param_shapes(entry.optimizer, slots, moved)
            skeleton = _skeleton_bytes(_optimizer_skeleton(entry.optimizer, shapes), f"entry {key!r}: save_cold")
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: entry.host[name] if host else slots[name].detach().contiguous() for name in moved}
        save_file(tensors, str(folder / TENSORS_FILE))
        _fsync_file(folder / TENSORS_FILE)
        if skeleton is not None:
            (folder / OPTIMIZER_FILE).write_bytes(skeleton)
            _fsync_file(folder / OPTIMIZER_FILE)
        del tensors
        for param in entry.module.parameters():
            param.grad = None
        for tensor in slots.values():
            tensor.data = _placeholder(tensor)
        entry.release_host()
        self._release_device_cache(entry.device)
        entry.moved = moved
        entry.residency = Residency.DISK
        entry.cold_dir = where
        return self._record(key, "offload", "cold", moved, start)

    def load_cold(self, key: Hashable, directory: str | os.PathLike[str], device: torch.device | str) -> SwitchRecord:
        """Read a checkpoint written by :meth:`save_cold` into the entry, on ``device``.

        Allowed from DISK, and from DEVICE (a restarted job whose freshly built module
        and optimizer take the saved values). Every module slot must match the file
        by name, shape and dtype (CheckpointMismatchError, before anything changes).
        Optimizer state tensors come back in their saved dtypes, also where
        ``Optimizer.load_state_dict`` cast them to their parameter's dtype.
        """
        entry = self._entry(key)
        self._expect(key, entry, "load_cold", (Residency.DISK, Residency.DEVICE))
        start = time.perf_counter()
        folder = Path(directory)
        target = _resolve(device)
        expected: Layout = (
            {name: (shape, dtype) for name, (shape, dtype, _) in entry.moved.items() if name.startswith("module.")}
            if entry.residency is Residency.DISK
            else {name: (t.shape, t.dtype) for name, t in state_slots(entry.module, None).items()}
        )
        loaded: dict[str, torch.Tensor] = {}
        with safe_open(str(folder / TENSORS_FILE), framework="pt", device="cpu") as handle:
            names = set(handle.keys())
            saved_module = {name for name in names if name.startswith("module.")}
            stray = sorted(saved_module ^ set(expected))
            if stray:
                where = "file" if stray[0] in names else "module"
                raise CheckpointMismatchError(
                    folder / TENSORS_FILE, stray[0], f"only in the {where}", "the same module slots in both"
                )
            for name in names:
                # onto a CPU, a copy of its own: safetensors' tensors are aligned to 8 bytes only, and kernels
                # may then round differently from the run that saved them (the next step differed in its last bits)
                tensor = handle.get_tensor(name)
                loaded[name] = tensor.clone() if target.type == "cpu" else tensor
        for name, (shape, dtype) in expected.items():
            if loaded[name].shape != shape or loaded[name].dtype != dtype:
                found = f"{tuple(loaded[name].shape)} {loaded[name].dtype}"
                raise CheckpointMismatchError(folder / TENSORS_FILE, name, found, f"{tuple(shape)} {dtype}")
        state_dict, placed = None, []
        module_slots = state_slots(entry.module, None)
        if entry.optimizer is not None:
            shapes = _param_shapes(entry.optimizer, module_slots, expected)
            state_dict, placed = _optimizer_state_dict(folder, loaded, entry.optimizer, shapes)
        fresh = {name: loaded[name].to(target) for name in module_slots}
        synchronize(target)
        for name, tensor in fresh.items():
            module_slots[name].data = tensor
        if entry.optimizer is not None:
            entry.optimizer.load_state_dict(state_dict)
            _restore_dtypes(entry.optimizer, placed)
        synchronize(target)
        entry.release_host()
        entry.device = target
        entry.residency = Residency.DEVICE
        moved = {name: (t.shape, t.dtype, t.device) for name, t in loaded.items()}
        return self._record(key, "load", "cold", moved, start)

    # ------------------------------------------------------------------ records
    @property
    def records(self) -> tuple[SwitchRecord, ...]:
        """Every switch so far, oldest first."""
        return tuple(self._records)

    def stats(self) -> CacheStats:
        """Budget, host bytes held, and per (path, direction) count/bytes/seconds."""
        totals: dict[tuple[SwitchPath, Direction], SwitchTotals] = {}
        for path in ("warm", "cold"):
            for direction in ("offload", "load"):
                chosen = [r for r in self._records if r.path == path and r.direction == direction]
                totals[(path, direction)] = SwitchTotals(
                    count=len(chosen),
                    bytes=sum(r.bytes for r in chosen),
                    seconds=sum(r.seconds for r in chosen),
                )
        return CacheStats(self.budget_bytes, self.reserved_bytes, len(self._entries), totals)

    # ----------------------------------------------------------------- helpers
    def _entry(self, key: Hashable) -> _Entry:
        if key not in self._entries:
            raise CacheKeyError(key, "a registered key")
        return self._entries[key]

    @staticmethod
    def _expect(key: Hashable, entry: _Entry, operation: str, allowed: tuple[Residency, ...]) -> None:
        if entry.residency not in allowed:
            raise CacheStateError(key, operation, entry.residency, " or ".join(repr(r.value) for r in allowed))

    def _release_device_cache(self, device: torch.device) -> None:
        if self.release_device_cache and device.type == "cuda":
            torch.cuda.empty_cache()

    def _record(
        self,
        key: Hashable,
        direction: Direction,
        path: SwitchPath,
        moved: Mapping[str, tuple[torch.Size, torch.dtype, torch.device]],
        start: float,
    ) -> SwitchRecord:
        size = sum(_nbytes(shape, dtype) for shape, dtype, _ in moved.values())
        record = SwitchRecord(key, direction, path, size, time.perf_counter() - start)
        self._records.append(record)
        return record


def _param_shapes(optimizer: torch.optim.Optimizer, slots: Mapping[str, torch.Tensor],
                  layout: Mapping[str, tuple]) -> list[list[int]]:
    """Each of the optimizer's parameters' shape, in its order, read from ``layout`` (slot
    name -> (shape, ...)): the tensors themselves may be (0,) placeholders while offloaded."""
    slot_of = {id(t): name for name, t in slots.items()}
    return [list(layout[slot_of[id(p)]][0]) for g in optimizer.param_groups for p in g["params"]]


def _optimizer_skeleton(optimizer: torch.optim.Optimizer, shapes: list[list[int]]) -> dict[str, object]:
    """The optimizer's state_dict without its tensors (those go to the safetensors file),
    with its parameters' ``shapes`` in its order (they may be offloaded now).

    A direct state tensor's key is left out of ``state`` and its slot listed in
    ``tensor_slots``; a nested one is None in a copy of its container, and its slot maps
    to (parameter index, key, path) in ``nested_slots``.
    """
    packed = optimizer.state_dict()
    found = list(_optimizer_tensors(packed["state"]))
    state = {index: {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
             for index, values in packed["state"].items()}
    return {
        "state": copy.deepcopy(state, {id(tensor): None for *_, tensor in found}),  # a tensor copies as None
        "tensor_slots": sorted(name for name, _, _, path, _ in found if not path),
        "nested_slots": {name: (index, key, path) for name, index, key, path, _ in found if path},
        "param_groups": packed["param_groups"],
        "param_shapes": shapes,
    }


def _skeleton_bytes(skeleton: dict[str, object], where: str) -> bytes:
    """``skeleton`` serialized by torch.save, once it is known to load back with
    ``torch.load(weights_only=True)`` as load_cold reads it; else SpecError naming the
    innermost value refused, by its place in the optimizer's state_dict, and its type."""
    data = _reloadable(skeleton)
    if data is None:
        place, value = _refused({k: skeleton[k] for k in ("param_groups", "state")}, "state_dict()")
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        raise SpecError(f"optimizer.{place}", value, "plain Python numbers, str, bool or None, lists, tuples, dicts "
                        f"or tensors (what torch.load(weights_only=True) reads back), not {kind}", where)
    return data


def _reloadable(value: object) -> bytes | None:
    """``value`` serialized by torch.save, or None where that or loading it back with
    ``torch.load(weights_only=True)`` fails."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception:  # the pickler and the weights-only unpickler raise errors of many types
        return None
    return buffer.getvalue()


def _refused(value: object, place: str) -> tuple[str, object]:
    """The place (``place`` followed by subscripts) and value of the innermost item of
    ``value`` that :func:`_reloadable` refuses; ``value`` itself when no item is."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for k, item in items:
        if _reloadable(item) is None:
            return _refused(item, f"{place}[{k!r}]")
    return place, value


@functools.cache
def _safetensors_writes(dtype: torch.dtype) -> bool:
    """Whether safetensors can write a tensor of ``dtype`` (probed once per dtype)."""
    try:
        save({"probe": torch.empty(0, dtype=dtype)})
    except Exception:  # an unknown dtype is a KeyError today; any failure means it cannot
        return False
    return True


def _optimizer_state_dict(
    folder: Path, loaded: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer, shapes: list[list[int]]
) -> tuple[dict[str, object], list[tuple[int, object, tuple, torch.Tensor]]]:
    """Rebuild an optimizer state_dict from ``optimizer.pt`` and the loaded tensors, and
    list where each tensor went: (parameter index, key, path, tensor).

    Checks that the saved param groups have the sizes of ``optimizer``'s groups, and that
    its parameters, whose shapes once loaded are ``shapes`` (in the optimizer's order),
    have the saved shapes in the saved order.
    """
    path = folder / OPTIMIZER_FILE
    if not path.exists():
        raise CheckpointMismatchError(path, "optimizer", "missing", "the file save_cold writes for an optimizer")
    skeleton = torch.load(path, weights_only=True)
    saved_sizes = [len(group["params"]) for group in skeleton["param_groups"]]
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    if saved_sizes != sizes:
        raise CheckpointMismatchError(path, "param_groups", f"sizes {saved_sizes}", f"sizes {sizes}")
    # the i-th parameter's state goes to the optimizer's i-th parameter: the same shapes, in
    # the same order (a file written before the shapes were saved is not checked)
    for index, (saved, now) in enumerate(zip(skeleton.get("param_shapes", shapes), shapes)):
        if list(saved) != now:
            raise CheckpointMismatchError(path, f"optimizer parameter {index}", f"shape {tuple(saved)}",
                                          f"shape {tuple(now)} (the optimizer's parameters in the order saved)")
    state: dict[int, dict[str, object]] = {int(i): dict(v) for i, v in skeleton["state"].items()}
    slots = {name: (int(index), k, ()) for name in skeleton["tensor_slots"] for _, index, k in [name.split(".", 2)]}
    placed = []
    for name, (index, k, path) in (slots | skeleton.get("nested_slots", {})).items():
        if name not in loaded:
            raise CheckpointMismatchError(folder / TENSORS_FILE, name, "missing", "a tensor listed in optimizer.pt")
        values = state.setdefault(index, {})
        values[k] = _put(values.get(k), path, loaded[name])
        placed.append((index, k, path, loaded[name]))
    return {"state": state, "param_groups": skeleton["param_groups"]}, placed


def _put(container: object, path: tuple, tensor: torch.Tensor) -> object:
    """``container`` with the item at ``path`` set to ``tensor`` (lists and dicts in place,
    tuples rebuilt); ``tensor`` itself for an empty path."""
    if not path:
        return tensor
    head, rest = path[0], path[1:]
    if isinstance(container, tuple):
        return (*container[:head], _put(container[head], rest, tensor), *container[head + 1 :])
    container[head] = _put(container[head], rest, tensor)
    return container


def _restore_dtypes(optimizer: torch.optim.Optimizer, placed: list[tuple[int, object, tuple, torch.Tensor]]) -> None:
    """Undo ``Optimizer.load_state_dict``'s casts: each state tensor it turned into another
    dtype than the ``placed`` one saved is replaced by the saved one, with its bits, on the
    device load_state_dict put it on."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, key, path, saved in placed:
        values = optimizer.state[params[index]]
        now = functools.reduce(operator.getitem, path, values[key])
        if now.dtype != saved.dtype:
            values[key] = _put(values[key], path, saved.to(now.device))
