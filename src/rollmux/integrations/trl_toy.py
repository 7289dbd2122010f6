"""A verifiable toy task for TRL jobs: tiny tokenizer, policies, data, reward.

Nothing is downloaded. The vocabulary is the GRPO demo's character set
(``rollmux.grpo.task.CHARS``) plus ``<pad>``, ``<eos>`` and ``<unk>``; the tokenizer is
character-level, built with ``tokenizers`` and wrapped as a ``PreTrainedTokenizerFast``.

Policies (``POLICIES``, randomly initialised, same seed same weights):

* ``tiny-qwen2``: a ``Qwen2ForCausalLM`` of width 64 and 2 layers (75k parameters), for
  CPU runs and tests;
* ``smollm2-135m``: a ``LlamaForCausalLM`` with SmolLM2-135M's architecture (30 layers,
  width 576, 9 query and 3 key/value heads, MLP width 1536, rope theta 1e5, tied
  embeddings) over the toy vocabulary instead of SmolLM2's 49,152 tokens: 106M
  parameters rather than 135M, the size of model whose state a GPU run switches.

Task ``shift`` (``shift`` = 0 or 1): the prompt is one digit and ``>`` (``"7>"``); the
policy should answer with the digit ``(d + shift) mod 10`` repeated. ``digit_reward``
scores a completion by the fraction of its ``COMPLETION_LEN`` positions that hold that
digit (an early end of sequence counts as misses), so a random policy scores about
1/16 and the exact answer 1.0. TRL passes the dataset's ``target`` column to the reward
function as a keyword argument.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rollmux.grpo.task import CHARS

COMPLETION_LEN = 8
SPECIAL = ("<pad>", "<eos>", "<unk>")


def toy_tokenizer():
    """The character-level tokenizer (special tokens first, then ``CHARS``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *CHARS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_qwen2(tokenizer, seed: int, hidden: int = 64, layers: int = 2):
    """A randomly initialised ``Qwen2ForCausalLM`` over ``tokenizer``'s vocabulary (same seed, same weights)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config)


def smollm2_shaped(tokenizer, seed: int):
    """SmolLM2-135M's architecture, randomly initialised, over ``tokenizer``'s vocabulary (module docstring)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=32, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


@dataclass(frozen=True, slots=True)
class Policy:
    """A toy policy: how to build it (``build(tokenizer, seed)``) and the learning rate it trains with."""

    build: Callable
    learning_rate: float


POLICIES = {"tiny-qwen2": Policy(tiny_qwen2, 1e-2), "smollm2-135m": Policy(smollm2_shaped, 1e-4)}


def shift_dataset(shift: int, rows: int, seed: int):
    """``rows`` prompts ``"d>"`` with their ``target`` digit ``(d + shift) % 10`` (a ``datasets.Dataset``)."""
    from datasets import Dataset

    rng = random.Random(seed)
    digits = [rng.randrange(10) for _ in range(rows)]
    return Dataset.from_dict({"prompt": [f"{d}>" for d in digits], "target": [str((d + shift) % 10) for d in digits]})


def digit_reward(completions: list[str], target: list[str], **_: object) -> list[float]:
    """TRL reward function: per completion, the fraction of ``COMPLETION_LEN`` positions holding its target digit."""
    return [sum(ch == t for ch in c[:COMPLETION_LEN]) / COMPLETION_LEN for c, t in zip(completions, target)]
