"""Capacity planning: a grid of cluster configurations, one simulation each, and the
cheapest configuration that meets a target (``rollmux whatif``; docs/whatif.md).

Contract
--------
* ``parse_vary(spec, base)``: ``spec`` is ``FIELD=VALUES``, split at the last ``=`` (a
  fleet pool's name may hold one; values never do). FIELD is a dotted path of the
  cluster file (``cluster_file.cluster_to_dict`` of ``base``) whose value is a number:
  ``gpus_per_node``, ``max_group_size``, ``{rollout,train}.{nodes,price_per_gpu_hour,
  host_mem_gb}``, and ``switch_cost_s`` (or ``switch_cost_s.{rollout,train}``) when the
  file gives seconds. A pool's ``nodes`` may be null (unbounded) in ``base``; it may not
  be a list of real nodes. VALUES is an inclusive range ``lo:hi:step`` (step > 0, lo <=
  hi) or a comma list; ``unbounded`` (null) is a value of a ``nodes`` field, in a list.
  Integer fields (node counts, ``gpus_per_node``, ``max_group_size``) take integers
  only; numbers are written in ASCII digits; every value must be finite, listed once
  and accepted by the cluster file. A two-pool field that ``accounting`` sets itself
  (``CostAccounting.apply_cluster``: the base's value and every varied one make one
  cluster as the accounting sees it, so every row would be the same; under ``paper``
  the rollout price, host memory and switch cost) is refused naming the accounting. Any
  other spec raises ``SpecError("vary", spec, expected)``.
* A fleet (``base`` with a ``pools`` list, ``whatif_fleet.fleet_dict``): FIELD is
  ``pools[P].{nodes,price_per_gpu_hour,host_mem_gb}``, P a pool's index or name (an
  integer is an index), or ``gpus_per_node``, ``max_group_size`` and ``switch_cost_s``
  as above. The parsed field is canonical, ``pools[NAME].LEAF``, whichever form the spec
  used, so one field given in both forms is "varied twice"; values must be accepted by
  the fleet file (``fleet_file.fleet_from_dict``).
* ``grid(varies)``: the cartesian product, one ``{field: value}`` per configuration, in
  the order the specs and their values were given (the last spec varies fastest).
  Fields varied twice, or more than ``MAX_CONFIGS`` configurations, raise SpecError
  before anything is built.
* ``run_config(...)`` simulates one configuration under one policy and returns a Row; a
  configuration the trace cannot run on (CapacityError, or a job the cluster cannot
  take) is a Row with ``error`` set, not an exception. A fleet runs under the policy of
  ``policies.fleet.fleet_policies`` with that name, with ``profiles``
  (``whatif_fleet.run_fleet_config``). ``backfill`` is the waiting line's order on
  bounded pools (``simulate(backfill=)``: a job that packs into a running group passes
  the line; False: strictly in arrival order).
* Waits: a job that never ran waits forever (``inf``); percentiles are nearest-rank, so
  ``p95_wait_h`` is ``inf`` when more than 5% of the jobs never ran.
* Cost bases: ``used`` is the pay-per-use cost (allocated nodes only,
  ``PolicyResult.used_cost``); ``owned`` charges every node of a bounded pool for the
  whole run (nodes x node price x makespan) plus an unbounded pool's used cost
  (``rollmux.sim.metrics.owned_cost``) plus the shared reward pool's bill
  (``PolicyResult.reward_cost``, billed per iteration on either basis): what ``pricing:
  owned`` in a cluster file charges, what the inventory costs to hold until the last job
  leaves (a fleet: the same per fleet pool, ``whatif_fleet.fleet_owned_cost``). ``used``
  is the pay-per-use figure whatever the base file's ``pricing`` says. Both $/h divide by
  the same hours, the trace's solo span (``PolicyResult.cost_per_hour``), so owned >= used.
* ``qualifies``: the row ran (no error), every job ran, and it meets the given targets
  (``p95_wait_h <= max_p95_wait_h``, ``slo_met >= min_slo``). ``choose``: the cheapest
  qualifying row on the basis, ties to the lower p95 wait, then the grid order.
  ``frontier``: the rows where every job ran that no other such row dominates (costs no
  more and waits no longer at p95, and is better in one), sorted by cost.
"""
from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import asdict, dataclass

from rollmux.accounting import OURS, CostAccounting
from rollmux.cluster_file import cluster_from_dict
from rollmux.errors import RollMuxError, SpecError
from rollmux.fleet import Profiles
from rollmux.model import POOLS, Job
from rollmux.sim.metrics import PolicyResult, owned_cost

MAX_CONFIGS = 10_000
UNBOUNDED = "unbounded"
COST_BASES = ("owned", "used")
_INT = re.compile(r"[+-]?[0-9]+")  # ASCII digits only (\d takes any script's: '٣' would be 3)
FLEET = "pools"  # the key that makes a base dict a fleet
_POOL_FIELD = re.compile(r"pools\[(.+)\]\.([^.\]]+)")
_POOL_LEAVES = ("nodes", "price_per_gpu_hour", "host_mem_gb")


@dataclass(frozen=True, slots=True)
class Vary:
    """One parsed ``--vary``: a dotted cluster field and its values (None: unbounded)."""

    spec: str
    field: str
    values: tuple[int | float | None, ...]


def variable_fields(base: dict) -> dict[str, type]:
    """The fields of a cluster dict (``cluster_to_dict``) or fleet dict (``fleet_dict``)
    that may vary, canonical names, and their type."""
    fields: dict[str, type] = {"gpus_per_node": int, "max_group_size": int}
    pools = [f"pools[{p['name']}]" for p in base[FLEET]] if FLEET in base else list(POOLS)
    for pool in pools:
        fields[f"{pool}.price_per_gpu_hour"] = float
        fields[f"{pool}.host_mem_gb"] = float
        fields[f"{pool}.nodes"] = int
    switch = base["switch_cost_s"]
    if isinstance(switch, dict):
        fields.update({f"switch_cost_s.{pool}": float for pool in POOLS})
    elif not isinstance(switch, str):
        fields["switch_cost_s"] = float
    return fields


def _parent(base: dict, field: str) -> tuple[dict, str]:
    """The mapping of ``base`` holding the canonical ``field``, and the key in it."""
    if field.startswith(f"{FLEET}["):
        name, _, leaf = field[len(FLEET) + 1:].rpartition("].")
        return next(p for p in base[FLEET] if p["name"] == name), leaf
    *path, leaf = field.split(".")
    node = base
    for key in path:
        node = node[key]
    return node, leaf


def with_values(base: dict, values: dict) -> dict:
    """A copy of the cluster or fleet dict ``base`` with each canonical field set to its value."""
    out = copy.deepcopy(base)
    for field, value in values.items():
        node, leaf = _parent(out, field)
        node[leaf] = value
    return out


def build(data: dict):
    """The Cluster (a two-pool dict) or Fleet (a dict with ``pools``) that ``data`` describes;
    SpecError when the file would not accept it."""
    if FLEET in data:
        from rollmux.fleet_file import fleet_from_dict

        return fleet_from_dict(data)
    return cluster_from_dict(data)


def _canonical(field: str, spec: str, base: dict) -> str:
    """A fleet's ``pools[INDEX].LEAF`` or ``pools[NAME].LEAF`` as ``pools[NAME].LEAF``;
    other fields as given."""
    match = _POOL_FIELD.fullmatch(field)
    if FLEET not in base or match is None:
        return field
    key, leaf = match.groups()
    names = [p["name"] for p in base[FLEET]]
    # (a pool named by an integer is reached by its index only: the brackets read an integer as one)
    named = ", ".join(n for n in names if not _INT.fullmatch(n))
    if _INT.fullmatch(key):
        if not 0 <= int(key) < len(names):
            raise SpecError("vary", spec, f"a pool index 0..{len(names) - 1}" + (f" or a pool name ({named})"
                                                                                 if named else ""))
        key = names[int(key)]
    elif key not in names:
        raise SpecError("vary", spec, (f"a pool name ({named}) or index" if named else "a pool index")
                        + f" 0..{len(names) - 1}")
    if leaf not in _POOL_LEAVES:
        raise SpecError("vary", spec, f"a pool field: one of {', '.join(_POOL_LEAVES)}")
    return f"{FLEET}[{key}].{leaf}"


def _number(text: str, kind: type, spec: str) -> int | float:
    if kind is int:
        if not _INT.fullmatch(text):
            raise SpecError("vary", spec, f"integers: {text!r} is not one")
        return int(text)
    if not text.isascii():  # (float() takes any script's digits too)
        raise SpecError("vary", spec, f"numbers: {text!r} is not one")
    try:
        value = float(text)
    except ValueError:
        raise SpecError("vary", spec, f"numbers: {text!r} is not one") from None
    if not math.isfinite(value):
        raise SpecError("vary", spec, f"finite numbers, not {text!r}")
    return value


def _range(text: str, kind: type, spec: str) -> tuple[int | float, ...]:
    parts = [p.strip() for p in text.split(":")]
    if len(parts) != 3:
        raise SpecError("vary", spec, "an inclusive range lo:hi:step or a comma list")
    lo, hi, step = (_number(p, kind, spec) for p in parts)
    if not step > 0 or lo > hi:
        raise SpecError("vary", spec, "a range lo:hi:step with step > 0 and lo <= hi")
    span = (hi - lo) / step
    if not span < MAX_CONFIGS:
        raise SpecError("vary", spec, f"at most {MAX_CONFIGS:,} values in a range")
    count = math.floor(span + 1e-9) + 1
    if kind is int:
        return tuple(range(lo, hi + 1, step))
    values = tuple(round(lo + i * step, 10) for i in range(count))
    if len(set(values)) != len(values):  # (a step below the 1e-10 the values are rounded to)
        raise SpecError("vary", spec, "a step of at least 1e-10, so that each value comes once")
    return values


def parse_vary(spec: str, base: dict, accounting: CostAccounting = OURS) -> Vary:
    """Parse one ``FIELD=VALUES`` spec against the cluster or fleet dict ``base``, for runs under
    ``accounting``; see the module contract."""
    field, sep, text = spec.rpartition("=")
    field, text = field.strip(), text.strip()
    fields = variable_fields(base)
    if not sep or not field or not text:
        example = "pools[H200].nodes=0:4:2 or pools[0].nodes=2,unbounded" if FLEET in base else \
            "train.nodes=10:20:2 or rollout.nodes=8,12,unbounded"
        raise SpecError("vary", spec, f"FIELD=VALUES, e.g. {example}")
    field = _canonical(field, spec, base)
    if field not in fields:
        raise SpecError("vary", spec, f"a numeric {'fleet' if FLEET in base else 'cluster'} field: one of "
                                      f"{', '.join(fields)}")
    parent, leaf = _parent(base, field)
    if leaf == "nodes" and isinstance(parent["nodes"], list):
        raise SpecError("vary", spec, "a pool given as a node count or null: the cluster file lists "
                                      f"{field.split('.')[0]}'s real nodes")
    kind = fields[field]
    if ":" in text:
        values = _range(text, kind, spec)
    else:
        items = [item.strip() for item in text.split(",")]
        if "" in items:
            raise SpecError("vary", spec, "a comma list without empty items")
        if UNBOUNDED in items and not field.endswith(".nodes"):
            raise SpecError("vary", spec, f"numbers ({UNBOUNDED!r} is a value of a pool's nodes only)")
        values = tuple(None if item == UNBOUNDED else _number(item, kind, spec) for item in items)
        if len(set(values)) != len(values):
            raise SpecError("vary", spec, "each value listed once")
    for value in values:
        try:
            build(with_values(base, {field: value}))
        except SpecError as err:
            raise SpecError("vary", spec, f"values the {'fleet' if FLEET in base else 'cluster'} file accepts "
                                          f"({err})") from None
    if FLEET not in base and _set_by(accounting, base, field, values):
        raise SpecError("vary", spec, f"a field that --accounting {accounting.name} leaves as the cluster file "
                                      f"gives it: it sets {field} itself, so every row would be the same")
    return Vary(spec, field, values)


def _set_by(accounting: CostAccounting, base: dict, field: str, values: tuple) -> bool:
    """Whether ``accounting`` sets ``field`` of the two-pool ``base`` itself: the clusters with
    the base's value and each of ``values`` differ, and ``apply_cluster`` makes them one."""
    parent, leaf = _parent(base, field)
    clusters = [cluster_from_dict(with_values(base, {field: v})) for v in dict.fromkeys((parent[leaf], *values))]
    seen = [accounting.apply_cluster(c) for c in clusters]
    return any(c != clusters[0] for c in clusters) and all(c == seen[0] for c in seen)


def grid(varies: list[Vary]) -> list[dict]:
    """Every combination of the varied values; see the module contract."""
    fields = [v.field for v in varies]
    twice = sorted({f for f in fields if fields.count(f) > 1})
    if twice:
        raise SpecError("vary", " ".join(v.spec for v in varies if v.field in twice), "each field varied once")
    size = math.prod(len(v.values) for v in varies)
    if size > MAX_CONFIGS:
        raise SpecError("vary", " ".join(v.spec for v in varies),
                        f"at most {MAX_CONFIGS:,} configurations; these make {size:,}")
    return [dict(zip(fields, combo)) for combo in itertools.product(*(v.values for v in varies))]


@dataclass(slots=True)
class Row:
    """One configuration under one policy. Waits and spans in hours; ``slo_met`` a share."""

    values: dict
    policy: str
    queue: str = "backfill"  # the waiting line's order on bounded pools (``run_config(backfill=)``)
    cost_per_hour: float = math.nan
    total_cost: float = math.nan
    owned_per_hour: float = math.nan
    owned_total: float = math.nan
    hours: float = math.nan  # the $/h denominator: the trace's solo span
    p50_wait_h: float = math.nan
    p95_wait_h: float = math.nan
    makespan_h: float = math.nan  # the policy's own span: first arrival to last departure
    slo_met: float = math.nan
    limiting_pool: str | None = None
    never_ran: int = 0
    error: str | None = None

    def cost(self, basis: str) -> float:
        """$/h on ``basis`` (``owned`` or ``used``)."""
        return self.owned_per_hour if basis == "owned" else self.cost_per_hour

    def total(self, basis: str) -> float:
        """Total $ on ``basis`` (``owned`` or ``used``)."""
        return self.owned_total if basis == "owned" else self.total_cost

    def label(self, with_policy: bool = False, with_queue: bool = False) -> str:
        """The varied values, then the policy and the line's order when asked for."""
        text = " ".join(f"{k}={UNBOUNDED if v is None else v}" for k, v in self.values.items())
        text = f"{text} {self.policy}".strip() if with_policy else text
        return f"{text} queue={self.queue}".strip() if with_queue else text

    def to_dict(self) -> dict:
        """Plain data; NaN and infinity (an error row, jobs that never ran) become None."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def nearest_rank(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def run_config(jobs: list[Job], base: dict, values: dict, policy: str, seed: int, duration_model: str,
               accounting: CostAccounting, profiles: Profiles | None = None, backfill: bool = True) -> Row:
    """Simulate ``jobs`` on ``base`` with ``values`` set, under ``policy``; see the module contract.
    ``profiles``: a fleet's measured phase times (none: the trace's and the roofline rule);
    ``backfill``: the waiting line's order (``simulate(backfill=)``)."""
    if FLEET in base:
        from rollmux.whatif_fleet import run_fleet_config

        return run_fleet_config(jobs, base, values, policy, seed, duration_model, profiles, accounting, backfill)
    from rollmux.policies import make_policy
    from rollmux.sim.engine import simulate

    try:
        cluster = accounting.apply_cluster(cluster_from_dict(with_values(base, values)))
        for job in jobs:
            job.validate(cluster)
        result = simulate(jobs, cluster, make_policy(policy, seed, accounting, cluster), duration_model, seed,
                          accounting=accounting, backfill=backfill)
    except RollMuxError as err:
        return Row(values, policy, error=str(err), queue=order(backfill))
    return result_row(values, policy, result, owned_cost(cluster, result.span_s, result.gpu_seconds),
                      order(backfill))


def order(backfill: bool) -> str:
    """The name of a waiting line's order: ``backfill`` or ``fifo``."""
    return "backfill" if backfill else "fifo"


def result_row(values: dict, policy: str, result: PolicyResult, owned_nodes: float,
               queue: str = "backfill") -> Row:
    """The Row of a finished replay ``result`` whose nodes cost ``owned_nodes`` $ on the owned
    basis (its line in order ``queue``); its owned cost adds the reward pool's bill to them."""
    hours = result.reference_span_s / 3600.0
    waits = [j.wait_s / 3600.0 for j in result.jobs] + [math.inf] * len(result.rejected)
    used, owned = result.used_cost, owned_nodes + result.reward_cost
    return Row(values, policy, queue, cost_per_hour=used / hours if hours > 0 else 0.0, total_cost=used,
               owned_per_hour=owned / hours if hours > 0 else 0.0, owned_total=owned, hours=hours,
               p50_wait_h=nearest_rank(waits, 0.5), p95_wait_h=nearest_rank(waits, 0.95),
               makespan_h=result.span_s / 3600.0, slo_met=result.slo_attainment,
               limiting_pool=result.limiting_pool, never_ran=len(result.rejected))


def qualifies(row: Row, max_p95_wait_h: float | None = None, min_slo: float | None = None) -> bool:
    """Whether ``row`` ran every job and meets the targets given; see the module contract."""
    if row.error is not None or row.never_ran:
        return False
    if max_p95_wait_h is not None and not row.p95_wait_h <= max_p95_wait_h:
        return False
    return min_slo is None or row.slo_met >= min_slo


def choose(rows: list[Row], basis: str = "owned", max_p95_wait_h: float | None = None,
           min_slo: float | None = None) -> Row | None:
    """The cheapest qualifying row (None when none qualifies); see the module contract."""
    ok = [(r.cost(basis), r.p95_wait_h, i) for i, r in enumerate(rows) if qualifies(r, max_p95_wait_h, min_slo)]
    return rows[min(ok)[2]] if ok else None


def frontier(rows: list[Row], basis: str = "owned") -> list[Row]:
    """The Pareto frontier of cost vs p95 wait; see the module contract."""
    ran = sorted((r for r in rows if qualifies(r)), key=lambda r: (r.cost(basis), r.p95_wait_h))
    out: list[Row] = []
    best = math.inf  # lowest p95 wait among strictly cheaper rows
    for _, group in itertools.groupby(ran, key=lambda r: r.cost(basis)):
        group = list(group)
        low = group[0].p95_wait_h
        if low < best:
            out.extend(r for r in group if r.p95_wait_h == low)
            best = low
    return out
