"""A memo of the exact solver's group searches, kept by one long-lived caller.

The search for the best group of a list of members in admission order
(``exact._cheapest_group``) is a pure function of the cluster, the members' profiles, the
search options and a budget. Its answer under a budget with acceptance limit L (a group
is kept when its objective is not >= L; L = +inf for no budget) is

    f(L) = f*  when f* is not >= L,  else None,

where f* is its answer with no budget: the search lists sizes and pinnings in an order
that does not depend on L, keeps the first group of least objective, and a bound only
skips what could not go below the bound (``exact`` module docstring, steps 2-4). So one
entry per (cluster, members, options) answers

* every later budget, once some search of it found a group (that group is f*), and
* every budget whose limit is at most L0, once a search under L0 found none.

Keys hold every field of each member that the search reads (every ``Job`` field but
``NOT_SEARCHED``), not the job's id: equal jobs under other ids share an entry, which is
what the online regroupings (``improve.plan_regroup``, ``fleet_exact.plan_fleet_regroup``)
ask again and again while the same jobs wait alone. The memo forgets its least recently
used entries beyond ``max_entries``; it never changes an answer, only how often the
search runs (the callers' ``ExactStats`` count a hit as a skipped subset).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import fields
from typing import Hashable

from rollmux.model import Job

#: ``Job`` fields the group search never reads: the id (results are by position), when the
#: job arrived (the members come in admission order), how long it runs, and free-form extras
NOT_SEARCHED = frozenset({"job_id", "arrival_s", "duration_s", "iterations", "extra"})
_SEARCHED = tuple(f.name for f in fields(Job) if f.name not in NOT_SEARCHED)


class FitMemo:
    """Answers of ``exact._cheapest_group`` by key (module docstring); ``hits`` and
    ``misses`` count the lookups."""

    def __init__(self, max_entries: int = 20_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries={max_entries}: expected at least 1")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, tuple[object, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(cluster: Hashable, members: list[Job], options: tuple) -> tuple:
        """The entry for ``members`` (admission order) on ``cluster`` under ``options``."""
        return cluster, options, tuple(tuple(getattr(j, name) for name in _SEARCHED) for j in members)

    def get(self, key: tuple, limit: float) -> tuple[bool, object]:
        """(known, answer) for a search under ``limit`` (+inf: none); answer has ``cost``."""
        entry = self._entries.get(key)
        if entry is not None:
            fit, searched = entry
            if fit is not None or limit <= searched:
                self._entries.move_to_end(key)
                self.hits += 1
                return True, fit if fit is not None and not fit.cost >= limit else None
        self.misses += 1
        return False, None

    def put(self, key: tuple, limit: float, fit: object) -> None:
        """Record the search's answer under ``limit``: a group (then valid for every limit)
        or None (valid up to the largest limit searched)."""
        entry = self._entries.get(key)
        if fit is None and entry is not None and (entry[0] is not None or entry[1] >= limit):
            return
        self._entries[key] = (fit, limit)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
