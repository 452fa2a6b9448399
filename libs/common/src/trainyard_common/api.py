"""The bodies of Trainyard's own HTTP API, as types: what the OpenAPI document
(``contracts/openapi.json``, ``make contracts``) says each route answers. The routes
declare them as documentation (``responses=``), not as response models, so an answer is
never filtered or re-validated on its way out; tests check that real answers fit them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .events import FieldIssue, JobState
from .jobspec import JobSpec


class Body(BaseModel):
    # Answers may gain fields: a client generated from this document must accept them.
    model_config = ConfigDict(extra="allow")


class ErrorBody(Body):
    """Every refusal: ``detail`` says what is wrong, naming the field where there is one
    (a list of FastAPI's field errors for a malformed query or path)."""

    detail: str | list[Any] | dict[str, Any]


class Me(Body):
    user: str
    admin: bool


class JobSummary(Body):
    id: str
    name: str | None
    user: str | None
    state: JobState | None
    dialect: str | None
    queue: str | None = None
    kind: str | None = None
    labels: dict[str, str] | None = None
    submitted_at: datetime | None
    updated_at: datetime | None
    reason: str | None


class JobList(Body):
    items: list[JobSummary]
    total: int = Field(
        description="the jobs that match, counted up to 10,000 and for at most 20 ms "
        "(total_exact says whether the count went to the end)"
    )
    total_exact: bool = Field(
        True,
        description="false: the count stopped, and at least `total` jobs match (10,000 "
        "when more than that do; past the time, those up to the end of this page)",
    )
    limit: int
    offset: int
    next: str | None = Field(
        None, description="the cursor of the page after this one (None: the last page)"
    )
    counts: dict[str, int] | None = Field(
        None,
        description="with ?counts=true: the matching jobs by state, each counted up to "
        "10,000 (10,001: more than that) and all within 50 ms (counts_exact)",
    )
    counts_exact: bool | None = Field(
        None,
        description="with ?counts=true, false: a count stopped at 10,000, or the time ran "
        "out and a state is left out",
    )


class PortView(Body):
    label: str
    ports: list[int]


class TaskView(Body):
    role: str | None
    index: int | None
    attempt: int | None
    state: str | None = Field(description="PENDING until placed, then a TaskState")
    exit_code: int | None
    reason: str | None
    failure_class: str | None
    node: str | None
    host_ip: str | None
    gpu_indices: list[int]
    ports: list[PortView] = Field(description="each label's ports: host_ip:port reaches it")
    started_at: datetime | None = None
    ended_at: datetime | None = None
    updated_at: datetime | None


class AttemptView(Body):
    attempt: int
    state: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    failure_class: str | None = None
    ended_at: datetime | None = None
    retried_as: int | None = None
    interrupted: str | None = None


class JobView(JobSummary):
    priority: int | None
    tags: list[str] = Field(
        default_factory=list, description="OpenPAI job tags, as added (PUT .../tag)"
    )
    attempt: int
    retries: int
    attempts: list[AttemptView]
    failure_class: str | None
    finished_at: datetime | None
    exit_code: int | None
    errors: list[FieldIssue]
    warnings: list[FieldIssue]
    queue_reasons: list[str] = Field(description="why the job waits, while it does")
    queue_position: int | None
    spec: JobSpec | None = Field(description="the canonical spec, secrets hidden")
    original: dict[str, Any] | None = Field(
        description="the body as submitted, in its dialect (secrets hidden); None for native"
    )
    tasks: list[TaskView] = Field(description="the first 1,000, by attempt, role and index")
    tasks_next: str | None = Field(
        None,
        description="more tasks than shown: the cursor of GET /v1/jobs/{id}/tasks for "
        "the rest (None: these are all)",
    )


class TaskList(Body):
    """``GET /v1/jobs/{id}/tasks``: a page of a job's tasks."""

    items: list[TaskView]
    next: str | None = Field(None, description="the cursor of the page after this one")


class HistoryEntry(Body):
    seq: int = Field(description="the event's sequence in the platform's stream")
    type: str
    event_id: str
    occurred_at: datetime
    trace_id: str | None
    event: dict[str, Any]


class History(Body):
    items: list[HistoryEntry]
    next_after_seq: int | None = Field(
        None,
        description="more events than this page holds: the after_seq of the next page "
        "(None: the last page)",
    )


class JobAsOf(Body):
    """A job as it was at a past moment (``GET /v1/jobs/{id}/state?at=``)."""

    id: str
    at: datetime
    state: JobState | None
    attempt: int
    reason: str | None
    queue_reasons: list[str]
    queue_position: int | None
    updated_at: datetime | None


class RebuildReport(Body):
    """``POST /v1/admin/rebuild``: the stream read again, and where the views differ."""

    until_seq: int = Field(description="the stream's newest message when the rebuild began")
    messages: int
    rebuilt: dict[str, int] = Field(description="documents of each rebuilt view")
    different: int
    differences: list[dict[str, Any]] = Field(description="the first 100")
    applied: bool


class SubmitAnswer(Body):
    id: str
    state: Literal["SUBMITTED", "REJECTED"] = Field(
        description="REJECTED: refused at once (every reason in errors), on record as such"
    )
    dialect: str
    warnings: list[FieldIssue]
    errors: list[FieldIssue] = Field(default_factory=list)


class ControlAnswer(Body):
    """``{"id": ..., "<verb>": "requested"}``."""

    id: str


class ValidationAnswer(Body):
    valid: bool
    dialect: str
    spec: JobSpec
    errors: list[FieldIssue]
    warnings: list[FieldIssue]


class WaitingJob(Body):
    job_id: str
    name: str
    user: str
    queue: str
    priority: int
    position: int
    reasons: list[str]


class QueueView(Body):
    jobs: list[WaitingJob]


class NodeHolder(Body):
    job_id: str | None = Field(description="None: another user's job")
    user: str | None
    queue: str
    task: str | None
    gpu_indices: list[int]
    gpus: float


class ClusterNode(Body):
    name: str
    state: Literal["ready", "drained"]
    host_ip: str
    gpu_type: str | None
    capacity: dict[str, float]
    allocated: dict[str, float]
    free: dict[str, float]
    tasks: list[NodeHolder]


class ClusterQueue(Body):
    name: str
    quota: dict[str, float | None]
    used: dict[str, float]
    waiting: int
    borrowing: bool = Field(True, description="its jobs may use idle capacity beyond the quota")


class ClusterView(Body):
    nodes: list[ClusterNode]
    queues: list[ClusterQueue]


# The refusals every authenticated route may answer.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (400, "bad input, the field named"),
        (401, "no token, or not a valid one"),
        (403, "not allowed for this identity"),
        (404, "no such thing (or not the caller's)"),
    )
}


def answers(model: type[BaseModel], status: int = 200, **more: str) -> dict[int | str, Any]:
    """``responses=`` for a route answering ``model`` with ``status``, and the errors."""
    out: dict[int | str, Any] = {status: {"model": model}, **ERRORS}
    for code, text in more.items():
        out[int(code.removeprefix("e"))] = {"model": ErrorBody, "description": text}
    return out


# A job's body in any dialect: JSON or YAML. Trainyard's own is the canonical JobSpec.
JOB_BODY = {
    "requestBody": {
        "required": True,
        "description": "A job in any dialect (detected, or ?dialect=), JSON or YAML; "
        "Trainyard's own is the canonical JobSpec.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
        },
    }
}
