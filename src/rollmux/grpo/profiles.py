"""The job profiles of the demo: what each GRPO job learns and how heavy its phases are.

A profile fixes the task, the model, the batch shape and the optimiser. Its phase
weights follow from them: rollout time grows with prompts x samples and shrinks with
the generation batch (each ``generate`` call decodes token by token, so small batches
are bound by per-step latency, as LLM decoding is); training time grows with the
number of samples, the model size and the PPO epochs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
