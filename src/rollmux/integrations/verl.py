"""Run a veRL ``RayPPOTrainer`` (PPO / GRPO) as a RollMux job: generation under rollout
grants, the update under train grants, veRL's own offload and sleep/wake at the boundaries.

User code (the job is a ``JobHandle``; the config a veRL Hydra config)::

    from rollmux.integrations.verl import RollMuxPPOTrainer, verl_overrides, apply_overrides, verl_pools

    placement = job.wait_placed()
    apply_overrides(config, verl_overrides(placement, config, gpus_per_node=8))
    trainer = RollMuxPPOTrainer(job=job, config=config, tokenizer=tokenizer, role_worker_mapping=roles,
                                resource_pool_manager=verl_pools(placement, 8, job_id=job.job_id),
                                train_dataset=train, val_dataset=val, collate_fn=collate_fn)
    with job.lifetime():
        trainer.init_workers()
        trainer.fit()

(``examples/verl/run_ppo.py`` is the whole script; ``docs/integrations.md`` the guide.)

Contract
--------
* Which trainer: veRL 0.9's legacy ``RayPPOTrainer`` (``verl.trainer.ppo.ray_trainer``,
  what ``main_ppo`` runs with ``trainer.use_v1=False``). It asserts the hybrid engine:
  the actor's worker processes also host the rollout engine (vLLM or SGLang), so
  generation and update share GPUs and the job needs a colocated RollMux placement
  (``verl_overrides`` refuses a disaggregated one for this config).
* Where veRL generates (``RayPPOTrainer.fit``, 0.9.1): once per step,
  ``self.async_rollout_manager.generate_sequences(batch)``, followed at once by
  ``self.checkpoint_manager.sleep_replicas()``; then old/ref log-probs, values,
  advantages, ``_update_critic``, ``_update_actor`` (``actor_rollout_wg.update_actor``),
  checkpoint saving, and ``self.checkpoint_manager.update_weights(step)`` (the weight
  sync that also wakes the engines). The hooks wrap those two managers' methods on the
  trainer's instances for the duration of ``fit``:

  - ``generate_sequences``: holds the ``rollout`` grant (releasing the train grant, if
    held), wakes the engines with the latest weights when they sleep (``wake`` below),
    then generates.
  - ``sleep_replicas`` right after a step's generation: releases the rollout grant,
    which puts the engines to sleep, and holds the ``train`` grant.
  - ``update_weights`` at the end of a step: deferred to the next rollout grant (the
    engines sit on rollout GPUs; between phases nothing of the job stays on a GPU).
  So a RollMux iteration is one veRL step: rollout = generation (with the streamed
  reward of veRL's agent loop), train = everything from log-probs to the checkpoint.
* Boundary actions (the SDK's ``state=``: they run once the grant is held and before
  it is released), each timed into ``records``:

  - train grant: ``reload`` = ``actor_rollout_wg.to("device")`` (and ``critic_wg``);
    before release ``offload`` = ``.to("cpu")`` of model, optimizer and gradients
    (veRL's own ``Worker.to`` API), and ``sleep`` if a validation woke the engines.
  - rollout grant: ``wake`` = actor model to the device, veRL's
    ``checkpoint_manager.update_weights(step)`` (naive backend: resumes the engine's
    weights, copies the actor's weights in, resumes the KV cache), actor model back to
    the host; before release ``sleep`` = veRL's ``checkpoint_manager.sleep_replicas()``:
    vLLM ``sleep(level)`` with veRL's level (2 = drop weights and KV cache, 1 with LoRA
    adapters or layered summon = weights kept in host memory), SGLang
    ``release_memory_occupation`` of KV cache and weights (KV cache only for LoRA
    adapters).
  - before ``fit``'s first phase the actor (and critic) are parked on the host
    (``park``), outside any grant, as ``init_workers`` left them on the device.
* Validation (``_validate``: ``val_before_train``, ``test_freq``) runs inside the grant
  held: before the first step it takes the first step's rollout grant; after a step it
  runs inside that step's train grant (hybrid engine: the rollout engines are on the
  training GPUs), waking the engines there and putting them back to sleep before the
  grant goes back. So the phases stay one rollout/train pair per step, which a spec's
  ``iterations`` counts.
* Not under a grant: ``init_workers`` (model load) and a checkpoint resume at the
  start of ``fit`` (``trainer.resume_mode``) run before the first grant.
* ``fit`` releases the phase held when it returns or raises (state offloaded, engines
  asleep) and removes the hooks; when it raises, the phase is released as failed (the
  service counts nothing and the job is due for that phase again).
* Refused at construction (``FrameworkConfigError``, see ``verl_config``): configs the
  boundary actions cannot keep off the GPUs (``free_cache_engine`` false, a reference
  model without param offload, engines other than vLLM / SGLang, ...).

Tests: ``tests/test_verl_adapter.py`` runs veRL's real ``RayPPOTrainer.fit`` (its real
data path, ``DataProto``, GRPO advantages, metrics) on CPU against a live control
plane, with stand-ins only for the objects that need GPUs: the actor worker group, the
rollout manager and the checkpoint manager (``FakeActorGroup`` & co. in the test
file). The GPU run (real vLLM/SGLang sleep and wake, FSDP offload) is not done here.
"""
from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from rollmux.integrations.verl_config import (COLOCATED, DISAGGREGATED, VerlPlacement, VerlShape, apply_overrides,
                                              hydra_args, job_spec_from_verl, verl_overrides)
from rollmux.integrations.verl_pools import (RollMuxResourcePool, RollMuxResourcePoolManager, pool_nodes,
                                             role_mapping, verl_pools)
from rollmux.model import ROLLOUT, TRAIN
from rollmux.runtime.sdk import JobHandle, leave

__all__ = ["BoundaryRecord", "COLOCATED", "DISAGGREGATED", "RollMuxPPOMixin", "RollMuxPPOTrainer",
           "RollMuxResourcePool", "RollMuxResourcePoolManager", "VerlPhases", "VerlPlacement", "VerlShape",
           "apply_overrides", "hydra_args", "job_spec_from_verl", "pool_nodes", "role_mapping", "verl_overrides",
           "verl_pools"]

HOOKED = (("async_rollout_manager", "generate_sequences"), ("checkpoint_manager", "sleep_replicas"),
          ("checkpoint_manager", "update_weights"))


@dataclass(frozen=True, slots=True)
class BoundaryRecord:
    """One boundary action: ``phase`` (rollout/train, or ``-`` outside grants), ``action``
    (park, reload, offload, wake, sleep), veRL's ``step`` at the time, and its seconds."""

    phase: str
    action: str
    step: int
    seconds: float


class VerlPhases:
    """One job's grants around a ``RayPPOTrainer``'s ``fit`` (module docstring).

    ``hold(name)`` releases the phase held, then blocks until ``name`` is granted and
    its boundary action ran; ``release()`` runs the closing action and gives it back.
    """

    def __init__(self, job: JobHandle, trainer: Any) -> None:
        self.job = job
        self.trainer = trainer
        self.held: str | None = None
        self.granted: str | None = None  # the phase whose grant is held, from its opening action to its closing one
        self.awake = False          # the rollout engines hold their weights and KV cache on the GPUs
        self.stale = True           # the engines' weights are older than the actor's
        self.validating = False
        self.records: list[BoundaryRecord] = []
        self._stack = ExitStack()
        self._originals: dict[tuple[str, str], Any] = {}

    # --- grants --------------------------------------------------------------------------
    def hold(self, name: str) -> None:
        self.release()
        self._stack.enter_context(self.job.phase(name, state=self, key=name))
        self.held = name

    def release(self, failure: BaseException | None = None) -> None:
        """Run the closing action and give the phase back; as failed (due again, nothing
        counted) with ``failure``, what ``fit`` raised."""
        self.held = None
        stack, self._stack = self._stack, ExitStack()
        leave(stack, failure)

    @contextmanager
    def resident(self, key: str, device: Any) -> Iterator[None]:
        """The SDK's state hook: the phase's opening action once granted, its closing one before release."""
        self.granted = key
        try:
            if key == TRAIN:
                self._train_to("device", TRAIN, "reload")
            try:
                yield
            finally:
                try:
                    if key == TRAIN:
                        self._train_to("cpu", TRAIN, "offload")
                finally:
                    if self.awake:  # after generating, or a validation inside the train grant
                        self.awake = False
                        self._timed(key, "sleep", self._original("checkpoint_manager", "sleep_replicas"))
        finally:
            self.granted = None

    # --- boundary actions -----------------------------------------------------------------
    def _groups(self) -> list[Any]:
        t = self.trainer
        groups = [t.actor_rollout_wg]
        if getattr(t, "use_critic", False) and getattr(t, "critic_wg", None) is not None:
            groups.append(t.critic_wg)
        return groups

    def _train_to(self, device: str, phase: str, action: str) -> None:
        def move() -> None:
            for group in self._groups():
                group.to(device, model=True, optimizer=True, grad=True)
        self._timed(phase, action, move)

    def park(self) -> None:
        """The trainer state to the host, outside any grant (before ``fit``'s first phase)."""
        self._train_to("cpu", "-", "park")

    def wake(self) -> None:
        """Engines awake with the actor's latest weights (veRL's naive ``update_weights``).

        The actor's model is on the device for the copy; in a rollout grant it goes back
        to the host afterwards, in a train grant (a validation) it stays.
        """
        in_train = self.granted == TRAIN

        def sync() -> None:
            actor = self.trainer.actor_rollout_wg
            if not in_train:
                actor.to("device", model=True, optimizer=False, grad=False)
            self._original("checkpoint_manager", "update_weights")(self._step())
            if not in_train:
                actor.to("cpu", model=True, optimizer=False, grad=False)
        self._timed(self.granted or "-", "wake", sync)
        self.awake, self.stale = True, False

    def _step(self) -> int:
        return int(getattr(self.trainer, "global_steps", 0) or 0)

    def _timed(self, phase: str, action: str, fn: Any) -> Any:
        t0 = time.monotonic()
        out = fn()
        self.records.append(BoundaryRecord(phase, action, self._step(), time.monotonic() - t0))
        return out

    # --- hooks ------------------------------------------------------------------------------
    def _original(self, owner: str, name: str) -> Any:
        return self._originals.get((owner, name)) or getattr(getattr(self.trainer, owner), name)

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.held != ROLLOUT and not (self.validating and self.held is not None):
            self.hold(ROLLOUT)
        if not self.awake or self.stale:
            self.wake()
        return self._originals[("async_rollout_manager", "generate_sequences")](*args, **kwargs)

    def _sleep_replicas(self, *args: Any, **kwargs: Any) -> Any:
        if self.held == ROLLOUT and not self.validating:
            self.hold(TRAIN)  # releasing the rollout grant puts the engines to sleep
            return None
        if self.awake:
            self.awake = False
            return self._originals[("checkpoint_manager", "sleep_replicas")](*args, **kwargs)
        return None

    def _update_weights(self, global_steps: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if self.validating and self.held is not None:
            self.wake()  # veRL wakes the engines after a colocated reward model scored
            return {}
        self.stale = True  # the next rollout grant syncs the weights (wake)
        return {}

    def install(self) -> None:
        """Wrap the trainer's managers' methods (``HOOKED``) on their instances."""
        if self._originals:
            return
        handlers = {"generate_sequences": self._generate, "sleep_replicas": self._sleep_replicas,
                    "update_weights": self._update_weights}
        for owner, name in HOOKED:
            target = getattr(self.trainer, owner)
            self._originals[(owner, name)] = getattr(target, name)
            setattr(target, name, handlers[name])

    def uninstall(self) -> None:
        """Put the managers' own methods back."""
        for (owner, name), original in self._originals.items():
            target = getattr(self.trainer, owner)
            if name in vars(target):
                delattr(target, name)
            if getattr(target, name, None) != original:
                setattr(target, name, original)
        self._originals.clear()

    @contextmanager
    def validation(self) -> Iterator[None]:
        """Run a validation inside the grant held, or the rollout grant when none is (module docstring)."""
        if self.held is None:
            self.hold(ROLLOUT)
        self.validating = True
        try:
            yield
        finally:
            self.validating = False


class RollMuxPPOMixin:
    """Put before ``RayPPOTrainer`` (or a subclass of it) in the bases: ``fit`` and
    ``_validate`` run under ``job``'s RollMux grants. Extra keyword argument: ``job``."""

    def __init__(self, *args: Any, job: JobHandle, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rollmux_shape = VerlShape.from_config(self.config)
        self.rollmux = VerlPhases(job, self)

    def fit(self) -> Any:
        phases = self.rollmux
        phases.install()
        failure = None
        try:
            phases.park()
            return super().fit()
        except BaseException as exc:
            failure = exc
            raise
        finally:
            try:
                phases.release(failure)
            finally:
                phases.uninstall()

    def _validate(self, merged: bool = False) -> Any:
        if not self.rollmux._originals:  # outside fit: no grants
            return super()._validate(merged)
        with self.rollmux.validation():
            return super()._validate(merged)

    @property
    def switches(self) -> tuple[BoundaryRecord, ...]:
        """Every boundary action so far."""
        return tuple(self.rollmux.records)


class RollMuxPPOTrainer(RollMuxPPOMixin, RayPPOTrainer):
    """veRL's ``RayPPOTrainer`` whose ``fit`` runs under ``job``'s RollMux grants (module docstring)."""
