"""Every message that crosses the bus: events (past tense) and commands (imperative).

One definition per message, shared by every service. Each carries ``event_id`` (also
the ``Nats-Msg-Id``, so JetStream drops a re-publish inside its duplicate window),
``job_id``, ``occurred_at`` and ``schema_version``.
Decoding goes through :func:`decode`, the one place where old versions are upcast.
"""

from __future__ import annotations

import functools
import json
import operator
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

from .jobspec import JobSpec, Model

SCHEMA_VERSION = 1


def new_id() -> str:
    return uuid.uuid4().hex


def derived_id(*parts: object) -> str:
    """A deterministic event id: the same cause always yields the same id, so a
    consumer that crashes after publishing and redoes its work re-publishes a duplicate
    that JetStream discards instead of a second event."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "trainyard:" + ":".join(map(str, parts))).hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class TaskState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)


class JobState(StrEnum):
    SUBMITTED = "SUBMITTED"
    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    QUEUED = "QUEUED"
    PLACED = "PLACED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    # Capacity given back, everything else kept, until a ResumeJob (docs/lifecycle.md).
    PAUSED = "PAUSED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


TERMINAL_JOB_STATES = frozenset(
    {JobState.REJECTED, JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}
)


class FailureClass(StrEnum):
    """Who a failed task's end is put down to (docs/lifecycle.md): the user's command or
    input, the platform (a lost task, a port taken, a start the launcher got wrong), or
    nobody for sure (a signal from outside, the OOM killer)."""

    USER = "user"
    PLATFORM = "platform"
    UNKNOWN = "unknown"


class FieldIssue(Model):
    """One problem with a submitted job, located by its path in the submitted payload."""

    path: str = Field(description="JSON path of the field, e.g. $.taskRoles[0].memoryMB")
    message: str
    code: str = "invalid"


class Event(Model):
    subject_suffix: ClassVar[str]

    event_id: str = Field(default_factory=new_id)
    job_id: str
    occurred_at: datetime = Field(default_factory=utcnow)
    schema_version: int = SCHEMA_VERSION


class JobSubmitted(Event):
    type: Literal["JobSubmitted"] = "JobSubmitted"
    subject_suffix: ClassVar[str] = "submitted"
    spec: JobSpec
    dialect: str = "native"
    dialect_key: str | None = Field(
        None, description="The job's name in its dialect, unique per user (None: by id only)."
    )
    original: dict[str, Any] | None = Field(
        None, description="The payload as the user sent it, kept for dialect views."
    )
    # Problems the dialect translation found; validation reports them with its own.
    translation_errors: list[FieldIssue] = Field(default_factory=list)
    warnings: list[FieldIssue] = Field(default_factory=list)
    name_claimed: bool = Field(
        False,
        description="Intake claimed dialect_key for this job before publishing it (a used "
        "name was refused there, at once); False on events of earlier versions.",
    )


class JobAccepted(Event):
    type: Literal["JobAccepted"] = "JobAccepted"
    subject_suffix: ClassVar[str] = "accepted"
    spec: JobSpec
    warnings: list[FieldIssue] = Field(default_factory=list)


class JobRejected(Event):
    type: Literal["JobRejected"] = "JobRejected"
    subject_suffix: ClassVar[str] = "rejected"
    errors: list[FieldIssue]


class JobQueued(Event):
    """The job is waiting for capacity; ``reasons`` say why, for people to read."""

    type: Literal["JobQueued"] = "JobQueued"
    subject_suffix: ClassVar[str] = "queued"
    attempt: int = 1
    position: int = 0
    reasons: list[str] = Field(default_factory=list)


class PortAssignment(Model):
    label: str
    ports: list[int]


class TaskPlacement(Model):
    role: str
    index: int
    node: str
    host_ip: str
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_milli: int | None = None  # a share of the one GPU in gpu_indices; None: whole GPUs
    ports: list[PortAssignment] = Field(default_factory=list)


class JobPlaced(Event):
    type: Literal["JobPlaced"] = "JobPlaced"
    subject_suffix: ClassVar[str] = "placed"
    attempt: int = 1
    spec: JobSpec
    tasks: list[TaskPlacement]
    retries_used: int | None = Field(
        None,
        description="Retry budget spent before this attempt (None: attempt - 1). Attempts "
        "started by a preemption, a resume, a scale or a restart do not spend it.",
    )


class TasksPlaced(Event):
    """More tasks of a placed attempt found capacity: a job without gang placement
    (``spec.gang`` false) is placed with the tasks that fit and gets the others one by
    one. ``tasks`` are all of the attempt's tasks placed so far (those of its JobPlaced
    too), so a repeat or a late copy says nothing new; id derived_id(job, attempt,
    "tasks", len(tasks))."""

    type: Literal["TasksPlaced"] = "TasksPlaced"
    subject_suffix: ClassVar[str] = "tasks"
    attempt: int = 1
    tasks: list[TaskPlacement]


class TaskStateChanged(Event):
    type: Literal["TaskStateChanged"] = "TaskStateChanged"
    subject_suffix: ClassVar[str] = "task"
    attempt: int = 1
    role: str
    index: int
    state: TaskState
    # Per task and attempt, increasing with every transition: lets a projection ignore
    # a stale transition that arrives after a newer one.
    seq: int
    node: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    failure_class: FailureClass | None = Field(
        None, description="Set on a FAILED transition only: whose failure it was."
    )


class JobFinished(Event):
    type: Literal["JobFinished"] = "JobFinished"
    subject_suffix: ClassVar[str] = "finished"
    attempt: int = 1
    state: Literal[JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED]
    reason: str
    exit_code: int | None = None
    failure_class: FailureClass | None = Field(
        None, description="Set when the job FAILED: the class of the failure that decided it."
    )


class JobRetrying(Event):
    """An attempt failed and the job runs again as a new attempt (in place of JobFinished
    for that attempt): placement re-queues it, not before ``not_before``. A job whose
    retry limit is RETRY_ALWAYS (OpenPAI retryCount -2) runs again after a success too:
    its JobRetrying has no failure class."""

    type: Literal["JobRetrying"] = "JobRetrying"
    subject_suffix: ClassVar[str] = "retrying"
    attempt: int = Field(description="The new attempt.")
    previous_attempt: int
    reason: str
    failure_class: FailureClass | None = Field(
        description="None: the previous attempt succeeded (retryCount -2 runs it again)."
    )
    not_before: datetime = Field(description="The new attempt is not placed before this time.")


class StopJob(Event):
    """Command: end the job wherever it is (queued, placed or running)."""

    type: Literal["StopJob"] = "StopJob"
    subject_suffix: ClassVar[str] = "stop"
    requested_by: str
    reason: str = "stopped by user"
    delete: bool = Field(
        False,
        description="The job's Kubernetes-style resource is deleted as well: it leaves "
        "the dialect's views (a watch sees DELETED) and its name is free again.",
    )


class JobResourceChanged(Event):
    """A job's Kubernetes-style resource changed (PATCH or PUT: labels, annotations, and
    the spec fields that act through commands, which are published beside it). The
    dialect's views show ``resource`` from then on, with its ``generation``."""

    type: Literal["JobResourceChanged"] = "JobResourceChanged"
    subject_suffix: ClassVar[str] = "resource"
    resource: dict[str, Any]
    generation: int


class JobTagged(Event):
    """A tag added to (``present``) or removed from a job by its owner or an admin
    (OpenPAI's job tags: ``PUT``/``DELETE /api/v2/jobs/{user}~{name}/tag``). Views show
    the job's tags; OpenPAI's job list filters by them."""

    type: Literal["JobTagged"] = "JobTagged"
    subject_suffix: ClassVar[str] = "tag"
    tag: str = Field(min_length=1, max_length=256)
    present: bool = True


class InterruptCause(StrEnum):
    """Why an attempt ends without failing: none of these spends the retry budget."""

    PREEMPTED = "preempted"  # a higher-priority job (or a queue reclaiming quota) needs it
    PAUSED = "paused"  # the user paused the job
    SCALED = "scaled"  # an elastic role changes size: the gang restarts at the new size
    NODE_REMOVED = "node_removed"  # an administrator removed a node the job ran on
    RESTARTED = "restarted"  # the user asked for the job to start over as a new attempt
    SHUTDOWN = "shutdown"  # the platform was shut down: the job runs again when it is back


class PauseJob(Event):
    """Command: give the job's capacity back and keep everything else until ResumeJob."""

    type: Literal["PauseJob"] = "PauseJob"
    subject_suffix: ClassVar[str] = "pause"
    requested_by: str
    reason: str = "paused by user"


class ResumeJob(Event):
    """Command: queue a paused job again (as a new attempt that spends no retry)."""

    type: Literal["ResumeJob"] = "ResumeJob"
    subject_suffix: ClassVar[str] = "resume"
    requested_by: str


class RestartJob(Event):
    """Command: end the running attempt (if any) and run the job again as a new attempt
    that spends no retry; a paused job is resumed, a queued one stays as it is."""

    type: Literal["RestartJob"] = "RestartJob"
    subject_suffix: ClassVar[str] = "restart"
    requested_by: str
    reason: str = "restarted by user"


class ScaleJob(Event):
    """Command: set an elastic role's replicas (within its min/max)."""

    type: Literal["ScaleJob"] = "ScaleJob"
    subject_suffix: ClassVar[str] = "scale"
    requested_by: str
    role: str
    replicas: int


class SetPriority(Event):
    """Command: the job's priority from now on (PAI-DLC's UpdateJob): its place in its
    queue while it waits, and what preemption weighs while it runs."""

    type: Literal["SetPriority"] = "SetPriority"
    subject_suffix: ClassVar[str] = "priority"
    requested_by: str
    priority: int


class InterruptJob(Event):
    """Command from placement to the launcher: end this attempt's tasks (keeping their
    directories) and answer with JobInterrupted. Placement alone decides interruptions."""

    type: Literal["InterruptJob"] = "InterruptJob"
    subject_suffix: ClassVar[str] = "interrupt"
    attempt: int
    cause: InterruptCause
    reason: str


class JobInterrupted(Event):
    """An attempt ended without failing, its capacity is free, and no retry was spent.
    ``cause`` paused: the job waits for ResumeJob (state PAUSED); any other cause:
    placement queues the next attempt. Published by the launcher for a running attempt,
    by placement for one that had not been placed; id derived_id(job, attempt,
    "interrupted"), so there is one per attempt."""

    type: Literal["JobInterrupted"] = "JobInterrupted"
    subject_suffix: ClassVar[str] = "interrupted"
    attempt: int
    cause: InterruptCause
    reason: str


# Every message type, once: the decoder's discriminated union is built from this tuple.
EVENT_TYPES: tuple[type[Event], ...] = (
    JobSubmitted,
    JobAccepted,
    JobRejected,
    JobQueued,
    JobPlaced,
    TasksPlaced,
    TaskStateChanged,
    JobFinished,
    JobRetrying,
    JobInterrupted,
    JobResourceChanged,
    JobTagged,
    StopJob,
    PauseJob,
    ResumeJob,
    ScaleJob,
    SetPriority,
    InterruptJob,
    RestartJob,
)
# Union[EVENT_TYPES] spelled for a tuple built at run time (X | Y over the tuple).
AnyEvent = Annotated[functools.reduce(operator.or_, EVENT_TYPES), Field(discriminator="type")]  # type: ignore[valid-type]
COMMAND_TYPES: tuple[type[Event], ...] = (
    StopJob,
    PauseJob,
    ResumeJob,
    ScaleJob,
    SetPriority,
    InterruptJob,
    RestartJob,
)

# AnyEvent is a union built at run time, which no static checker can follow.
_adapter: TypeAdapter[Any] = TypeAdapter(AnyEvent)  # type: ignore[arg-type]

# Upcasters: (type, from_version) -> function turning that version's dict into the next.
# Empty while every event is at version 1; add one here before bumping SCHEMA_VERSION.
UPCASTERS: dict[tuple[str, int], Any] = {}


def upcast(data: dict[str, Any]) -> dict[str, Any]:
    version = int(data.get("schema_version", 1))
    while (step := UPCASTERS.get((data.get("type", ""), version))) is not None:
        data = step(data)
        version += 1
        data["schema_version"] = version
    return data


def decode(raw: bytes | str | dict[str, Any]) -> Event:
    """Parse any message from the bus into its model. What is not an event raises
    pydantic.ValidationError or ValueError (the bus dead-letters both): JSON that is not
    an object, or whose ``schema_version`` or ``type`` cannot be read, included; those
    raised AttributeError or TypeError once, which stopped a consumer on every delivery."""
    data = raw if isinstance(raw, dict) else json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"an event is a JSON object, not {type(data).__name__}")
    try:
        data = upcast(data)
    except TypeError as exc:
        raise ValueError(f"schema_version or type cannot be read: {exc}") from exc
    return _adapter.validate_python(data)


def encode(event: Event) -> bytes:
    return event.model_dump_json().encode()
