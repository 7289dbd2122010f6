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
"""
from __future__ import annotations

import random

from rollmux.model import ROLLOUT

MODELS = ("worst", "stochastic")


class DurationModel:
    def __init__(self, kind: str = "worst", seed: int = 0) -> None:
        if kind not in MODELS:
            raise ValueError(f"duration model {kind!r}: expected one of {', '.join(MODELS)}")
        self.kind = kind
        self._rng = random.Random(seed)

    def draw(self, worst: float, pool: str) -> float:
        if self.kind == "worst":
            return worst
        if pool == ROLLOUT:
            return worst * (0.5 + 0.5 * self._rng.betavariate(2.0, 5.0))
        return worst * (0.8 + 0.2 * self._rng.betavariate(2.0, 3.0))
