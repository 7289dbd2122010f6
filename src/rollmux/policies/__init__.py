"""Placement policies, one per file, behind ``rollmux.policies.base.Policy``."""
from __future__ import annotations

from rollmux.accounting import OURS, CostAccounting
from rollmux.errors import SpecError
from rollmux.model import Cluster
from rollmux.planner import FULL_SPACE, HOSTING_SPACE
from rollmux.policies.base import Policy
from rollmux.policies.colocated import Colocated
from rollmux.policies.gavel import Gavel
from rollmux.policies.most_idle import MostIdle
from rollmux.policies.random_pick import RandomPick
from rollmux.policies.rollmux import RollMuxPolicy
from rollmux.policies.solo_d import SoloDisaggregated

DEFAULT_POLICIES = ("rollmux", "rollmux-consolidate", "rollmux-regroup", "rollmux-hedge", "solo-d", "colocated",
                    "gavel", "random", "most-idle")
KNOWN = DEFAULT_POLICIES + ("rollmux-bestfit", "rollmux-full", "rollmux-full-regroup", "rollmux-host",
                            "rollmux-host-regroup", "rollmux-lifetime", "rollmux-full-lifetime", "optimal")
#: Policies that plan on the fleet planner (the cluster as a one-view fleet): our accounting only
FLEET_BACKED = ("rollmux-hedge",)


def make_policy(name: str, seed: int = 0, accounting: CostAccounting = OURS, cluster: Cluster | None = None) -> Policy:
    """A fresh policy instance by name (policies may keep per-run state). ``accounting``
    reaches RollMux's planner (saturation gate, SLO checks; ``rollmux.accounting``).
    ``rollmux-hedge`` is the fleet planner's (``rollmux.policies.fleet``) on ``cluster``
    (default: the paper's testbed) as a fleet of one view, and needs our accounting."""
    acct = accounting
    check_accounting(name, accounting)
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
        "rollmux-hedge": lambda: _fleet_backed(name, cluster or Cluster()),
        "solo-d": SoloDisaggregated,
        "colocated": Colocated,
        "gavel": Gavel,
        "random": lambda: RandomPick(seed),
        "most-idle": MostIdle,
    }
    if name not in factories:
        hint = " ('optimal' is the offline optimum that rollmux simulate solves, not a policy)" * (name == "optimal")
        raise ValueError(f"policy {name!r}: expected one of {', '.join(factories)}{hint}")
    return factories[name]()


def check_accounting(name: str, accounting: CostAccounting) -> None:
    """SpecError when policy ``name`` cannot run under ``accounting``: a fleet-backed one
    runs under our accounting only."""
    if name in FLEET_BACKED and accounting != OURS:  # (by value: a Ray worker unpickles its own copy)
        raise SpecError("policy", name, f"--accounting ours ({name} runs under --accounting ours only: it plans "
                        "on the fleet planner, which keeps only our accounting; docs/fleet.md)")


def _fleet_backed(name: str, cluster: Cluster) -> Policy:
    from rollmux.fleet import Profiles, fleet_of  # (the fleet modules import the planner's; load them when asked)
    from rollmux.policies.fleet import fleet_rollmux

    return fleet_rollmux(fleet_of(cluster), Profiles(), name)
