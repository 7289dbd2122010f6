"""Cluster description files (YAML) and their JSON-ready form.

Contract
--------
* Keys (all optional; defaults are the paper's testbed, ``Cluster()``):
  ``gpus_per_node`` (8); ``rollout`` and ``train``, each a mapping of ``gpu`` (default
  H20 / H800), ``price_per_gpu_hour`` (default: the GPU type's price in
  ``model.GPU_TYPES``), ``host_mem_gb`` (2048) and ``nodes``: an int (that many nodes,
  named R0.. / T0..), a list of real nodes ``{id, gpus, host_mem_gb}`` (``gpus`` must
  equal ``gpus_per_node``; ``host_mem_gb`` defaults to the pool's; ids unique across
  both pools), or null for an unbounded pool (the default); ``switch_cost_s``: "warm" (default) or "cold", a number
  of seconds for both pools, or ``{rollout: s, train: s}``; ``max_group_size`` (5);
  ``pricing``: "pay-per-use" (default: a node costs while a group holds it) or "owned"
  (every node of a bounded pool costs for the whole run; needs a bounded pool).
* Types are strict (a quoted "8" is not a number). An unknown key, a wrong type or a
  value outside its contract raises SpecError naming the dotted field path, the value
  and what was expected (for an unknown key: the allowed keys; for a key that is not a
  string, such as ``1:`` or ``true:``, the field is ``top-level key`` or ``<path> key``
  and the value the key). A file that is not YAML
  or not a mapping raises TraceFormatError with the file and line.
* ``load_cluster(None)`` is ``Cluster()``. The result has passed ``Cluster.validate()``.
* ``cluster_to_dict`` gives the same shape as the file (``pricing`` only when not the
  default, so state files written before it existed compare equal); ``load_cluster`` of
  its YAML dump is an equal Cluster.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rollmux import strict_yaml
from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import GPU_TYPES, POOLS, ROLLOUT, TRAIN, Cluster, NodeSpec, PoolSpec, SwitchCost
from rollmux.text_file import read_text

_DEFAULT = Cluster()
_SWITCH_EXPECTED = '"warm", "cold", seconds >= 0, or {rollout: seconds, train: seconds}'


class _NodeFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    id: str
    gpus: int | None = None
    host_mem_gb: float | None = None


class _PoolFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    gpu: str | None = None
    price_per_gpu_hour: float | None = None
    host_mem_gb: float = 2048.0
    nodes: int | list[_NodeFile] | None = None


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    gpus_per_node: int = _DEFAULT.gpus_per_node
    rollout: _PoolFile = _PoolFile()
    train: _PoolFile = _PoolFile()
    switch_cost_s: Any = _DEFAULT.switch_cost.mode
    max_group_size: int = _DEFAULT.max_group_size
    pricing: str = _DEFAULT.pricing


def _field_path(loc: tuple) -> tuple[list[str], str]:
    """Dotted path of a pydantic error location, union branch tags dropped, indexes as [i]."""
    parts: list[str] = []
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("int", "float", "str", "none") or part.startswith(("list[", "function-")):
            continue
        else:
            parts.append(part)
            path += f".{part}" if path else part
    return parts, path


def key_error(where: str, key) -> SpecError:
    """A mapping key that is not a string (``1:``, ``true:``), in the mapping at dotted
    path ``where`` ("" for the top level): cluster and fleet files word it alike."""
    return SpecError(f"{where} key" if where else "top-level key", key,
                     "a string (keys are names; quote one YAML reads as a number, boolean or null)")


def _spec_error(err: ValidationError) -> SpecError:
    # A value that fails a union (``nodes``: int, list or null) reports one error per
    # branch; the deepest one is the one that says what is wrong inside the value.
    first = max(err.errors(), key=lambda e: len(e["loc"]))
    if first["type"] == "invalid_key":  # (the key itself ends the location: drop it)
        return key_error(_field_path(first["loc"][:-1])[1], first["input"])
    loc, field = _field_path(first["loc"])
    if first["type"] == "extra_forbidden":
        model = _ClusterFile if len(loc) == 1 else _NodeFile if "nodes" in loc else _PoolFile
        return SpecError(field, first["input"],
                         f"no such key; allowed keys: {', '.join(model.model_fields)}")
    if first["type"] == "model_type":
        return SpecError(field, first["input"],
                         f"a mapping with keys {', '.join(_PoolFile.model_fields)}")
    if loc[-1] == "nodes":
        return SpecError(field, first["input"], "a node count, a list of {id, gpus, host_mem_gb}, or null")
    return SpecError(field, first["input"], first["msg"].removeprefix("Input should be "))


def _pool(spec: _PoolFile, pool: str, default_gpu: str, gpus_per_node: int) -> PoolSpec:
    gpu = spec.gpu if spec.gpu is not None else default_gpu
    if gpu not in GPU_TYPES:
        raise SpecError(f"{pool}.gpu", gpu, f"one of {sorted(GPU_TYPES)}")
    price = GPU_TYPES[gpu][2] if spec.price_per_gpu_hour is None else spec.price_per_gpu_hour
    if not isinstance(spec.nodes, list):
        return PoolSpec(gpu, price, spec.host_mem_gb, spec.nodes)
    listed = []
    for i, node in enumerate(spec.nodes):
        if node.gpus is not None and node.gpus != gpus_per_node:
            raise SpecError(f"{pool}.nodes[{i}].gpus", node.gpus,
                            f"gpus_per_node ({gpus_per_node}): every node of a pool has the same GPU count")
        listed.append(NodeSpec(node.id, spec.host_mem_gb if node.host_mem_gb is None else node.host_mem_gb))
    biggest = max((n.host_mem_gb for n in listed), default=spec.host_mem_gb)
    return PoolSpec(gpu, price, biggest, len(listed), tuple(listed))


def switch_from_value(value: Any) -> SwitchCost:
    """``switch_cost_s`` of a cluster or fleet file as a SwitchCost (SpecError if malformed)."""
    if value in ("warm", "cold"):
        return SwitchCost(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return SwitchCost("fixed", float(value), float(value))
    if isinstance(value, dict) and set(value) == {ROLLOUT, TRAIN} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        return SwitchCost("fixed", float(value[ROLLOUT]), float(value[TRAIN]))
    raise SpecError("switch_cost_s", value, _SWITCH_EXPECTED)  # (the range: Cluster.validate)


def cluster_from_dict(data: dict) -> Cluster:
    """Build and validate a Cluster from the file's mapping; see the module contract."""
    if "pools" in data:
        raise SpecError("pools", "a fleet of GPU pools", "a two-pool cluster file (keys rollout and train) for "
                        "this command; `rollmux fleet plan` and `rollmux fleet simulate` plan a fleet of several GPU "
                        "types, and `rollmux serve` serves one (docs/fleet.md)")
    try:
        spec = _ClusterFile.model_validate(data)
    except ValidationError as err:
        raise _spec_error(err) from None
    cluster = Cluster(
        gpus_per_node=spec.gpus_per_node,
        rollout=_pool(spec.rollout, ROLLOUT, _DEFAULT.rollout.gpu, spec.gpus_per_node),
        train=_pool(spec.train, TRAIN, _DEFAULT.train.gpu, spec.gpus_per_node),
        switch_cost=switch_from_value(spec.switch_cost_s),
        max_group_size=spec.max_group_size,
        pricing=spec.pricing,
    )
    cluster.validate()
    return cluster


def read_mapping(path: str | Path, what: str) -> dict:
    """A YAML file's top-level mapping (an empty file: {}), read by ``strict_yaml``;
    TraceFormatError with the line otherwise (also for text that is not UTF-8)."""
    text = read_text(path)
    try:
        data = strict_yaml.load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise TraceFormatError(str(path), line, "", f"not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TraceFormatError(str(path), 1, "", f"expected a mapping of {what} keys")
    return data


def load_cluster(path: str | Path | None) -> Cluster:
    """Read a cluster YAML file (None: the default cluster); see the module contract."""
    if path is None:
        return Cluster()
    cluster = cluster_from_dict(read_mapping(path, "cluster"))
    for pool in POOLS:
        for i, node in enumerate(cluster.pool(pool).node_list or ()):
            if not _NODE_ID.fullmatch(node.node_id):
                raise SpecError(f"{pool}.nodes[{i}].id", node.node_id, "1-128 of A-Z a-z 0-9 . _ -, starting "
                                                                     "alphanumeric (what `admin nodes add` takes)",
                                str(path))
    return cluster


#: a node id a cluster file may list: an ESC reached terminals raw, and "a/../b" could not be drained
#: (checked on the files people write; a state file saved before keeps its ids)
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def switch_to_value(switch: SwitchCost) -> str | float | dict[str, float]:
    if switch.mode != "fixed":
        return switch.mode
    if switch.rollout_s == switch.train_s:
        return switch.rollout_s
    return {ROLLOUT: switch.rollout_s, TRAIN: switch.train_s}


def cluster_to_dict(cluster: Cluster) -> dict:
    """The cluster as plain data in the file's shape (JSON- and YAML-ready)."""
    def pool(spec: PoolSpec) -> dict:
        nodes = ([{"id": n.node_id, "host_mem_gb": n.host_mem_gb} for n in spec.node_list] if spec.node_list
                 else spec.nodes)
        return {"gpu": spec.gpu, "price_per_gpu_hour": spec.price_per_gpu_hour,
                "host_mem_gb": spec.host_mem_gb, "nodes": nodes}

    return {"gpus_per_node": cluster.gpus_per_node, ROLLOUT: pool(cluster.rollout),
            TRAIN: pool(cluster.train), "switch_cost_s": switch_to_value(cluster.switch_cost),
            "max_group_size": cluster.max_group_size,
            **({"pricing": cluster.pricing} if cluster.pricing != _DEFAULT.pricing else {})}
