"""Cluster description files (YAML) and their JSON-ready form.

Contract
--------
* Keys (all optional; defaults are the paper's testbed, ``Cluster()``):
  ``gpus_per_node`` (8); ``rollout`` and ``train``, each a mapping of ``gpu`` (default
  H20 / H800), ``price_per_gpu_hour`` (default: the GPU type's price in
  ``model.GPU_TYPES``), ``host_mem_gb`` (2048) and ``nodes`` (an int, or null for an
  unbounded pool, the default); ``switch_cost_s``: "warm" (default) or "cold", a number
  of seconds for both pools, or ``{rollout: s, train: s}``; ``max_group_size`` (5).
* Types are strict (a quoted "8" is not a number). An unknown key, a wrong type or a
  value outside its contract raises SpecError naming the dotted field path, the value
  and what was expected (for an unknown key: the allowed keys). A file that is not YAML
  or not a mapping raises TraceFormatError with the file and line.
* ``load_cluster(None)`` is ``Cluster()``. The result has passed ``Cluster.validate()``.
* ``cluster_to_dict`` gives the same shape as the file; ``load_cluster`` of its YAML
  dump is an equal Cluster.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import GPU_TYPES, ROLLOUT, TRAIN, Cluster, PoolSpec, SwitchCost

_DEFAULT = Cluster()
_SWITCH_EXPECTED = '"warm", "cold", seconds >= 0, or {rollout: seconds, train: seconds}'


class _PoolFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gpu: str | None = None
    price_per_gpu_hour: float | None = None
    host_mem_gb: float = 2048.0
    nodes: int | None = None


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gpus_per_node: int = _DEFAULT.gpus_per_node
    rollout: _PoolFile = _PoolFile()
    train: _PoolFile = _PoolFile()
    switch_cost_s: Any = _DEFAULT.switch_cost.mode
    max_group_size: int = _DEFAULT.max_group_size


def _spec_error(err: ValidationError) -> SpecError:
    first = err.errors()[0]
    loc = [str(part) for part in first["loc"]]
    field = ".".join(loc)
    if first["type"] == "extra_forbidden":
        model = _ClusterFile if len(loc) == 1 else _PoolFile
        return SpecError(field, first["input"],
                         f"no such key; allowed keys: {', '.join(model.model_fields)}")
    if first["type"] == "model_type":
        return SpecError(field, first["input"],
                         f"a mapping with keys {', '.join(_PoolFile.model_fields)}")
    return SpecError(field, first["input"], first["msg"].removeprefix("Input should be "))


def _pool(spec: _PoolFile, pool: str, default_gpu: str) -> PoolSpec:
    gpu = spec.gpu if spec.gpu is not None else default_gpu
    if gpu not in GPU_TYPES:
        raise SpecError(f"{pool}.gpu", gpu, f"one of {sorted(GPU_TYPES)}")
    price = spec.price_per_gpu_hour
    return PoolSpec(gpu, GPU_TYPES[gpu][2] if price is None else price, spec.host_mem_gb,
                    spec.nodes)


def _switch(value: Any) -> SwitchCost:
    if value in ("warm", "cold"):
        return SwitchCost(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return SwitchCost("fixed", float(value), float(value))
    if isinstance(value, dict) and set(value) == {ROLLOUT, TRAIN} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        return SwitchCost("fixed", float(value[ROLLOUT]), float(value[TRAIN]))
    raise SpecError("switch_cost_s", value, _SWITCH_EXPECTED)


def cluster_from_dict(data: dict) -> Cluster:
    """Build and validate a Cluster from the file's mapping; see the module contract."""
    try:
        spec = _ClusterFile.model_validate(data)
    except ValidationError as err:
        raise _spec_error(err) from None
    cluster = Cluster(
        gpus_per_node=spec.gpus_per_node,
        rollout=_pool(spec.rollout, ROLLOUT, _DEFAULT.rollout.gpu),
        train=_pool(spec.train, TRAIN, _DEFAULT.train.gpu),
        switch_cost=_switch(spec.switch_cost_s),
        max_group_size=spec.max_group_size,
    )
    cluster.validate()
    return cluster


def load_cluster(path: str | Path | None) -> Cluster:
    """Read a cluster YAML file (None: the default cluster); see the module contract."""
    if path is None:
        return Cluster()
    with open(path, encoding="utf-8") as handle:
        try:
            data = yaml.safe_load(handle)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            raise TraceFormatError(str(path), line, "", f"not valid YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TraceFormatError(str(path), 1, "", "expected a mapping of cluster keys")
    return cluster_from_dict(data)


def _switch_to_value(switch: SwitchCost) -> str | float | dict[str, float]:
    if switch.mode != "fixed":
        return switch.mode
    if switch.rollout_s == switch.train_s:
        return switch.rollout_s
    return {ROLLOUT: switch.rollout_s, TRAIN: switch.train_s}


def cluster_to_dict(cluster: Cluster) -> dict:
    """The cluster as plain data in the file's shape (JSON- and YAML-ready)."""
    def pool(spec: PoolSpec) -> dict:
        return {"gpu": spec.gpu, "price_per_gpu_hour": spec.price_per_gpu_hour,
                "host_mem_gb": spec.host_mem_gb, "nodes": spec.nodes}

    return {"gpus_per_node": cluster.gpus_per_node, ROLLOUT: pool(cluster.rollout),
            TRAIN: pool(cluster.train), "switch_cost_s": _switch_to_value(cluster.switch_cost),
            "max_group_size": cluster.max_group_size}
