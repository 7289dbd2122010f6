"""A vLLM engine as a RollMux job's rollout state: awake inside its rollout grants only.

:class:`VllmEngineState` is the ``state=`` object of the SDK's rollout phase::

    engine = VllmEngineState(llm, level=2, load_weights=push_latest_weights)
    engine.park()                                   # outside any grant: give the GPU back
    for step in range(iterations):
        with job.phase("rollout", state=engine):    # wake on entry, sleep before release
            outputs = llm.generate(prompts, params)
        with job.phase("train", state=trainer_cache):
            update(outputs)                         # the trainer publishes new weights

The engine must be built with ``enable_sleep_mode=True``: vLLM then allocates its
weights and KV cache through its own allocator (``CuMemAllocator``, tagged ``weights``
and ``kv_cache``), which can unmap them and map them again at the same virtual
addresses, so the engine's tensors and captured graphs stay valid.

Levels (vLLM's ``LLM.sleep(level)``):

* **1**: the weights are copied to pinned host memory, the KV cache is dropped. The wake
  copies the weights back: the engine resumes the very model it slept with (a warm
  start from host memory, RollMux's switch).
* **2**: both are dropped (no host copy). The wake maps the weights' pages, calls
  ``load_weights(llm)`` to write them (the trainer's latest, for an on-policy job), then
  maps the KV cache. This is what an RL job whose weights change every step wants: the
  host copy of level 1 would be stale anyway. Level 2 without ``load_weights`` is refused.

Contract: ``resident`` wakes the engine if it sleeps, yields the LLM, and puts it to
sleep when the block ends, also when it raised. A wake that fails after vLLM's first
``wake_up`` (``load_weights`` raised, or mapping the KV cache did) puts the engine back
to sleep before the error propagates: its pages go back, it stays ``host``, and the
next grant's wake starts afresh. The KV cache is empty after every wake
(vLLM clears its prefix cache at sleep). Each switch appends a :class:`VllmSwitchRecord`
(seconds, and the device bytes it gave back or took again, from the driver's free-memory
count). An engine built without sleep mode, a level other than 1 or 2, or level 2
without a loader raise :class:`~rollmux.errors.FrameworkConfigError` naming the field,
before anything changes. Several engines may share one GPU when each lives in its own
process (vLLM's default, ``VLLM_ENABLE_V1_MULTIPROCESSING=1``): the allocator that
sleeps is one per process.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rollmux.errors import FrameworkConfigError
from rollmux.runtime.state_cache import CacheStateError, Residency

__all__ = ["VllmEngineState", "VllmSwitchRecord", "sleep_mode_enabled"]

LEVELS = (1, 2)


@dataclass(frozen=True)
class VllmSwitchRecord:
    """One sleep or wake: when it began (``time.time()``), its seconds, and the device bytes
    it gave back (sleep) or took again (wake); ``device_bytes`` is None without CUDA here."""

    direction: str
    level: int
    at: float
    seconds: float
    device_bytes: int | None
    load_s: float = 0.0  # of ``seconds``: the ``load_weights`` call of a level-2 wake


def sleep_mode_enabled(llm: Any) -> bool:
    """Whether ``llm`` (a ``vllm.LLM``) was built with ``enable_sleep_mode=True``."""
    return bool(llm.llm_engine.vllm_config.model_config.enable_sleep_mode)


def _free_bytes() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.mem_get_info()[0]


class VllmEngineState:
    """Sleep and wake of one vLLM engine at its job's phase boundaries (module docstring).

    ``measure()`` gives the device's free bytes at each switch (default: the CUDA driver's
    count; None where there is no CUDA, and then the records carry no bytes)."""

    def __init__(self, llm: Any, level: int = 1, load_weights: Callable[[Any], None] | None = None,
                 measure: Callable[[], int | None] = _free_bytes) -> None:
        where = "VllmEngineState"
        if isinstance(level, bool) or level not in LEVELS:
            raise FrameworkConfigError("level", level, "1 (weights kept in host memory) or 2 (dropped)", where)
        if level == 2 and load_weights is None:
            raise FrameworkConfigError("load_weights", None, "a callable writing the weights after a level-2 "
                                       "wake (level 2 drops them)", where)
        if load_weights is not None and not callable(load_weights):
            raise FrameworkConfigError("load_weights", load_weights, "a callable taking the LLM", where)
        if not sleep_mode_enabled(llm):
            raise FrameworkConfigError("enable_sleep_mode", False, "True (vllm.LLM(..., enable_sleep_mode=True))",
                                       where)
        self.llm = llm
        self.level = level
        self.load_weights = load_weights
        self.residency = Residency.DEVICE
        self.records: list[VllmSwitchRecord] = []
        self._measure = measure

    @contextlib.contextmanager
    def resident(self, key: object = None, device: object = None) -> Iterator[Any]:
        """Awake for the ``with`` body, asleep after it (also on error): the SDK's state hook
        (``key`` and ``device`` unused: the engine lives where it was built). Yields the LLM."""
        if self.residency is Residency.HOST:
            self.wake()
        try:
            yield self.llm
        finally:
            self.sleep()

    def park(self) -> VllmSwitchRecord:
        """Put a freshly built engine to sleep (outside any grant), so its GPU memory goes back."""
        return self.sleep()

    def sleep(self) -> VllmSwitchRecord:
        """``LLM.sleep(level)``: the KV cache dropped, the weights copied to host (1) or dropped (2)."""
        if self.residency is not Residency.DEVICE:
            raise CacheStateError("vllm-engine", "sleep", self.residency, "'device' (wake first)")
        before, at, t0 = self._measure(), time.time(), time.perf_counter()
        self.llm.sleep(level=self.level)
        seconds = time.perf_counter() - t0
        self.residency = Residency.HOST
        return self._note("sleep", at, seconds, before, 1)

    def wake(self) -> VllmSwitchRecord:
        """``LLM.wake_up()``; at level 2 the weights' pages first, ``load_weights(llm)``, then the KV cache.
        When it fails after the first ``wake_up`` the engine is put back to sleep (module doc)."""
        if self.residency is not Residency.HOST:
            raise CacheStateError("vllm-engine", "wake", self.residency, "'host' (sleep first)")
        before, at, t0 = self._measure(), time.time(), time.perf_counter()
        load_s = 0.0
        if self.level == 2:
            self.llm.wake_up(tags=["weights"])  # the KV cache once the weights are written
        else:
            self.llm.wake_up()
        try:
            if self.load_weights is not None:
                t_load = time.perf_counter()
                self.load_weights(self.llm)
                load_s = time.perf_counter() - t_load
            if self.level == 2:
                self.llm.wake_up(tags=["kv_cache"])
        except BaseException as failure:  # back to sleep, so the state's 'host' stays true (module doc)
            try:
                self.llm.sleep(level=self.level)
            except Exception as err:
                failure.add_note(f"rollmux: putting the engine back to sleep failed too: {type(err).__name__}: "
                                 f"{err}")
            raise
        seconds = time.perf_counter() - t0
        self.residency = Residency.DEVICE
        return self._note("wake", at, seconds, before, -1, load_s)

    def _note(self, direction: str, at: float, seconds: float, before: int | None, sign: int,
              load_s: float = 0.0) -> VllmSwitchRecord:
        after = self._measure()
        moved = None if before is None or after is None else sign * (after - before)
        record = VllmSwitchRecord(direction, self.level, at, seconds, moved, load_s)
        self.records.append(record)
        return record

    def summary(self) -> dict:
        """Median seconds and device GB per direction over the records (the first wake/sleep included)."""
        out: dict = {"level": self.level, "switches": len(self.records)}
        for direction in ("sleep", "wake"):
            rs = [r for r in self.records if r.direction == direction]
            if not rs:
                continue
            moved = [r.device_bytes for r in rs if r.device_bytes is not None]
            out[direction] = {"count": len(rs), "median_s": statistics.median_high(r.seconds for r in rs),
                              "max_s": max(r.seconds for r in rs),
                              "device_gb_median": statistics.median_high(moved) / 1e9 if moved else None,
                              "load_s_median": statistics.median_high(r.load_s for r in rs)}
        return out
