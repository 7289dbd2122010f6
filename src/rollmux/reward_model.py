"""Reward functions behind the shared reward service: the demo tasks' exact verifiers
and a tiny learned reward model.

An item is ``(task, prompt, completion)``: a task name of ``rollmux.grpo.task.TASKS``,
the prompt as the rollout saw it (BOS first) and the generated completion.

* ``exact_rewards(items)``: ``rollmux.grpo.task.reward(completion, answer)`` with the
  reference answer recovered from the prompt (``Task.answer``), so a rollout worker
  gets the very numbers it would have computed itself.
* ``RewardModel``: token embeddings of the prompt and completion (padded to
  ``MAX_LEN``) plus a task embedding, an MLP, a sigmoid: a score in (0, 1) per item.
  ``train_reward_model(steps, seed)`` fits it for a few Adam steps on the exact reward
  of corrupted reference answers (each answer character replaced by a random digit with
  probability 1/2), so its scores track the verifier roughly; deterministic per seed,
  CPU, one thread is plenty.
"""
from __future__ import annotations

import random

import torch
from torch import nn

from rollmux.errors import SpecError
from rollmux.grpo.task import TASKS, VOCAB_SIZE, encode, get_task, reward

Item = tuple[str, str, str]  # (task, prompt, completion)
TASK_NAMES = sorted(TASKS)
MAX_LEN = max(t.prompt_len + t.answer_len for t in TASKS.values())
PAD_ID = VOCAB_SIZE


def check_items(items: list[Item]) -> None:
    """Raises ``SpecError`` naming the first bad item (``items[i]``, or ``items[i].task`` /
    ``items[i].prompt`` / ``items[i].completion``) unless ``items`` is a list of ``(task,
    prompt, completion)`` strings with a known task, a prompt of that task's form
    (``Task.answer``) and a completion of characters of the tasks' vocabulary
    (``rollmux.grpo.task.CHARS``, what ``encode`` takes), so both reward kinds take the same items."""
    if not isinstance(items, (list, tuple)):
        raise SpecError("items", items, "a list of (task, prompt, completion) items")
    for i, item in enumerate(items):
        if not isinstance(item, (list, tuple)) or len(item) != 3 or not all(isinstance(x, str) for x in item):
            raise SpecError(f"items[{i}]", item, "a (task, prompt, completion) triple of strings")
        try:
            get_task(item[0]).answer(item[1])
        except SpecError as err:
            raise SpecError(f"items[{i}].{err.field}", err.value, err.expected) from err
        try:
            encode(item[2])
        except SpecError as err:
            raise SpecError(f"items[{i}].completion", item[2], err.expected) from err


def exact_rewards(items: list[Item]) -> list[float]:
    """The task's exact reward of every item (``rollmux.grpo.task.reward``); an unknown task
    or a malformed prompt raises ``SpecError`` naming it."""
    return [reward(completion, get_task(task).answer(prompt)) for task, prompt, completion in items]


class RewardModel(nn.Module):
    """Scores [B] in (0, 1) for a batch of items (see ``encode_items``)."""

    def __init__(self, width: int = 64, embed: int = 8) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB_SIZE + 1, embed)
        self.tasks = nn.Embedding(len(TASK_NAMES), embed)
        self.mlp = nn.Sequential(nn.Linear(embed * (MAX_LEN + 1), width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, tokens: torch.Tensor, tasks: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.tokens(tokens).flatten(1), self.tasks(tasks)], dim=1)
        return torch.sigmoid(self.mlp(x).squeeze(1))


def encode_items(items: list[Item]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, MAX_LEN] (prompt then completion, padded) and task ids [B], both int64
    (also for an empty batch, B = 0)."""
    rows = []
    for _, prompt, completion in items:
        ids = encode(prompt + completion)[:MAX_LEN]
        rows.append(ids + [PAD_ID] * (MAX_LEN - len(ids)))
    tasks = [TASK_NAMES.index(get_task(t).name) for t, _, _ in items]
    return (torch.tensor(rows, dtype=torch.long).reshape(len(rows), MAX_LEN),
            torch.tensor(tasks, dtype=torch.long))


@torch.no_grad()
def model_rewards(model: RewardModel, items: list[Item]) -> list[float]:
    """The learned model's score of every item ([] for no item)."""
    model.eval()
    return model(*encode_items(items)).tolist()


def training_items(rng: random.Random, n: int) -> list[Item]:
    """``n`` items over all tasks whose completions are reference answers, each character
    replaced by a random digit with probability 1/2."""
    items = []
    for _ in range(n):
        task = TASKS[rng.choice(TASK_NAMES)]
        prompt, answer = task.sample(rng)
        completion = "".join(rng.choice("0123456789") if rng.random() < 0.5 else c for c in answer)
        items.append((task.name, prompt, completion))
    return items


def train_reward_model(steps: int = 200, seed: int = 0, batch: int = 128,
                       lr: float = 3e-3) -> tuple[RewardModel, list[float]]:
    """A ``RewardModel`` fitted for ``steps`` Adam steps (mean squared error to the exact
    reward); returns it and the loss per step."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = RewardModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        items = training_items(rng, batch)
        target = torch.tensor(exact_rewards(items))
        loss = nn.functional.mse_loss(model(*encode_items(items)), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses
