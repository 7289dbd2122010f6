"""The choices of choice-valued CLI options shared by several commands, as typer enums
(typer checks a value against them and lists them in errors and ``--help``)."""
from __future__ import annotations

import enum

from rollmux.accounting import ACCOUNTINGS
from rollmux.planner import FULL_SPACE, HOSTING_SPACE, PAPER_SPACE
from rollmux.sim.durations import MODELS

DurationModel = enum.Enum("DurationModel", {m: m for m in MODELS}, type=str)
#: The planner's placement space by name (``rollmux.planner.Space``; docs/placement_space.md).
SPACES = {"paper": PAPER_SPACE, "full": FULL_SPACE, "host": HOSTING_SPACE}
SpaceName = enum.Enum("SpaceName", {s: s for s in SPACES}, type=str)
#: Fleets search the paper's and the full space (hosting is not offered across views).
FleetSpaceName = enum.Enum("FleetSpaceName", {s: s for s in ("paper", "full")}, type=str)
AccountingName = enum.Enum("AccountingName", {a: a for a in ACCOUNTINGS}, type=str)
#: The waiting line on bounded pools (``simulate(backfill=)``, ``ControlPlane(backfill=)``):
#: a job that packs into a running group passes it, or strictly first come, first placed.
QueueOrder = enum.Enum("QueueOrder", {q: q for q in ("backfill", "fifo")}, type=str)
QUEUE_HELP = ("On bounded pools: backfill (a job that packs into a running group on its nodes passes the waiting "
              "line; it takes no free node, though it may keep its group's nodes busy longer) or fifo (strictly "
              "first come, first placed).")
#: Where ``rollmux serve`` decides a regrouping (``ServiceConfig.decide_apart``;
#: ``rollmux.runtime.regroup_ticket``).
RegroupDecisions = enum.Enum("RegroupDecisions", {d: d for d in ("apart", "locked")}, type=str)
REGROUP_HELP = ("Where a regrouping is decided (policies that regroup): apart (on a copy of the plan, while other "
                "requests are answered; carried out only if the groups it replaces are unchanged and every moved job "
                "still keeps its SLO) or locked (in the request that asks for it, as `rollmux simulate` decides; "
                "other requests wait).")
