"""veRL config <-> RollMux job: the job spec a veRL PPO/GRPO config asks for, and the
config overrides a RollMux placement gives back. Needs no veRL install (plain dicts and
OmegaConf ``DictConfig`` both work).

Forward (``VerlShape.from_config(config)``, then ``shape.job_spec(...)``)
--------------------------------------------------------------------------
* Training GPUs: ``trainer.nnodes x trainer.n_gpus_per_node``.
* Rollout GPUs: with ``actor_rollout_ref.hybrid_engine`` true (veRL's default, and the
  only mode of ``RayPPOTrainer``) the rollout engine lives in the actor's worker
  processes, on the same GPUs: rollout GPUs = training GPUs and the job needs a
  colocated RollMux placement (``layout == "colocated"``). With it false, veRL serves
  generation from standalone replicas on ``actor_rollout_ref.rollout.nnodes x
  actor_rollout_ref.rollout.n_gpus_per_node`` GPUs of their own (``"disaggregated"``).
* Model: the last component of ``actor_rollout_ref.model.path``
  (``Qwen/Qwen2.5-7B-Instruct`` -> ``Qwen2.5-7B-Instruct``); RollMux reads its size
  column from the name.
* Memory (host GB per node, what a warm switch parks; ``P`` = parameters, from
  ``params_b`` or the size in the model name, e.g. ``7B``, see ``params_from_name``):
  training state ``12 P / train nodes`` for the actor (fp32 master weights 4 bytes +
  Adam moments 8 bytes, FSDP-sharded over the training nodes), the same again for a
  critic (``critic.enable``, or GAE), plus ``2 P / train nodes`` for a reference model
  (bf16); rollout state ``2 P x n_gpus_per_node / (tp x pp)`` (bf16 weights of the
  replicas on one node: what vLLM's sleep level 1 keeps in host memory; level 2 and
  SGLang's release keep nothing, so this is the worst case). A name without a size
  leaves the memory fields out (RollMux then assumes 0); a name that marks a mixture
  of experts (``Mixtral-8x7B``, ``Qwen1.5-MoE-A2.7B``) gives no size either, as its total
  size is not in it, and ``job_spec`` refuses it without ``params_b``, naming
  ``actor_rollout_ref.model.path`` (leaving its memory out would understate it).
* Not movable (``movable: false``): the worker groups stay where their pools were
  pinned; the adapter cannot bring them to other nodes.
* Refused (``FrameworkConfigError``, naming the field): a group on a field's path that
  is not a mapping (``critic: yes``), a node or GPU count, batch size or ``rollout.n``
  outside 1 to ``MAX_COUNT``, an ``algorithm.adv_estimator`` or
  ``actor_rollout_ref.actor.strategy`` that is not a string, an empty or missing model
  path, a model name whose size is not in (0, 1e6) B, a rollout engine other than
  ``vllm`` / ``sglang``,
  ``actor_rollout_ref.rollout.free_cache_engine`` false (veRL's sleep would then be a
  no-op and the engine would keep its GPU memory while other jobs run), a rollout
  parallel size (tp x dp x pp) that does not divide the rollout GPUs, and a reference
  model without ``param_offload`` in its strategy's group
  (``actor_rollout_ref.ref.fsdp_config.param_offload`` for ``fsdp`` / ``fsdp2``,
  ``actor_rollout_ref.ref.megatron.param_offload`` for ``megatron``, ``ref.<strategy>``
  for another: veRL's ``to()`` moves only the actor, so an unoffloaded reference model
  would stay on the GPUs between phases).

Back (``verl_overrides(placement, config, gpus_per_node)``)
------------------------------------------------------------
A placement (``Placement`` or the SDK's ``{"rollout_nodes", "train_nodes"}``) becomes
the dotted overrides veRL needs: node and GPU counts of the trainer (and of the
standalone rollout when disaggregated), ``trainer.use_v1=False`` (the legacy
``RayPPOTrainer`` loop the phase hooks wrap). A placement whose two node sets are the
same is colocated; any other is disaggregated. A hybrid-engine config on a
disaggregated placement is refused (``RayPPOTrainer`` asserts ``hybrid_engine``; a
disaggregated veRL run is veRL's standalone rollout, ``hybrid_engine=False``). A
placement with fewer training GPUs than the config asks for, or (disaggregated) fewer
rollout GPUs, is refused too (the job's spec came from another config): the overrides
never shrink a run silently. They grow one to whole nodes (``verl_pools`` reserves
every GPU of each node): a config asking for 4 GPUs runs on the 8 of the node it is
given. A grown run's batches must still split over its data-parallel ranks, as veRL
checks at its start (``validate_config`` and the workers' mini-batch split, without
``use_dynamic_bsz``): ``data.train_batch_size x rollout.n`` a multiple of the training
GPUs (Megatron: of its data-parallel size x ``ppo_micro_batch_size_per_gpu``), and
``ppo_mini_batch_size x rollout.n`` of the actor (and of a critic) a multiple of the
data-parallel size; else FrameworkConfigError naming the batch field, before veRL
starts (pass a smaller ``gpus_per_node`` to ``verl_overrides`` and ``verl_pools`` to run
on part of each node).
``apply_overrides`` writes them into a config (refusing a path with an empty key, or
one through a value that is not a mapping, which would replace it), ``hydra_args``
renders them for veRL's command line.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollmux.errors import FrameworkConfigError
from rollmux.model import MAX_JOB_ITERATIONS, size_in_name

WHERE = "veRL config"
ENGINES = ("vllm", "sglang")
COLOCATED = "colocated"
DISAGGREGATED = "disaggregated"
FSDP_STRATEGIES = ("fsdp", "fsdp2")
TRAIN_BYTES_PER_PARAM = 12   # fp32 master weights (4) + Adam first and second moments (8)
REF_BYTES_PER_PARAM = 2      # bf16 reference weights
ROLLOUT_BYTES_PER_PARAM = 2  # bf16 inference weights (vLLM sleep level 1 parks them on the host)
MAX_COUNT = 10 ** 9          # a node, GPU, batch or sample count above it is a typo, not a run
MAX_PARAMS_B = 1e6           # billions of parameters (a size at or above it is a typo)
MODEL_PATH = "actor_rollout_ref.model.path"

_MISSING = object()
_MOE_RE = re.compile(r"\d\s*x\s*\d+(?:\.\d+)?\s*b(?![a-z])"   # Mixtral-8x7B: experts x expert size
                     r"|[-_]a\d+(?:\.\d+)?b(?![a-z])"        # Qwen3-30B-A3B: active size
                     r"|[-_]\d+e(?![a-z\d])"                # Llama-4-Scout-17B-16E: expert count
                     r"|moe", re.IGNORECASE)                # Qwen1.5-MoE-A2.7B, OLMoE-1B-7B


def _plain(config: Any) -> Any:
    """A plain nested dict of ``config`` (DictConfig interpolations resolved, ``???`` kept)."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with the verl extra
        DictConfig = ()  # type: ignore[assignment]
    if DictConfig and isinstance(config, DictConfig):
        from omegaconf.errors import OmegaConfBaseException

        try:
            return OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
        except OmegaConfBaseException as err:  # (an interpolation that does not resolve, anywhere in it)
            key = getattr(err, "full_key", None) or "config"
            raise FrameworkConfigError(str(key), getattr(err, "msg", str(err)).splitlines()[0],
                                       "a value that resolves (an interpolation failed)", WHERE) from None
    if not isinstance(config, Mapping):
        raise FrameworkConfigError("config", type(config).__name__, "a veRL config (dict or OmegaConf DictConfig)",
                                   WHERE)
    return config


def _get(config: Mapping, path: str, default: Any = _MISSING) -> Any:
    """The value at dotted ``path``: ``default`` where a key on the way is missing or the value
    is ``???`` (without one, FrameworkConfigError); a value on the way that is not a mapping
    (``critic: yes`` for ``critic.enable``) is FrameworkConfigError naming it."""
    node: Any = config
    parts = path.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, Mapping):
            raise FrameworkConfigError(".".join(parts[:depth]), node, f"a mapping (the group of {path})", WHERE)
        if part not in node:
            if default is _MISSING:
                raise FrameworkConfigError(path, None, "a value (the field is missing)", WHERE)
            return default
        node = node[part]
    if node == "???":
        if default is _MISSING:
            raise FrameworkConfigError(path, node, "a value (veRL's '???' means it must be set)", WHERE)
        return default
    return node


def _int(config: Mapping, path: str, minimum: int, default: Any = _MISSING) -> int:
    value = _get(config, path, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise FrameworkConfigError(path, value, f"an integer from {minimum} to {MAX_COUNT}", WHERE)
    return value


def _str(config: Mapping, path: str, default: str) -> str:
    value = _get(config, path, default)
    if not isinstance(value, str):
        raise FrameworkConfigError(path, value, "a string", WHERE)
    return value


def _flag(config: Mapping, path: str, default: bool) -> bool:
    value = _get(config, path, default)
    if not isinstance(value, bool):
        raise FrameworkConfigError(path, value, "true or false", WHERE)
    return value


def is_mixture_of_experts(model: str) -> bool:
    """Whether a model name marks a mixture of experts: an ``<N>x<M>B`` size
    (``Mixtral-8x7B``), an ``-A<M>B`` active size (``Qwen3-30B-A3B``), an ``-<N>E`` expert
    count (``Llama-4-Scout-17B-16E``) or ``MoE`` (``Qwen1.5-MoE-A2.7B``, ``OLMoE-1B-7B``)."""
    return bool(_MOE_RE.search(model or ""))


def params_from_name(model: str) -> float | None:
    """Billions of parameters named in a model name (``Qwen2.5-0.5B`` -> 0.5; the decimal
    point written ``_`` as in ``stablelm-2-1_6b`` -> 1.6, or ``b`` as in ``bloom-1b7`` -> 1.7,
    ``bloom-7b1`` -> 7.1), or None: no size in the name, or a name that marks a mixture of
    experts (``is_mixture_of_experts``), whose total size is not in its name (``Mixtral-8x7B``
    holds 46.7B parameters, ``Qwen1.5-MoE-A2.7B`` 14.3B) and must be given as ``params_b``."""
    return None if is_mixture_of_experts(model) else size_in_name(model)


def _size_from_name(path: str, model: str) -> float | None:
    """``params_from_name(model)``; a size not in (0, 1e6) is FrameworkConfigError naming
    ``actor_rollout_ref.model.path`` (``path``)."""
    size = params_from_name(model)
    if size is not None and not 0 < size < MAX_PARAMS_B:
        raise FrameworkConfigError(MODEL_PATH, path, "a model name whose size is between 0 and 1e6 B (exclusive), "
                                   "or params_b given", WHERE)
    return size


def needs_reference(config: Mapping) -> bool:
    """veRL's ``need_reference_policy``: a KL term in the reward or in the actor's loss."""
    return (_flag(config, "algorithm.use_kl_in_reward", False)
            or _flag(config, "actor_rollout_ref.actor.use_kl_loss", False))


def needs_critic(config: Mapping) -> bool:
    """veRL's ``need_critic``: ``critic.enable`` when set, else GAE advantages."""
    enable = _get(config, "critic.enable", None)
    if enable is not None:
        return _flag(config, "critic.enable", False)  # (a string "false" was read as true)
    return _str(config, "algorithm.adv_estimator", "gae") == "gae"


@dataclass(frozen=True, slots=True)
class VerlShape:
    """What a veRL config asks of a cluster (module docstring): layout, nodes, GPUs, model, memory."""

    layout: str
    train_nodes: int
    train_gpus_per_node: int
    rollout_nodes: int
    rollout_gpus_per_node: int
    model: str
    engine: str
    rollout_parallel: int          # GPUs per rollout replica (tp x dp x pp)
    responses_per_step: int        # data.train_batch_size x actor_rollout_ref.rollout.n
    params_b: float | None
    mem_roll_gb: float | None
    mem_train_gb: float | None
    critic: bool
    reference: bool
    iterations: int | None         # trainer.total_training_steps when set

    @property
    def train_gpus(self) -> int:
        return self.train_nodes * self.train_gpus_per_node

    @property
    def rollout_gpus(self) -> int:
        return self.rollout_nodes * self.rollout_gpus_per_node

    @classmethod
    def from_config(cls, config: Any, params_b: float | None = None) -> "VerlShape":
        """Read and check ``config`` (module docstring); ``FrameworkConfigError`` names the first bad field."""
        c = _plain(config)
        train_nodes = _int(c, "trainer.nnodes", 1)
        train_gpn = _int(c, "trainer.n_gpus_per_node", 1)
        hybrid = _flag(c, "actor_rollout_ref.hybrid_engine", True)
        engine = _get(c, "actor_rollout_ref.rollout.name")
        if engine not in ENGINES:
            raise FrameworkConfigError("actor_rollout_ref.rollout.name", engine,
                                       f"one of {ENGINES} (the engines whose sleep/wake the adapter drives)", WHERE)
        if not _flag(c, "actor_rollout_ref.rollout.free_cache_engine", True):
            raise FrameworkConfigError("actor_rollout_ref.rollout.free_cache_engine", False,
                                       "true: without it veRL's sleep keeps the engine's GPU memory while other "
                                       "jobs' phases run on the node", WHERE)
        if hybrid:
            layout, roll_nodes, roll_gpn = COLOCATED, train_nodes, train_gpn
        else:
            layout = DISAGGREGATED
            roll_nodes = _int(c, "actor_rollout_ref.rollout.nnodes", 1)
            roll_gpn = _int(c, "actor_rollout_ref.rollout.n_gpus_per_node", 1)
        parallel = 1
        for name in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
            parallel *= _int(c, f"actor_rollout_ref.rollout.{name}", 1, 1)
        if (roll_nodes * roll_gpn) % parallel:
            tp = _get(c, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
            raise FrameworkConfigError("actor_rollout_ref.rollout.tensor_model_parallel_size", tp,
                                       f"a replica size (tp x dp x pp = {parallel}) dividing the "
                                       f"{roll_nodes * roll_gpn} rollout GPUs", WHERE)
        path = _get(c, MODEL_PATH)
        if not isinstance(path, str) or path != path.strip() or not path.strip("/ "):
            raise FrameworkConfigError(MODEL_PATH, path, "a model path or hub id (without surrounding spaces)", WHERE)
        model = path.rstrip("/").split("/")[-1].strip()
        if not model:
            raise FrameworkConfigError(MODEL_PATH, path, "a path ending in a model name", WHERE)
        batch = _int(c, "data.train_batch_size", 1)
        n = _int(c, "actor_rollout_ref.rollout.n", 1, 1)
        reference, critic = needs_reference(c), needs_critic(c)
        strategy = _str(c, "actor_rollout_ref.actor.strategy", "fsdp")
        offload = f"actor_rollout_ref.ref.{'fsdp_config' if strategy in FSDP_STRATEGIES else strategy}.param_offload"
        if reference and not _flag(c, offload, False):
            raise FrameworkConfigError(offload, False, "true when a reference model is used (actor.use_kl_loss or "
                                       "algorithm.use_kl_in_reward): the adapter's offload moves only the "
                                       "actor, so the reference model must offload itself", WHERE)
        steps = _get(c, "trainer.total_training_steps", None)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or not 1 <= steps <= MAX_JOB_ITERATIONS):
            raise FrameworkConfigError("trainer.total_training_steps", steps,
                                       f"null or an integer from 1 to {MAX_JOB_ITERATIONS}", WHERE)
        if params_b is not None and (isinstance(params_b, bool) or not isinstance(params_b, (int, float))
                                     or not 0 < params_b < MAX_PARAMS_B):
            raise FrameworkConfigError("params_b", params_b, "billions of parameters, a finite number > 0", WHERE)
        size = params_b if params_b is not None else _size_from_name(path, model)
        mem_roll = mem_train = None
        if size is not None:
            p = size * 1e9
            tp_pp = (_int(c, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1, 1)
                     * _int(c, "actor_rollout_ref.rollout.pipeline_model_parallel_size", 1, 1))
            mem_roll = ROLLOUT_BYTES_PER_PARAM * p * roll_gpn / tp_pp / 1e9
            per_node = TRAIN_BYTES_PER_PARAM * (1 + critic) + REF_BYTES_PER_PARAM * reference
            mem_train = per_node * p / train_nodes / 1e9
        return cls(layout, train_nodes, train_gpn, roll_nodes, roll_gpn, model, engine, parallel, batch * n, size,
                   mem_roll, mem_train, critic, reference, steps)

    def job_spec(self, job_id: str, t_roll_s: float, t_train_s: float, slo: float = 1.5,
                 iterations: int | None = None) -> dict:
        """The RollMux job spec (``Client.submit``'s dict); phase times come from a profile.

        ``movable`` is false: veRL's worker groups stay on the nodes their pools were
        pinned to, and the adapter has no way to bring them to others (no ``on_move``).
        ``colocate`` is true for the hybrid engine (generation and updates on the same
        GPUs): the planner then only ever places the job co-located on its training nodes,
        the placement ``verl_overrides`` accepts for it.

        A shape without a size whose model name marks a mixture of experts
        (``is_mixture_of_experts``) is refused, naming ``actor_rollout_ref.model.path``: its
        memory left out would understate it; ``VerlShape.from_config(config, params_b)``
        gives the size.
        """
        if self.params_b is None and is_mixture_of_experts(self.model):
            raise FrameworkConfigError(MODEL_PATH, self.model, "a size given as params_b (the model's total "
                                       "parameters, in billions) to VerlShape.from_config or job_spec_from_verl: "
                                       "the name marks a mixture of experts, whose total size is not in its name",
                                       WHERE)
        spec: dict[str, Any] = {"job_id": job_id, "rollout_gpus": self.rollout_gpus, "train_gpus": self.train_gpus,
                                "t_roll_s": t_roll_s, "t_train_s": t_train_s, "slo": slo, "model": self.model,
                                "movable": False, "colocate": self.layout == COLOCATED}
        if self.mem_roll_gb is not None:
            spec["mem_roll_gb"] = round(self.mem_roll_gb, 3)
            spec["mem_train_gb"] = round(self.mem_train_gb, 3)
        steps = iterations if iterations is not None else self.iterations
        if steps is not None:
            spec["iterations"] = steps
        from pydantic import ValidationError

        from rollmux.runtime.api_models import JobSpec

        try:  # what the service would refuse, refused here naming the field
            JobSpec.model_validate(spec)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "spec"
            said = first["msg"]
            for prefix in ("Input should be ", "String should "):
                said = said.removeprefix(prefix)
            raise FrameworkConfigError(f"spec.{field}", spec.get(field), said, WHERE) from None
        return spec


def job_spec_from_verl(config: Any, job_id: str, t_roll_s: float, t_train_s: float, slo: float = 1.5,
                       params_b: float | None = None, iterations: int | None = None) -> dict:
    """``VerlShape.from_config(config, params_b).job_spec(job_id, t_roll_s, t_train_s, slo, iterations)``."""
    return VerlShape.from_config(config, params_b).job_spec(job_id, t_roll_s, t_train_s, slo, iterations)


@dataclass(frozen=True, slots=True)
class VerlPlacement:
    """A RollMux placement as veRL needs it: pinned node ids per pool and GPUs per node."""

    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    gpus_per_node: int

    @property
    def layout(self) -> str:
        return COLOCATED if set(self.rollout_nodes) == set(self.train_nodes) else DISAGGREGATED

    @classmethod
    def of(cls, placement: Any, gpus_per_node: int) -> "VerlPlacement":
        """From a ``rollmux.plan_state.Placement``, the SDK's placement dict, or a ``VerlPlacement``."""
        if isinstance(placement, VerlPlacement):
            return placement
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise FrameworkConfigError("gpus_per_node", gpus_per_node, "an integer >= 1", "RollMux placement")
        if isinstance(placement, Mapping):
            rollout, train = placement.get("rollout_nodes"), placement.get("train_nodes")
        else:
            rollout, train = getattr(placement, "rollout_nodes", None), getattr(placement, "train_nodes", None)
        for name, nodes in (("rollout_nodes", rollout), ("train_nodes", train)):
            if isinstance(nodes, str) or not isinstance(nodes, Sequence) or not nodes or \
                    not all(isinstance(n, str) and n for n in nodes) or len(set(nodes)) != len(nodes):
                raise FrameworkConfigError(name, nodes, "a non-empty list of distinct node ids", "RollMux placement")
        rollout, train = tuple(rollout), tuple(train)
        if set(rollout) & set(train) and set(rollout) != set(train):
            raise FrameworkConfigError("train_nodes", list(train), "the rollout nodes (colocated) or nodes disjoint "
                                       f"from them (disaggregated); rollout nodes {list(rollout)}", "RollMux placement")
        return cls(rollout, train, gpus_per_node)


def _data_parallel(config: Mapping, group: str, world: int, grown: str) -> int:
    """The data-parallel size of ``group`` (the actor or the critic) on ``world`` GPUs: divided
    by its Megatron model parallelism (tp x pp x cp, which must divide ``world``: else
    FrameworkConfigError), or by its Ulysses sequence parallelism (FSDP)."""
    if _str(config, f"{group}.strategy", "fsdp") != "megatron":
        return world // _int(config, f"{group}.ulysses_sequence_parallel_size", 1, 1)
    parallel = 1
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        parallel *= _int(config, f"{group}.megatron.{name}", 1, 1)
    if world % parallel:
        raise FrameworkConfigError(f"{group}.megatron.tensor_model_parallel_size", parallel,
                                   f"a model-parallel size (tp x pp x cp) dividing {world}: {grown}", WHERE)
    return world // parallel


def _check_grown_batches(config: Mapping, shape: VerlShape, nodes: int, world: int) -> None:
    """FrameworkConfigError naming the batch field that does not split over ``world`` training
    GPUs on ``nodes`` nodes, ``config``'s run grown to them (module docstring)."""
    actor = "actor_rollout_ref.actor"
    per_node = shape.train_gpus // nodes
    grown = (f"the run grows from the {shape.train_gpus} training GPUs the config asks for to the placement's "
             f"{world} (whole nodes); change the batch sizes"
             + (f", or pass gpus_per_node={per_node} to verl_overrides and verl_pools to run on part of each node"
                if per_node * nodes == shape.train_gpus else ""))
    n = _int(config, "actor_rollout_ref.rollout.n", 1, 1)
    groups = (actor, "critic") if shape.critic else (actor,)
    parallel = {group: _data_parallel(config, group, world, grown) for group in groups}
    if not _flag(config, f"{actor}.use_dynamic_bsz", False):  # (veRL's validate_config)
        smallest = world
        if _str(config, f"{actor}.strategy", "fsdp") == "megatron":
            smallest = parallel[actor] * _int(config, f"{actor}.ppo_micro_batch_size_per_gpu", 1)
        batch = _int(config, "data.train_batch_size", 1)
        if batch * n % smallest:
            raise FrameworkConfigError("data.train_batch_size", batch, f"train_batch_size x rollout.n ({batch} x "
                                       f"{n}) a multiple of {smallest}: {grown}", WHERE)
    for group, ranks in parallel.items():  # (the workers split each mini-batch over the data-parallel ranks)
        mini = _int(config, f"{group}.ppo_mini_batch_size", 1)
        if mini * n % ranks:
            raise FrameworkConfigError(f"{group}.ppo_mini_batch_size", mini, f"ppo_mini_batch_size x rollout.n "
                                       f"({mini} x {n}) a multiple of the {ranks} data-parallel ranks: {grown}",
                                       WHERE)


def verl_overrides(placement: Any, config: Any, gpus_per_node: int = 8) -> dict[str, Any]:
    """Dotted veRL overrides that run ``config`` on ``placement`` (module docstring)."""
    where = VerlPlacement.of(placement, gpus_per_node)
    shape = VerlShape.from_config(config)
    granted = len(where.train_nodes) * where.gpus_per_node
    if granted < shape.train_nodes * shape.train_gpus_per_node:
        raise FrameworkConfigError("trainer.nnodes", shape.train_nodes,
                                   f"a config this placement can run: it asks for {shape.train_nodes} x "
                                   f"{shape.train_gpus_per_node} training GPUs, the placement has {granted} "
                                   f"({len(where.train_nodes)} node(s) of {where.gpus_per_node}); submit the job's "
                                   "spec from this config (VerlShape.job_spec)", WHERE)
    if granted > shape.train_gpus:
        _check_grown_batches(_plain(config), shape, len(where.train_nodes), granted)
    out: dict[str, Any] = {"trainer.nnodes": len(where.train_nodes), "trainer.n_gpus_per_node": where.gpus_per_node,
                           "trainer.use_v1": False}
    roll_gpus = len(where.rollout_nodes) * where.gpus_per_node
    if where.layout == COLOCATED:
        out["actor_rollout_ref.hybrid_engine"] = True
        if shape.layout != COLOCATED:
            raise FrameworkConfigError("actor_rollout_ref.hybrid_engine", False,
                                       "true on a colocated placement (the rollout then shares the trainer's "
                                       "GPUs); or ask RollMux for distinct rollout nodes", WHERE)
    else:
        if shape.layout == COLOCATED:
            raise FrameworkConfigError("actor_rollout_ref.hybrid_engine", True,
                                       f"false on a disaggregated placement (rollout {list(where.rollout_nodes)}, "
                                       f"train {list(where.train_nodes)}): veRL's hybrid engine runs generation in "
                                       "the actor's processes, on the training GPUs", WHERE)
        if roll_gpus < shape.rollout_gpus:
            raise FrameworkConfigError("actor_rollout_ref.rollout.nnodes", shape.rollout_nodes,
                                       f"a config this placement can run: it asks for {shape.rollout_nodes} x "
                                       f"{shape.rollout_gpus_per_node} rollout GPUs, the placement has {roll_gpus} "
                                       f"({len(where.rollout_nodes)} node(s) of {where.gpus_per_node}); submit the "
                                       "job's spec from this config (VerlShape.job_spec)", WHERE)
        out["actor_rollout_ref.rollout.nnodes"] = len(where.rollout_nodes)
        out["actor_rollout_ref.rollout.n_gpus_per_node"] = where.gpus_per_node
    if roll_gpus % shape.rollout_parallel:
        raise FrameworkConfigError("actor_rollout_ref.rollout.tensor_model_parallel_size",
                                   shape.rollout_parallel, f"a replica size dividing the placement's {roll_gpus} "
                                   "rollout GPUs", WHERE)
    return out


def _check_override(config: Any, path: Any) -> None:
    """FrameworkConfigError unless ``path`` is a dotted path of non-empty keys (field
    ``overrides``) whose every group present in ``config`` is a mapping (field: the group;
    ``trainer.nnodes.x`` would replace the count ``trainer.nnodes`` with a mapping)."""
    if not isinstance(path, str) or not all(path.split(".")):
        raise FrameworkConfigError("overrides", path, "a dotted path of non-empty keys, e.g. trainer.nnodes", WHERE)
    node, parts = config, path.split(".")
    for depth, part in enumerate(parts[:-1], 1):
        if part not in node:
            return
        node = node[part]
        if not isinstance(node, Mapping):
            raise FrameworkConfigError(".".join(parts[:depth]), node, f"a mapping to write {path} into", WHERE)


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """Write dotted ``overrides`` into ``config`` (a DictConfig, in place, struct mode respected; or a dict).
    A path ``_check_override`` refuses raises FrameworkConfigError before anything is written."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover
        DictConfig = ()  # type: ignore[assignment]
    if not isinstance(config, Mapping):
        raise FrameworkConfigError("config", type(config).__name__, "a veRL config (dict or OmegaConf DictConfig)",
                                   WHERE)
    for path in overrides:
        _check_override(config, path)
    for path, value in overrides.items():
        if DictConfig and isinstance(config, DictConfig):
            OmegaConf.update(config, path, value, merge=False)
            continue
        node = config
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def hydra_args(overrides: Mapping[str, Any]) -> list[str]:
    """``key=value`` arguments for veRL's Hydra command line (``python -m verl.trainer.main_ppo ...``)."""
    def render(value: Any) -> str:
        if isinstance(value, bool):
            return "True" if value else "False"
        return str(value)
    return [f"{k}={render(v)}" for k, v in overrides.items()]
