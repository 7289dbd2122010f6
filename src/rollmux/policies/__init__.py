"""Placement policies, one per file, behind ``rollmux.policies.base.Policy``."""
from __future__ import annotations

from rollmux.accounting import OURS, CostAccounting
from rollmux.planner import FULL_SPACE, HOSTING_SPACE
from rollmux.policies.base import Policy
from rollmux.policies.colocated import Colocated
from rollmux.policies.gavel import Gavel
from rollmux.policies.most_idle import MostIdle
from rollmux.policies.random_pick import RandomPick
from rollmux.policies.rollmux import RollMuxPolicy
from rollmux.policies.solo_d import SoloDisaggregated

DEFAULT_POLICIES = ("rollmux", "rollmux-consolidate", "rollmux-regroup", "solo-d", "colocated", "gavel", "random",
                    "most-idle")
KNOWN = DEFAULT_POLICIES + ("rollmux-bestfit", "rollmux-full", "rollmux-full-regroup", "rollmux-host",
                            "rollmux-host-regroup", "rollmux-lifetime", "rollmux-full-lifetime", "optimal")


def make_policy(name: str, seed: int = 0, accounting: CostAccounting = OURS) -> Policy:
    """A fresh policy instance by name (policies may keep per-run state). ``accounting``
    reaches RollMux's planner (saturation gate, SLO checks; ``rollmux.accounting``)."""
    acct = accounting
    factories = {
        "rollmux": lambda: RollMuxPolicy("first", "rollmux", accounting=acct),
        "rollmux-bestfit": lambda: RollMuxPolicy("best-fit", "rollmux-bestfit", accounting=acct),
        "rollmux-consolidate": lambda: RollMuxPolicy("first", "rollmux-consolidate", consolidate=True,
                                                     accounting=acct),
        "rollmux-regroup": lambda: RollMuxPolicy("first", "rollmux-regroup", consolidate=True, regroup=True,
                                                 accounting=acct),
        "rollmux-full": lambda: RollMuxPolicy("first", "rollmux-full", accounting=acct, space=FULL_SPACE),
        "rollmux-full-regroup": lambda: RollMuxPolicy("first", "rollmux-full-regroup", consolidate=True, regroup=True,
                                                      accounting=acct, space=FULL_SPACE),
        "rollmux-host": lambda: RollMuxPolicy("first", "rollmux-host", accounting=acct, space=HOSTING_SPACE),
        "rollmux-host-regroup": lambda: RollMuxPolicy("first", "rollmux-host-regroup", consolidate=True, regroup=True,
                                                      accounting=acct, space=HOSTING_SPACE),
        "rollmux-lifetime": lambda: RollMuxPolicy("first", "rollmux-lifetime", accounting=acct, objective="lifetime"),
        "rollmux-full-lifetime": lambda: RollMuxPolicy("first", "rollmux-full-lifetime", accounting=acct,
                                                       space=FULL_SPACE, objective="lifetime"),
        "solo-d": SoloDisaggregated,
        "colocated": Colocated,
        "gavel": Gavel,
        "random": lambda: RandomPick(seed),
        "most-idle": MostIdle,
    }
    if name not in factories:
        raise ValueError(f"policy {name!r}: expected one of {', '.join(KNOWN)}")
    return factories[name]()
