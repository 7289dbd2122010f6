"""A fleet of GPU pools of any types, and a job's phase times on each type.

Contract
--------
* A ``Fleet`` is a list of pools (``FleetPool``): a name, a GPU type, its price per
  GPU-hour, dense bf16 TFLOPS, memory bandwidth (TB/s), host memory per node, an
  inventory (a node count or None: unbounded) and the roles it may play (rollout,
  training or both). Pools of one GPU type have the same TFLOPS and TB/s: phase times
  are per type (a profile row, the trace's reference columns, the roofline rule), so a
  GPU of other figures is another type. Every node has ``gpus_per_node`` GPUs.
  ``reference`` names the GPU types a trace's ``t_roll_s`` and ``t_train_s`` were
  profiled on (the paper's H20 and H800 unless the fleet file says otherwise); every
  SLO is relative to the job's solo time on them, whatever types it ends up on.
* A *view* is an ordered pair of pools (rollout pool a, training pool b) whose roles
  allow it, a == b included (disaggregated on separate nodes of one pool). Each view is
  an ordinary two-pool ``Cluster``; the planner, the intra-group analysis and the exact
  solver run on it unchanged. A group lives in one view. Co-location on pool c is
  offered in one view only, ``colocation_view(c)``: the diagonal (c, c) when c plays
  both roles, else the first view training on c.
* A two-pool cluster file of today is the fleet of its two pools with fixed roles and
  the pools' types as reference: one view, exactly today's planner.

Phase times on a type (``Profiles.phase_s``), first that applies:
1. the job's profile for that GPU type (a profile file: ``load_profiles``);
2. the trace's own columns: rollout on the reference rollout type is ``t_roll_s``,
   training on the reference training type ``t_train_s``; rollout on the reference
   training type ``t_roll_colo_s`` when given (the trace measured it there, co-located);
3. the roofline rule: decode is memory-bandwidth bound and training compute bound, so

       t_roll(g)  = t_roll_s  * bw(ref_R)    / bw(g)
       t_train(g) = t_train_s * tflops(ref_T) / tflops(g)

   ``roofline_check`` measures this rule against a trace that gives co-located times
   (rollout on the training type) and reports its error; docs/fleet.md has the numbers.
Co-located training on the reference training type is ``t_train_colo_s`` when given
(the trace's measurement), else the disaggregated training time on that type. A
co-located rollout runs on the job's training GPUs: ``t_roll_colo_s`` on the reference
training type when given, else its time on that type above times
``colocation.rollout_width_factor`` (a job with more rollout than training GPUs runs its
batch on fewer GPUs).

Translation (``translate``): the job as the planner of view v sees it is the same job
with v's phase times, its co-located times on v's training pool, a fixed iteration
count (its solo iterations on the reference types; none when it has no known length)
and the SLO rescaled so that the deadline is unchanged:

    slo_v = SLO * T_solo_ref / T_solo_v      (iter_v <= slo_v * T_solo_v  <=>  iter_v <= SLO * T_solo_ref)

A view where slo_v < 1 cannot meet the SLO even alone and is not offered.
"""
from __future__ import annotations

import dataclasses
import io
import functools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from rollmux.colocation import rollout_width_factor
from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import (CONTROL_CHARS, GPU_TYPES, MAX_PHASE_S, MAX_POOL_NODES, MAX_PRICE, MIN_PHASE_S, ROLLOUT,
                           TRAIN, Cluster, Job, PoolSpec, SwitchCost)
from rollmux.text_file import csv_fields, read_text

ROLES = (ROLLOUT, TRAIN)
MAX_FIGURE = 1e6  # TFLOPS or TB/s of a GPU type: far above any GPU (B200: 2,250 and 8), so ratios stay finite


@dataclass(slots=True, frozen=True)
class FleetPool:
    """One pool of a fleet: its GPU type and figures, node shape, inventory and roles."""

    name: str
    gpu: str
    price_per_gpu_hour: float
    tflops: float
    tb_per_s: float
    host_mem_gb: float = 2048.0
    nodes: int | None = None
    roles: tuple[str, ...] = ROLES

    def validate(self, where: str) -> None:
        for name, top in (("price_per_gpu_hour", MAX_PRICE), ("tflops", MAX_FIGURE), ("tb_per_s", MAX_FIGURE),
                          ("host_mem_gb", math.inf)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and 0 < value <= top):
                raise SpecError(f"{where}.{name}", value, "a number > 0" + (f" and <= {top:g}" if top < math.inf
                                                                             else ""))
        if self.nodes is not None and (not isinstance(self.nodes, int) or isinstance(self.nodes, bool)
                                       or not 0 <= self.nodes <= MAX_POOL_NODES):
            raise SpecError(f"{where}.nodes", self.nodes, f"a node count from 0 to {MAX_POOL_NODES:,} or null "
                                                          f"(unbounded)")
        if not self.roles or any(r not in ROLES for r in self.roles) or len(set(self.roles)) != len(self.roles):
            raise SpecError(f"{where}.roles", list(self.roles), f"a non-empty list of distinct {list(ROLES)}")

    def spec(self) -> PoolSpec:
        """The pool as a two-pool cluster's side (unbounded: the fleet planner keeps the inventory)."""
        return PoolSpec(self.gpu, self.price_per_gpu_hour, self.host_mem_gb)


@dataclass(slots=True, frozen=True)
class View:
    """A pair of pools a group may live on, and the two-pool cluster that models it."""

    rollout: FleetPool
    train: FleetPool
    cluster: Cluster

    @property
    def name(self) -> str:
        return f"{self.rollout.name}/{self.train.name}"

    def pool_of(self, side: str) -> FleetPool:
        return self.rollout if side == ROLLOUT else self.train


@dataclass(slots=True, frozen=True)
class Fleet:
    """Pools of any GPU types plus the knobs every view shares (see the module contract)."""

    pools: tuple[FleetPool, ...]
    reference: tuple[str, str] = ("H20", "H800")  # (rollout type, training type) of the trace's profiles
    gpus_per_node: int = 8
    switch_cost: SwitchCost = SwitchCost()
    max_group_size: int = 5

    def validate(self) -> None:
        if not self.pools:
            raise SpecError("pools", [], "at least one pool")
        seen: set[str] = set()
        for i, pool in enumerate(self.pools):
            pool.validate(f"pools[{i}]")
            if (not pool.name or pool.name in seen or "/" in pool.name or ":" in pool.name
                    or CONTROL_CHARS.search(pool.name)):
                raise SpecError(f"pools[{i}].name", pool.name, "a non-empty name without '/', ':' or control "
                                "characters, unique in the fleet")
            seen.add(pool.name)
            first = next(p for p in self.pools if p.gpu == pool.gpu)
            for name in ("tflops", "tb_per_s"):
                if getattr(pool, name) != getattr(first, name):
                    raise SpecError(f"pools[{i}].{name}", getattr(pool, name), f"{getattr(first, name):g}, the "
                                    f"{name} of pool {first.name!r} of GPU type {pool.gpu!r}: the pools of one GPU "
                                    "type share its figures, as its profiles and the trace's reference times do "
                                    "(a GPU of other figures is another type: give it its own gpu name)")
        for side, gpu in zip(ROLES, self.reference):
            if gpu not in self.figures():
                raise SpecError(f"reference.{side}", gpu, f"a GPU type with known figures: {sorted(self.figures())}")
        for role in ROLES:
            if not any(role in p.roles for p in self.pools):
                raise SpecError("pools", [p.name for p in self.pools], f"at least one pool with the {role} role")
        if not any(TRAIN in p.roles and p.nodes != 0 for p in self.pools):
            raise SpecError("pools", [p.name for p in self.pools], "a pool with the train role and nodes to train "
                            "on (every job trains; `nodes: 0` on each such pool leaves none)")
        # the knobs every view shares, checked as a two-pool cluster file checks them
        Cluster(self.gpus_per_node, switch_cost=self.switch_cost, max_group_size=self.max_group_size).validate()

    def figures(self) -> dict[str, tuple[float, float]]:
        """GPU type -> (TFLOPS, TB/s): the built-in table, overridden by the fleet's pools
        (which agree on their type's figures: ``validate``)."""
        table = {gpu: (row[0], row[1]) for gpu, row in GPU_TYPES.items()}
        table.update({p.gpu: (p.tflops, p.tb_per_s) for p in self.pools})
        return table

    def pool(self, name: str) -> FleetPool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def views(self) -> list[View]:
        """Every (rollout pool, training pool) pair the roles allow, in file order."""
        return list(_views(self))

    def colocation_view(self, pool: FleetPool) -> str | None:
        """Name of the one view where co-location on ``pool`` is offered (None: it never trains)."""
        return _colocation_views(self).get(pool.name)


@functools.lru_cache(maxsize=64)
def _views(fleet: Fleet) -> tuple[View, ...]:
    """``Fleet.views``, built once per fleet (a planner asks at every arrival)."""
    return tuple(View(a, b, Cluster(fleet.gpus_per_node, a.spec(), b.spec(), fleet.switch_cost, fleet.max_group_size))
                 for a in fleet.pools if ROLLOUT in a.roles for b in fleet.pools if TRAIN in b.roles)


@functools.lru_cache(maxsize=64)
def _colocation_views(fleet: Fleet) -> dict[str, str]:
    """``Fleet.colocation_view`` by pool name, for every pool that trains."""
    out = {}
    for pool in fleet.pools:
        names = [v.name for v in _views(fleet) if v.train.name == pool.name]
        diagonal = f"{pool.name}/{pool.name}"
        if names:
            out[pool.name] = diagonal if diagonal in names else names[0]
    return out


def fleet_of(cluster: Cluster) -> Fleet:
    """A two-pool cluster as a fleet: its two pools in fixed roles, their types as reference."""
    def pool(spec: PoolSpec, name: str, role: str) -> FleetPool:
        tflops, bw = GPU_TYPES[spec.gpu][:2]
        return FleetPool(name, spec.gpu, spec.price_per_gpu_hour, tflops, bw, spec.host_mem_gb, spec.nodes, (role,))

    return Fleet((pool(cluster.rollout, ROLLOUT, ROLLOUT), pool(cluster.train, TRAIN, TRAIN)),
                 (cluster.rollout.gpu, cluster.train.gpu), cluster.gpus_per_node, cluster.switch_cost,
                 cluster.max_group_size)


@dataclass(slots=True, frozen=True)
class Profiles:
    """Measured phase seconds per (job id, GPU type): ``{(job, gpu): (t_roll or None, t_train or None)}``."""

    table: dict[tuple[str, str], tuple[float | None, float | None]] = dataclasses.field(default_factory=dict)

    def unused(self, fleet: Fleet, jobs: list[Job]) -> list[str]:
        """What of this table a plan of ``jobs`` on ``fleet`` never reads, as lines to warn
        with: rows of jobs not in the trace, rows of GPU types the fleet has no pool of."""
        ids = {j.job_id for j in jobs}
        types = {p.gpu for p in fleet.pools}
        strangers = sorted({job for job, _ in self.table if job not in ids})
        elsewhere = sorted({gpu for _, gpu in self.table if gpu not in types})
        lines = []
        if strangers:
            lines.append(f"{len(strangers)} job id(s) not in the trace: {', '.join(strangers[:5])}"
                         + (" ..." if len(strangers) > 5 else ""))
        if elsewhere:
            lines.append(f"GPU type(s) the fleet has no pool of: {', '.join(elsewhere)}")
        return lines

    def phase_s(self, fleet: Fleet, job: Job, side: str, gpu: str) -> tuple[float, str]:
        """(seconds, source) of ``job``'s ``side`` phase on ``gpu``; source is "profile",
        "trace" or "roofline" (module contract, in that order)."""
        measured = self.table.get((job.job_id, gpu), (None, None))[0 if side == ROLLOUT else 1]
        if measured is not None:
            return measured, "profile"
        ref_r, ref_t = fleet.reference
        if side == ROLLOUT:
            if gpu == ref_r:
                return job.t_roll_s, "trace"
            if gpu == ref_t and job.t_roll_colo_s is not None:
                return job.t_roll_colo_s, "trace"
            figures = fleet.figures()
            return job.t_roll_s * figures[ref_r][1] / figures[gpu][1], "roofline"
        if gpu == ref_t:
            return job.t_train_s, "trace"
        figures = fleet.figures()
        return job.t_train_s * figures[ref_t][0] / figures[gpu][0], "roofline"

    def colocated_roll_s(self, fleet: Fleet, job: Job, gpu: str) -> float:
        """Rollout seconds co-located on ``gpu`` (on the job's training GPUs): the trace's
        ``t_roll_colo_s`` on the reference training type when given, else the rollout on
        ``gpu`` at its own width, times ``colocation.rollout_width_factor``."""
        seconds, source = self.phase_s(fleet, job, ROLLOUT, gpu)
        if source == "trace" and gpu == fleet.reference[1] and job.t_roll_colo_s is not None:
            return seconds
        return seconds * rollout_width_factor(job)

    def colocated_train_s(self, fleet: Fleet, job: Job, gpu: str) -> float:
        """Training seconds co-located on ``gpu``: the trace's ``t_train_colo_s`` on the
        reference training type when given, else the disaggregated time on ``gpu``."""
        measured = self.table.get((job.job_id, gpu), (None, None))[1]
        if gpu == fleet.reference[1] and job.t_train_colo_s is not None and measured is None:
            return job.t_train_colo_s
        return self.phase_s(fleet, job, TRAIN, gpu)[0]


def translate(fleet: Fleet, profiles: Profiles, job: Job, view: View, strict: bool = True) -> Job | None:
    """``job`` as the planner of ``view`` sees it (module contract), or None when even
    alone on the view's types it would miss its SLO (slo_v < 1). A job that only runs
    co-located keeps its profile (measured co-located on the reference training type)
    and is offered only on a pool of that type. With ``strict=False`` there is no None:
    the job as it runs there, slo_v < 1 included (a baseline that puts it there anyway)."""
    if job.colocate:
        if strict and (view.train.gpu != fleet.reference[1] or view.name != fleet.colocation_view(view.train)):
            return None
        return dataclasses.replace(job, iterations=_length(job), duration_s=None)
    t_roll = profiles.phase_s(fleet, job, ROLLOUT, view.rollout.gpu)[0]
    t_train = profiles.phase_s(fleet, job, TRAIN, view.train.gpu)[0]
    moved = dataclasses.replace(
        job, t_roll_s=t_roll, t_train_s=t_train,
        t_roll_colo_s=profiles.colocated_roll_s(fleet, job, view.train.gpu),
        t_train_colo_s=profiles.colocated_train_s(fleet, job, view.train.gpu),
        iterations=_length(job), duration_s=None)
    slo = job.slo if moved.t_solo == job.t_solo else job.slo * job.t_solo / moved.t_solo
    if slo < 1.0 and strict:
        return None
    moved.slo = slo  # (a fresh copy: nobody else holds it yet)
    return moved


def _length(job: Job) -> int | None:
    """The translated job's iteration count: its solo iterations on the reference types,
    or None (unknown, as the planner's start-up check reads it) when the job has no length."""
    return job.solo_iterations() if job.iterations is not None or job.duration_s is not None else None


def speed_factor(job: Job, moved: Job) -> float:
    """How much longer ``job`` holds its nodes per unit of work on the moved job's types:
    T_solo_v / T_solo_ref (< 1 on faster types)."""
    return moved.t_solo / job.t_solo


_PROFILE_COLUMNS = ("job_id", "gpu", "t_roll_s", "t_train_s")


def load_profiles(path: str | Path, fleet: Fleet) -> Profiles:
    """Read a profile CSV (columns job_id, gpu, t_roll_s, t_train_s; an empty time: not
    measured). Comment lines (``#``) and blank lines are skipped, a byte-order mark is
    dropped. A bad row raises TraceFormatError naming the file, its line in the file and
    the field."""
    table: dict[tuple[str, str], tuple[float | None, float | None]] = {}
    known = fleet.figures()
    with io.StringIO(read_text(path), newline="") as handle:
        numbered = [(n, text) for n, text in enumerate(handle, start=1)
                    if text.strip() and not text.lstrip().startswith("#")]
    if not numbered or [h.strip() for h in csv_fields(numbered[0][1], path, numbered[0][0])] != list(
            _PROFILE_COLUMNS):
        raise TraceFormatError(str(path), numbered[0][0] if numbered else 1, "header",
                               f"expected the columns {','.join(_PROFILE_COLUMNS)}")
    for line, text in numbered[1:]:
        row = csv_fields(text, path, line)
        if len(row) != len(_PROFILE_COLUMNS):
            raise TraceFormatError(str(path), line, "row", f"{len(row)} fields, expected {len(_PROFILE_COLUMNS)}")
        job_id, gpu = row[0].strip(), row[1].strip()
        if not job_id:
            raise TraceFormatError(str(path), line, "job_id", "empty")
        if gpu not in known:
            raise TraceFormatError(str(path), line, "gpu", f"{gpu!r} is not a GPU type of the fleet "
                                   f"({', '.join(sorted({p.gpu for p in fleet.pools}))}) or the built-in table")
        times: list[float | None] = []
        for name, cell in zip(_PROFILE_COLUMNS[2:], row[2:]):
            cell = cell.strip()
            if not cell:
                times.append(None)
                continue
            try:
                value = float(cell)
            except ValueError:
                value = float("nan")
            if not MIN_PHASE_S <= value <= MAX_PHASE_S:
                raise TraceFormatError(str(path), line, name, f"{cell!r} is not a duration from {MIN_PHASE_S:g} "
                                                              f"to {MAX_PHASE_S:g} seconds")
            times.append(value)
        if (job_id, gpu) in table:
            raise TraceFormatError(str(path), line, "job_id", f"a second row for ({job_id}, {gpu})")
        table[(job_id, gpu)] = (times[0], times[1])
    return Profiles(table)


@dataclass(slots=True, frozen=True)
class RooflineError:
    """The roofline rule against measured times: relative errors (predicted / measured - 1)."""

    rows: int
    median_abs: float
    mean_abs: float
    worst: float
    by_model: dict[str, float]  # model -> mean relative error


def roofline_check(jobs: list[Job], fleet: Fleet, side: str = ROLLOUT) -> RooflineError:
    """How well the roofline rule predicts the trace's co-located phase times on the
    reference training type: ``t_roll_colo_s`` (side rollout: bandwidth rule from the
    reference rollout type, times ``colocation.rollout_width_factor``) or
    ``t_train_colo_s`` (side train: the same type, the rule predicts ``t_train_s``).
    Jobs without the column are skipped."""
    ref_r, ref_t = fleet.reference
    figures = fleet.figures()
    errors: list[tuple[str, float]] = []
    for job in jobs:
        if side == ROLLOUT and job.t_roll_colo_s is not None:
            rule = job.t_roll_s * figures[ref_r][1] / figures[ref_t][1] * rollout_width_factor(job)
            errors.append((job.model, rule / job.t_roll_colo_s - 1))
        elif side == TRAIN and job.t_train_colo_s is not None:
            errors.append((job.model, job.t_train_s / job.t_train_colo_s - 1))
    if not errors:
        column = "t_roll_colo_s" if side == ROLLOUT else "t_train_colo_s"
        raise SpecError("trace", len(jobs), f"jobs with {column} to check against")
    models: dict[str, list[float]] = {}
    for model, err in errors:
        models.setdefault(model or "?", []).append(err)
    absolute = [abs(e) for _, e in errors]
    return RooflineError(len(errors), statistics.median(absolute), statistics.fmean(absolute),
                         max((e for _, e in errors), key=abs),
                         {m: statistics.fmean(v) for m, v in sorted(models.items())})
