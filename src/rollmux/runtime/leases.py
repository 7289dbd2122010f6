"""Leases of live jobs, on the monotonic clock.

Contract
--------
* ``touch(job)`` records that a call from the job was *received* now (any authenticated
  call of the job counts, heartbeats included). ``ensure(job)`` starts a lease for a job
  that has none (a new job, or every live job after a restart).
* A job is silent once ``lease_s + grace_s`` seconds passed since the last receipt.
  ``grace_s`` is the documented allowance for slow networks and paused clients: with
  the SDK's heartbeats every ``lease_s / 4``, a job whose calls are delayed by less than
  ``grace_s`` never expires.
* Wall-clock jumps have no effect: only the injected monotonic clock is read.
"""
from __future__ import annotations

from typing import Callable, Iterable


class Leases:
    def __init__(self, lease_s: float, grace_s: float, monotonic: Callable[[], float]) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s={lease_s!r}: expected seconds > 0")
        if not grace_s >= 0:
            raise ValueError(f"grace_s={grace_s!r}: expected seconds >= 0")
        self.lease_s = lease_s
        self.grace_s = grace_s
        self._mono = monotonic
        self._seen: dict[str, float] = {}

    def touch(self, job_id: str) -> None:
        self._seen[job_id] = self._mono()

    def ensure(self, job_ids: Iterable[str]) -> None:
        now = self._mono()
        for job_id in job_ids:
            self._seen.setdefault(job_id, now)

    def drop(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._seen.pop(job_id, None)

    def silent(self) -> list[str]:
        """Jobs with no call received for ``lease_s + grace_s`` seconds."""
        limit = self._mono() - self.lease_s - self.grace_s
        return [j for j, t in list(self._seen.items()) if t < limit]

    def is_silent(self, job_id: str) -> bool:
        t = self._seen.get(job_id)
        return t is not None and t < self._mono() - self.lease_s - self.grace_s

    def age(self, job_id: str) -> float | None:
        """Seconds since the job was last heard from."""
        t = self._seen.get(job_id)
        return None if t is None else self._mono() - t
