"""Brute force over set partitions, shared by the exact solver's tests: each test
brings its own cost of a block (a group), so the oracles stay independent of the solver."""
from __future__ import annotations

from typing import Callable, Sequence


def set_partitions(items: list):
    """Every partition of ``items`` into non-empty blocks, each exactly once."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[head]] + part
        for i in range(len(part)):
            yield part[:i] + [[head] + part[i]] + part[i + 1:]


def cheapest_partition(ordered: Sequence, block_cost: Callable[[list], float], key: Callable = id) -> float:
    """The least total of ``block_cost`` over every partition of ``ordered``; each block
    keeps ``ordered``'s order and is costed once (memoized on its members' keys)."""
    memo: dict[tuple, float] = {}
    best = float("inf")
    for part in set_partitions(list(ordered)):
        total = 0.0
        for block in part:
            block = sorted(block, key=list(ordered).index)
            k = tuple(key(j) for j in block)
            if k not in memo:
                memo[k] = block_cost(block)
            total += memo[k]
        best = min(best, total)
    return best
