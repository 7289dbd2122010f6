"""One veRL PPO/GRPO job under RollMux: submit it, run veRL's ``RayPPOTrainer`` on the
nodes RollMux pins it to, generation under rollout grants and updates under train grants.
NEEDS GPUs (vLLM or SGLang and FSDP workers); ``--print-spec`` runs anywhere.

Before: a Ray cluster whose GPU nodes advertise their RollMux ids
(``rollmux.runtime.ray_adapter.node_resources``, e.g. ``ray start ... --resources
'{"rollmux_node:T0": 1, "train_gpu": 8}'``) and a RollMux control plane over the same
node ids (``rollmux serve``). The hybrid engine (veRL's default, and the only mode of
``RayPPOTrainer``) needs a colocated placement: rollout and training on the same nodes.

    # what RollMux would be asked for (no GPU, no server needed)
    python examples/verl/run_ppo.py --print-spec -- \\
        algorithm.adv_estimator=grpo actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=8

    # the run (on the Ray head node)
    python examples/verl/run_ppo.py --url http://HEAD:8470 --token $TOKEN --job-id grpo-a \\
        --t-roll 20 --t-train 50 -- \\
        algorithm.adv_estimator=grpo actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=8 \\
        data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \\
        trainer.total_training_steps=50 trainer.logger='[console]'

Everything after ``--`` is a veRL (Hydra) override of its ``ppo_trainer`` config. Prints the
spec, the placement and the overrides it led to, then veRL's own log, then one line per
phase (grant arrival to release) and the boundary actions' mean seconds. See
docs/integrations.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def verl_config(overrides: list[str]):
    """veRL's ``ppo_trainer`` config from the installed package, with ``overrides``."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def build_trainer(job, config, placement, gpus_per_node: int):
    """What veRL's ``main_ppo_v0.TaskRunner.run`` builds, with RollMux's pools, phases and overrides."""
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn

    from rollmux.integrations.verl import RollMuxPPOTrainer, verl_pools

    OmegaConf.resolve(config)
    roles = BaseTaskRunner()                      # veRL's own role -> worker class choices
    _, worker_group_cls = roles.add_actor_rollout_worker(config)
    if need_critic(config):
        roles.add_critic_worker(config)
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    data = config.data
    train = create_rl_dataset(data.train_files, data, model.tokenizer, model.processor, is_train=True)
    val = create_rl_dataset(data.val_files, data, model.tokenizer, model.processor, is_train=False)
    # --- the RollMux lines: pinned pools and the phase-hooked trainer ------------------------
    pools = verl_pools(placement, gpus_per_node, job_id=job.job_id)  # every role: one pool when colocated
    return RollMuxPPOTrainer(job=job, config=config, tokenizer=model.tokenizer, processor=model.processor,
                             role_worker_mapping=roles.role_worker_mapping, resource_pool_manager=pools,
                             ray_worker_group_cls=worker_group_cls, train_dataset=train, val_dataset=val,
                             collate_fn=collate_fn, train_sampler=create_rl_sampler(data, train))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470", help="the RollMux control plane")
    parser.add_argument("--token", default=os.environ.get("ROLLMUX_TOKEN"), help="tenant or admin token")
    parser.add_argument("--job-id", default="verl-ppo")
    parser.add_argument("--t-roll", type=float, default=60.0, help="profiled worst-case rollout seconds")
    parser.add_argument("--t-train", type=float, default=60.0, help="profiled worst-case train seconds")
    parser.add_argument("--slo", type=float, default=2.0)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--params-b", type=float, default=None, help="model size, when its name has none")
    parser.add_argument("--print-spec", action="store_true", help="print the job spec and exit")
    parser.add_argument("overrides", nargs="*", help="veRL overrides, after --")
    args = parser.parse_args()

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rollmux.errors import RollMuxError
    from rollmux.integrations.verl_config import VerlShape, apply_overrides, hydra_args, verl_overrides

    try:
        config = verl_config(args.overrides)
        shape = VerlShape.from_config(config, params_b=args.params_b)
        spec = shape.job_spec(args.job_id, args.t_roll, args.t_train, args.slo)
    except (RollMuxError, HydraException, OmegaConfBaseException) as err:  # named: the override, the field
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"layout {shape.layout}; job spec {json.dumps(spec)}")
    if args.print_spec:
        return 0

    import ray

    from rollmux.runtime.sdk import Client

    ray.init(address="auto")
    client = Client(args.url, token=args.token)
    try:
        job = client.submit(spec)
        with job.lifetime():
            placement = job.wait_placed()
            overrides = verl_overrides(placement, config, args.gpus_per_node)
            print(f"placed: rollout {placement['rollout_nodes']}, train {placement['train_nodes']}; "
                  f"veRL overrides {' '.join(hydra_args(overrides))}")
            apply_overrides(config, overrides)
            trainer = build_trainer(job, config, placement, args.gpus_per_node)
            trainer.init_workers()   # model load, engines started and put to sleep (before any grant)
            trainer.fit()
    finally:
        client.close()
    for i, (pool, nodes, _seq, start, end) in enumerate(job.history):
        print(f"phase {i:3d} {pool:<7} on {','.join(nodes)}: {end - start:8.2f} s")
    for action in ("park", "wake", "sleep", "reload", "offload"):
        took = [r.seconds for r in trainer.switches if r.action == action]
        if took:
            print(f"{action:<8} x{len(took):<4} mean {statistics.fmean(took):.3f} s, max {max(took):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
