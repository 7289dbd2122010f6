"""The policy: a tiny GPT-2 trained from scratch on the task vocabulary.

* ``build_policy(spec, seed)`` makes a randomly initialised ``GPT2LMHeadModel``
  (Hugging Face transformers, nothing downloaded) of the given width and depth.
* ``generate`` samples ``answer_len`` tokens per prompt with ``model.generate``
  (temperature 1, KV cache on); it returns only the completion ids.
* ``completion_logprobs`` gives per-token log-probabilities of completions under a
  model, with gradients when called outside ``torch.no_grad``.
* ``warm_up`` runs a short supervised phase on (prompt, answer) pairs so that the
  reward of sampled answers is above zero before reinforcement learning starts.

Callers set ``torch.set_num_threads(1)`` themselves (the workers do).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from rollmux.grpo.task import BOS_ID, VOCAB_SIZE, Task, encode

hf_logging.set_verbosity_error()


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Width and depth of the policy network."""

    d_model: int = 64
    layers: int = 2
    heads: int = 4
    max_len: int = 16


def build_policy(spec: ModelSpec, seed: int) -> GPT2LMHeadModel:
    """A randomly initialised causal LM over the task vocabulary (same seed, same weights)."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=spec.max_len, n_embd=spec.d_model,
                        n_layer=spec.layers, n_head=spec.heads, bos_token_id=BOS_ID, eos_token_id=BOS_ID,
                        pad_token_id=BOS_ID, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def generate(model: GPT2LMHeadModel, prompts: torch.Tensor, answer_len: int, generator_seed: int) -> torch.Tensor:
    """Sample one completion of exactly ``answer_len`` tokens per row of ``prompts`` [B, P]; returns [B, answer_len]."""
    model.eval()
    torch.manual_seed(generator_seed)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                         top_k=0, top_p=1.0, max_new_tokens=answer_len, min_new_tokens=answer_len,
                         use_cache=True, pad_token_id=BOS_ID)
    return out[:, prompts.shape[1]:]


def completion_logprobs(model: GPT2LMHeadModel, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """Log-probability of each completion token given everything before it: [B, answer_len]."""
    ids = torch.cat([prompts, completions], dim=1)
    logits = model(ids).logits[:, prompts.shape[1] - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)


def task_batch(task: Task, rng: random.Random, n: int) -> tuple[torch.Tensor, list[str]]:
    """``n`` prompts [n, prompt_len] and their reference answers."""
    pairs = [task.sample(rng) for _ in range(n)]
    return torch.tensor([encode(p) for p, _ in pairs]), [a for _, a in pairs]


def warm_up(model: GPT2LMHeadModel, task: Task, steps: int, batch: int, lr: float, seed: int) -> list[float]:
    """Supervised next-token training on answers (teacher forcing); returns the loss per step."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        prompts, answers = task_batch(task, rng, batch)
        targets = torch.tensor([encode(a) for a in answers])
        loss = -completion_logprobs(model, prompts, targets).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
