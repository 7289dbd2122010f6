"""Sleep and wake of a rollout engine's device memory, with ``torch_memory_saver``.

A rollout engine (an inference model and its KV cache) holds the rollout GPUs only while
its job's rollout phase runs. Between phases its device memory must go back, and the
engine must resume where it was, cheaply. vLLM's sleep mode and SGLang's memory release
do it inside those engines; :class:`EngineMemory` does it for an engine built in plain
PyTorch (the GRPO demo's rollout worker, a Hugging Face ``generate`` loop), the way
SGLang does, with the ``torch_memory_saver`` library:

* tensors allocated inside ``with memory.weights():`` are *kept*: ``sleep()`` copies
  them to host memory and unmaps their device pages; ``wake()`` maps new pages at the
  same virtual addresses and copies the bytes back;
* tensors allocated inside ``with memory.cache():`` (the KV cache, scratch buffers) are
  *dropped*: ``sleep()`` unmaps them, ``wake()`` maps fresh pages whose contents are
  undefined (the engine must treat its cache as empty, as after vLLM's level-1 sleep).

No tensor object or address changes, so module parameters, views and captured CUDA
graphs stay valid. Each switch returns an :class:`EngineSwitchRecord` with its seconds
and, from the driver's free-memory count, the device bytes each kind gave back or took
again; ``host_bytes`` is what the kept tensors occupy on the host while asleep.

The class needs a CUDA device and ``torch_memory_saver`` (``pip install
'rollmux[gpu]'``); without either it raises :class:`~rollmux.errors.DeviceUnavailableError`
before allocating. ``torch_memory_saver`` refuses ``expandable_segments`` in
``PYTORCH_CUDA_ALLOC_CONF``. A process holds one ``torch_memory_saver`` (it hooks the
allocator), so each :class:`EngineMemory` of a process needs its own ``key``. Like the
host arenas of :class:`~rollmux.runtime.state_cache.StateCache`, the host copy of the kept
tensors is allocated (pinned) at the first sleep and reused by every later one: the class
turns on the library's ``retain_cpu_backup`` for the process, so the host memory stays
held, awake or asleep (``benchmarks/engine_sleep.py`` measures both policies).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rollmux.errors import DeviceUnavailableError, SpecError
from rollmux.runtime.state_cache import CacheStateError, Residency

__all__ = ["EngineMemory", "EngineSwitchRecord"]


@dataclass(frozen=True)
class EngineSwitchRecord:
    """One sleep or wake: ``weights_bytes`` and ``cache_bytes`` of device memory given back
    (sleep) or taken again (wake), ``host_bytes`` held on the host while asleep."""

    key: str
    direction: str
    seconds: float
    weights_bytes: int
    cache_bytes: int
    host_bytes: int


def _saver():
    if not torch.cuda.is_available():
        raise DeviceUnavailableError("EngineMemory (sleep/wake of a rollout engine)", "a CUDA device")
    try:
        from torch_memory_saver import torch_memory_saver
    except ImportError as exc:
        raise DeviceUnavailableError("EngineMemory (sleep/wake of a rollout engine)",
                                     "the torch_memory_saver package (pip install 'rollmux[gpu]')") from exc
    if torch_memory_saver._impl is None:
        torch_memory_saver.hook_mode = "torch"  # in-process allocator: no LD_PRELOAD needed
    torch_memory_saver.retain_cpu_backup = True
    return torch_memory_saver


def _free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


class EngineMemory:
    """The kept (weights) and dropped (cache) device memory of one engine; see the module doc."""

    _keys: set[str] = set()

    def __init__(self, key: str) -> None:
        if not isinstance(key, str) or not key or ":" in key:
            raise SpecError("key", key, "a non-empty name without ':'", "EngineMemory")
        self._saver = _saver()
        if key in EngineMemory._keys:
            raise SpecError("key", key, "a key no other EngineMemory of this process uses", "EngineMemory")
        EngineMemory._keys.add(key)
        self.key = key
        self.residency = Residency.DEVICE
        self.host_bytes = 0

    @contextlib.contextmanager
    def weights(self) -> Iterator[None]:
        """Allocate inside this block what must survive a sleep (weights, the engine's state)."""
        with self._saver.region(tag=f"{self.key}:weights", enable_cpu_backup=True):
            yield

    @contextlib.contextmanager
    def cache(self) -> Iterator[None]:
        """Allocate inside this block what a sleep may drop (KV cache, scratch buffers)."""
        with self._saver.region(tag=f"{self.key}:cache", enable_cpu_backup=False):
            yield

    @contextlib.contextmanager
    def resident(self, key: object = None, device: object = None) -> Iterator[EngineSwitchRecord | None]:
        """Awake for the ``with`` body, asleep after it (also on error): the state hook of the
        SDK's ``job.phase("rollout", state=memory)``, which passes ``key`` and ``device``
        (not used: the engine lives where it was built). Yields the wake's record, or None
        when it was awake."""
        record = self.wake() if self.residency is Residency.HOST else None
        try:
            yield record
        finally:
            self.sleep()

    def guard(self, module: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
        """Make ``module``'s forward raise CacheStateError while asleep (its pages are unmapped:
        running it would fault the device). Returns the hook's handle."""
        def refuse(*_: object) -> None:
            if self.residency is not Residency.DEVICE:
                raise CacheStateError(self.key, "run the engine", self.residency, "'device' (wake first)")
        return module.register_forward_pre_hook(refuse, prepend=True)

    def sleep(self) -> EngineSwitchRecord:
        """Back up the kept tensors to the host and give every page of both kinds back."""
        return self._switch("sleep", self._saver.pause, Residency.DEVICE, Residency.HOST, "'device' (wake first)")

    def wake(self) -> EngineSwitchRecord:
        """Map both kinds again at their old addresses and restore the kept tensors."""
        return self._switch("wake", self._saver.resume, Residency.HOST, Residency.DEVICE, "'host' (sleep first)")

    def _switch(self, direction: str, action, before: Residency, after: Residency, expected: str
                ) -> EngineSwitchRecord:
        """Pause or resume the kept kind, then the dropped one, counting the device bytes
        each gives back (sleep) or takes again (wake)."""
        if self.residency is not before:
            raise CacheStateError(self.key, direction, self.residency, expected)
        start = time.perf_counter()
        sign = 1 if direction == "sleep" else -1
        free = [_free_bytes()]
        for kind in ("weights", "cache"):
            action(f"{self.key}:{kind}")
            free.append(_free_bytes())
        self.residency = after
        weights, cache = sign * (free[1] - free[0]), sign * (free[2] - free[1])
        if direction == "sleep":
            self.host_bytes = weights
        return EngineSwitchRecord(self.key, direction, time.perf_counter() - start, weights, cache, self.host_bytes)
