"""veRL adapter (rollmux.integrations.verl*): config translation both ways, resource pools
pinned to RollMux nodes on a local multi-node Ray cluster, and veRL's own
``RayPPOTrainer.fit`` run under a live control plane's grants.

What is real here: veRL 0.9's config (composed by Hydra from veRL's own YAML), its
``RayResourcePool`` / ``ResourcePoolManager`` / ``RayWorkerGroup`` / ``Worker`` on a CPU
Ray cluster with logical GPUs, and its ``RayPPOTrainer`` (constructor, data loader,
``DataProto``, the fit loop, GRPO advantages, metrics, validation). What is a stand-in,
because the real one needs GPUs: the actor worker group (FSDP), the rollout manager
(vLLM / SGLang servers) and the checkpoint manager's weight sync (``FakeActorGroup``,
``FakeRollout``, ``FakeCheckpoints`` below; they record what ran in which grant).
"""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest

pytest.importorskip("verl", reason="veRL not installed (pip install --no-deps verl==0.9.1 and the 'verl' extra)")
pytest.importorskip("hydra")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from rollmux.errors import FrameworkConfigError, SpecError  # noqa: E402
from rollmux.integrations.verl_config import (COLOCATED, DISAGGREGATED, VerlShape, apply_overrides,  # noqa: E402
                                              hydra_args, job_spec_from_verl, params_from_name, verl_overrides)
from rollmux.model import Job  # noqa: E402

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture(scope="module")
def base_config():
    """veRL's own ``ppo_trainer`` config, composed by Hydra from the installed package."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm",
                                                             f"actor_rollout_ref.model.path={MODEL}"])


def _config(base, **overrides):
    cfg = copy.deepcopy(base)
    for path, value in overrides.items():
        OmegaConf.update(cfg, path.replace("__", "."), value, merge=False)
    return cfg


# --- config translation -------------------------------------------------------------------
def test_hybrid_config_becomes_a_colocated_job_spec(base_config):
    cfg = _config(base_config, trainer__nnodes=2, trainer__n_gpus_per_node=8, data__train_batch_size=256,
                  actor_rollout_ref__rollout__n=4, trainer__total_training_steps=100)
    shape = VerlShape.from_config(cfg)
    assert shape.layout == COLOCATED and shape.train_gpus == shape.rollout_gpus == 16
    assert shape.model == "Qwen2.5-0.5B-Instruct" and shape.params_b == 0.5 and shape.engine == "vllm"
    # veRL's defaults: GAE (so a critic), no KL (no reference model), rollout tp 2
    assert shape.critic and not shape.reference and shape.rollout_parallel == 2
    assert shape.responses_per_step == 1024
    assert shape.mem_train_gb == pytest.approx(2 * 12 * 0.5e9 / 2 / 1e9)       # actor + critic, 2 nodes
    assert shape.mem_roll_gb == pytest.approx(2 * 0.5e9 * 8 / 2 / 1e9)         # bf16, 8 GPUs / tp 2
    spec = shape.job_spec("ppo-a", t_roll_s=20.0, t_train_s=50.0, slo=2.0)
    assert spec == {"job_id": "ppo-a", "rollout_gpus": 16, "train_gpus": 16, "t_roll_s": 20.0, "t_train_s": 50.0,
                    "slo": 2.0, "model": "Qwen2.5-0.5B-Instruct", "mem_roll_gb": 4.0, "mem_train_gb": 6.0,
                    "iterations": 100, "movable": False, "colocate": True}
    job = Job(**{k: v for k, v in spec.items() if k != "movable"})
    job.validate()  # (the fit tests submit one to the service)
    # the planner places a hybrid job co-located on its training nodes, which veRL accepts
    from rollmux.model import Cluster
    from rollmux.plan_state import PlanState
    from rollmux.planner import Planner

    placement = Planner().decide(PlanState(Cluster()), job).placement
    assert placement.colocated and placement.rollout_nodes == placement.train_nodes == ("T0", "T1")
    assert verl_overrides(placement, cfg, 8)["actor_rollout_ref.hybrid_engine"] is True
    assert job_spec_from_verl(cfg, "ppo-a", 20.0, 50.0, 2.0) == spec
    # GRPO without a critic, a declared size, the iteration count from the caller
    grpo = _config(cfg, algorithm__adv_estimator="grpo")
    spec = job_spec_from_verl(grpo, "grpo-a", 1.0, 2.0, params_b=7, iterations=3)
    assert spec["mem_train_gb"] == pytest.approx(12 * 7e9 / 2 / 1e9) and spec["iterations"] == 3


def test_standalone_rollout_config_becomes_a_disaggregated_job_spec(base_config):
    cfg = _config(base_config, actor_rollout_ref__hybrid_engine=False, trainer__nnodes=2,
                  actor_rollout_ref__rollout__nnodes=1, actor_rollout_ref__rollout__n_gpus_per_node=4,
                  actor_rollout_ref__rollout__tensor_model_parallel_size=4,
                  actor_rollout_ref__model__path="/models/my-policy")
    shape = VerlShape.from_config(cfg)
    assert shape.layout == DISAGGREGATED and (shape.rollout_gpus, shape.train_gpus) == (4, 16)
    # no size in the name: no memory estimate, and the spec leaves the fields out
    assert shape.model == "my-policy" and shape.mem_roll_gb is None
    spec = shape.job_spec("d", 1.0, 1.0)
    assert "mem_roll_gb" not in spec and spec["rollout_gpus"] == 4 and spec["colocate"] is False
    assert VerlShape.from_config(cfg, params_b=14).mem_roll_gb == pytest.approx(2 * 14e9 * 4 / 4 / 1e9)
    # a plain dict works as well as a DictConfig
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert VerlShape.from_config(plain) == shape


@pytest.mark.parametrize(("overrides", "field"), [
    ({"trainer__nnodes": 0}, "trainer.nnodes"),
    ({"trainer__n_gpus_per_node": "8"}, "trainer.n_gpus_per_node"),
    ({"actor_rollout_ref__rollout__name": "hf"}, "actor_rollout_ref.rollout.name"),
    ({"actor_rollout_ref__rollout__name": "???"}, "actor_rollout_ref.rollout.name"),
    ({"actor_rollout_ref__rollout__free_cache_engine": False}, "actor_rollout_ref.rollout.free_cache_engine"),
    ({"actor_rollout_ref__rollout__tensor_model_parallel_size": 3},
     "actor_rollout_ref.rollout.tensor_model_parallel_size"),
    ({"actor_rollout_ref__model__path": ""}, "actor_rollout_ref.model.path"),
    ({"data__train_batch_size": 0}, "data.train_batch_size"),
    ({"actor_rollout_ref__actor__use_kl_loss": True}, "actor_rollout_ref.ref.fsdp_config.param_offload"),
    ({"actor_rollout_ref__hybrid_engine": False}, "actor_rollout_ref.rollout.nnodes"),  # veRL's default 0
    ({"trainer__total_training_steps": 0}, "trainer.total_training_steps"),
    # read as true through bool() (a critic doubled the training memory), or a blank model name
    ({"critic__enable": "false"}, "critic.enable"),
    ({"actor_rollout_ref__actor__use_kl_loss": "false"}, "actor_rollout_ref.actor.use_kl_loss"),
    ({"algorithm__use_kl_in_reward": 0}, "algorithm.use_kl_in_reward"),
    ({"actor_rollout_ref__model__path": "Qwen/Qwen2.5-7B/ "}, "actor_rollout_ref.model.path"),
    # an interpolation that does not resolve (it escaped as OmegaConf's own error)
    ({"trainer__nnodes": "${trainer.no_such_key}"}, "trainer.nnodes"),
])
def test_unusable_configs_are_refused_naming_the_field(base_config, overrides, field):
    with pytest.raises(FrameworkConfigError) as info:
        VerlShape.from_config(_config(base_config, **overrides))
    assert info.value.field == field and field in str(info.value) and "veRL config" in str(info.value)
    assert isinstance(info.value, SpecError)


@pytest.mark.parametrize("params_b", [True, float("inf"), float("nan"), -1, "7"])
def test_a_model_size_that_is_not_a_finite_number_is_refused(base_config, params_b):
    """(inf put "mem_roll_gb": Infinity, which is not JSON, into the job spec)"""
    with pytest.raises(FrameworkConfigError, match="params_b"):
        VerlShape.from_config(base_config, params_b=params_b)


@pytest.mark.parametrize("kwargs, field", [({"t_roll_s": -5.0}, "spec.t_roll_s"), ({"slo": 0.5}, "spec.slo"),
                                            ({"job_id": "../x"}, "spec.job_id"),
                                            ({"t_train_s": float("nan")}, "spec.t_train_s")])
def test_a_job_spec_the_service_would_refuse_is_refused_naming_the_field(base_config, kwargs, field):
    """(``--print-spec``, "what RollMux would be asked for", printed such specs, NaN included)"""
    args = {"job_id": "j", "t_roll_s": 1.0, "t_train_s": 1.0, "slo": 1.5} | kwargs
    with pytest.raises(FrameworkConfigError) as info:
        VerlShape.from_config(base_config).job_spec(**args)
    assert info.value.field == field


def test_overrides_never_shrink_a_run_to_a_smaller_placement(base_config):
    """A config asking for 4 nodes on a 1-node placement got ``trainer.nnodes: 1`` silently."""
    cfg = _config(base_config, trainer__nnodes=4, trainer__n_gpus_per_node=8)
    with pytest.raises(FrameworkConfigError, match="asks for 4 x 8 training GPUs, the placement has 8") as info:
        verl_overrides({"rollout_nodes": ["T0"], "train_nodes": ["T0"]}, cfg, 8)
    assert info.value.field == "trainer.nnodes"


def test_overrides_never_shrink_a_standalone_rollout_to_a_smaller_placement(base_config):
    """A config asking for 2 x 8 rollout GPUs on 1 rollout node got ``rollout.nnodes: 1`` silently."""
    cfg = _config(base_config, actor_rollout_ref__hybrid_engine=False, actor_rollout_ref__rollout__nnodes=2,
                  actor_rollout_ref__rollout__n_gpus_per_node=8)
    with pytest.raises(FrameworkConfigError, match="asks for 2 x 8 rollout GPUs, the placement has 8") as info:
        verl_overrides({"rollout_nodes": ["R0"], "train_nodes": ["T0"]}, cfg, 8)
    assert info.value.field == "actor_rollout_ref.rollout.nnodes"
    over = verl_overrides({"rollout_nodes": ["R0", "R1"], "train_nodes": ["T0"]}, cfg, 8)  # as many: taken
    assert over["actor_rollout_ref.rollout.nnodes"] == 2


def _small_grpo(base, **overrides):
    """A GRPO config of 4 GPUs with small batches that veRL's ``validate_config`` accepts."""
    return _config(base, **{"algorithm__adv_estimator": "grpo", "trainer__n_gpus_per_node": 4,
                            "actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 1,
                            "actor_rollout_ref__rollout__log_prob_micro_batch_size_per_gpu": 1,
                            "actor_rollout_ref__ref__log_prob_micro_batch_size_per_gpu": 1} | overrides)


def test_overrides_that_grow_a_run_to_whole_nodes_check_its_batches(base_config):
    """A 4-GPU config with 12 prompts per step, valid for veRL, was grown to the 8 GPUs of
    the node RollMux gives it, and veRL then refused it (12 not a multiple of 8). The
    grown run's batches are now checked as veRL checks them, naming the field; passing
    the config's GPUs per node keeps it at its size."""
    from verl.utils.config import validate_config

    node = {"rollout_nodes": ["T0"], "train_nodes": ["T0"]}
    cfg = _small_grpo(base_config, data__train_batch_size=12, actor_rollout_ref__actor__ppo_mini_batch_size=4)
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    with pytest.raises(FrameworkConfigError, match=r"\(12 x 1\) a multiple of 8: the run grows from the 4 .* "
                       "gpus_per_node=4") as info:
        verl_overrides(node, cfg, 8)
    assert info.value.field == "data.train_batch_size"
    over = verl_overrides(node, cfg, 4)
    assert (over["trainer.nnodes"], over["trainer.n_gpus_per_node"]) == (1, 4)
    validate_config(apply_overrides(copy.deepcopy(cfg), over), use_reference_policy=False, use_critic=False)
    # the workers split each mini-batch (ppo_mini_batch_size x rollout.n) over the data-parallel ranks
    cfg = _small_grpo(base_config, data__train_batch_size=16, actor_rollout_ref__actor__ppo_mini_batch_size=4)
    with pytest.raises(FrameworkConfigError, match="a multiple of the 8 data-parallel ranks") as info:
        verl_overrides(node, cfg, 8)
    assert info.value.field == "actor_rollout_ref.actor.ppo_mini_batch_size"
    cfg = _small_grpo(base_config, data__train_batch_size=16, actor_rollout_ref__actor__ppo_mini_batch_size=8)
    over = verl_overrides(node, cfg, 8)
    assert over["trainer.n_gpus_per_node"] == 8
    validate_config(apply_overrides(copy.deepcopy(cfg), over), use_reference_policy=False, use_critic=False)
    # a critic's mini-batch too; dynamic batch sizes leave the whole batch to veRL
    cfg = _small_grpo(base_config, data__train_batch_size=16, actor_rollout_ref__actor__ppo_mini_batch_size=8,
                      algorithm__adv_estimator="gae", critic__ppo_mini_batch_size=4)
    with pytest.raises(FrameworkConfigError) as info:
        verl_overrides(node, cfg, 8)
    assert info.value.field == "critic.ppo_mini_batch_size"
    cfg = _small_grpo(base_config, data__train_batch_size=12, actor_rollout_ref__actor__ppo_mini_batch_size=8,
                      actor_rollout_ref__actor__use_dynamic_bsz=True)
    assert verl_overrides(node, cfg, 8)["trainer.n_gpus_per_node"] == 8


def test_kl_loss_with_an_offloaded_reference_model_is_accepted(base_config):
    cfg = _config(base_config, actor_rollout_ref__actor__use_kl_loss=True,
                  actor_rollout_ref__ref__fsdp_config__param_offload=True)
    shape = VerlShape.from_config(cfg)
    assert shape.reference and shape.mem_train_gb == pytest.approx((2 * 12 + 2) * 0.5)


def test_a_megatron_reference_model_must_offload_itself():
    """veRL's Megatron config with a KL loss was accepted with its reference model left on
    the GPUs (only the FSDP strategies' offload flag was checked)."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_megatron_trainer", overrides=[
            "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.model.path={MODEL}",
            "actor_rollout_ref.actor.use_kl_loss=true"])
    with pytest.raises(FrameworkConfigError) as info:
        VerlShape.from_config(cfg)
    assert info.value.field == "actor_rollout_ref.ref.megatron.param_offload"
    assert VerlShape.from_config(_config(cfg, actor_rollout_ref__ref__megatron__param_offload=True)).reference


def test_placement_becomes_verl_overrides_and_back(base_config):
    cfg = _config(base_config, trainer__nnodes=1)
    over = verl_overrides({"group_id": "g0", "rollout_nodes": ["T3", "T4"], "train_nodes": ["T4", "T3"]}, cfg, 4)
    assert over == {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 4, "trainer.use_v1": False,
                    "actor_rollout_ref.hybrid_engine": True}
    apply_overrides(cfg, over)
    shape = VerlShape.from_config(cfg)
    assert (shape.train_gpus, shape.rollout_gpus, shape.layout) == (8, 8, COLOCATED)
    assert hydra_args(over) == ["trainer.nnodes=2", "trainer.n_gpus_per_node=4", "trainer.use_v1=False",
                                "actor_rollout_ref.hybrid_engine=True"]
    # the hybrid engine cannot run on distinct rollout nodes: refused, naming the field
    with pytest.raises(FrameworkConfigError) as info:
        verl_overrides({"rollout_nodes": ["R0"], "train_nodes": ["T0"]}, cfg, 8)
    assert info.value.field == "actor_rollout_ref.hybrid_engine" and "disaggregated" in str(info.value)
    # a standalone-rollout config takes a disaggregated placement; its counts follow the placement
    standalone = _config(base_config, actor_rollout_ref__hybrid_engine=False, actor_rollout_ref__rollout__nnodes=1)
    from rollmux.plan_state import Placement

    over = verl_overrides(Placement("g1", ("R0", "R1"), ("T0",)), standalone, 8)
    assert over["actor_rollout_ref.rollout.nnodes"] == 2 and over["trainer.nnodes"] == 1
    plain = apply_overrides(OmegaConf.to_container(standalone, resolve=True), over)
    assert VerlShape.from_config(plain).rollout_gpus == 16 and plain["actor_rollout_ref"]["hybrid_engine"] is False
    with pytest.raises(FrameworkConfigError) as info:
        verl_overrides({"rollout_nodes": ["R0"], "train_nodes": ["R0"]}, standalone, 8)
    assert info.value.field == "actor_rollout_ref.hybrid_engine"
    # placements that are neither colocated nor disjoint, or empty, or odd GPU counts
    for bad, field in (({"rollout_nodes": ["R0", "T0"], "train_nodes": ["T0"]}, "train_nodes"),
                       ({"rollout_nodes": [], "train_nodes": ["T0"]}, "rollout_nodes"),
                       ({"rollout_nodes": "R0", "train_nodes": ["T0"]}, "rollout_nodes")):
        with pytest.raises(FrameworkConfigError) as info:
            verl_overrides(bad, standalone, 8)
        assert info.value.field == field
    with pytest.raises(FrameworkConfigError) as info:
        verl_overrides({"rollout_nodes": ["T0"], "train_nodes": ["T0"]}, cfg, 0)
    assert info.value.field == "gpus_per_node"
    # tp 2 does not divide one 1-GPU node
    with pytest.raises(FrameworkConfigError) as info:
        verl_overrides({"rollout_nodes": ["T0"], "train_nodes": ["T0"]},
                       _config(base_config, trainer__nnodes=1, trainer__n_gpus_per_node=1), 1)
    assert info.value.field == "actor_rollout_ref.rollout.tensor_model_parallel_size"


@pytest.mark.parametrize(("name", "size"), [
    ("Qwen2.5-0.5B-Instruct", 0.5), ("deepseek-llm-7b-chat", 7), ("gemma-2-2b-it", 2), ("Llama-3.1-70B", 70),
    ("gpt-neo-2.7B", 2.7), ("pythia-1.4b-deduped", 1.4), ("t5-3b", 3), ("my-policy", None), ("bf16-model", None),
    # the decimal point written '_' or 'b' (read as 6B, 1B and 7B: stablelm-2's memory 3.7x too high)
    ("stablelm-2-1_6b", 1.6), ("stablelm-2-zephyr-1_6b", 1.6), ("bloom-1b7", 1.7), ("bloom-7b1", 7.1),
    ("BLOOM-1B1", 1.1), ("bloom-560m", None),
    # a version before '_' is no integer part, nor a context length after the size a fraction
    ("llama2_7b", 7), ("llama-7b16k", 7), ("stablelm-3b-4e1t", 3), ("phi-1_5", None),
])
def test_model_sizes_are_read_from_names(name, size):
    assert params_from_name(name) == size


@pytest.mark.parametrize("name", ["Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x22B", "Qwen1.5-MoE-A2.7B", "Qwen3-30B-A3B",
                                  "Llama-4-Scout-17B-16E-Instruct", "OLMoE-1B-7B-0924"])
def test_a_mixture_of_experts_name_gives_no_size_and_its_spec_asks_for_params_b(base_config, name):
    """Mixtral-8x7B read as 7B (it holds 46.7B), Qwen1.5-MoE-A2.7B as its active 2.7B: memory
    understated about 6.7x."""
    assert params_from_name(name) is None
    cfg = _config(base_config, actor_rollout_ref__model__path=f"org/{name}")
    shape = VerlShape.from_config(cfg)
    assert shape.params_b is None and shape.mem_roll_gb is None
    with pytest.raises(FrameworkConfigError) as info:
        shape.job_spec("moe", 1.0, 1.0)
    assert info.value.field == "actor_rollout_ref.model.path" and "params_b" in str(info.value)
    assert "mixture of experts" in str(info.value)
    spec = job_spec_from_verl(cfg, "moe", 1.0, 1.0, params_b=46.7)
    assert spec["mem_roll_gb"] == pytest.approx(2 * 46.7 * 8 / 2)
    # the overrides need no size: a trainer on a mixture of experts still runs
    assert verl_overrides({"rollout_nodes": ["T0"], "train_nodes": ["T0"]}, cfg, 8)["trainer.nnodes"] == 1


def _plain_config(base, path: str, value):
    cfg = OmegaConf.to_container(base, resolve=True)
    node = cfg
    *groups, leaf = path.split(".")
    for group in groups:
        node = node[group]
    node[leaf] = value
    return cfg


@pytest.mark.parametrize(("path", "value", "field"), [
    ("critic", "yes", "critic"),                                          # was read as no critic.enable
    ("algorithm.adv_estimator", ["gae"], "algorithm.adv_estimator"),       # was read as "no critic"
    ("actor_rollout_ref.actor.strategy", ["fsdp"], "actor_rollout_ref.actor.strategy"),  # skipped the ref check
    ("data.train_batch_size", 10 ** 400, "data.train_batch_size"),
    ("trainer.total_training_steps", 10 ** 400, "trainer.total_training_steps"),
    ("actor_rollout_ref.model.path", "Qwen/" + "9" * 5000 + "B", "actor_rollout_ref.model.path"),  # (was mem_roll_gb)
    ("actor_rollout_ref.model.path", "Qwen/Qwen-0B", "actor_rollout_ref.model.path"),
])
def test_malformed_config_values_are_refused_naming_the_dotted_field(base_config, path, value, field):
    with pytest.raises(FrameworkConfigError) as info:
        VerlShape.from_config(_plain_config(base_config, path, value)).job_spec("j", 1.0, 1.0)
    assert info.value.field == field and "veRL config" in str(info.value), str(info.value)


@pytest.mark.parametrize("as_omegaconf", [False, True])
@pytest.mark.parametrize(("overrides", "field"), [
    ({"trainer.nnodes.x": 1}, "trainer.nnodes"),   # a raw TypeError on a dict; OmegaConf replaced the count
    ({"": 1}, "overrides"),                         # wrote cfg[""]
    ({"trainer..nnodes": 1}, "overrides"),
    ({"trainer.": 1}, "overrides"),
])
def test_an_override_path_that_cannot_be_written_is_refused(overrides, field, as_omegaconf):
    cfg = {"trainer": {"nnodes": 1}}
    cfg = OmegaConf.create(cfg) if as_omegaconf else cfg
    with pytest.raises(FrameworkConfigError) as info:
        apply_overrides(cfg, {"trainer.n_gpus_per_node": 4, **overrides})
    assert info.value.field == field, str(info.value)
    assert dict(cfg["trainer"]) == {"nnodes": 1} and "" not in cfg  # nothing written
    with pytest.raises(FrameworkConfigError) as info:
        apply_overrides(None, {"trainer.nnodes": 1})
    assert info.value.field == "config"


# --- resource pools on a local multi-node Ray cluster ------------------------------------------
def test_verl_pools_and_worker_groups_land_on_the_pinned_nodes(monkeypatch):
    """veRL's own ``RayWorkerGroup`` and ``Worker`` on pools pinned to RollMux nodes R0 and T0
    (a CPU Ray cluster whose nodes advertise 2 logical GPUs each; one worker per pool, so
    that the worker processes, each importing veRL, stay few on a 2-core machine)."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
    from verl.trainer.ppo.utils import Role

    from rollmux.integrations.verl_pools import (COLOCATED_POOL, ROLLOUT_POOL, TRAIN_POOL, pool_nodes,
                                                 verl_pools)
    from rollmux.runtime.ray_adapter import UnknownNodeError, node_resources, rollmux_nodes

    class Probe(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def where(self):
            return ray.get_runtime_context().get_node_id(), self.rank

    def node_args(node, pool):
        return {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 * 1024**2,
                "resources": node_resources(node, pool, 2)}

    cluster = Cluster(initialize_head=True, head_node_args={**node_args("R0", "rollout"), "include_dashboard": False})
    groups, managers = [], []
    try:
        cluster.add_node(**node_args("T0", "train"))
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        rollmux_of = {ray_id: node for node, ray_id in rollmux_nodes().items()}

        def spawn(manager, role):
            wg = RayWorkerGroup(resource_pool=manager.get_resource_pool(role),
                                ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(Probe)), device_name="cuda")
            groups.append(wg)
            return sorted((rollmux_of[node], rank) for node, rank in wg.where())

        # disaggregated: the standalone rollout on R0, the trainer side (hybrid actor, critic) on T0
        pools = verl_pools({"rollout_nodes": ["R0"], "train_nodes": ["T0"]}, 2, max_colocate_count=1, job_id="a")
        managers.append(pools)
        assert pools.resource_pool_spec == {ROLLOUT_POOL: [2], TRAIN_POOL: [2]}
        assert pools.mapping[Role.Rollout] == ROLLOUT_POOL
        assert {pools.mapping[r] for r in (Role.ActorRollout, Role.Critic, Role.RefPolicy)} == {TRAIN_POOL}
        pools.create_resource_pool()
        assert pool_nodes(pools) == {ROLLOUT_POOL: ["R0"], TRAIN_POOL: ["T0"]}
        assert pools.get_n_gpus() == 4
        pools.remove()
        pools = verl_pools({"rollout_nodes": ["R0"], "train_nodes": ["T0"]}, 1, max_colocate_count=1, job_id="a1")
        managers.append(pools)
        pools.create_resource_pool()
        assert spawn(pools, Role.Rollout) == [("R0", 0)]
        assert spawn(pools, Role.ActorRollout) == [("T0", 0)]
        for wg in groups:
            for w in wg.workers:
                ray.kill(w)
        pools.remove()
        # colocated (the hybrid engine): one pool on the training node, every role in it
        colo = verl_pools({"rollout_nodes": ["T0"], "train_nodes": ["T0"]}, 2, max_colocate_count=1,
                          roles=[Role.ActorRollout, Role.Critic], job_id="b")
        managers.append(colo)
        assert colo.mapping == {Role.ActorRollout: COLOCATED_POOL, Role.Critic: COLOCATED_POOL}
        colo.create_resource_pool()
        assert pool_nodes(colo) == {COLOCATED_POOL: ["T0"]}
        # refused before anything is reserved: an unknown node, more GPUs than the node has
        with pytest.raises(UnknownNodeError, match="rollmux_node:T9"):
            verl_pools({"rollout_nodes": ["T9"], "train_nodes": ["T9"]}, 2).create_resource_pool()
        with pytest.raises(FrameworkConfigError, match="node R0") as info:
            verl_pools({"rollout_nodes": ["R0"], "train_nodes": ["T0"]}, 4).create_resource_pool()
        assert info.value.field == "resource_pool_spec"
        # more CPUs than the node has (veRL's bundle holds max_colocate_count of them): the
        # reservation waited for good when it was not checked
        with pytest.raises(FrameworkConfigError, match="CPU of node T0"):
            verl_pools({"rollout_nodes": ["T0"], "train_nodes": ["T0"]}, 2, use_gpu=False).create_resource_pool()
    finally:
        for manager in managers:
            manager.remove()
        ray.shutdown()
        cluster.shutdown()
    assert not ray.is_initialized()


# --- veRL's RayPPOTrainer.fit under RollMux grants ----------------------------------------------
# Stand-ins for the three objects of a trainer that need GPUs. ``World`` is what they share: where
# the actor's model and optimizer are, the policy version, and the rollout engines' state.
PROMPT, RESPONSE = 3, 4
FIT_OVERRIDES = {
    "trainer.total_training_steps": 3, "trainer.total_epochs": 1, "data.train_batch_size": 2,
    "actor_rollout_ref.rollout.n": 2, "algorithm.adv_estimator": "grpo", "critic.enable": False,
    "trainer.logger": ["console"], "trainer.val_before_train": True, "trainer.test_freq": 2,
    "trainer.save_freq": -1, "trainer.resume_mode": "disable", "trainer.balance_batch": False,
    "trainer.device": "cpu", "trainer.n_gpus_per_node": 2, "data.dataloader_num_workers": 0,
    "data.val_batch_size": 2, "actor_rollout_ref.rollout.agent.num_workers": 1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
}


class World:
    def __init__(self):
        self.model = self.optim = "device"   # init_workers leaves the actor on its GPUs
        self.version = 0                      # optimizer steps taken by the actor
        self.awake = False                    # rollout engines hold weights + KV cache on the GPUs
        self.engine_version = None            # the policy version the engines generate with
        self.events: list[tuple[str, str | None]] = []
        self.problems: list[str] = []
        self.phases = None
        self.fail_update_at: int | None = None
        self.reward_model = False             # a colocated reward model scores after generation

    def granted(self):
        return self.phases.granted if self.phases is not None else None

    def log(self, event, grant=None):
        got = self.granted()
        self.events.append((event, got))
        if grant is not None and got != grant:
            self.problems.append(f"{event} under grant {got!r}, expected {grant!r}")


class FakeActorGroup:
    """The hybrid actor worker group (FSDP on GPUs in veRL): ``to``, ``compute_log_prob``, ``update_actor``."""

    def __init__(self, world):
        self.w = world

    def to(self, device, model=True, optimizer=True, grad=True):
        if model:
            self.w.model = device
        if optimizer:
            self.w.optim = device
        self.w.log(f"to {device}")

    def compute_log_prob(self, td):
        from verl.utils import tensordict_utils as tu

        self.w.log("compute_log_prob", "train")
        if self.w.model != "device":
            self.w.problems.append("log-probs with the model on the host")
        ids = td["input_ids"]
        zeros = torch.nested.nested_tensor_from_jagged(torch.zeros(ids.values().shape), offsets=ids.offsets())
        return tu.get_tensordict({"log_probs": zeros, "entropy": zeros.clone()}, {"metrics": {"mfu": 0.0}})

    def update_actor(self, td):
        from verl.utils import tensordict_utils as tu

        self.w.log("update_actor", "train")
        if (self.w.model, self.w.optim) != ("device", "device"):
            self.w.problems.append(f"update with model on {self.w.model}, optimizer on {self.w.optim}")
        if self.w.fail_update_at == self.w.version + 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        self.w.version += 1
        return tu.get_tensordict({}, {"metrics": {"mfu": 0.0, "pg_loss": [0.1]}})


class FakeRollout:
    """The agent-loop manager over vLLM/SGLang servers: ``generate_sequences`` with per-token scores."""

    def __init__(self, world):
        self.w = world
        self.rng = torch.Generator().manual_seed(0)

    def generate_sequences(self, batch):
        from verl import DataProto

        validating = self.w.phases.validating  # a validation runs inside whichever grant is held
        self.w.log("validate" if validating else "generate", None if validating else "rollout")
        if self.w.granted() is None:
            self.w.problems.append("generation outside any grant")
        if not self.w.awake or self.w.engine_version != self.w.version:
            self.w.problems.append(f"generation on engines awake={self.w.awake} with policy v{self.w.engine_version}"
                                   f" (actor at v{self.w.version})")
        if self.w.granted() == "rollout" and self.w.model != "cpu":
            self.w.problems.append("generation in a rollout grant with the actor's model on the GPUs")
        b = len(batch)
        prompts = torch.randint(3, 12, (b, PROMPT), generator=self.rng)
        responses = torch.randint(3, 12, (b, RESPONSE), generator=self.rng)
        attention = torch.ones(b, PROMPT + RESPONSE, dtype=torch.long)
        attention[0, -1] = 0  # one response ended early
        tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], -1),
                   "attention_mask": attention, "position_ids": torch.clamp(attention.cumsum(-1) - 1, min=0),
                   "response_mask": attention[:, PROMPT:]}
        if not self.w.reward_model:  # the agent loop's streamed rule-based reward
            tensors["rm_scores"] = torch.zeros(b, RESPONSE)
            tensors["rm_scores"][:, -2] = torch.rand(b, generator=self.rng)
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"multi_modal_inputs": np.array([{} for _ in range(b)], dtype=object)},
            meta_info={"timing": {"agent_loop/generate": 0.0}})


class FakeCheckpoints:
    """veRL's ``CheckpointEngineManager`` (naive backend): ``update_weights`` wakes and syncs, ``sleep_replicas``."""

    def __init__(self, world):
        self.w = world

    def update_weights(self, global_steps=None):
        self.w.log("sync weights")
        if self.w.granted() is None:
            self.w.problems.append("weight sync (engines woken) outside any grant")
        if self.w.model != "device":
            self.w.problems.append("weight sync read the actor's model from the host")
        self.w.awake, self.w.engine_version = True, self.w.version
        return {}

    def sleep_replicas(self):
        self.w.log("sleep engines")
        self.w.awake = False


class FakeRewardLoop:
    """veRL's ``RewardLoopManager`` with a colocated reward model (on the GPUs in veRL)."""

    def __init__(self, world):
        self.w = world

    def compute_rm_score(self, batch):
        from verl import DataProto

        self.w.log("reward model")
        if self.w.granted() is None:
            self.w.problems.append("reward model outside any grant")
        if self.w.awake:
            self.w.problems.append("reward model scored next to awake engines")
        scores = torch.zeros(len(batch), RESPONSE)
        scores[:, -1] = batch.batch["responses"][:, -1].float() / 12
        return DataProto.from_dict(tensors={"rm_scores": scores})


class ToyPrompts(torch.utils.data.Dataset):
    """Rows as veRL's agent-loop dataset gives them: a dummy tensor and the raw prompt."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        return {"dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "raw_prompt": [{"role": "user", "content": f"{i % 10}>"}], "data_source": "toy",
                "reward_model": {"ground_truth": str(i % 10)}, "index": i}


class ToyTokenizer:
    eos_token_id, pad_token_id = 1, 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)


def _run_fit(base_config, tmp_path, fail_update_at=None, reward_model=False):
    """veRL's fit under a private control plane's grants; returns (trainer, job, world, snapshots, view)."""
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import collate_fn

    from rollmux.demo import _control_plane
    from rollmux.integrations.verl import RollMuxPPOTrainer, verl_pools
    from rollmux.runtime.sdk import Client

    cfg = copy.deepcopy(base_config)
    for path, value in FIT_OVERRIDES.items():
        OmegaConf.update(cfg, path, value, merge=False)
    OmegaConf.update(cfg, "reward.reward_model.enable", reward_model, merge=False)
    world = World()
    world.fail_update_at, world.reward_model = fail_update_at, reward_model
    snapshots = []  # the job's state at every grant release
    error = None
    with _control_plane(1, 1, tmp_path) as (url, token):
        client = Client(url, token=token)
        try:
            from rollmux.integrations.verl import VerlShape

            spec = VerlShape.from_config(cfg).job_spec("verl-grpo", t_roll_s=1.0, t_train_s=1.0, slo=2.0)
            assert spec["movable"] is False and spec["iterations"] == 3 and spec["train_gpus"] == 2
            job = client.submit(spec)
            release = job._release

            def snapshot_release(name, grant, duration_s, failed=False, restart=False):
                snapshots.append((name, world.model, world.optim, world.awake))
                release(name, grant, duration_s, failed, restart)
            job._release = snapshot_release
            try:
                with job.lifetime():
                    placement = job.wait_placed(timeout_s=60)
                    trainer = RollMuxPPOTrainer(
                        job=job, config=cfg, tokenizer=ToyTokenizer(), role_worker_mapping={Role.ActorRollout: object},
                        resource_pool_manager=verl_pools(placement, 2, roles=[Role.ActorRollout], job_id=job.job_id),
                        train_dataset=ToyPrompts(6), val_dataset=ToyPrompts(2), collate_fn=collate_fn)
                    # what init_workers would have built on GPUs
                    trainer.actor_rollout_wg = FakeActorGroup(world)
                    trainer.async_rollout_manager = FakeRollout(world)
                    trainer.checkpoint_manager = FakeCheckpoints(world)
                    trainer.reward_loop_manager = FakeRewardLoop(world)
                    world.phases = trainer.rollmux
                    trainer.fit()
            except RuntimeError as exc:
                error = exc
            view = client.job(job.job_id)
        finally:
            client.close()
    return trainer, job, world, snapshots, view, error


def test_verl_fit_runs_each_step_under_a_rollout_and_a_train_grant(base_config, tmp_path):
    trainer, job, world, snapshots, view, error = _run_fit(base_config, tmp_path)
    assert error is None
    assert world.problems == []
    pools = [name for name, *_ in job.history]
    # val_before_train shares step 1's rollout grant; the validations after steps 2 and 3 run in
    # those steps' train grants: one pair per step, as the spec's iterations (3) count them
    assert pools == ["rollout", "train"] * 3
    assert view["state"] == "done" and view["iterations_done"] == 3
    # nothing of the job stays on the GPUs between grants: state offloaded, engines asleep
    assert snapshots == [(name, "cpu", "cpu", False) for name in pools]
    events = [e for e, _ in world.events]
    assert events.count("update_actor") == 3 == world.version and trainer.global_steps == 4
    assert events.count("generate") == 3  # the steps' generations, all under rollout grants
    assert [grant for event, grant in world.events if event == "validate"] == ["rollout", "train", "train"]
    # once per rollout grant, and in the train grants of steps 2 and 3 for their validations
    assert [grant for event, grant in world.events if event == "sync weights"] == [
        "rollout", "rollout", "train", "rollout", "train"]
    assert [(r.phase, r.action) for r in trainer.switches] == [
        ("-", "park"),
        ("rollout", "wake"), ("rollout", "sleep"), ("train", "reload"), ("train", "offload"),
        ("rollout", "wake"), ("rollout", "sleep"),
        ("train", "reload"), ("train", "wake"), ("train", "offload"), ("train", "sleep"),
        ("rollout", "wake"), ("rollout", "sleep"),
        ("train", "reload"), ("train", "wake"), ("train", "offload"), ("train", "sleep")]
    assert all(r.seconds >= 0 for r in trainer.switches)
    # the hooks are gone once fit returned
    assert "generate_sequences" not in vars(trainer.async_rollout_manager)
    assert "update_weights" not in vars(trainer.checkpoint_manager)
    assert trainer.rollmux.held is None and trainer.rollmux.granted is None


def test_a_failing_verl_update_releases_its_grant_with_the_state_offloaded(base_config, tmp_path):
    trainer, job, world, snapshots, view, error = _run_fit(base_config, tmp_path, fail_update_at=2)
    assert isinstance(error, RuntimeError) and "out of memory" in str(error)
    assert [name for name, *_ in job.history] == ["rollout", "train"] * 2
    assert snapshots[-1] == ("train", "cpu", "cpu", False) and world.version == 1
    assert view["state"] == "cancelled"  # JobHandle.lifetime cancels on an exception
    # the failed update's train phase was released as failed: the service counted one step, not two
    assert view["iterations_done"] == 1 and view["next_phase"] == "train"
    assert "sleep_replicas" not in vars(trainer.checkpoint_manager) and trainer.rollmux.held is None


def test_verl_fit_with_a_colocated_reward_model_keeps_engines_asleep_while_it_scores(base_config, tmp_path):
    """veRL puts the engines to sleep for a colocated reward model and wakes them with a weight sync
    (in validation); in a step the reward model scores under the train grant."""
    trainer, job, world, snapshots, view, error = _run_fit(base_config, tmp_path, reward_model=True)
    assert error is None and world.problems == []
    pools = [name for name, *_ in job.history]
    assert pools == ["rollout", "train"] * 3
    assert snapshots == [(name, "cpu", "cpu", False) for name in pools]
    # 3 steps (train grants) and 3 validations: before training (step 1's rollout grant), after
    # steps 2 and 3 (their train grants)
    scored = [grant for event, grant in world.events if event == "reward model"]
    assert scored == ["rollout", "train", "train", "train", "train", "train"]
    # a sync per rollout grant (3), one per validation in a train grant (2), and veRL's wake-up
    # after each validation's reward model (3)
    assert [e for e, _ in world.events].count("sync weights") == 8
