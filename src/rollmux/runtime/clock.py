"""The service's clocks: a timestamp clock that never runs backwards, and the monotonic
clock leases are measured on.

``ServiceClock.now()`` is wall-clock seconds taken once at start, advanced by the
monotonic clock from then on, and never below ``floor`` (the last time a previous run
committed). A wall-clock jump while the service runs changes neither timestamps nor
leases; tests inject both clocks.
"""
from __future__ import annotations

import time
from typing import Callable


class ServiceClock:
    def __init__(self, floor: float | None = None, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        start = wall() if floor is None else max(wall(), floor)
        self._anchor = start - monotonic()

    def now(self) -> float:
        return self._anchor + self.monotonic()
