"""What each event means for the read model: pure functions from an event to the
changes of the job, task and history views. The store applies them with guards that make
a redelivered or late event change nothing twice (see adapters/views.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainyard_common.dialects import BY_NAME
from trainyard_common.events import (
    Event,
    InterruptCause,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobQueued,
    JobRejected,
    JobResourceChanged,
    JobRetrying,
    JobState,
    JobSubmitted,
    JobTagged,
    SetPriority,
    StopJob,
    TaskPlacement,
    TasksPlaced,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.jobspec import JobSpec

# A job's state only moves forward; a late event of an earlier step never moves it back.
# Within an attempt by this order; a later attempt ranks above every step of an earlier
# one (a retried job goes back from RUNNING to QUEUED, PLACED, RUNNING of its next
# attempt); a terminal state, which only JobFinished and JobRejected bring, above all.
# PAUSED ends its attempt without ending the job: above that attempt's every step, below
# the next attempt's, which a resume starts.
STATE_RANK: dict[JobState, int] = {
    JobState.SUBMITTED: 0,
    JobState.ACCEPTED: 1,
    JobState.QUEUED: 2,
    JobState.PLACED: 3,
    JobState.RUNNING: 4,
    JobState.PAUSED: 5,
    JobState.REJECTED: 9,
    JobState.SUCCEEDED: 9,
    JobState.FAILED: 9,
    JobState.STOPPED: 9,
}
ATTEMPT_RANKS = 100
TERMINAL_RANK = 1_000_000_000


def job_rank(state: JobState, attempt: int = 1) -> int:
    if state.terminal:
        return TERMINAL_RANK
    return attempt * ATTEMPT_RANKS + STATE_RANK[state]


@dataclass
class JobChange:
    """Fields to set on the job view. ``state`` is applied only if it ranks higher than
    the stored one (``same_rank_ok``: also when equal, for repeated QUEUED updates);
    ``rank_state`` ranks it as another step of its attempt. ``add_to_set`` appends to
    arrays whatever the rank (an exact repeat is kept once)."""

    job_id: str
    always: dict[str, Any] = field(default_factory=dict)
    state: JobState | None = None
    with_state: dict[str, Any] = field(default_factory=dict)
    same_rank_ok: bool = False
    attempt: int = 1
    rank_state: JobState | None = None
    add_to_set: dict[str, Any] = field(default_factory=dict)
    # Values to remove from arrays (whatever the rank), as ``add_to_set`` adds them.
    pull: dict[str, Any] = field(default_factory=dict)
    # The job's first event (JobSubmitted): its stream sequence is kept as created_seq,
    # which tells a Kubernetes-style watch an ADDED object from a MODIFIED one.
    created: bool = False
    # Fields more than one kind of event sets, by group: a group is written only by an
    # event later in the stream than the one that last wrote it (``<group>_seq``), so an
    # event applied late (a redelivery, another replica) does not undo a newer one.
    ordered: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The same by the state's rank (``<group>_rank``), whether or not the state itself
    # moves: what every step of a job carries (its spec), the latest step's wins, and a
    # job whose end was applied first still gets it from the earlier steps.
    ranked: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The tag whose add or removal ``add_to_set``/``pull`` are: applied only by an
    # event later in the stream than the last that changed that tag (kept per tag), so
    # a late add (another replica, a redelivery) does not bring back a removed tag.
    tag: str | None = None

    @property
    def rank(self) -> int:
        ranked = self.rank_state or self.state
        return job_rank(ranked, self.attempt) if ranked else -1


@dataclass
class TaskChange:
    """Fields to set on one task view; ``seq`` orders transitions (None: placement
    fields, which never conflict with a transition)."""

    task_id: str
    fields: dict[str, Any]
    seq: int | None = None


@dataclass
class EndTasks:
    """Every task of ``attempt`` not yet in a terminal state gets ``fields`` (its seq is
    kept, so the launcher's own transitions still apply)."""

    job_id: str
    attempt: int
    fields: dict[str, Any]


@dataclass
class Changes:
    job: JobChange | None = None
    tasks: list[TaskChange] = field(default_factory=list)
    end_tasks: EndTasks | None = None
    # The job whose tasks changed: its feed_seq moves even where its own view does not
    # (a second task RUNNING, a task's end before the job's), so the live feed sends it
    # and a job's page follows its tasks.
    touched: str | None = None


def task_id(job_id: str, attempt: int, role: str, index: int) -> str:
    return f"{job_id}:{attempt}:{role}:{index}"


def _issues(items: list[Any]) -> list[dict[str, Any]]:
    return [i.model_dump() for i in items]


def project(event: Event) -> Changes:
    at = event.occurred_at
    match event:
        case JobSubmitted():
            spec = event.spec
            shown = spec.redacted()
            return Changes(
                JobChange(
                    event.job_id,
                    always={
                        "name": spec.name,
                        "user": spec.user,
                        "dialect": event.dialect,
                        "dialect_key": event.dialect_key,
                        "queue": spec.queue,
                        "kind": spec.kind.value,
                        "labels": {label.name: label.value for label in spec.labels},
                        # What a dialect's searches read (PAI-DLC's ImageSearch and
                        # UserCommandSearch): the images and commands, as text.
                        "search": _search(shown),
                        "submitted_at": at,
                        "claimed": event.name_claimed,
                    },
                    state=JobState.SUBMITTED,
                    with_state={"updated_at": at},
                    created=True,
                    ordered={
                        "priority": {"priority": spec.priority},
                        "resource": {"original_json": _original(event)},
                    },
                    # As submitted, until validation's (defaulted) replaces them.
                    ranked={
                        "spec": {"spec_json": shown.model_dump_json()},
                        "warnings": {"warnings": _issues(event.warnings)},
                    },
                )
            )
        case JobAccepted():
            return Changes(
                JobChange(
                    event.job_id,
                    state=JobState.ACCEPTED,
                    with_state={"updated_at": at},
                    # A placed attempt's spec (a new size) is not undone by this event
                    # applied late.
                    ranked={
                        "spec": {"spec_json": event.spec.redacted().model_dump_json()},
                        "warnings": {"warnings": _issues(event.warnings)},
                    },
                )
            )
        case JobRejected():
            reason = "; ".join(f"{e.path}: {e.message}" for e in event.errors) or "rejected"
            return Changes(
                JobChange(
                    event.job_id,
                    always={"errors": _issues(event.errors)},
                    state=JobState.REJECTED,
                    with_state={"reason": reason, "updated_at": at, "finished_at": at},
                )
            )
        case JobQueued():
            return Changes(
                JobChange(
                    event.job_id,
                    state=JobState.QUEUED,
                    same_rank_ok=True,
                    attempt=event.attempt,
                    with_state={
                        "queue_reasons": list(event.reasons),
                        "queue_position": event.position,
                        "reason": "; ".join(event.reasons) or None,
                        "attempt": event.attempt,
                        "updated_at": at,
                    },
                )
            )
        case JobPlaced():
            total = event.spec.task_count()
            return Changes(
                JobChange(
                    event.job_id,
                    state=JobState.PLACED,
                    attempt=event.attempt,
                    # The attempt's own spec: a scaled job runs at its new size.
                    with_state={
                        "attempt": event.attempt,
                        # Without gang placement, part of the tasks may wait.
                        "reason": None
                        if len(event.tasks) >= total
                        else f"{len(event.tasks)} of {total} tasks placed; the others are "
                        "placed one by one as capacity frees (no gang placement)",
                        "queue_reasons": [],
                        "updated_at": at,
                    },
                    ranked={"spec": {"spec_json": event.spec.redacted().model_dump_json()}},
                ),
                _placements(event.job_id, event.attempt, event.tasks),
            )
        case TasksPlaced():
            # Placement fields only: a task's state comes with its own transitions.
            return Changes(
                tasks=_placements(event.job_id, event.attempt, event.tasks),
                touched=event.job_id,
            )
        case TaskStateChanged():
            task = TaskChange(
                task_id(event.job_id, event.attempt, event.role, event.index),
                {
                    "job_id": event.job_id,
                    "attempt": event.attempt,
                    "role": event.role,
                    "index": event.index,
                    "state": event.state.value,
                    "exit_code": event.exit_code,
                    "reason": event.reason,
                    "updated_at": at,
                    "failure_class": event.failure_class.value if event.failure_class else None,
                    **({"node": event.node} if event.node else {}),
                },
                seq=event.seq,
            )
            # When it started and ended: each said once, by its own transition, so set
            # whatever the order they arrive in (the state above keeps the latest).
            timing = (
                {"started_at": at}
                if event.state is TaskState.RUNNING
                else {"ended_at": at}
                if event.state.terminal
                else None
            )
            times = [TaskChange(task.task_id, timing)] if timing else []
            job = None
            if event.state is TaskState.RUNNING:
                job = JobChange(
                    event.job_id,
                    state=JobState.RUNNING,
                    attempt=event.attempt,
                    with_state={"attempt": event.attempt, "updated_at": at},
                )
            return Changes(job, [task, *times], touched=event.job_id)
        case JobFinished():
            cls = event.failure_class.value if event.failure_class else None
            return Changes(
                JobChange(
                    event.job_id,
                    state=event.state,
                    attempt=event.attempt,
                    with_state={
                        "reason": event.reason,
                        "exit_code": event.exit_code,
                        "attempt": event.attempt,
                        "failure_class": cls,
                        "updated_at": at,
                        "finished_at": at,
                    },
                    add_to_set={
                        "attempts": {
                            "attempt": event.attempt,
                            "state": event.state.value,
                            "reason": event.reason,
                            "exit_code": event.exit_code,
                            "failure_class": cls,
                            "ended_at": at,
                        }
                    },
                )
            )
        case JobRetrying():
            # The job is back in line as its next attempt; ranked as that attempt's
            # ACCEPTED so that placement's JobQueued/JobPlaced of it, in any order, win.
            return Changes(
                JobChange(
                    event.job_id,
                    state=JobState.QUEUED,
                    attempt=event.attempt,
                    rank_state=JobState.ACCEPTED,
                    with_state={
                        "attempt": event.attempt,
                        "reason": event.reason,
                        "queue_reasons": [],
                        "queue_position": None,
                        "not_before": event.not_before,
                        "updated_at": at,
                    },
                    add_to_set={
                        "attempts": {
                            "attempt": event.previous_attempt,
                            "state": (
                                JobState.FAILED if event.failure_class else JobState.SUCCEEDED
                            ).value,  # fmt: skip
                            "reason": event.reason,
                            "exit_code": None,
                            "failure_class": event.failure_class and event.failure_class.value,
                            "ended_at": at,
                            "retried_as": event.attempt,
                            "not_before": event.not_before,
                        }
                    },
                )
            )
        case JobInterrupted():
            return _interrupted(event)
        case StopJob():
            deleted = {"deleted_at": at} if event.delete else {}
            return Changes(
                JobChange(event.job_id, always={"stop_requested_by": event.requested_by, **deleted})
            )
        case SetPriority():
            return Changes(
                JobChange(event.job_id, ordered={"priority": {"priority": event.priority}})
            )
        case JobTagged():
            tags = {"tags": event.tag}
            if event.present:
                return Changes(JobChange(event.job_id, add_to_set=tags, tag=event.tag))
            return Changes(JobChange(event.job_id, pull=tags, tag=event.tag))
        case JobResourceChanged():
            return Changes(
                JobChange(
                    event.job_id,
                    ordered={
                        "resource": {
                            "original_json": json.dumps(event.resource, ensure_ascii=False),
                            "generation": event.generation,
                            "updated_at": at,
                        }
                    },
                )
            )
    return Changes()


# The most search text kept per field: a search reads the start of a long command.
MAX_SEARCH_TEXT = 16 * 1024


def _search(spec: JobSpec) -> dict[str, str]:
    """``spec`` as views show it (secrets hidden)."""
    images = dict.fromkeys(i for i in (spec.image, *(r.image for r in spec.roles)) if i)
    commands = dict.fromkeys(r.command for r in spec.roles if r.command)
    return {
        "images": "\n".join(images)[:MAX_SEARCH_TEXT],
        "commands": "\n".join(commands)[:MAX_SEARCH_TEXT],
    }


def _placements(job_id: str, attempt: int, tasks: list[TaskPlacement]) -> list[TaskChange]:
    return [
        TaskChange(
            task_id(job_id, attempt, t.role, t.index),
            {
                "job_id": job_id,
                "attempt": attempt,
                "role": t.role,
                "index": t.index,
                "node": t.node,
                "host_ip": t.host_ip,
                "gpu_indices": list(t.gpu_indices),
                "ports": [p.model_dump() for p in t.ports],
            },
        )
        for t in tasks
    ]


def _interrupted(event: JobInterrupted) -> Changes:
    """An attempt ended without failing: PAUSED until a resume, or (preempted, scaled, a
    node removed) back in line as the next attempt, ranked as that attempt's ACCEPTED
    like a retry so placement's JobQueued/JobPlaced of it, in any order, win."""
    at = event.occurred_at
    ended = {
        "attempt": event.attempt,
        "state": JobState.STOPPED.value,
        "reason": event.reason,
        "exit_code": None,
        "failure_class": None,
        "interrupted": event.cause.value,
    }
    tasks = EndTasks(
        event.job_id,
        event.attempt,
        {"state": TaskState.STOPPED.value, "reason": event.reason, "updated_at": at},
    )
    if event.cause is InterruptCause.PAUSED:
        job = JobChange(
            event.job_id,
            state=JobState.PAUSED,
            attempt=event.attempt,
            with_state={
                "attempt": event.attempt,
                "reason": event.reason,
                "queue_reasons": [],
                "queue_position": None,
                "updated_at": at,
            },
            add_to_set={"attempts": ended},
        )
    else:
        job = JobChange(
            event.job_id,
            state=JobState.QUEUED,
            attempt=event.attempt + 1,
            rank_state=JobState.ACCEPTED,
            with_state={
                "attempt": event.attempt + 1,
                "reason": event.reason,
                "queue_reasons": [],
                "queue_position": None,
                "updated_at": at,
            },
            add_to_set={"attempts": {**ended, "retried_as": event.attempt + 1}},
        )
    return Changes(job, end_tasks=tasks)


def _original(event: JobSubmitted) -> str | None:
    """The payload as the user sent it, with what its dialect calls secret hidden."""
    if event.original is None:
        return None
    chosen = BY_NAME.get(event.dialect)
    shown = chosen.redact(event.original) if chosen else event.original
    return json.dumps(shown, ensure_ascii=False)


def job_as_of(events: list[Event], at: datetime) -> dict[str, Any] | None:
    """The job's view as it was at ``at``: its history up to then (in stream order)
    through the same projection and the same rank rule as the stored view. None when
    nothing of it had happened yet."""
    view: dict[str, Any] | None = None
    rank = -1
    for event in events:
        if event.occurred_at > at:
            continue
        change = project(event).job
        if change is None:
            continue
        if view is None:
            view = {"state": None}
        view.update(change.always)
        for key, value in change.add_to_set.items():
            if value not in view.setdefault(key, []):
                view[key].append(value)
        if change.state is not None and (
            change.rank > rank or (change.rank == rank and change.same_rank_ok)
        ):
            rank = change.rank
            view.update({"state": change.state.value, **change.with_state})
    return view
