"""Request and response bodies of the control plane's HTTP API (pydantic, the edge only).

Every request model forbids unknown fields, so a misspelt field is a 422 naming it.
Every input is bounded: numbers finite and within the ranges below, integers strict
(``true`` is not 1), strings limited in length and characters. A job's bounds are
``rollmux.model``'s, which ``Job.validate`` holds every job to (a trace file's too). The
cluster-dependent limits (GPUs at most the pool's size, or ``--max-job-gpus`` on an
unbounded pool) are checked by the service before any planning.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, ValidationInfo,
                      field_validator)

from rollmux.model import (CONTROL_CHARS, JOB_ID_PATTERN, JOB_ID_RULE, MAX_JOB_GPUS, MAX_JOB_ITERATIONS, MAX_MEM_GB,
                           MAX_MODEL_CHARS, MAX_PHASE_S, MAX_PRICE, MAX_SLO, MAX_STALENESS, MIN_PHASE_S,
                           REWARD_PRICE_PER_HOUR, Job)
from rollmux.runtime.control import GrantRecord, JobRecord

Phase = Literal["rollout", "train"]
MAX_WAIT_S = 30.0
MAX_GPUS = MAX_JOB_GPUS      # shape bound only; the service applies the cluster's limit
MAX_BODY_BYTES = 64 * 1024
TEXT = r"^[^\x00-\x1f\x7f]*$"  # no control characters


def _number(value):
    """A JSON number as it came: a boolean or a numeric string is refused, not converted."""
    if isinstance(value, bool):
        raise ValueError("a number, not a boolean")
    if isinstance(value, str):
        raise ValueError(f"a number, not a string ({value[:40]!r})")
    if not isinstance(value, (int, float)):
        raise ValueError(f"a number, not {type(value).__name__}")
    return value


Number = Annotated[float, BeforeValidator(_number)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class JobSpec(_Request):
    """A job as submitted: the columns of a trace row (``iterations`` optional)."""

    job_id: str = Field(pattern=JOB_ID_PATTERN, description=JOB_ID_RULE)
    rollout_gpus: StrictInt = Field(default=8, ge=1, le=MAX_GPUS)
    train_gpus: StrictInt = Field(default=8, ge=1, le=MAX_GPUS)
    t_roll_s: Number = Field(ge=MIN_PHASE_S, le=MAX_PHASE_S)
    t_train_s: Number = Field(ge=MIN_PHASE_S, le=MAX_PHASE_S)
    mem_roll_gb: Number = Field(default=0.0, ge=0, le=MAX_MEM_GB)
    mem_train_gb: Number = Field(default=0.0, ge=0, le=MAX_MEM_GB)
    slo: Number = Field(default=1.5, ge=1.0, le=MAX_SLO)
    model: str = Field(default="", max_length=MAX_MODEL_CHARS)
    iterations: StrictInt | None = Field(default=None, ge=1, le=MAX_JOB_ITERATIONS)
    movable: StrictBool = Field(default=True, description="false: the policy never moves this job")
    tail_workers: StrictInt | None = Field(default=None, ge=1, le=MAX_GPUS,
                                           description="GPUs a rollout keeps in its long tail (default: 1/8)")
    staleness: StrictInt = Field(default=0, description=f"policy versions a rollout may lag, 0 to {MAX_STALENESS} "
                                                        "(0: synchronous; k >= 1: rollout i+1 may run while "
                                                        "training i does, docs/rollart.md)")
    reward_s: Number = Field(default=0.0, ge=0, le=MAX_PHASE_S,
                             description="seconds per iteration scored on the shared reward service (0: none; "
                                         "docs/rollart.md)")
    reward_price_per_hour: Number = Field(default=REWARD_PRICE_PER_HOUR, ge=0, le=MAX_PRICE,
                                          description="$ per busy hour of the shared reward pool")
    reward_mem_gb: Number = Field(default=0.0, ge=0, le=MAX_MEM_GB,
                                  description="GB of mem_roll_gb that is the job's own reward model (freed on its "
                                              "rollout nodes when reward_s > 0)")

    colocate: StrictBool = Field(default=False, description="true: both phases run on the same GPUs (veRL's hybrid "
                                                             "engine); the job is only ever placed co-located on "
                                                             "its training nodes")

    @field_validator("model")
    @classmethod
    def _model_text(cls, value: str) -> str:
        if CONTROL_CHARS.search(value):  # Job.validate's rule: a control or invisible formatting character
            raise ValueError("a name without control or invisible formatting characters")
        return value

    @field_validator("reward_mem_gb")
    @classmethod
    def _reward_mem_within_rollout(cls, value: float, info: ValidationInfo) -> float:
        mem = info.data.get("mem_roll_gb")
        if mem is not None and value > mem:
            raise ValueError(f"{value} exceeds mem_roll_gb ({mem}), which includes it")
        return value

    @field_validator("staleness")
    @classmethod
    def _staleness_bounded(cls, value: int) -> int:
        if not 0 <= value <= MAX_STALENESS:
            raise ValueError(f"staleness {value}: an integer from 0 (synchronous) to {MAX_STALENESS}")
        return value

    @field_validator("tail_workers")
    @classmethod
    def _tail_within_rollout(cls, value: int | None, info: ValidationInfo) -> int | None:
        gpus = info.data.get("rollout_gpus")
        if value is not None and gpus is not None and value > gpus:
            raise ValueError(f"{value} exceeds rollout_gpus ({gpus})")
        return value

    def to_job(self) -> Job:
        return Job(job_id=self.job_id, t_roll_s=self.t_roll_s, t_train_s=self.t_train_s,
                   rollout_gpus=self.rollout_gpus, train_gpus=self.train_gpus, mem_roll_gb=self.mem_roll_gb,
                   mem_train_gb=self.mem_train_gb, slo=self.slo, model=self.model, iterations=self.iterations,
                   tail_workers=self.tail_workers, staleness=self.staleness, reward_s=self.reward_s,
                   reward_price_per_hour=self.reward_price_per_hour, reward_mem_gb=self.reward_mem_gb,
                   colocate=self.colocate)


class SubmitRequest(_Request):
    """``token``: the job's own secret, chosen by the client (the SDK does), so that a
    retried submit (same ``request_id`` and token) gets the first answer and no answer
    ever carries a token the caller did not already have. Without it the service makes
    one and returns it once."""

    spec: JobSpec
    request_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    token: str | None = Field(default=None, min_length=32, max_length=256, pattern=r"^[A-Za-z0-9._~+/=-]+$")


class AcquireRequest(_Request):
    """Wait up to ``wait_s`` seconds (long poll) for the grant of ``phase``."""

    phase: Phase
    wait_s: Number = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)


class ReleaseRequest(_Request):
    """End the phase held under grant ``grant_seq``; ``duration_s`` as the job measured it."""

    phase: Phase
    grant_seq: StrictInt = Field(ge=1, le=2**62)
    duration_s: Number = Field(ge=0.0, le=MAX_PHASE_S)
    failed: StrictBool = Field(default=False, description="the job's code raised in the phase: it did not "
                                                          "complete; the job is due for the same phase again "
                                                          "and nothing is counted")
    restart: StrictBool = Field(default=False, description="with failed, for a synchronous job's training "
                                                           "phase: the job is due for its rollout instead (its "
                                                           "iteration starts again)")


class HeartbeatRequest(_Request):
    progress: Number | None = Field(default=None, ge=0.0, le=1.0)


class ProgressRequest(_Request):
    fraction: Number = Field(ge=0.0, le=1.0)


class TailRequest(_Request):
    """The running rollout's fraction of responses done (long-tail hand-off)."""

    fraction: Number = Field(ge=0.0, le=1.0)


class AddNodeRequest(_Request):
    """A node for a bounded pool. A retried add (same ``request_id``) gets the first answer
    and adds nothing (``ControlPlane.add_node``)."""

    pool: Literal["rollout", "train"]
    node_id: str = Field(default="", max_length=128, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$")
    host_mem_gb: Number | None = Field(default=None, gt=0, le=MAX_MEM_GB)
    request_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")


class MovedRequest(_Request):
    """The job's answer to a move directive: ``ok`` once its state is on the new nodes."""

    ok: StrictBool = True
    reason: str = Field(default="", max_length=500, pattern=TEXT)
    seq: StrictInt | None = Field(default=None, ge=0, le=2**62,
                                  description="the directive's seq: which move this reports on")


class MoveView(BaseModel):
    """A move directive: leave your nodes, bring your state to these, then POST /moved."""

    from_group: str
    to_group: str
    rollout_nodes: list[str]
    train_nodes: list[str]
    decided_at: float
    seq: int


class PlacementView(BaseModel):
    group_id: str
    rollout_nodes: list[str]
    train_nodes: list[str]


class GrantView(BaseModel):
    seq: int
    pool: Phase
    nodes: list[str]
    granted_at: float
    switch_s: float
    share: float = Field(description="1, or the fraction of the nodes' GPUs of a long-tail slice")

    @classmethod
    def of(cls, g: GrantRecord | None) -> "GrantView | None":
        if g is None:
            return None
        return cls(seq=g.seq, pool=g.pool, nodes=list(g.nodes), granted_at=g.granted_at, switch_s=g.switch_s,
                   share=g.share)


class PipelineView(BaseModel):
    """An asynchronous job's counters (rules 10-12 of the execution rule): a rollout may start
    while ``rollouts_started - trainings_done <= staleness``; a training while
    ``rollouts_done > trainings_done``."""

    staleness: int
    rollouts_started: int
    rollouts_done: int
    trainings_done: int


class JobView(BaseModel):
    job_id: str
    state: str
    tenant: str
    placement: PlacementView | None
    grant: GrantView | None
    grants: list[GrantView] = Field(default=[], description="every grant held (two at once only for an "
                                                           "asynchronous job: one per pool)")
    staleness: int = 0
    colocate: bool = Field(default=False, description="true: both phases on the same (training) nodes")
    pipeline: PipelineView | None = None
    next_phase: Phase
    iterations_done: int
    iterations: int | None
    progress: float
    lease_s: float
    grace_s: float
    outcome: str
    explanation: list[str]
    reason: str
    movable: bool
    moves: int
    move: MoveView | None

    @classmethod
    def of(cls, rec: JobRecord, lease_s: float, grace_s: float) -> "JobView":
        placement = None
        if rec.group_id is not None:
            placement = PlacementView(group_id=rec.group_id, rollout_nodes=list(rec.rollout_nodes),
                                      train_nodes=list(rec.train_nodes))
        pipe = rec.pipeline()
        return cls(job_id=rec.job_id, state=rec.state, tenant=rec.tenant, placement=placement,
                   grant=GrantView.of(rec.grant), grants=[GrantView.of(g) for g in rec.grants],
                   staleness=rec.job.staleness, colocate=rec.job.colocate, pipeline=PipelineView(**pipe) if pipe else None,
                   next_phase=rec.next_phase, iterations_done=rec.iterations_done,
                   iterations=rec.job.iterations, progress=rec.progress, lease_s=lease_s, grace_s=grace_s,
                   outcome=rec.outcome, explanation=rec.explanation, reason=rec.end_reason, movable=rec.movable,
                   moves=rec.moves, move=MoveView(**rec.move) if rec.move and "to_group" in rec.move else None)


class SubmitResponse(JobView):
    token: str | None = Field(description="The job's token when the service made it (first answer only)")


class AcquireResponse(BaseModel):
    """``granted`` with the grant; or ``move``: the job must move first (see ``MoveView``)."""

    granted: bool
    grant: GrantView | None
    move: MoveView | None = None
    job: JobView


class TailResponse(BaseModel):
    """``keep_gpus``: the GPUs the rollout should keep from now on (all of them below the threshold)."""

    keep_gpus: int
    job: JobView


class HeartbeatResponse(BaseModel):
    job_id: str
    state: str
    lease_s: float
    grace_s: float


class NodeResponse(BaseModel):
    node: str
    jobs_on_node: list[str] = []
    placed: list[str] = []


class Problem(BaseModel):
    """Every error answer (RFC 9457 problem details, ``application/problem+json``), with
    ``field`` (what was wrong) and ``reason`` (why) as extension members."""

    type: str
    title: str
    status: int
    detail: str
    field: str
    reason: str
    state: str | None = None
