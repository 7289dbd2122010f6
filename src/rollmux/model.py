"""The data everything else relies on: pools, cluster, jobs, groups.

Contract
--------
* A cluster has a rollout pool and a training pool. Each pool has one GPU type, an
  hourly price per GPU, a GPU count and host memory per node, and either a fixed
  inventory of nodes (``nodes`` is an int) or none (``nodes`` is None: provisioned on
  demand, unbounded).
* A job takes whole nodes: ``ceil(gpus / gpus_per_node)`` nodes of each pool. Its memory
  fields are host memory *per node* for its rollout state and for its training state.
* A group is a set of rollout nodes and a set of training nodes with every member job
  pinned to exactly as many nodes of each pool as it needs. Groups share no node. Node
  ids are strings, unique across both pools (``R0``, ``T3``), so they are also unique
  within each pool.
* Residency: on every node, the summed host memory of the jobs pinned there fits the
  node's host memory.
* Cost of a group: the hourly price of all its GPUs. Cost of a plan: the sum over groups.

These are plain slotted dataclasses: the planner and the simulator run hot loops over
them. Validation happens once, when a job or cluster enters the system.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from dataclasses import dataclass, field

from rollmux.errors import SpecError

ROLLOUT = "rollout"
TRAIN = "train"
POOLS = (ROLLOUT, TRAIN)
#: The shortest phase a job may declare: the group analysis runs the execution rule in
#: integer microsecond ticks (``rollmux.kernel``), and a phase shorter than a tick was a
#: phase of no time (a division by zero in the planner). No RL phase is shorter than this.
MIN_PHASE_S = 1e-3
#: Upper bounds on a job's and a cluster's numbers, far above any real one: beyond them a
#: replay lost float precision (a job of 1e25 s crashed the engine), ran for hours without
#: a sign (1e8 nodes, 1e24 iterations), or gave negative bubbles (an arrival at 1e20 s).
MAX_PHASE_S = 1e6            # a worst-case phase of about 11.6 days
MAX_TIME_S = 1e9             # an arrival or a duration: about 32 years
MAX_JOB_ITERATIONS = 1_000_000  # a replay's time grows with them: 2 jobs of 1e7 took 200 s
MAX_JOB_GPUS = 100_000       # per pool and job
MAX_POOL_NODES = 100_000
MAX_GPUS_PER_NODE = 1024
MAX_PRICE = 1e6              # $ per GPU-hour (a pool) or per busy hour (the reward pool): bills stay finite
MAX_MEM_GB = 1e6             # host memory per node, a job's (each of its memory fields) or a node's
MAX_SLO = 1000.0             # a slowdown tolerance: a job that may run 1,000 times slower has no deadline
MAX_STALENESS = 8            # the largest staleness k (policy versions a rollout may lag) the live service runs
MAX_MODEL_CHARS = 128        # a model name's length
#: a job id: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most 128
#: characters (safe in URLs, file names and logs); a trace's, a job file's and the API's alike
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
JOB_ID_RULE = "1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
#: a control character (an ESC in a job id reached reports and terminals raw), or an invisible
#: formatting one (a bidi override such as U+202E shows another id than the one stored)
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
#: a node id that a pool naming its nodes by count gives (``PlanState``: R0, R1, ... / T0, T1, ...)
_COUNTED_ID = re.compile(r"([RT])[0-9]+")

#: Warm-start switch seconds on one 8-GPU node, by model size column (facts section 7).
WARM_SWITCH_S = {
    3: {ROLLOUT: 0.8, TRAIN: 1.9},
    7: {ROLLOUT: 0.9, TRAIN: 4.1},
    14: {ROLLOUT: 1.8, TRAIN: 4.7},
    32: {ROLLOUT: 1.7, TRAIN: 5.9},
}
#: Cold-start (load from disk, rebuild) seconds, same columns (facts section 7).
COLD_SWITCH_S = {
    3: {ROLLOUT: 25.3, TRAIN: 26.7},
    7: {ROLLOUT: 38.8, TRAIN: 32.7},
    14: {ROLLOUT: 60.4, TRAIN: 59.0},
    32: {ROLLOUT: 81.7, TRAIN: 81.2},
}
#: Known GPU types: name -> (dense bf16 TFLOPS, memory bandwidth TB/s, default $/GPU-hour).
#: H200 and B200 use NVIDIA's published figures (H200 SXM: 989.5 TFLOPS dense bf16,
#: 4.8 TB/s; HGX B200: 2,250 TFLOPS dense bf16, 8.0 TB/s per GPU). Their prices are
#: CoreWeave's on-demand list prices (coreweave.com/pricing, early 2026) divided by the
#: 8 GPUs of the instance: HGX H200 $50.44/h -> $6.305, HGX B200 $68.80/h -> $8.60.
GPU_TYPES = {
    "H20": (148.0, 4.0, 1.85),
    "H800": (989.5, 3.35, 5.28),
    "H100": (989.5, 3.35, 5.28),
    "H200": (989.5, 4.8, 6.305),
    "B200": (2250.0, 8.0, 8.60),
    "A100": (312.0, 2.0, 3.0),
}

#: Default price of the shared reward pool, $ per busy hour: one H20 GPU-hour (the rollout
#: pool's default list price above). Reward scoring is inference (a forward pass, like
#: generation), so the shared service runs on the same inference GPUs as the rollouts;
#: ``reward_s`` is then busy seconds of one such GPU.
REWARD_PRICE_PER_HOUR = GPU_TYPES["H20"][2]

_SIZE_RE = re.compile(r"(?<![a-z\d._])(?P<int_>\d+)_(?P<frac_>\d+)b(?![a-z\d])"  # stablelm-2-1_6b: 1.6
                      r"|(?<![\d.])(?P<int_b>\d+)b(?P<frac_b>\d+)(?![a-z\d])"     # bloom-1b7: 1.7
                      r"|(?<![\d.])(?P<size>\d+(?:\.\d+)?)\s*b(?![a-z])",          # Qwen2.5-0.5B: 0.5
                      re.IGNORECASE)


def size_in_name(model: str) -> float | None:
    """The first size in billions of parameters a model name states (``Qwen2.5-0.5B`` -> 0.5,
    ``14B_8k`` -> 14; the decimal point written ``_`` as in ``stablelm-2-1_6b`` -> 1.6, or
    ``b`` as in ``bloom-1b7`` -> 1.7), or None."""
    match = _SIZE_RE.search(model or "")
    if match is None:
        return None
    if match["size"] is not None:
        return float(match["size"])
    return float(f"{match['int_'] or match['int_b']}.{match['frac_'] or match['frac_b']}")


@lru_cache(maxsize=4096)
def model_size_column(model: str) -> int:
    """Map a model name ("14B_8k", "Qwen2.5-7B") to a column of the switch tables.

    Sizes (``size_in_name``) up to 5B use the 3B column, up to 10B the 7B column, up to
    20B the 14B column, anything larger the 32B column (per-node state stops growing with
    size, facts section 2). A name without a size is planned on the largest column: worst
    case.
    """
    size = size_in_name(model)
    if size is None:
        return 32
    for limit, column in ((5, 3), (10, 7), (20, 14)):
        if size <= limit:
            return column
    return 32


#: How nodes are paid for (``Cluster.pricing``).
PRICINGS = ("pay-per-use", "owned")


@dataclass(slots=True, frozen=True)
class NodeSpec:
    """A real node of a bounded pool: its id (unique across both pools) and host memory."""

    node_id: str
    host_mem_gb: float


@dataclass(slots=True, frozen=True)
class PoolSpec:
    """One GPU pool: type, price, node shape and inventory (None = unbounded).

    ``node_list`` names the real nodes of a bounded pool (then ``nodes`` is their count and
    ``host_mem_gb`` the largest of their memories); without it a bounded pool's nodes
    are ``R0..`` / ``T0..`` with ``host_mem_gb`` each.
    """

    gpu: str
    price_per_gpu_hour: float
    host_mem_gb: float = 2048.0
    nodes: int | None = None
    node_list: tuple[NodeSpec, ...] = ()

    def validate(self, pool: str, known_gpu: bool = True) -> None:
        """SpecError naming the first field outside its contract; ``known_gpu``: the GPU type
        must be one of ``GPU_TYPES`` (a cluster file's; a fleet's view may carry a type of
        its own, whose figures the fleet holds)."""
        if not isinstance(self.gpu, str) or not self.gpu or (known_gpu and self.gpu not in GPU_TYPES):
            raise SpecError(f"{pool}.gpu", self.gpu, f"one of {sorted(GPU_TYPES)}")
        if not 0 < self.price_per_gpu_hour <= MAX_PRICE:
            raise SpecError(f"{pool}.price_per_gpu_hour", self.price_per_gpu_hour, f"a price > 0 and <= {MAX_PRICE:g}")
        if not self.host_mem_gb > 0:  # (infinite under the paper's accounting: rollmux.accounting)
            raise SpecError(f"{pool}.host_mem_gb", self.host_mem_gb, "memory > 0 GB")
        if self.nodes is not None and (not isinstance(self.nodes, int) or isinstance(self.nodes, bool)
                                       or not 0 <= self.nodes <= MAX_POOL_NODES):
            raise SpecError(f"{pool}.nodes", self.nodes, f"a node count from 0 to {MAX_POOL_NODES:,} or null "
                                                         f"(unbounded)")
        if self.node_list:
            if self.nodes != len(self.node_list):
                raise SpecError(f"{pool}.nodes", self.nodes, f"the length of the node list ({len(self.node_list)})")
            seen: set[str] = set()
            for i, node in enumerate(self.node_list):
                if not node.node_id or node.node_id in seen:
                    raise SpecError(f"{pool}.nodes[{i}].id", node.node_id, "a non-empty id unique in the cluster")
                seen.add(node.node_id)
                if not node.host_mem_gb > 0:
                    raise SpecError(f"{pool}.nodes[{i}].host_mem_gb", node.host_mem_gb, "memory > 0 GB")


@dataclass(slots=True, frozen=True)
class SwitchCost:
    """Seconds charged when a node starts a phase of a job other than the last one it ran.

    ``mode`` is "warm" (per-model figures of WARM_SWITCH_S), "cold" (COLD_SWITCH_S) or
    "fixed" (``rollout_s`` and ``train_s`` for every job; 0 allowed).
    """

    mode: str = "warm"
    rollout_s: float = 0.0
    train_s: float = 0.0

    def seconds(self, model: str, pool: str) -> float:
        if self.mode == "fixed":
            return self.rollout_s if pool == ROLLOUT else self.train_s
        table = WARM_SWITCH_S if self.mode == "warm" else COLD_SWITCH_S
        return table[model_size_column(model)][pool]


@dataclass(slots=True, frozen=True)
class Cluster:
    """Pools plus the knobs the planner uses. Defaults are the paper's testbed.

    ``pricing``: "pay-per-use" (a node costs while some group holds it) or "owned" (every
    node of a bounded pool costs for the whole run, used or idle; an unbounded pool is
    still paid per use). It changes what a run costs, never what the policies decide."""

    gpus_per_node: int = 8
    rollout: PoolSpec = PoolSpec("H20", 1.85)
    train: PoolSpec = PoolSpec("H800", 5.28)
    switch_cost: SwitchCost = SwitchCost()
    max_group_size: int = 5
    pricing: str = "pay-per-use"

    def pool(self, name: str) -> PoolSpec:
        return self.rollout if name == ROLLOUT else self.train

    def node_price(self, pool: str) -> float:
        """Hourly price of one whole node of ``pool``."""
        return self.pool(pool).price_per_gpu_hour * self.gpus_per_node

    def counted_pool_of(self, node_id: str) -> str | None:
        """The pool that names its nodes by count (``R0, R1, ...`` / ``T0, ...``: bounded
        without a node list, or unbounded) and gives, or may one day give, ``node_id``; None
        if neither does. A listed node must not have such an id (two nodes, one name)."""
        match = _COUNTED_ID.fullmatch(node_id)
        if match is None:
            return None
        pool = ROLLOUT if match.group(1) == "R" else TRAIN
        return pool if not self.pool(pool).node_list else None

    def validate(self, known_gpu: bool = True) -> None:
        """SpecError naming the first field outside its contract (``known_gpu``: as
        ``PoolSpec.validate``)."""
        if (not isinstance(self.gpus_per_node, int) or isinstance(self.gpus_per_node, bool)
                or not 0 < self.gpus_per_node <= MAX_GPUS_PER_NODE):
            raise SpecError("gpus_per_node", self.gpus_per_node, f"an integer from 1 to {MAX_GPUS_PER_NODE:,}")
        if not isinstance(self.max_group_size, int) or self.max_group_size < 1:
            raise SpecError("max_group_size", self.max_group_size, "an integer >= 1")
        self.rollout.validate(ROLLOUT, known_gpu)
        self.train.validate(TRAIN, known_gpu)
        shared = {n.node_id for n in self.rollout.node_list} & {n.node_id for n in self.train.node_list}
        if shared:
            raise SpecError("train.nodes", sorted(shared), "node ids not used by the rollout pool")
        for pool in POOLS:
            for i, node in enumerate(self.pool(pool).node_list):
                other = self.counted_pool_of(node.node_id)
                if other is not None:
                    raise SpecError(f"{pool}.nodes[{i}].id", node.node_id,
                                    f"an id that the {other} pool, which names its nodes by count, cannot also give")
        if self.switch_cost.mode not in ("warm", "cold", "fixed"):
            raise SpecError("switch_cost_s", self.switch_cost.mode, '"warm", "cold" or seconds')
        if self.pricing not in PRICINGS:
            raise SpecError("pricing", self.pricing, f"one of {list(PRICINGS)}")
        if self.pricing == "owned" and self.rollout.nodes is None and self.train.nodes is None:
            raise SpecError("pricing", self.pricing, "a bounded pool to own (rollout.nodes or train.nodes)")
        if not all(0 <= s <= MAX_PHASE_S for s in (self.switch_cost.rollout_s, self.switch_cost.train_s)):
            raise SpecError("switch_cost_s", (self.switch_cost.rollout_s, self.switch_cost.train_s),
                            f"finite seconds >= 0 and <= {MAX_PHASE_S:g}")


@dataclass(slots=True)
class Job:
    """An RL job as the scheduler sees it (worst-case profiled phases).

    ``duration_s`` is how long the job would run alone; ``iterations`` (when given)
    replaces it. ``t_roll_colo_s``/``t_train_colo_s`` are the phases co-located on the
    training GPU type, used by the co-located baseline when present.

    Reward (docs/rollart.md, "reward as a billed stage in the simulator"): ``reward_s`` > 0
    means the job scores its trajectories on the shared reward service, ``reward_s``
    busy seconds of that pool per iteration billed at ``reward_price_per_hour``. Scoring
    streams while the rollout generates, so ``t_roll_s`` already includes it. Such a job
    does not hold its own reward model on its rollout nodes: ``mem(ROLLOUT)`` is
    ``mem_roll_gb`` - ``reward_mem_gb``. With ``reward_s`` 0 (the default) the job scores
    inside its own rollout and holds all of ``mem_roll_gb``.

    ``model``: the model's name, which may be empty; the size in it ("7B") picks the
    switch-cost column, a name without one (or none) the largest (``model_size_column``).

    ``colocate``: the job's framework runs both phases on the same GPUs (veRL's hybrid
    engine), so it is only ever placed co-located, alone on its training nodes, and its
    profile (``t_roll_s``, ``t_train_s``) was measured that way, switches included
    (``rollmux.colocation``). Its nodes hold both phases' state. It cannot be asynchronous.
    """

    job_id: str
    t_roll_s: float
    t_train_s: float
    rollout_gpus: int = 8
    train_gpus: int = 8
    mem_roll_gb: float = 0.0
    mem_train_gb: float = 0.0
    slo: float = 1.5
    model: str = ""
    arrival_s: float = 0.0
    duration_s: float | None = None
    iterations: int | None = None
    t_roll_colo_s: float | None = None
    t_train_colo_s: float | None = None
    extra: dict[str, str] = field(default_factory=dict)
    tail_workers: int | None = None  # GPUs a rollout keeps for its long tail (None: tail_gpus())
    staleness: int = 0  # policy versions a rollout may lag (0: synchronous; rule 10 of rollmux.execution)
    reward_s: float = 0.0  # shared reward service seconds per iteration (0: scores inside its own rollout)
    reward_price_per_hour: float = REWARD_PRICE_PER_HOUR  # $ per busy hour of the shared reward pool
    reward_mem_gb: float = 0.0  # host memory per rollout node of its own reward model (part of mem_roll_gb)
    colocate: bool = False  # both phases on the same GPUs (veRL hybrid engine): only ever placed co-located

    def tail_gpus(self) -> int:
        """GPUs the rollout keeps once its tail begins: ``tail_workers``, else 1/8 of its rollout GPUs (>= 1)."""
        return self.tail_workers if self.tail_workers is not None else max(1, self.rollout_gpus // 8)

    @property
    def t_solo(self) -> float:
        """Steady-state iteration time alone on its own disaggregated nodes:
        T_roll + T_train for a synchronous job, max(T_roll, T_train) for an asynchronous
        one (staleness >= 1 pipelines rollout i+1 with training i; ``rollmux.planner``)."""
        if self.staleness:
            return max(self.t_roll_s, self.t_train_s)
        return self.t_roll_s + self.t_train_s

    @property
    def fill_s(self) -> float:
        """The pipeline fill: what n solo iterations take beyond n x ``t_solo``
        (min(T_roll, T_train) for an asynchronous job, whose first iteration runs both
        phases in turn; 0 for a synchronous one)."""
        return min(self.t_roll_s, self.t_train_s) if self.staleness else 0.0

    def solo_run_s(self, iterations: int) -> float:
        """Seconds ``iterations`` iterations take alone: n x ``t_solo`` + ``fill_s``."""
        return iterations * self.t_solo + self.fill_s

    def nodes(self, pool: str, gpus_per_node: int) -> int:
        gpus = self.rollout_gpus if pool == ROLLOUT else self.train_gpus
        return -(-gpus // gpus_per_node)

    def mem(self, pool: str) -> float:
        """Host memory per node of ``pool`` the job holds: ``mem_train_gb`` on training
        nodes; on rollout nodes ``mem_roll_gb``, less ``reward_mem_gb`` (never below 0)
        when the job scores on the shared reward service (``reward_s`` > 0): its reward
        model then lives there, not on its rollout nodes."""
        if pool != ROLLOUT:
            return self.mem_train_gb
        if self.reward_s > 0:
            return max(0.0, self.mem_roll_gb - self.reward_mem_gb)
        return self.mem_roll_gb

    @property
    def uses_reward_service(self) -> bool:
        """True when the job scores on the shared reward service (``reward_s`` > 0)."""
        return self.reward_s > 0

    def reward_cost(self, iterations: int) -> float:
        """$ the shared reward pool bills for ``iterations`` completed iterations:
        iterations x ``reward_s`` / 3600 x ``reward_price_per_hour`` (0 when ``reward_s`` is 0)."""
        return iterations * self.reward_s * self.reward_price_per_hour / 3600.0 if self.reward_s > 0 else 0.0

    def solo_iterations(self) -> int:
        """Iterations the job runs: ``iterations``, else the n with ``solo_run_s(n)`` nearest
        its solo duration, (duration - fill) / T_solo rounded (>= 1)."""
        if self.iterations is not None:
            return self.iterations
        if self.duration_s is None:
            return 1
        return max(1, round((self.duration_s - self.fill_s) / self.t_solo))

    def validate(self, cluster: Cluster | None = None, where: str = "") -> None:
        """Raise SpecError naming the first field outside its contract. These are the bounds of a job
        wherever it comes from (a trace file, a job spec file, the service's API: docs/traces.md)."""
        if not isinstance(self.job_id, str) or not re.fullmatch(JOB_ID_PATTERN, self.job_id):
            raise SpecError("job_id", self.job_id, JOB_ID_RULE, where)
        ctx = where or f"job {self.job_id}"
        if not isinstance(self.model, str) or len(self.model) > MAX_MODEL_CHARS or CONTROL_CHARS.search(self.model):
            raise SpecError("model", self.model, f"a string of at most {MAX_MODEL_CHARS} characters without control "
                                                 f"or invisible formatting characters (may be empty)", ctx)
        for name in ("t_roll_s", "t_train_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and MIN_PHASE_S <= value <= MAX_PHASE_S):
                raise SpecError(name, value, f"a duration from {MIN_PHASE_S:g} to {MAX_PHASE_S:g} seconds", ctx)
        for name in ("rollout_gpus", "train_gpus"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_JOB_GPUS:
                raise SpecError(name, value, f"an integer from 1 to {MAX_JOB_GPUS:,}", ctx)
        if self.tail_workers is not None and (not isinstance(self.tail_workers, int)
                                              or isinstance(self.tail_workers, bool)
                                              or not 1 <= self.tail_workers <= self.rollout_gpus):
            raise SpecError("tail_workers", self.tail_workers,
                            f"an integer from 1 to rollout_gpus ({self.rollout_gpus}) or empty", ctx)
        for name in ("mem_roll_gb", "mem_train_gb"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value <= MAX_MEM_GB):
                raise SpecError(name, value, f"host memory from 0 to {MAX_MEM_GB:g} GB", ctx)
        if not (isinstance(self.slo, (int, float)) and 1.0 <= self.slo <= MAX_SLO):
            raise SpecError("slo", self.slo, f"a slowdown tolerance from 1.0 to {MAX_SLO:g}", ctx)
        if not 0 <= self.arrival_s <= MAX_TIME_S:
            raise SpecError("arrival_s", self.arrival_s, f"a time from 0 to {MAX_TIME_S:g} seconds", ctx)
        if self.duration_s is not None and not 0 < self.duration_s <= MAX_TIME_S:
            raise SpecError("duration_s", self.duration_s, f"a duration > 0 and <= {MAX_TIME_S:g} seconds", ctx)
        if self.iterations is not None and (not isinstance(self.iterations, int) or isinstance(self.iterations, bool)
                                            or not 0 < self.iterations <= MAX_JOB_ITERATIONS):
            raise SpecError("iterations", self.iterations, f"an integer from 1 to {MAX_JOB_ITERATIONS:,}", ctx)
        longest = MAX_JOB_ITERATIONS * self.t_solo
        if self.iterations is None and self.duration_s is not None and self.duration_s > longest:
            raise SpecError("duration_s", self.duration_s, f"at most {MAX_JOB_ITERATIONS:,} solo iterations of "
                                                           f"{self.t_solo:g} s ({longest:g} s)",
                            ctx)
        for name in ("t_roll_colo_s", "t_train_colo_s"):
            value = getattr(self, name)
            if value is not None and not MIN_PHASE_S <= value <= MAX_PHASE_S:
                raise SpecError(name, value, f"a duration from {MIN_PHASE_S:g} to {MAX_PHASE_S:g} seconds or empty",
                                ctx)
        if (not isinstance(self.staleness, int) or isinstance(self.staleness, bool)
                or not 0 <= self.staleness <= MAX_STALENESS):
            raise SpecError("staleness", self.staleness, f"an integer from 0 (synchronous) to {MAX_STALENESS}", ctx)
        for name, top, expected in (
                ("reward_s", MAX_PHASE_S, f"seconds from 0 to {MAX_PHASE_S:g} (0: no shared reward service)"),
                ("reward_price_per_hour", MAX_PRICE, f"a price from 0 to {MAX_PRICE:g} $ per busy hour"),
                ("reward_mem_gb", MAX_MEM_GB, f"host memory from 0 to {MAX_MEM_GB:g} GB")):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and 0 <= value <= top):
                raise SpecError(name, value, expected, ctx)
        if self.reward_mem_gb > self.mem_roll_gb:
            raise SpecError("reward_mem_gb", self.reward_mem_gb,
                            f"at most mem_roll_gb ({self.mem_roll_gb} GB), which includes it", ctx)
        if not isinstance(self.colocate, bool):
            raise SpecError("colocate", self.colocate, "true or false", ctx)
        if self.colocate and self.staleness:
            raise SpecError("colocate", self.colocate, "false for an asynchronous job (staleness >= 1): its phases "
                            "overlap, which one set of GPUs cannot do", ctx)
        if cluster is not None and self.colocate:
            both, cap = self.mem(ROLLOUT) + self.mem(TRAIN), cluster.pool(TRAIN).host_mem_gb
            if both > cap:
                raise SpecError("mem_roll_gb", self.mem(ROLLOUT), f"with mem_train_gb at most the train node's host "
                                f"memory ({cap} GB): a co-located job holds both phases' state ({both:g} GB)", ctx)
        if cluster is not None:
            for pool in POOLS:
                cap = cluster.pool(pool).host_mem_gb
                if self.mem(pool) > cap:
                    field_name = "mem_roll_gb" if pool == ROLLOUT else "mem_train_gb"
                    raise SpecError(field_name, self.mem(pool), f"at most the {pool} node's host memory ({cap} GB)", ctx)


@dataclass(slots=True)
class Member:
    """A job pinned inside a group: the exact nodes it runs on in each pool.

    ``hosted``: the job runs co-located inside a shared group, both phases on some of the
    group's training nodes (``rollout_nodes`` are then those training nodes; its phases
    take ``rollmux.colocation``'s times, switch included). Such a node holds both its
    phases' state.
    """

    job: Job
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    hosted: bool = False

    def nodes(self, pool: str) -> tuple[str, ...]:
        return self.rollout_nodes if pool == ROLLOUT else self.train_nodes

    def mem_on(self, pool: str) -> float:
        """GB it holds on each of its ``pool`` nodes of the group (a hosted member: both
        phases' state on its training nodes, none on the rollout pool's)."""
        if self.hosted:
            return self.job.mem(ROLLOUT) + self.job.mem(TRAIN) if pool == TRAIN else 0.0
        return self.job.mem(pool)


@dataclass(slots=True)
class Group:
    """A co-execution group: its nodes and its members in admission order.

    ``colocated`` marks a group whose rollout phases run on the training nodes (the
    veRL-style baseline); such a group owns no rollout node.
    """

    group_id: str
    rollout_nodes: list[str] = field(default_factory=list)
    train_nodes: list[str] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    colocated: bool = False

    def nodes(self, pool: str) -> list[str]:
        return self.rollout_nodes if pool == ROLLOUT else self.train_nodes

    def member(self, job_id: str) -> Member | None:
        for m in self.members:
            if m.job.job_id == job_id:
                return m
        return None

    def mem_used(self, node: str, pool: str) -> float:
        return sum(m.mem_on(pool) for m in self.members if node in m.nodes(pool))

    @property
    def hosts(self) -> bool:
        """Whether a member runs co-located on the group's training nodes (``Member.hosted``)."""
        return any(m.hosted for m in self.members)

    def cost_per_hour(self, cluster: Cluster) -> float:
        return (len(self.rollout_nodes) * cluster.node_price(ROLLOUT)
                + len(self.train_nodes) * cluster.node_price(TRAIN))
