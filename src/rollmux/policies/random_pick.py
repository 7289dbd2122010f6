"""Random: pack the job into a uniformly random group that has room (residency and group
size honoured, SLOs not checked), else open a new group. Seeded."""
from __future__ import annotations

import random

from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision
from rollmux.policies.base import isolated, packable, packed


class RandomPick:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def place(self, state: PlanState, job: Job) -> Decision:
        options = packable(state, job)
        if not options:
            return isolated(state, job, "no group has room")
        return packed(job, self._rng.choice(options), "random group with room")
