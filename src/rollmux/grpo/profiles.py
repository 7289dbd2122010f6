"""The job profiles of the demo: what each GRPO job learns and how heavy its phases are.

A profile fixes the task, the model, the batch shape and the optimiser. Its phase
weights follow from them: rollout time grows with prompts x samples and shrinks with
the generation batch (each ``generate`` call decodes token by token, so small batches
are bound by per-step latency, as LLM decoding is); training time grows with the
number of samples, the model size and the PPO epochs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from rollmux.grpo.policy import ModelSpec


@dataclass(frozen=True, slots=True)
class JobProfile:
    """One GRPO job's configuration (everything but its iteration count)."""

    name: str
    task: str
    model: ModelSpec = field(default_factory=ModelSpec)
    prompts: int = 32             # prompts per iteration
    samples: int = 8              # completions per prompt (the GRPO group size)
    gen_batch: int = 256          # sequences per generate call
    epochs: int = 1               # passes over the batch per train phase
    minibatch: int = 256          # sequences per optimiser step
    lr: float = 1e-3
    clip: float = 0.2
    kl_coef: float = 0.0          # > 0 keeps a frozen reference model and adds the k3 KL term
    warmup_steps: int = 20        # supervised steps before RL (reward above zero at the start)
    warmup_lr: float = 3e-3
    seed: int = 0
    slo: float = 2.0
    reward_service: str | None = None  # a shared reward service's Serve app; None: rewards in the worker


ROLLOUT_HEAVY = JobProfile("reverse-r", "reverse", ModelSpec(64, 2), prompts=48, samples=16, gen_batch=8,
                           epochs=1, minibatch=768, warmup_steps=15, seed=1)
TRAIN_HEAVY = JobProfile("sort-t", "sort", ModelSpec(96, 3), prompts=24, samples=8, gen_batch=4,
                         epochs=8, minibatch=96, lr=3e-4, kl_coef=0.02, warmup_steps=20, seed=2)
ROLLOUT_HEAVY_WIDE = JobProfile("add-r", "add", ModelSpec(96, 2), prompts=32, samples=16, gen_batch=6,
                                epochs=1, minibatch=512, lr=1e-3, warmup_steps=40, seed=3)

#: The jobs the demo runs, by job count: a rollout-heavy job and a train-heavy job whose
#: phases complement each other, plus a second rollout-heavy job for three. The
#: train-heavy job has the longest iteration, so the two others fit into its cycle.
DEMO_PROFILES = {2: (ROLLOUT_HEAVY, TRAIN_HEAVY), 3: (TRAIN_HEAVY, ROLLOUT_HEAVY, ROLLOUT_HEAVY_WIDE)}

#: ``rollmux demo --policy rollmux-consolidate``: three jobs on 2 rollout + 2 training
#: nodes, listed in submission order with their iteration counts as multiples of N.
#: ``sort-t`` (N) and the short ``reverse-t`` (N/3) are both train-heavy: together on
#: one node pair they saturate it (T_load = both trainings > T_cycle), so the
#: rollout-heavy ``reverse-r`` (3N, so it still runs after the move) opens a second group on R1+T1. When ``reverse-t``
#: finishes, ``sort-t`` is offered a move; next to ``reverse-r`` its phases complement
#: the other's, so the planner moves it there and R0+T0 go back. The SLO of 3 is a
#: whole-run budget that also absorbs the CPU contention of a 2-core machine.
REVERSE_TRAIN_HEAVY = JobProfile("reverse-t", "reverse", ModelSpec(96, 3), prompts=24, samples=8, gen_batch=4,
                                 epochs=8, minibatch=96, lr=3e-4, kl_coef=0.02, warmup_steps=15, seed=4,
                                 slo=3.0)
MOVE_PROFILES = (replace(TRAIN_HEAVY, slo=3.0), REVERSE_TRAIN_HEAVY, replace(ROLLOUT_HEAVY, slo=3.0))
MOVE_ITERATION_SHARES = {"sort-t": 1.0, "reverse-t": 1 / 3, "reverse-r": 3.0}
MOVING_JOB = "sort-t"
