"""The two Ray actor classes of a GRPO job: a rollout worker and a training worker.

Both take a ``WorkerInfo`` (the Ray adapter's constructor contract) and are configured
by ``setup(profile, weights)``, which builds the model, registers its state in the
worker's ``StateCache`` and offloads it to host buffers: between its phases a job's
state sits in the cache, and ``switch_in`` / ``switch_out`` (called by the driver's
``RemoteState`` under the phase's grant) load it and offload it again, each returning
the cache's ``SwitchRecord``.

* ``RolloutWorker.rollout(step, weights)``: if ``weights`` is given, copy them into the
  policy first (the training worker's latest update, the asynchronous variants' path);
  if ``weights`` is None and a weight sync delivered new weights since the last rollout,
  copy those in (see "Weight sync" below); then sample ``prompts`` prompts
  (seeded by the job seed and ``step``), generate ``samples`` completions for each and
  score them. Returns (batch, stats): the batch holds ``prompts`` [B, P],
  ``completions`` [B, A], ``rewards`` [B] with B = prompts x samples, grouped by prompt.
  Scoring is the task's exact reward in the worker, or, when the profile names a
  ``reward_service`` (a Serve app of ``rollmux.reward_service``), the same exact reward
  from that shared service through a ``RewardClient`` (one call per batch or chunk).
* ``TrainWorker.train(batch)``: group-relative advantages; old (and reference)
  log-probs under the current weights, which are the ones the rollout sampled with
  (or the batch's ``behaviour_logp`` when an asynchronous rollout brings them);
  ``epochs`` passes of shuffled minibatches with the clipped loss and gradient
  clipping at 1. Returns (weights, stats): the updated policy's state_dict, which the
  worker also keeps as its weight sender's state. ``update(batch)`` is ``train`` that
  returns only the stats (the synchronous driver: the weights leave by weight sync).

Weight sync (``rollmux.weight_sync``): a ``TrainWorker`` is a ``WeightSender`` whose
state is the weights of its latest update (after ``setup``: the initial weights; after
``import_state``: the moved policy's weights, rebuilt from the exported slots), and a
``RolloutWorker`` is a ``WeightReceiver``. ``scatter_broadcast_sync([train],
[rollout, *helpers])`` (or ``naive_sync`` with one receiver: a single copy) leaves the
new weights in each receiver; its next ``rollout(step, None)`` / ``prepare(step, None)``
loads them into the policy once, checks that the policy now holds them bit for bit
(``WeightSyncError`` otherwise) and drops the receiver's copy.

Chunked rollout (``prepare(step, weights)``, then ``chunk(step, start)`` per
``gen_batch`` sequences): the long-tail demo spreads one rollout over several rollout
workers of a job and reports its tail as chunks finish; each chunk has the seed it has
in ``rollout``, so the assembled batch is ``rollout``'s, whoever generated which chunk.

Moves (``export_state`` / ``import_state``): between phases an entry sits in its
cache's host buffers. ``export_state`` returns copies of those buffers by slot name
(every parameter and buffer, every tensor of the optimizer's per-parameter state),
the optimizer's non-tensor state and the worker's step counter; returned from an actor
call, it lands in the Ray object store. ``import_state(profile, state)`` on a fresh
worker (another node) builds the same modules and optimizer, copies the slots in,
recreates the optimizer state, and parks the entry in its own cache: the job carries
on bit for bit where it left off.

Each worker runs torch on one thread, so phases on different nodes run in parallel.
"""
from __future__ import annotations

import copy
import functools
import random
import time

import torch

from rollmux.grpo.algorithm import group_advantages, grpo_loss
from rollmux.grpo.policy import build_policy, completion_logprobs, generate, parameter_count, task_batch
from rollmux.grpo.profiles import JobProfile
from rollmux.grpo.task import decode, get_task, reward
from rollmux.runtime.ray_adapter import WorkerInfo
from rollmux.runtime.state_cache import SwitchRecord, StateCache
from rollmux.weight_sync import WeightReceiver, WeightSender, WeightSyncError, digest

DEVICE = "cpu"
CACHE_BUDGET_BYTES = 256 * 1024**2


class _CachedWorker:
    """What both workers share: one cache entry holding the state, switched per phase."""

    def __init__(self, info: WorkerInfo) -> None:
        torch.set_num_threads(1)
        self.info = info
        self.key = f"{info.job_id}/{info.pool}"
        self.cache = StateCache(CACHE_BUDGET_BYTES, release_device_cache=False)
        self.profile: JobProfile | None = None

    def switch_in(self) -> SwitchRecord:
        """Load the state from host buffers onto the device (warm path)."""
        return self.cache.load(self.key, DEVICE)

    def switch_out(self) -> SwitchRecord:
        """Offload the state to its host buffers and free the device copy."""
        return self.cache.offload(self.key)

    def export_state(self) -> dict:
        """The entry's state while parked (between phases) as compact copies, for a move."""
        from rollmux.runtime.state_cache import Residency

        if self.cache.residency(self.key) is not Residency.HOST:
            raise RuntimeError(f"{self.key}: export_state between phases only (state must be offloaded)")
        entry_optimizer = getattr(self, "optimizer", None)
        extra = {}
        if entry_optimizer is not None:
            params = [p for g in entry_optimizer.param_groups for p in g["params"]]
            extra = {(i, k): v for i, p in enumerate(params)
                     for k, v in entry_optimizer.state.get(p, {}).items() if not isinstance(v, torch.Tensor)}
        return {"slots": {name: t.clone() for name, t in self.cache.host_buffers(self.key).items()},
                "optimizer_extra": extra, "updates": getattr(self, "updates", 0), "profile": self._configured()}

    def _adopt(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict) -> None:
        """Copy an exported state into freshly built ``module`` / ``optimizer`` and park it."""
        named = dict([*module.named_parameters(), *module.named_buffers()])
        params = [] if optimizer is None else [p for g in optimizer.param_groups for p in g["params"]]
        expected = {f"module.{n}" for n in named}
        module_slots = {k for k in state["slots"] if k.startswith("module.")}
        if module_slots != expected:
            raise RuntimeError(f"{self.key}: exported slots do not match the module "
                               f"({sorted(module_slots ^ expected)[:4]} ...)")
        with torch.no_grad():
            for name, tensor in state["slots"].items():
                kind, rest = name.split(".", 1)
                if kind == "module":
                    named[rest].copy_(tensor)
                else:
                    index, key = rest.split(".", 1)
                    optimizer.state[params[int(index)]][key] = tensor.clone()
        for (index, key), value in state["optimizer_extra"].items():
            optimizer.state[params[index]][key] = value
        self.cache.register(self.key, module, optimizer)
        self.cache.offload(self.key)

    def _configured(self) -> JobProfile:
        if self.profile is None:
            raise RuntimeError(f"{self.key}: setup(profile, weights) must run before phases")
        return self.profile


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bytes (equal bits: equal tensors, NaN payloads and signed zeros included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class RolloutWorker(_CachedWorker, WeightReceiver):
    def __init__(self, info: WorkerInfo) -> None:
        _CachedWorker.__init__(self, info)
        WeightReceiver.__init__(self, info)
        self._fresh = False  # a sync delivered weights the policy does not hold yet
        self.synced = 0  # received weight sets loaded into the policy

    def _assemble(self, parts: dict[str, torch.Tensor], order) -> None:
        WeightReceiver._assemble(self, parts, order)
        self._fresh = True

    def _take(self, weights: dict[str, torch.Tensor] | None) -> None:
        """Load ``weights`` if given; else the weights the last sync delivered (once, then
        checked bit for bit against the policy and dropped); else keep the policy's."""
        if weights is not None:
            self.policy.load_state_dict(weights)
            return
        if not self._fresh:
            return
        received, self._fresh = self.state, False
        self.policy.load_state_dict(received)
        held = self.policy.state_dict()
        bad = [k for k, t in received.items() if k not in held or not torch.equal(_bits(held[k]), _bits(t))]
        if bad or len(held) != len(received):
            raise WeightSyncError(f"{self.key}: the policy does not hold the synced weights ({bad[:4]})")
        self.state = {}
        self.synced += 1

    def setup(self, profile: JobProfile, weights: dict[str, torch.Tensor]) -> int:
        """Build the policy with ``weights`` and park it in the cache; returns its parameter count."""
        self.profile = profile
        self.task = get_task(profile.task)
        self.policy = build_policy(profile.model, profile.seed)
        self.policy.load_state_dict(weights)
        params = parameter_count(self.policy)
        self.cache.register(self.key, self.policy)
        self.cache.offload(self.key)
        return params

    def import_state(self, profile: JobProfile, state: dict) -> int:
        """Take over a moved job's rollout state (``export_state`` of its old worker)."""
        self.profile = profile
        self.task = get_task(profile.task)
        self.policy = build_policy(profile.model, profile.seed)
        self._adopt(self.policy, None, state)
        return parameter_count(self.policy)

    def rollout(self, step: int, weights: dict[str, torch.Tensor] | None) -> tuple[dict, dict]:
        p = self._configured()
        t0 = time.perf_counter()
        self._take(weights)
        rng = random.Random(p.seed * 1_000_003 + step)
        prompts, answers = task_batch(self.task, rng, p.prompts)
        prompts = prompts.repeat_interleave(p.samples, dim=0)
        answers = [a for a in answers for _ in range(p.samples)]
        completions = torch.cat([
            generate(self.policy, prompts[i : i + p.gen_batch], self.task.answer_len, p.seed * 7919 + step * 131 + i)
            for i in range(0, len(prompts), p.gen_batch)
        ])
        rewards = self._score(prompts, completions, answers)
        stats = {"reward": float(rewards.mean()), "exact": float((rewards == 1.0).float().mean()),
                 "samples": len(rewards), "compute_s": time.perf_counter() - t0}
        return {"prompts": prompts, "completions": completions, "rewards": rewards}, stats

    def _score(self, prompts: torch.Tensor, completions: torch.Tensor, answers: list[str]) -> torch.Tensor:
        """Rewards [B] of completions [B, A]: the exact reward here, or from the profile's reward service."""
        texts = [decode(c.tolist()) for c in completions]
        if self.profile.reward_service is None:
            return torch.tensor([reward(t, a) for t, a in zip(texts, answers)])
        items = [(self.task.name, decode(q.tolist()), t) for q, t in zip(prompts, texts)]
        return torch.tensor(self._reward_client.score(items, "exact"))

    @functools.cached_property
    def _reward_client(self):
        """The ``RewardClient`` of the profile's reward service, made on first use (in the worker)."""
        from rollmux.reward_service import RewardClient

        return RewardClient(self.profile.reward_service)

    # --- chunked rollout (the long-tail demo) ----------------------------------------
    def prepare(self, step: int, weights: dict[str, torch.Tensor] | None) -> int:
        """Start a chunked rollout of ``step``: take ``weights`` (if given; else the synced
        ones, as ``rollout``) and sample the
        step's prompts (the same on every worker: seeded by the job seed and ``step``).
        Returns the number of sequences (prompts x samples). The state must be loaded."""
        p = self._configured()
        self._take(weights)
        rng = random.Random(p.seed * 1_000_003 + step)
        prompts, answers = task_batch(self.task, rng, p.prompts)
        self._step_batch = (step, prompts.repeat_interleave(p.samples, dim=0),
                            [a for a in answers for _ in range(p.samples)])
        return len(self._step_batch[2])

    def chunk(self, step: int, start: int) -> dict:
        """Generate and score sequences ``start .. start + gen_batch`` of ``step``'s batch:
        the same seed per chunk as ``rollout``, so the batch does not depend on which
        worker generated which chunk (a chunked rollout equals ``rollout``)."""
        p = self._configured()
        if getattr(self, "_step_batch", (None,))[0] != step:
            raise RuntimeError(f"{self.key}: chunk({step}) before prepare({step})")
        _, prompts, answers = self._step_batch
        part = prompts[start : start + p.gen_batch]
        completions = generate(self.policy, part, self.task.answer_len, p.seed * 7919 + step * 131 + start)
        rewards = self._score(part, completions, answers[start : start + p.gen_batch])
        return {"prompts": part, "completions": completions, "rewards": rewards}


class TrainWorker(_CachedWorker, WeightSender):
    def __init__(self, info: WorkerInfo) -> None:
        _CachedWorker.__init__(self, info)
        WeightSender.__init__(self, info)

    def setup(self, profile: JobProfile, weights: dict[str, torch.Tensor]) -> int:
        """Build policy (+ frozen reference when ``kl_coef`` > 0) and optimiser; park them in the cache."""
        modules = self._build(profile, weights)
        self.set_weights(weights)
        params = parameter_count(self.policy)
        self.cache.register(self.key, torch.nn.ModuleDict(modules), self.optimizer)
        self.cache.offload(self.key)
        self.updates = 0
        return params

    def _build(self, profile: JobProfile, weights: dict | None = None) -> dict:
        """Policy (with ``weights`` if given), frozen reference when ``kl_coef`` > 0, optimiser;
        returns the modules the state cache holds."""
        self.profile = profile
        self.policy = build_policy(profile.model, profile.seed)
        if weights is not None:
            self.policy.load_state_dict(weights)
        modules = {"policy": self.policy}
        self.reference = None
        if profile.kl_coef > 0:
            self.reference = copy.deepcopy(self.policy).requires_grad_(False)
            modules["reference"] = self.reference
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=profile.lr, weight_decay=0.0)
        return modules

    def import_state(self, profile: JobProfile, state: dict) -> int:
        """Take over a moved job's training state: policy, reference, AdamW moments and
        step counts, and the update counter (it seeds the minibatch order)."""
        modules = self._build(profile)
        # The sender's state: the policy's state_dict, read from the exported slots (a
        # tied weight's second name maps to the slot of the parameter it shares).
        slot_of = {id(t): f"module.policy.{n}" for n, t in
                   [*self.policy.named_parameters(), *self.policy.named_buffers()]}
        names = {k: slot_of[id(t)] for k, t in self.policy.state_dict(keep_vars=True).items()}
        self._adopt(torch.nn.ModuleDict(modules), self.optimizer, state)
        self.state = {k: state["slots"][slot].clone() for k, slot in names.items()}
        self.updates = state["updates"]
        return parameter_count(self.policy)

    def train(self, batch: dict) -> tuple[dict[str, torch.Tensor], dict]:
        p = self._configured()
        t0 = time.perf_counter()
        prompts, completions = batch["prompts"], batch["completions"]
        advantages = group_advantages(batch["rewards"], p.samples)
        self.policy.train()
        with torch.no_grad():
            # An asynchronous rollout (rollmux.grpo.async_grpo) brings its behaviour policy's
            # log-probs: the ratio is then current over behaviour policy, clipped as usual.
            logp_old = batch.get("behaviour_logp")
            if logp_old is None:
                logp_old = completion_logprobs(self.policy, prompts, completions)
            logp_ref = completion_logprobs(self.reference, prompts, completions) if self.reference else None
        gen = torch.Generator().manual_seed(p.seed * 104729 + self.updates)
        losses, clip_fracs, kls = [], [], []
        for _ in range(p.epochs):
            order = torch.randperm(len(prompts), generator=gen)
            for start in range(0, len(order), p.minibatch):
                idx = order[start : start + p.minibatch]
                logp = completion_logprobs(self.policy, prompts[idx], completions[idx])
                loss, info = grpo_loss(logp, logp_old[idx], advantages[idx], p.clip,
                                       None if logp_ref is None else logp_ref[idx], p.kl_coef)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
                self.optimizer.step()
                losses.append(loss.item())
                clip_fracs.append(info["clip_frac"])
                kls.append(info.get("kl", 0.0))
        self.updates += 1
        weights = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        self.state = weights  # what a weight sync sends (no copy: the returned tensors)
        stats = {"loss": sum(losses) / len(losses), "clip_frac": sum(clip_fracs) / len(clip_fracs),
                 "kl": sum(kls) / len(kls), "steps": len(losses), "compute_s": time.perf_counter() - t0}
        return weights, stats

    def update(self, batch: dict) -> dict:
        """``train(batch)``, returning only the stats: the new weights stay here, as this
        sender's state, until a weight sync sends them to the rollout workers. Their
        per-tensor digests (for the sync's check) are computed here too, inside the train
        phase, so that the sync, which runs under the next rollout grant, only reads them."""
        stats = self.train(batch)[1]
        self._digests = (self.state, {k: digest(t) for k, t in self.state.items()})
        return stats

    def digests(self) -> dict[str, str]:
        held = getattr(self, "_digests", None)
        if held is not None and held[0] is self.state:
            return held[1]
        return WeightSender.digests(self)
