"""Fleet files: any number of GPU pools (YAML), or today's two-pool cluster file.

Contract
--------
* A file with a ``pools`` key is a fleet: ``pools`` is a list of mappings with ``gpu``
  (required), ``name`` (default: the GPU type; unique, no '/'), ``price_per_gpu_hour``,
  ``tflops`` (dense bf16) and ``tb_per_s`` (memory bandwidth), each defaulting to the
  type's row of ``model.GPU_TYPES`` and required for a type not in it, ``host_mem_gb``
  (2048), ``nodes`` (a count or null: unbounded, the default) and ``roles`` (a list of
  ``rollout``/``train``, default both). Other keys: ``reference`` (``{rollout: GPU,
  train: GPU}``, the types the trace's phase times were profiled on; default H20 and
  H800), ``gpus_per_node`` (8), ``switch_cost_s`` and ``max_group_size`` as in a
  cluster file (``rollmux.cluster_file``).
* A file without ``pools`` is a two-pool cluster file, read by ``load_cluster`` and
  turned into a fleet by ``fleet.fleet_of``: one view, today's planner exactly.
* Types are strict; an unknown key, a wrong type or a value outside its contract
  raises SpecError naming the dotted field path (``pools[2].tb_per_s``), the value and
  what was expected. The result has passed ``Fleet.validate()``.
* ``fleet_to_dict`` is the inverse of ``fleet_from_dict`` for a fleet (every figure
  written out), and ``profiles_to_rows`` / ``profiles_from_rows`` carry a profile table as
  JSON rows: how ``rollmux serve`` keeps a fleet in its state file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rollmux.cluster_file import cluster_from_dict, key_error, read_mapping, switch_from_value, switch_to_value
from rollmux.errors import SpecError
from rollmux.fleet import ROLES, Fleet, FleetPool, Profiles, fleet_of
from rollmux.model import GPU_TYPES, Cluster

_DEFAULT = Fleet(())


class _PoolFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    gpu: str
    name: str | None = None
    price_per_gpu_hour: float | None = None
    tflops: float | None = None
    tb_per_s: float | None = None
    host_mem_gb: float = 2048.0
    nodes: int | None = None
    roles: list[str] = list(ROLES)


class _Reference(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    rollout: str = _DEFAULT.reference[0]
    train: str = _DEFAULT.reference[1]


class _FleetFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    pools: list[_PoolFile]
    reference: _Reference = _Reference()
    gpus_per_node: int = _DEFAULT.gpus_per_node
    switch_cost_s: Any = _DEFAULT.switch_cost.mode
    max_group_size: int = _DEFAULT.max_group_size


def _path(loc: tuple) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("int", "float", "str", "none"):
            path += f".{part}" if path else str(part)
    return path


def _pool(spec: _PoolFile, i: int) -> FleetPool:
    row = GPU_TYPES.get(spec.gpu)
    figures = {}
    for key, column in (("tflops", 0), ("tb_per_s", 1), ("price_per_gpu_hour", 2)):
        value = getattr(spec, key)
        if value is None:
            if row is None:
                raise SpecError(f"pools[{i}].{key}", None, f"a number for GPU type {spec.gpu!r}, which is not in "
                                f"the built-in table ({', '.join(sorted(GPU_TYPES))})")
            value = row[column]
        figures[key] = value
    return FleetPool(spec.name if spec.name is not None else spec.gpu, spec.gpu, figures["price_per_gpu_hour"],
                     figures["tflops"], figures["tb_per_s"], spec.host_mem_gb, spec.nodes, tuple(spec.roles))


def fleet_from_dict(data: dict) -> Fleet:
    """Build and validate a Fleet from a file's mapping (either shape; module contract)."""
    if "pools" not in data:
        return fleet_of(cluster_from_dict(data))
    try:
        spec = _FleetFile.model_validate(data)
    except ValidationError as err:
        first = max(err.errors(), key=lambda e: len(e["loc"]))
        if first["type"] == "invalid_key":  # (the key itself ends the location: drop it)
            raise key_error(_path(first["loc"][:-1]), first["input"]) from None
        expected = ("no such key; allowed keys: " + ", ".join(
            _FleetFile.model_fields if len(first["loc"]) == 1 else
            _Reference.model_fields if first["loc"][0] == "reference" else _PoolFile.model_fields)
            if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Input should be "))
        raise SpecError(_path(first["loc"]), first.get("input"), expected) from None
    fleet = Fleet(tuple(_pool(p, i) for i, p in enumerate(spec.pools)), (spec.reference.rollout, spec.reference.train),
                  spec.gpus_per_node, switch_from_value(spec.switch_cost_s), spec.max_group_size)
    fleet.validate()
    return fleet


def load_cluster_or_fleet(path: str | Path) -> Cluster | Fleet:
    """Read a file as what it is: a fleet file (with ``pools``) as a ``Fleet``, a two-pool
    cluster file as a ``Cluster`` (``rollmux serve`` runs either)."""
    data = read_mapping(path, "fleet or cluster")
    return fleet_from_dict(data) if "pools" in data else cluster_from_dict(data)


def load_fleet(path: str | Path | None) -> Fleet:
    """Read a fleet or cluster YAML file (None: the default two-pool cluster)."""
    return fleet_from_dict({} if path is None else read_mapping(path, "fleet or cluster"))


def fleet_to_dict(fleet: Fleet) -> dict:
    """The fleet as plain data in the fleet file's shape (JSON- and YAML-ready)."""
    return {"pools": [{"gpu": p.gpu, "name": p.name, "price_per_gpu_hour": p.price_per_gpu_hour, "tflops": p.tflops,
                       "tb_per_s": p.tb_per_s, "host_mem_gb": p.host_mem_gb, "nodes": p.nodes, "roles": list(p.roles)}
                      for p in fleet.pools],
            "reference": {"rollout": fleet.reference[0], "train": fleet.reference[1]},
            "gpus_per_node": fleet.gpus_per_node, "switch_cost_s": switch_to_value(fleet.switch_cost),
            "max_group_size": fleet.max_group_size}


def profiles_to_rows(profiles: Profiles) -> list[list]:
    """A profile table as JSON rows ``[job_id, gpu, t_roll_s or None, t_train_s or None]``."""
    return [[job, gpu, roll, train] for (job, gpu), (roll, train) in sorted(profiles.table.items())]


def profiles_from_rows(rows: list[list]) -> Profiles:
    """The inverse of ``profiles_to_rows``."""
    return Profiles({(job, gpu): (roll, train) for job, gpu, roll, train in rows})
