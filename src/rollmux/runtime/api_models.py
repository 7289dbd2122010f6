"""Request and response bodies of the control plane's HTTP API (pydantic, the edge only).

Every request model forbids unknown fields, so a misspelt field is a 422 naming it
rather than a silently ignored value. Domain checks (durations > 0, SLO >= 1, ...) stay
in ``Job.validate``; these models only fix the shape.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollmux.model import Job
from rollmux.runtime.control import GrantRecord, JobRecord

Phase = Literal["rollout", "train"]
MAX_WAIT_S = 30.0


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSpec(_Request):
    """A job as submitted: the columns of a trace row (``iterations`` optional)."""

    job_id: str = Field(min_length=1, max_length=200)
    rollout_gpus: int = 8
    train_gpus: int = 8
    t_roll_s: float
    t_train_s: float
    mem_roll_gb: float = 0.0
    mem_train_gb: float = 0.0
    slo: float = 1.5
    model: str = ""
    iterations: int | None = None

    def to_job(self) -> Job:
        return Job(job_id=self.job_id, t_roll_s=self.t_roll_s, t_train_s=self.t_train_s,
                   rollout_gpus=self.rollout_gpus, train_gpus=self.train_gpus, mem_roll_gb=self.mem_roll_gb,
                   mem_train_gb=self.mem_train_gb, slo=self.slo, model=self.model, iterations=self.iterations)


class SubmitRequest(_Request):
    """``request_id`` makes a retried submit return the first answer instead of a 409."""

    spec: JobSpec
    request_id: str | None = Field(default=None, max_length=200)


class AcquireRequest(_Request):
    """Wait up to ``wait_s`` seconds (long poll) for the grant of ``phase``."""

    phase: Phase
    wait_s: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)


class ReleaseRequest(_Request):
    """End the phase held under grant ``grant_seq``; ``duration_s`` as the job measured it."""

    phase: Phase
    grant_seq: int
    duration_s: float = Field(ge=0.0)


class HeartbeatRequest(_Request):
    progress: float | None = Field(default=None, ge=0.0, le=1.0)


class ProgressRequest(_Request):
    fraction: float = Field(ge=0.0, le=1.0)


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

    @classmethod
    def of(cls, g: GrantRecord | None) -> "GrantView | None":
        if g is None:
            return None
        return cls(seq=g.seq, pool=g.pool, nodes=list(g.nodes), granted_at=g.granted_at, switch_s=g.switch_s)


class JobView(BaseModel):
    job_id: str
    state: str
    placement: PlacementView | None
    grant: GrantView | None
    next_phase: Phase
    iterations_done: int
    iterations: int | None
    progress: float
    lease_s: float
    outcome: str
    explanation: list[str]
    reason: str

    @classmethod
    def of(cls, rec: JobRecord, lease_s: float) -> "JobView":
        placement = None
        if rec.group_id is not None:
            placement = PlacementView(group_id=rec.group_id, rollout_nodes=list(rec.rollout_nodes),
                                      train_nodes=list(rec.train_nodes))
        return cls(job_id=rec.job_id, state=rec.state, placement=placement, grant=GrantView.of(rec.grant),
                   next_phase=rec.next_phase, iterations_done=rec.iterations_done, iterations=rec.job.iterations,
                   progress=rec.progress, lease_s=lease_s, outcome=rec.outcome, explanation=rec.explanation,
                   reason=rec.end_reason)


class SubmitResponse(JobView):
    token: str


class AcquireResponse(BaseModel):
    granted: bool
    grant: GrantView | None
    job: JobView


class DrainResponse(BaseModel):
    node: str
    jobs_on_node: list[str]


class ErrorBody(BaseModel):
    """Every 4xx answer: which field was wrong and why."""

    field: str
    reason: str
    state: str | None = None
