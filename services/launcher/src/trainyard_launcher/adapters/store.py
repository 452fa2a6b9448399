"""The launcher's own state in the store (SQLite or MongoDB, trainyard_common.storage):
one document per job and one per task.

``jobs`` {_id: job_id, attempt, spec_json, tasks_json, user, state, verdict, retry,
finished_published}; ``tasks`` {_id: "job:attempt:role:index", state, seq, pid, ...,
transitions, published_seq}. Every change is a conditional update inside one document
(FerretDB v1 has no transactions): a task moves only from the ``seq`` it was read at, a
job's verdict is set only while it is running. A redelivered event or a restarted
launcher therefore never makes a transition twice. ``transitions`` doubles as the
task's outbox: what is stored but not yet published (seq > published_seq) is published
again after a crash, under the same derived event id. A failed attempt that will be
retried keeps its verdict and its ``retry`` (new attempt, not_before) in the same
document, so the JobRetrying published after a crash is the same event. An attempt
interrupted by placement (pause, preemption, scale) is finished with a STOPPED verdict
and its ``interrupt`` (cause, reason): it ends with JobInterrupted, never judged, and
``retries_used`` (from JobPlaced) is what the failure judgement counts as spent.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pymongo import ASCENDING

from trainyard_common.events import FailureClass, JobState, TaskPlacement, TaskState, utcnow
from trainyard_common.jobspec import JobSpec
from trainyard_common.lifecycle import TASK
from trainyard_common.storage import Database, insert_once

from ..domain.completion import Verdict
from ..domain.failure import Retry

JOB_RUNNING = "running"
JOB_FINISHED = "finished"
# A StopJob came before the job was ever placed here: a tombstone the JobPlaced finds.
JOB_STOP_EARLY = "stop_requested_early"

ACTIVE_TASK_STATES = (TaskState.STARTING, TaskState.RUNNING)


def now_ms() -> datetime:
    """Now, at the millisecond precision BSON keeps: an event published before a crash
    and again after it then carries the same time."""
    now = utcnow()
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def task_id(job_id: str, attempt: int, role: str, index: int) -> str:
    return f"{job_id}:{attempt}:{role}:{index}"


@dataclass(frozen=True)
class Transition:
    seq: int
    state: TaskState
    at: datetime
    exit_code: int | None = None
    reason: str | None = None
    failure_class: FailureClass | None = None


@dataclass(frozen=True)
class TaskRecord:
    job_id: str
    attempt: int
    role: str
    index: int
    state: TaskState
    seq: int
    dir: str
    node: str | None = None
    # How the backend finds the task again (adapters.backend.TaskHandle): the wrapper's
    # pid and start time here, the pod's uid on Kubernetes.
    pid: int | None = None
    start_ticks: int | None = None
    uid: str | None = None
    started: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    ended_at: float | None = None
    # A failed end's class and how it ended (domain.failure: FailureClass, EndKind).
    failure_class: FailureClass | None = None
    end_kind: str | None = None
    transitions: tuple[Transition, ...] = ()
    published_seq: int = 0
    # True while a stored transition may not have been published yet: an index-friendly
    # stand-in for seq > published_seq, which FerretDB v1 cannot query ($expr).
    outbox: bool = True
    # The trace of the JobPlaced that started the task: what the watcher publishes about
    # it later continues the job's trace.
    traceparent: str | None = None

    @property
    def id(self) -> str:
        return task_id(self.job_id, self.attempt, self.role, self.index)

    def unpublished(self) -> list[Transition]:
        return [t for t in self.transitions if t.seq > self.published_seq]


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    attempt: int
    state: str
    spec: JobSpec | None = None
    tasks: list[TaskPlacement] = field(default_factory=list)
    user: str = ""
    verdict: Verdict | None = None
    # Set with a FAILED verdict that runs again; JobRetrying is then published for the
    # attempt instead of JobFinished (``finished_published`` covers either).
    retry: Retry | None = None
    finished_published: bool = False
    stop_reason: str | None = None
    # Set when placement interrupted the attempt: (InterruptCause value, reason).
    interrupt: tuple[str, str] | None = None
    # The retry budget spent before this attempt (JobPlaced.retries_used; None: attempt-1).
    retries_used: int | None = None
    # When this attempt was placed: of several jobs once named alike, the newest is the
    # one a pod name means.
    placed_at: datetime | None = None


def new_task(
    job_id: str,
    attempt: int,
    role: str,
    index: int,
    dir: str,
    node: str | None = None,
    traceparent: str | None = None,
) -> TaskRecord:
    """A task's first record: STARTING, seq 1, its transition waiting to be published."""
    return TaskRecord(
        job_id=job_id,
        attempt=attempt,
        role=role,
        index=index,
        state=TaskState.STARTING,
        seq=1,
        dir=dir,
        node=node,
        traceparent=traceparent,
        transitions=(Transition(1, TaskState.STARTING, now_ms()),),
    )


class LauncherStore(Protocol):
    async def ensure_indexes(self) -> None: ...
    async def insert_job(self, job: JobRecord) -> bool: ...
    async def get_job(self, job_id: str) -> JobRecord | None: ...
    async def job_named(self, user: str, namespace: str, name: str) -> JobRecord | None:
        """The newest job of ``user`` named ``namespace``/``name`` (a Kubernetes-style
        job's pods are named after it)."""
        ...

    async def insert_tombstone(self, job_id: str, reason: str) -> bool: ...
    async def start_attempt(
        self, job: JobRecord, expected_state: str, expected_attempt: int
    ) -> bool: ...
    async def set_verdict(
        self, job_id: str, attempt: int, verdict: Verdict, retry: Retry | None = None
    ) -> bool: ...
    async def note_stop(self, job_id: str, attempt: int, reason: str) -> bool: ...
    async def set_placements(
        self, job_id: str, attempt: int, tasks: Sequence[TaskPlacement]
    ) -> bool:
        """The running ``attempt``'s placements, now ``tasks`` (a job without gang
        placement gets tasks after its start); False when it is not running."""

    async def set_interrupted(
        self, job_id: str, attempt: int, verdict: Verdict, cause: str
    ) -> bool: ...
    async def mark_finished_published(self, job_id: str, attempt: int) -> None: ...
    async def unpublished_jobs(self) -> list[JobRecord]: ...
    async def running_jobs(self) -> list[JobRecord]: ...
    async def insert_task(self, task: TaskRecord) -> bool: ...
    async def get_task(self, id: str) -> TaskRecord | None: ...
    async def tasks_of(self, job_id: str, attempt: int) -> list[TaskRecord]: ...
    async def active_tasks(self) -> list[TaskRecord]: ...
    async def transition(
        self, task: TaskRecord, state: TaskState, **fields: Any
    ) -> TaskRecord | None: ...
    async def mark_published(self, id: str, seq: int) -> None: ...
    async def unpublished_tasks(self) -> list[TaskRecord]: ...


# --- documents ------------------------------------------------------------------------


def _verdict_doc(verdict: Verdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {
        "state": verdict.state.value,
        "reason": verdict.reason,
        "exit_code": verdict.exit_code,
        "task": list(verdict.task) if verdict.task else None,
        "failure_class": verdict.failure_class.value if verdict.failure_class else None,
    }


def _verdict(doc: dict[str, Any] | None) -> Verdict | None:
    if not doc:
        return None
    task = doc.get("task")
    cls = doc.get("failure_class")
    return Verdict(
        JobState(doc["state"]),
        doc["reason"],
        doc.get("exit_code"),
        (task[0], int(task[1])) if task else None,
        FailureClass(cls) if cls else None,
    )


def _retry_doc(retry: Retry | None) -> dict[str, Any] | None:
    if retry is None:
        return None
    return {
        "attempt": retry.attempt,
        "backoff_s": retry.backoff_s,
        "reason": retry.reason,
        "failure_class": retry.failure_class and retry.failure_class.value,
        "not_before": retry.not_before,
    }


def _retry(doc: dict[str, Any] | None) -> Retry | None:
    if not doc:
        return None
    return Retry(
        int(doc["attempt"]),
        float(doc["backoff_s"]),
        doc["reason"],
        _failure_class(doc.get("failure_class")),
        doc.get("not_before"),
    )


def newest(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The most recently created of several job documents (by id among equals)."""
    oldest = datetime.min.replace(tzinfo=UTC)
    return max(docs, key=lambda d: (d.get("placed_at") or oldest, d["_id"]))


def job_doc(job: JobRecord) -> dict[str, Any]:
    return {
        "_id": job.job_id,
        "attempt": job.attempt,
        "state": job.state,
        "spec_json": job.spec.model_dump_json() if job.spec else None,
        "tasks_json": _placements_json(job.tasks),
        "user": job.user,
        # What a pod's name is made of (Kubernetes-style jobs: <name>-<role>-<index>).
        "name": job.spec.name if job.spec else None,
        "namespace": job.spec.namespace if job.spec else None,
        "placed_at": job.placed_at,
        "verdict": _verdict_doc(job.verdict),
        "retry": _retry_doc(job.retry),
        "finished_published": job.finished_published,
        "stop_reason": job.stop_reason,
        "interrupt": _interrupt_doc(job.interrupt),
        "retries_used": job.retries_used,
    }


def _interrupt_doc(interrupt: tuple[str, str] | None) -> dict[str, str] | None:
    return None if interrupt is None else {"cause": interrupt[0], "reason": interrupt[1]}


def job_record(doc: dict[str, Any]) -> JobRecord:
    return JobRecord(
        job_id=doc["_id"],
        attempt=int(doc.get("attempt", 0)),
        state=doc["state"],
        spec=JobSpec.model_validate_json(doc["spec_json"]) if doc.get("spec_json") else None,
        tasks=[TaskPlacement.model_validate(t) for t in json.loads(doc.get("tasks_json") or "[]")],
        user=doc.get("user", ""),
        verdict=_verdict(doc.get("verdict")),
        retry=_retry(doc.get("retry")),
        finished_published=bool(doc.get("finished_published")),
        stop_reason=doc.get("stop_reason"),
        interrupt=(doc["interrupt"]["cause"], doc["interrupt"]["reason"])
        if doc.get("interrupt")
        else None,
        retries_used=doc.get("retries_used"),
        placed_at=doc.get("placed_at"),
    )


def _transition_doc(t: Transition) -> dict[str, Any]:
    return {
        "seq": t.seq,
        "state": t.state.value,
        "at": t.at,
        "exit_code": t.exit_code,
        "reason": t.reason,
        "failure_class": t.failure_class.value if t.failure_class else None,
    }


def task_doc(task: TaskRecord) -> dict[str, Any]:
    doc = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    doc["_id"] = task.id
    doc["state"] = task.state.value
    doc["failure_class"] = task.failure_class.value if task.failure_class else None
    doc["transitions"] = [_transition_doc(t) for t in task.transitions]
    return doc


def task_record(doc: dict[str, Any]) -> TaskRecord:
    names = {f.name for f in dataclasses.fields(TaskRecord)}
    values = {k: v for k, v in doc.items() if k in names}
    values["state"] = TaskState(doc["state"])
    values["failure_class"] = _failure_class(doc.get("failure_class"))
    values["transitions"] = tuple(
        Transition(
            t["seq"],
            TaskState(t["state"]),
            t["at"],
            t.get("exit_code"),
            t.get("reason"),
            _failure_class(t.get("failure_class")),
        )
        for t in doc.get("transitions", [])
    )
    return TaskRecord(**values)


def _failure_class(value: str | None) -> FailureClass | None:
    return FailureClass(value) if value else None


def _set_fields(fields: dict[str, Any]) -> dict[str, Any]:
    # Stored as plain strings, as every other enum here.
    return {k: (v.value if isinstance(v, FailureClass) else v) for k, v in fields.items()}


def _advance(
    task: TaskRecord, state: TaskState, fields: dict[str, Any]
) -> tuple[TaskRecord, Transition]:
    unknown = set(fields) - {f.name for f in dataclasses.fields(TaskRecord)}
    if unknown or {"seq", "state", "transitions", "outbox", "published_seq"} & set(fields):
        raise ValueError(f"not a task field to set: {sorted(unknown or fields)}")
    TASK.check([task.state], state)
    seq = task.seq + 1
    step = Transition(
        seq,
        state,
        now_ms(),
        fields.get("exit_code"),
        fields.get("reason"),
        fields.get("failure_class"),
    )
    new = dataclasses.replace(
        task, state=state, seq=seq, transitions=(*task.transitions, step), outbox=True, **fields
    )
    return new, step


# --- the store (SQLite or MongoDB) ----------------------------------------------------


class DocLauncherStore:
    def __init__(self, db: Database) -> None:
        self.jobs = db["jobs"]
        self.tasks = db["tasks"]

    async def ensure_indexes(self) -> None:
        await self.tasks.create_index([("job_id", ASCENDING), ("attempt", ASCENDING)])
        await self.tasks.create_index([("state", ASCENDING)])
        # What a restart reads (adopt): the outbox and the unpublished verdicts, found
        # without reading the history of every task and job ever run.
        await self.tasks.create_index([("outbox", ASCENDING)])
        await self.jobs.create_index([("state", ASCENDING), ("finished_published", ASCENDING)])
        await self.jobs.create_index(
            [("user", ASCENDING), ("namespace", ASCENDING), ("name", ASCENDING)]
        )

    async def insert_job(self, job: JobRecord) -> bool:
        return await insert_once(self.jobs, job_doc(job))

    async def get_job(self, job_id: str) -> JobRecord | None:
        doc = await self.jobs.find_one({"_id": job_id})
        return job_record(doc) if doc else None

    async def job_named(self, user: str, namespace: str, name: str) -> JobRecord | None:
        query = {"user": user, "namespace": namespace, "name": name}
        docs = [doc async for doc in self.jobs.find(query)]
        return job_record(newest(docs)) if docs else None

    async def insert_tombstone(self, job_id: str, reason: str) -> bool:
        return await self.insert_job(
            JobRecord(job_id=job_id, attempt=0, state=JOB_STOP_EARLY, stop_reason=reason)
        )

    async def start_attempt(
        self, job: JobRecord, expected_state: str, expected_attempt: int
    ) -> bool:
        result = await self.jobs.replace_one(
            {"_id": job.job_id, "state": expected_state, "attempt": expected_attempt}, job_doc(job)
        )
        return result.modified_count == 1

    async def set_verdict(
        self, job_id: str, attempt: int, verdict: Verdict, retry: Retry | None = None
    ) -> bool:
        result = await self.jobs.update_one(
            {"_id": job_id, "attempt": attempt, "state": JOB_RUNNING},
            {
                "$set": {
                    "state": JOB_FINISHED,
                    "verdict": _verdict_doc(verdict),
                    "retry": _retry_doc(retry),
                    "finished_published": False,
                }
            },
        )
        return result.modified_count == 1

    async def set_interrupted(
        self, job_id: str, attempt: int, verdict: Verdict, cause: str
    ) -> bool:
        """running -> finished as interrupted (no retry, no judgement); False when the
        attempt had ended already."""
        result = await self.jobs.update_one(
            {"_id": job_id, "attempt": attempt, "state": JOB_RUNNING},
            {
                "$set": {
                    "state": JOB_FINISHED,
                    "verdict": _verdict_doc(verdict),
                    "retry": None,
                    "interrupt": _interrupt_doc((cause, verdict.reason)),
                    "finished_published": False,
                }
            },
        )
        return result.modified_count == 1

    async def set_placements(
        self, job_id: str, attempt: int, tasks: Sequence[TaskPlacement]
    ) -> bool:
        result = await self.jobs.update_one(
            {"_id": job_id, "attempt": attempt, "state": JOB_RUNNING},
            {"$set": {"tasks_json": _placements_json(tasks)}},
        )
        return result.modified_count == 1

    async def note_stop(self, job_id: str, attempt: int, reason: str) -> bool:
        """A stop that came while the finished ``attempt`` waits for its retry: the next
        attempt starts stopped. False when the job moved on meanwhile."""
        result = await self.jobs.update_one(
            {"_id": job_id, "attempt": attempt, "state": JOB_FINISHED},
            {"$set": {"stop_reason": reason}},
        )
        return result.modified_count == 1

    async def mark_finished_published(self, job_id: str, attempt: int) -> None:
        await self.jobs.update_one(
            {"_id": job_id, "attempt": attempt}, {"$set": {"finished_published": True}}
        )

    async def unpublished_jobs(self) -> list[JobRecord]:
        cursor = self.jobs.find({"state": JOB_FINISHED, "finished_published": False})
        return [job_record(doc) async for doc in cursor]

    async def running_jobs(self) -> list[JobRecord]:
        cursor = self.jobs.find({"state": JOB_RUNNING})
        return [job_record(doc) async for doc in cursor]

    async def insert_task(self, task: TaskRecord) -> bool:
        return await insert_once(self.tasks, task_doc(task))

    async def get_task(self, id: str) -> TaskRecord | None:
        doc = await self.tasks.find_one({"_id": id})
        return task_record(doc) if doc else None

    async def tasks_of(self, job_id: str, attempt: int) -> list[TaskRecord]:
        cursor = self.tasks.find({"job_id": job_id, "attempt": attempt})
        return sorted([task_record(doc) async for doc in cursor], key=lambda t: (t.role, t.index))

    async def active_tasks(self) -> list[TaskRecord]:
        cursor = self.tasks.find({"state": {"$in": [s.value for s in ACTIVE_TASK_STATES]}})
        return [task_record(doc) async for doc in cursor]

    async def transition(
        self, task: TaskRecord, state: TaskState, **fields: Any
    ) -> TaskRecord | None:
        """Move ``task`` to ``state`` from the seq it was read at; None when another
        writer moved it first (re-read and decide again)."""
        new, step = _advance(task, state, fields)
        result = await self.tasks.update_one(
            {"_id": task.id, "seq": task.seq},
            {
                "$set": {
                    "state": state.value,
                    "seq": new.seq,
                    "outbox": True,
                    **_set_fields(fields),
                },
                "$push": {"transitions": _transition_doc(step)},
            },
        )
        return new if result.modified_count == 1 else None

    async def mark_published(self, id: str, seq: int) -> None:
        # Only while seq is still the latest: a newer transition keeps the outbox open
        # and its own publish closes it.
        await self.tasks.update_one(
            {"_id": id, "seq": seq}, {"$set": {"published_seq": seq, "outbox": False}}
        )

    async def unpublished_tasks(self) -> list[TaskRecord]:
        return [task_record(doc) async for doc in self.tasks.find({"outbox": True})]


# --- in memory, for unit tests of the handlers ----------------------------------------


class MemoryLauncherStore:
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}

    async def ensure_indexes(self) -> None:
        return None

    async def insert_job(self, job: JobRecord) -> bool:
        if job.job_id in self.jobs:
            return False
        self.jobs[job.job_id] = job_doc(job)
        return True

    async def get_job(self, job_id: str) -> JobRecord | None:
        doc = self.jobs.get(job_id)
        return job_record(copy.deepcopy(doc)) if doc else None

    async def job_named(self, user: str, namespace: str, name: str) -> JobRecord | None:
        wanted = (user, namespace, name)
        docs = [d for d in self.jobs.values() if (d["user"], d["namespace"], d["name"]) == wanted]
        return job_record(copy.deepcopy(newest(docs))) if docs else None

    async def insert_tombstone(self, job_id: str, reason: str) -> bool:
        return await self.insert_job(
            JobRecord(job_id=job_id, attempt=0, state=JOB_STOP_EARLY, stop_reason=reason)
        )

    async def start_attempt(
        self, job: JobRecord, expected_state: str, expected_attempt: int
    ) -> bool:
        doc = self.jobs.get(job.job_id)
        if not doc or doc["state"] != expected_state or doc["attempt"] != expected_attempt:
            return False
        self.jobs[job.job_id] = job_doc(job)
        return True

    async def set_verdict(
        self, job_id: str, attempt: int, verdict: Verdict, retry: Retry | None = None
    ) -> bool:
        doc = self.jobs.get(job_id)
        if not doc or doc["attempt"] != attempt or doc["state"] != JOB_RUNNING:
            return False
        doc.update(
            state=JOB_FINISHED,
            verdict=_verdict_doc(verdict),
            retry=_retry_doc(retry),
            finished_published=False,
        )
        return True

    async def set_interrupted(
        self, job_id: str, attempt: int, verdict: Verdict, cause: str
    ) -> bool:
        doc = self.jobs.get(job_id)
        if not doc or doc["attempt"] != attempt or doc["state"] != JOB_RUNNING:
            return False
        doc.update(
            state=JOB_FINISHED,
            verdict=_verdict_doc(verdict),
            retry=None,
            interrupt=_interrupt_doc((cause, verdict.reason)),
            finished_published=False,
        )
        return True

    async def set_placements(
        self, job_id: str, attempt: int, tasks: Sequence[TaskPlacement]
    ) -> bool:
        doc = self.jobs.get(job_id)
        if not doc or doc["attempt"] != attempt or doc["state"] != JOB_RUNNING:
            return False
        doc["tasks_json"] = _placements_json(tasks)
        return True

    async def note_stop(self, job_id: str, attempt: int, reason: str) -> bool:
        doc = self.jobs.get(job_id)
        if not doc or doc["attempt"] != attempt or doc["state"] != JOB_FINISHED:
            return False
        doc["stop_reason"] = reason
        return True

    async def mark_finished_published(self, job_id: str, attempt: int) -> None:
        doc = self.jobs.get(job_id)
        if doc and doc["attempt"] == attempt:
            doc["finished_published"] = True

    async def unpublished_jobs(self) -> list[JobRecord]:
        return [
            job_record(copy.deepcopy(d))
            for d in self.jobs.values()
            if d["state"] == JOB_FINISHED and not d["finished_published"]
        ]

    async def running_jobs(self) -> list[JobRecord]:
        return [
            job_record(copy.deepcopy(d)) for d in self.jobs.values() if d["state"] == JOB_RUNNING
        ]

    async def insert_task(self, task: TaskRecord) -> bool:
        if task.id in self.tasks:
            return False
        self.tasks[task.id] = task_doc(task)
        return True

    async def get_task(self, id: str) -> TaskRecord | None:
        doc = self.tasks.get(id)
        return task_record(copy.deepcopy(doc)) if doc else None

    async def tasks_of(self, job_id: str, attempt: int) -> list[TaskRecord]:
        found = [
            task_record(copy.deepcopy(d))
            for d in self.tasks.values()
            if d["job_id"] == job_id and d["attempt"] == attempt
        ]
        return sorted(found, key=lambda t: (t.role, t.index))

    async def active_tasks(self) -> list[TaskRecord]:
        return [
            task_record(copy.deepcopy(d))
            for d in self.tasks.values()
            if d["state"] in {s.value for s in ACTIVE_TASK_STATES}
        ]

    async def transition(
        self, task: TaskRecord, state: TaskState, **fields: Any
    ) -> TaskRecord | None:
        new, _ = _advance(task, state, fields)  # an invalid move is refused either way
        doc = self.tasks.get(task.id)
        if doc is None or doc["seq"] != task.seq:
            return None
        self.tasks[task.id] = task_doc(dataclasses.replace(new, published_seq=doc["published_seq"]))
        return new

    async def mark_published(self, id: str, seq: int) -> None:
        doc = self.tasks.get(id)
        if doc and doc["seq"] == seq:
            doc.update(published_seq=seq, outbox=False)

    async def unpublished_tasks(self) -> list[TaskRecord]:
        return [task_record(copy.deepcopy(d)) for d in self.tasks.values() if d["outbox"]]


def _placements_json(tasks: Sequence[TaskPlacement]) -> str:
    return json.dumps([t.model_dump(mode="json") for t in tasks])
