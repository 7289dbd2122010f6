"""Verifiable digit tasks on a character vocabulary, and their exact-match rewards.

Every task has fixed-length prompts and answers, so a completion is exactly
``answer_len`` generated tokens and no end-of-sequence handling is needed.

* ``reverse``: ``"4071>"`` -> ``"1704"`` (reverse a 4-digit string)
* ``sort``: ``"4071>"`` -> ``"0147"`` (sort 4 digits)
* ``add``: ``"37+48="`` -> ``"085"`` (sum of two 2-digit numbers, zero-padded to 3)

Reward (``reward``): the fraction of answer positions whose character equals the
reference, a dense but exactly checked signal in [0, 1]; 1.0 means an exact answer.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from rollmux.errors import SpecError

BOS = "^"
CHARS = BOS + "0123456789+=>"
VOCAB_SIZE = len(CHARS)
BOS_ID = CHARS.index(BOS)
_INDEX = {c: i for i, c in enumerate(CHARS)}
# The prompt form of each task (what ``Task.sample`` makes): a pattern and its description.
_PROMPT_FORMS = {
    "add": (re.compile(r"\^[0-9]{2}\+[0-9]{2}="), "BOS, 2 digits, '+', 2 digits, '=' (e.g. '^37+48=')"),
    "reverse": (re.compile(r"\^[0-9]{4}>"), "BOS, 4 digits, '>' (e.g. '^4071>')"),
    "sort": (re.compile(r"\^[0-9]{4}>"), "BOS, 4 digits, '>' (e.g. '^4071>')"),
}


def encode(text: str) -> list[int]:
    """Token ids of ``text``; raises SpecError on a character outside the vocabulary."""
    try:
        return [_INDEX[c] for c in text]
    except KeyError as err:
        raise SpecError("text", text, f"characters from {CHARS!r}") from err


def decode(ids: list[int]) -> str:
    return "".join(CHARS[i] for i in ids)


@dataclass(frozen=True, slots=True)
class Task:
    """One task family: its name and the fixed prompt and answer lengths (BOS included in the prompt)."""

    name: str
    prompt_len: int
    answer_len: int

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """One (prompt, answer) pair; the prompt starts with BOS."""
        if self.name == "add":
            a, b = rng.randrange(100), rng.randrange(100)
            prompt = f"{BOS}{a:02d}+{b:02d}="
        else:
            prompt = f"{BOS}{''.join(rng.choice('0123456789') for _ in range(4))}>"
        return prompt, self.answer(prompt)

    def answer(self, prompt: str) -> str:
        """The reference answer of a prompt of this task (as ``sample`` makes them); raises
        ``SpecError`` naming the prompt when it is not of this task's form (empty, no BOS,
        letters, wrong length)."""
        pattern, form = _PROMPT_FORMS[self.name]
        if not isinstance(prompt, str) or not pattern.fullmatch(prompt):
            raise SpecError("prompt", prompt, f"a prompt of task {self.name!r}: {form}")
        if self.name == "add":
            return f"{int(prompt[1:3]) + int(prompt[4:6]):03d}"
        digits = prompt[1:5]
        return digits[::-1] if self.name == "reverse" else "".join(sorted(digits))


TASKS = {t.name: t for t in (Task("reverse", 6, 4), Task("sort", 6, 4), Task("add", 7, 3))}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SpecError("task", name, f"one of {sorted(TASKS)}")
    return TASKS[name]


def reward(completion: str, answer: str) -> float:
    """Fraction of positions where ``completion`` matches ``answer`` (missing characters count as wrong);
    raises ``SpecError`` on an empty ``answer``."""
    if not answer:
        raise SpecError("answer", answer, "a non-empty reference answer")
    return sum(a == b for a, b in zip(completion, answer)) / len(answer)
