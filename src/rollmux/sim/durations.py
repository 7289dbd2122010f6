"""Duration models: how long a phase actually takes, given its worst-case profile.

* ``worst``: exactly the profile (deterministic). The planner plans on these figures, so
  under this model every SLO it accepted must hold.
* ``stochastic``: profiling assumes every response hits the token limit, so real
  rollouts run shorter, with a long tail towards the limit. Each rollout takes
  ``worst x (0.5 + 0.5 B)`` with ``B ~ Beta(2, 5)`` (mean 0.64 of worst, about 1 in 60
  iterations above 0.9 of worst). Training scales with the tokens generated but less
  steeply: ``worst x (0.8 + 0.2 B')`` with ``B' ~ Beta(2, 3)``. Draws never exceed the
  worst case. Seeded: one ``random.Random(seed)`` per simulation, drawn in event order,
  so the same seed gives the same run.

Long tail (``tail=True``, ``rollmux simulate --tail``; docs/long_tail.md): each rollout
also draws ``head``, the fraction of its body after which ``threshold`` (default 0.8) of
its responses are done; the rest of the body is its tail. Decoding is length-bound, so
with response lengths roughly exponential of mean ``mu`` (as a fraction of the longest
response, which ends the rollout) the ``threshold`` quantile is reached at
``head = min(1, -ln(1 - threshold) x mu)``; ``mu ~ Uniform(0.28, 0.63)``, the range of the
mean response length over the response limit in the three veRL runs of the shared traces
(verl_ppo_step_timings.csv: 145/512, 278/512, 161/256). At 0.8 that puts head in [0.45, 1]
(mean 0.70): the last 20% of responses take 0-55% of the rollout. With the tail on, every
draw comes from a stream of its own job (seeded by seed and job id), so a job's k-th
phase draws the same figures whatever the interleaving (the engine draws one head per
rollout, a hand-off slice's too): runs with and without hand-offs compare phase for
phase. Off (the default), nothing changes.
"""
from __future__ import annotations

import math
import random

from rollmux.model import ROLLOUT

MODELS = ("worst", "stochastic")


class DurationModel:
    def __init__(self, kind: str = "worst", seed: int = 0, tail: bool = False, threshold: float = 0.8) -> None:
        if kind not in MODELS:
            raise ValueError(f"duration model {kind!r}: expected one of {', '.join(MODELS)}")
        if not 0 < threshold < 1:
            raise ValueError(f"tail threshold {threshold!r}: expected a fraction of responses in (0, 1)")
        self.kind = kind
        self.tail = tail
        self.threshold = threshold
        self.seed = seed
        self._rng = random.Random(seed)
        self._streams: dict[str, tuple[random.Random, random.Random]] = {}

    def _stream(self, job_id: str) -> tuple[random.Random, random.Random]:
        s = self._streams.get(job_id)
        if s is None:
            s = self._streams[job_id] = (random.Random(f"{self.seed}/{job_id}"),
                                         random.Random(f"{self.seed}/{job_id}/tail"))
        return s

    def draw(self, worst: float, pool: str, job_id: str | None = None) -> float:
        if self.kind == "worst":
            return worst
        rng = self._stream(job_id)[0] if self.tail and job_id is not None else self._rng
        if pool == ROLLOUT:
            return worst * (0.5 + 0.5 * rng.betavariate(2.0, 5.0))
        return worst * (0.8 + 0.2 * rng.betavariate(2.0, 3.0))

    def head(self, job_id: str) -> float:
        """Fraction of a rollout's body before ``threshold`` of its responses are done (tail on)."""
        mu = self._stream(job_id)[1].uniform(0.28, 0.63)
        return min(1.0, -math.log(1.0 - self.threshold) * mu)
