"""Run a TRL ``GRPOTrainer`` as a RollMux job: generation under rollout grants, updates under train grants.

User code (the job is a ``JobHandle`` from ``Client.submit`` or ``Client.attach``)::

    from rollmux.integrations.trl import RollMuxGRPOTrainer

    trainer = RollMuxGRPOTrainer(job=job, model=model, reward_funcs=reward, args=grpo_config,
                                 train_dataset=data, processing_class=tokenizer)
    trainer.train()
    job.complete()

Contract
--------
* Where TRL generates: ``GRPOTrainer._prepare_inputs`` calls
  ``_generate_and_score_completions`` once every ``steps_per_generation x
  num_iterations`` micro-steps (TRL 1.16); that call samples the completions
  (``model.generate`` in the trainer process, or the vLLM client when ``use_vllm``) and
  scores them with the reward functions. This subclass runs the whole call inside a
  granted ``rollout`` phase. Everything after it, up to the next generation (the
  micro-steps' forward and backward, the optimizer steps, logging, checkpoints and
  evaluation), runs inside a granted ``train`` phase: it is entered as the rollout
  phase is released and released as the next rollout phase is asked for, or when
  ``train`` returns or raises. One RollMux iteration is therefore one generation and
  the ``generate_every / gradient_accumulation_steps`` optimizer steps that use it.
  The one evaluation before any generation (``eval_on_start``) runs inside the job's
  first rollout phase, which the first generation then keeps (its measured time
  includes the evaluation's).
* Why a subclass and a callback: TRL has no callback event around generation, so the
  rollout phase needs the method override; the state is registered by a
  ``TrainerCallback`` at ``on_train_begin``, the first moment the Trainer has built its
  optimizer, and returned to the caller at ``on_train_end`` (or when ``train`` raises).
* State: the model and the optimizer (the torch optimizer under accelerate's wrapper),
  with TRL's reference model (``beta != 0``) and the reward functions that are modules,
  form one ``StateCache`` entry. It is offloaded to host buffers at ``on_train_begin``;
  each phase loads it onto the trainer's device when its grant arrives and offloads it
  before the grant goes back (the SDK's ``state=``), so between phases nothing of the
  job stays on the device. The cache's unit is module plus optimizer, so a rollout
  phase loads the optimizer moments too. At ``on_train_end`` the entry is loaded into
  host memory (``cpu``) and removed: after ``train`` the model (and the reference and
  reward models) are usable, on the host.
* Weights to the rollout side: TRL's default generation runs in the trainer process on
  the same module the optimizer updates, so each rollout samples with the latest
  update without any copy. With ``use_vllm`` TRL pushes the weights to vLLM itself at
  the start of generation, which is inside the rollout grant (not exercised here:
  the examples and tests run without vLLM).
* Refused (``SpecError``): a configuration that generates in the middle of a gradient
  accumulation (``steps_per_generation x num_iterations`` not a multiple of
  ``gradient_accumulation_steps``): an offload drops the accumulated gradients.
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from rollmux.errors import SpecError
from rollmux.model import ROLLOUT, TRAIN
from rollmux.runtime.sdk import JobHandle, leave
from rollmux.runtime.state_cache import SwitchRecord, StateCache

CACHE_BUDGET_BYTES = 8 * 1024**3


class PhaseHolder:
    """At most one granted phase of ``job`` at a time, with the job's state switched through ``cache``.

    ``hold(name)`` releases the phase held (if any), then blocks until ``name`` is
    granted and its state loaded; ``release()`` offloads and gives the grant back.
    """

    def __init__(self, job: JobHandle, cache: StateCache, key: str) -> None:
        self.job = job
        self.cache = cache
        self.key = key
        self.device = "cpu"
        self.held: str | None = None
        self._stack = ExitStack()

    def hold(self, name: str) -> None:
        self.release()
        # a failed update cannot be redone (the batch is gone with it; a new train() generates
        # again), so a failed train phase restarts the job's iteration at its rollout
        self._stack.enter_context(self.job.phase(name, state=self.cache, key=self.key, device=self.device,
                                                 restart_on_failure=name == TRAIN))
        self.held = name

    def release(self, failure: BaseException | None = None) -> None:
        """Give the phase held back; as failed (due again, nothing counted) with ``failure``."""
        self.held = None
        stack, self._stack = self._stack, ExitStack()
        leave(stack, failure)

    def hand_back(self, failure: BaseException | None = None) -> None:
        """Release the phase held (see ``release``) and return the state to its module and
        optimizer, on the host (``cpu``), leaving the cache; a state not in the cache is
        left alone."""
        self.release(failure)
        if self.key in self.cache:
            self.cache.load(self.key, "cpu")
            self.cache.remove(self.key)


def _parked_module(trainer: GRPOTrainer) -> torch.nn.Module:
    """The module whose state the job parks: the policy, with TRL's reference model (``beta
    != 0``) and the reward functions that are modules when there are any (one
    ``ModuleDict``, so that one cache entry switches them all)."""
    others = [m for m in (trainer.ref_model, *trainer.reward_funcs) if isinstance(m, torch.nn.Module)]
    if not others:
        return trainer.model
    return torch.nn.ModuleDict({"policy": trainer.model, **{f"model{i}": m for i, m in enumerate(others)}})


class _StateCallback(TrainerCallback):
    """Parks the models and optimizer in the cache when training starts; hands them back when it ends."""

    def __init__(self, trainer: "RollMuxGRPOTrainer") -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        t = self.trainer
        optimizer = getattr(t.optimizer, "optimizer", t.optimizer)  # accelerate's AcceleratedOptimizer wraps it
        t.phases.device = str(t.accelerator.device)
        t.phases.cache.register(t.phases.key, _parked_module(t), optimizer)
        try:
            t.phases.cache.offload(t.phases.key)
        except BaseException:  # (e.g. over the cache's budget): the state never left the module
            t.phases.cache.remove(t.phases.key)
            raise

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.phases.hand_back()


class RollMuxGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose generation and updates run under ``job``'s RollMux grants (module docstring).

    Extra keyword arguments: ``job`` (a placed or waiting ``JobHandle``; this process
    must drive it), ``cache_budget_bytes`` (host memory for the parked state) and
    ``cache`` (a ``StateCache`` to park it in instead of a new one of that budget, e.g.
    one shared with the job's other state or one that observes its switches).
    Everything else is ``GRPOTrainer``'s.
    """

    def __init__(self, *args: Any, job: JobHandle, cache_budget_bytes: int = CACHE_BUDGET_BYTES,
                 cache: StateCache | None = None, **kwargs: Any) -> None:
        if not isinstance(job, JobHandle):  # before the whole GRPOTrainer is built
            raise SpecError("job", type(job).__name__, "a rollmux JobHandle (Client.submit or Client.attach)",
                            "RollMuxGRPOTrainer")
        if cache is not None and not isinstance(cache, StateCache):
            raise SpecError("cache", type(cache).__name__, "a rollmux StateCache, or None for a new one of "
                            "cache_budget_bytes", "RollMuxGRPOTrainer")
        if cache is None:
            try:
                cache = StateCache(cache_budget_bytes)
            except SpecError:
                raise SpecError("cache_budget_bytes", cache_budget_bytes, "an int >= 0 (bytes of host memory)",
                                "RollMuxGRPOTrainer") from None
        super().__init__(*args, **kwargs)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if generate_every % self.args.gradient_accumulation_steps:
            raise SpecError("steps_per_generation", self.args.steps_per_generation,
                            "steps_per_generation x num_iterations a multiple of gradient_accumulation_steps "
                            f"({self.args.gradient_accumulation_steps}), so that no generation falls inside an "
                            "accumulation", "RollMuxGRPOTrainer")
        self.phases = PhaseHolder(job, cache, f"{job.job_id}/policy")
        self.add_callback(_StateCallback(self))

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:  # evaluation: runs inside the phase held (see evaluate)
            return super()._generate_and_score_completions(inputs)
        if self.phases.held != ROLLOUT:  # (held already: eval_on_start's, see evaluate)
            self.phases.hold(ROLLOUT)
        batch = super()._generate_and_score_completions(inputs)
        self.phases.hold(TRAIN)
        return batch

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.evaluate``. Inside ``train`` it runs in the phase held (the train grant,
        after an update), except at the start (``eval_on_start``): no phase is held yet and
        the state is parked, so it takes the job's first rollout grant, which loads the
        state and which the first generation keeps. Outside ``train`` the state is the
        caller's, as with ``GRPOTrainer``."""
        if self.phases.held is None and self.phases.key in self.phases.cache:
            self.phases.hold(ROLLOUT)
        return super().evaluate(*args, **kwargs)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``. When it raises, the phase held is released and the model and
        optimizer get their state back on the host, as after a normal end: the model can be
        saved or inspected, and ``train`` called again (e.g. from a checkpoint): the phase
        it failed in was released as failed, so the job is due for that phase again."""
        failure = None
        try:
            return super().train(*args, **kwargs)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.phases.hand_back(failure)

    @property
    def switches(self) -> tuple[SwitchRecord, ...]:
        """Every warm switch of the job's state so far (the cache's records)."""
        return self.phases.cache.records


def logged_series(log_history: list[dict], key: str) -> list[float]:
    """The values TRL logged under ``key`` (``"reward"``, ``"loss"``, ...), one per logging step."""
    return [entry[key] for entry in log_history if key in entry and "train_runtime" not in entry]
