"""Profile a job: run it alone for a few iterations through its adapter; measure its phases.

``profile_job(run, iterations)`` starts a private control plane on 127.0.0.1 (one
rollout and one training node, ``rollmux.demo._control_plane``), submits a job that
nobody else competes with, and calls ``run(job, iterations)`` in this process: the
adapter drives the job's phases (for TRL, ``RollMuxGRPOTrainer(job=job, ...,
args=...max_steps=iterations).train()``). Each phase is timed as the job's SDK sees it,
from the grant's arrival to the release, so the warm load and offload of its state are
included, as they are when the job runs multiplexed. The worst case over the iterations
is what a spec's ``t_roll_s`` / ``t_train_s`` should declare.
"""
from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from rollmux.errors import RollMuxError, SpecError
from rollmux.model import ROLLOUT, TRAIN
from rollmux.runtime.sdk import JobHandle


class ProfileRunFailed(RollMuxError):
    """The job's own code raised while it was profiled (the job was cancelled; nothing written)."""


@dataclass(frozen=True, slots=True)
class PhaseProfile:
    """Measured phase seconds of a lone run: worst case (``t_roll_s``, ``t_train_s``), means, every sample."""

    iterations: int
    t_roll_s: float
    t_train_s: float
    mean_roll_s: float
    mean_train_s: float
    rollout_s: tuple[float, ...]
    train_s: tuple[float, ...]


def profile_job(run: Callable[[JobHandle, int], object], iterations: int = 3, job_id: str = "profile") -> PhaseProfile:
    """Run ``run(job, iterations)`` alone under a private control plane; returns its phase times.

    ``run`` must drive exactly ``iterations`` rollout/train phase pairs of ``job`` and
    return; the job is completed afterwards (cancelled if ``run`` raises: an exception of
    the job's own code is re-raised as ``ProfileRunFailed`` naming it, a ``RollMuxError``
    as it is). ``SpecError`` if ``iterations`` < 1 or the job ran another number of
    phases.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise SpecError("iterations", iterations, "an integer >= 1")
    from rollmux.demo import _control_plane
    from rollmux.runtime.sdk import Client

    with tempfile.TemporaryDirectory(prefix="rollmux-profile-") as out, \
            _control_plane(1, 1, out) as (url, token):
        client = Client(url, token=token)
        try:
            # The spec of a lone job only needs to fit; its declared phase times are what we measure.
            job = client.submit({"job_id": job_id, "t_roll_s": 1.0, "t_train_s": 1.0, "slo": 2.0})
            with job.lifetime():
                job.wait_placed(timeout_s=60)
                try:
                    run(job, iterations)
                except RollMuxError:
                    raise
                except Exception as err:  # the job's own code: named, not a traceback of ours
                    name = getattr(run, "__qualname__", repr(run))
                    raise ProfileRunFailed(f"profile: {name} raised {type(err).__name__}: {err}") from err
        finally:
            client.close()
    pools = [name for name, *_ in job.history]
    if pools != [ROLLOUT, TRAIN] * iterations:
        raise SpecError("run", f"{len(pools)} phases ({', '.join(pools) or 'none'})",
                        f"{2 * iterations} phases: {iterations} rollout/train pairs, as --iterations asks", job_id)
    times = {pool: tuple(end - start for name, _nodes, _seq, start, end in job.history if name == pool)
             for pool in (ROLLOUT, TRAIN)}
    return PhaseProfile(iterations, max(times[ROLLOUT]), max(times[TRAIN]), statistics.fmean(times[ROLLOUT]),
                        statistics.fmean(times[TRAIN]), times[ROLLOUT], times[TRAIN])
