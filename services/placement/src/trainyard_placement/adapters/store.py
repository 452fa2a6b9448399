"""Placement state in the store (SQLite or MongoDB): one document per job (``jobs``).

``{_id: job_id, state, attempt, arrival_seq, spec, allocation, reasons,
placed_published, queued_notices, stopped_in_queue, not_before}``; ``spec`` is the JobSpec as a
JSON string so env names with '.' or '$' never become document keys. Every change of
``state`` is a conditional update on the state it leaves, so a redelivered event or a
restarted process cannot apply a transition twice (no transactions in FerretDB v1). A
retry moves a placed attempt back to queued as the next attempt (``requeue``), guarded
by the attempt it leaves; ``not_before`` is when its backoff ends.

Control (docs/lifecycle.md): a placed attempt being interrupted is ``interrupting`` (it
keeps its allocation, and ``interrupt`` says why, until the launcher's JobInterrupted);
a paused job is ``paused`` (no allocation) until a resume queues its next attempt.
``retries_used`` is the retry budget spent (only a JobRetrying spends it); ``next_spec``
is the spec a placed job's next attempt runs with (a scale), ``stop_reason`` a stop that
came while the job was interrupting. ``restarts`` holds the ids of the last RestartJobs
handled, stored with each one's effect, so a redelivered one never restarts the attempt
that it started itself.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pymongo import ASCENDING

from trainyard_common.events import TaskPlacement, utcnow
from trainyard_common.jobspec import JobSpec
from trainyard_common.lifecycle import PLACEMENT, PlacementState
from trainyard_common.lifecycle import PlacementState as P
from trainyard_common.storage import Collection, insert_once

# The states of placement's record: the lifecycle model's (trainyard_common.lifecycle).
JobStoreState = PlacementState
ACTIVE_STATES: tuple[JobStoreState, ...] = (P.QUEUED, P.PLACED, P.INTERRUPTING)


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    state: JobStoreState
    attempt: int = 1
    arrival_seq: int = 0
    spec: JobSpec | None = None  # None only on a P.STOPPED_EARLY tombstone
    allocation: tuple[TaskPlacement, ...] = ()
    reasons: tuple[str, ...] = ()
    placed_published: bool = False
    # How many JobQueued notices were published; part of their derived ids, so a job
    # whose reasons go A -> B -> A announces A again instead of being deduplicated.
    queued_notices: int = 0
    stopped_in_queue: bool = False
    # A retried attempt is not placed before this time (its backoff).
    not_before: datetime | None = None
    retries_used: int = 0
    # While interrupting: (cause, reason) of the InterruptJob sent.
    interrupt: tuple[str, str] | None = None
    next_spec: JobSpec | None = None
    stop_reason: str | None = None
    # When this attempt was placed (victims are chosen by how long they ran), how often
    # the job was preempted (kept across attempts), and, while a preemption interrupts
    # it, the job it was preempted for and whether its InterruptJob went out.
    placed_at: datetime | None = None
    preemptions: int = 0
    preempted_by: str | None = None
    interrupt_sent: bool = False
    # The ids of the RestartJobs already handled, oldest first (the last RESTARTS_KEPT).
    restarts: tuple[str, ...] = ()
    # A job without gang placement gives back each task's capacity when the task ends:
    # those tasks of the placed attempt, (role, index), never placed again.
    released: tuple[tuple[str, int], ...] = ()


def record_from_doc(doc: dict[str, Any]) -> JobRecord:
    spec = doc.get("spec")
    return JobRecord(
        job_id=doc["_id"],
        state=PlacementState(doc["state"]),
        attempt=int(doc.get("attempt", 1)),
        arrival_seq=int(doc.get("arrival_seq", 0)),
        spec=JobSpec.model_validate_json(spec) if spec else None,
        allocation=tuple(TaskPlacement.model_validate(t) for t in doc.get("allocation") or ()),
        reasons=tuple(doc.get("reasons") or ()),
        placed_published=bool(doc.get("placed_published")),
        queued_notices=int(doc.get("queued_notices", 0)),
        stopped_in_queue=bool(doc.get("stopped_in_queue")),
        not_before=doc.get("not_before"),
        # Records from before retries were counted: every earlier attempt was a retry.
        retries_used=int(doc.get("retries_used", int(doc.get("attempt", 1)) - 1)),
        interrupt=(doc["interrupt"]["cause"], doc["interrupt"]["reason"])
        if doc.get("interrupt")
        else None,
        next_spec=JobSpec.model_validate_json(doc["next_spec"]) if doc.get("next_spec") else None,
        stop_reason=doc.get("stop_reason"),
        placed_at=doc.get("placed_at"),
        preemptions=int(doc.get("preemptions", 0)),
        preempted_by=doc.get("preempted_by"),
        interrupt_sent=bool(doc.get("interrupt_sent")),
        restarts=tuple(doc.get("restarts") or ()),
        released=tuple((str(r), int(i)) for r, i in doc.get("released") or ()),
    )


def queued_doc(
    job_id: str,
    *,
    attempt: int,
    arrival_seq: int,
    spec: JobSpec,
    state: JobStoreState = P.QUEUED,
) -> dict[str, Any]:
    return {
        "_id": job_id,
        "state": state,
        "attempt": attempt,
        "arrival_seq": arrival_seq,
        "spec": spec.model_dump_json(),
        "allocation": [],
        "reasons": [],
        "placed_published": False,
        "queued_notices": 0,
        "stopped_in_queue": False,
        "retries_used": 0,
    }


def tombstone_doc(job_id: str, *, attempt: int) -> dict[str, Any]:
    return {"_id": job_id, "state": P.STOPPED_EARLY, "attempt": attempt}


class JobStore(Protocol):
    async def ensure_indexes(self) -> None:
        """The indexes its queries read, made where missing (at each start)."""

    async def add_queued(
        self,
        job_id: str,
        *,
        attempt: int,
        arrival_seq: int,
        spec: JobSpec,
        state: JobStoreState = P.QUEUED,
    ) -> bool:
        """Insert a queued (or, submitted to start paused, a paused) job; False when a
        document for it already exists."""

    async def add_tombstone(self, job_id: str, *, attempt: int) -> bool:
        """Remember a stop that came before the job; False when the job exists."""

    async def get(self, job_id: str) -> JobRecord | None: ...

    async def active(self) -> list[JobRecord]:
        """Every queued or placed job: what a restart rebuilds its state from."""

    async def mark_placed(self, job_id: str, tasks: Sequence[TaskPlacement]) -> bool:
        """queued -> placed with this allocation; False when the job was not queued."""

    async def mark_placed_published(self, job_id: str) -> None: ...

    async def note_reasons(self, job_id: str, reasons: Sequence[str], notices: int) -> None:
        """Record the reasons the last JobQueued carried (only while queued)."""

    async def mark_done(
        self, job_id: str, from_state: JobStoreState, *, stopped_in_queue: bool = False
    ) -> bool:
        """from_state -> done; False when the job was not in from_state."""

    async def requeue(
        self,
        job_id: str,
        *,
        from_attempt: int,
        attempt: int,
        not_before: datetime,
        retries_used: int | None = None,
    ) -> bool:
        """placed (or interrupting) ``from_attempt`` -> queued ``attempt`` (a retry),
        without its old allocation; False when the job was not placed in that attempt."""

    async def change(
        self,
        job_id: str,
        *,
        states: Sequence[JobStoreState],
        attempt: int,
        fields: dict[str, Any],
    ) -> bool:
        """Set ``fields`` (made by the ``*_fields`` functions below) if the job is in one
        of ``states`` in ``attempt``; False otherwise, and when the job had those values
        already (MongoDB's and SQLite's modified count: a redelivered change is False,
        so a caller that acts only on True must not be the only one to make memory
        follow the store: common.catch_up)."""


def checked(sources: Sequence[str], fields: dict[str, Any]) -> None:
    """Refuse, before anything is written, a change of state the lifecycle model does not
    have (trainyard_common.lifecycle.PLACEMENT)."""
    if "state" in fields:
        PLACEMENT.check([PlacementState(s) for s in sources], PlacementState(fields["state"]))


class DocJobStore:
    def __init__(self, collection: Collection) -> None:
        self._jobs = collection

    async def ensure_indexes(self) -> None:
        # The active jobs a leader loads when it takes over (active): with no index,
        # every job ever placed was read, at every start and failover.
        await self._jobs.create_index([("state", ASCENDING)])

    async def add_queued(
        self,
        job_id: str,
        *,
        attempt: int,
        arrival_seq: int,
        spec: JobSpec,
        state: JobStoreState = P.QUEUED,
    ) -> bool:
        doc = queued_doc(job_id, attempt=attempt, arrival_seq=arrival_seq, spec=spec, state=state)
        return bool(await insert_once(self._jobs, doc))

    async def add_tombstone(self, job_id: str, *, attempt: int) -> bool:
        return bool(await insert_once(self._jobs, tombstone_doc(job_id, attempt=attempt)))

    async def get(self, job_id: str) -> JobRecord | None:
        doc = await self._jobs.find_one({"_id": job_id})
        return record_from_doc(doc) if doc else None

    async def active(self) -> list[JobRecord]:
        cursor = self._jobs.find({"state": {"$in": list(ACTIVE_STATES)}})
        return [record_from_doc(doc) async for doc in cursor]

    async def mark_placed(self, job_id: str, tasks: Sequence[TaskPlacement]) -> bool:
        checked([P.QUEUED], {"state": P.PLACED})
        result = await self._jobs.update_one(
            {"_id": job_id, "state": P.QUEUED},
            {"$set": {
                "state": P.PLACED,
                "allocation": [t.model_dump(mode="json") for t in tasks],
                "released": [],
                "placed_published": False,
                "placed_at": utcnow(),
            }},
        )  # fmt: skip
        return result.modified_count == 1

    async def mark_placed_published(self, job_id: str) -> None:
        await self._jobs.update_one(
            {"_id": job_id, "state": P.PLACED}, {"$set": {"placed_published": True}}
        )

    async def note_reasons(self, job_id: str, reasons: Sequence[str], notices: int) -> None:
        await self._jobs.update_one(
            {"_id": job_id, "state": P.QUEUED},
            {"$set": {"reasons": list(reasons), "queued_notices": notices}},
        )

    async def mark_done(
        self, job_id: str, from_state: JobStoreState, *, stopped_in_queue: bool = False
    ) -> bool:
        checked([from_state], {"state": P.DONE})
        result = await self._jobs.update_one(
            {"_id": job_id, "state": from_state},
            {"$set": {"state": P.DONE, "stopped_in_queue": stopped_in_queue}},
        )
        return result.modified_count == 1

    async def requeue(
        self,
        job_id: str,
        *,
        from_attempt: int,
        attempt: int,
        not_before: datetime,
        retries_used: int | None = None,
    ) -> bool:
        checked([P.PLACED, P.INTERRUPTING], {"state": P.QUEUED})
        result = await self._jobs.update_one(
            {"_id": job_id, "state": {"$in": [P.PLACED, P.INTERRUPTING]}, "attempt": from_attempt},
            {"$set": requeued_fields(attempt, not_before, retries_used)},
        )
        return result.modified_count == 1

    async def change(
        self,
        job_id: str,
        *,
        states: Sequence[JobStoreState],
        attempt: int,
        fields: dict[str, Any],
    ) -> bool:
        checked(states, fields)
        result = await self._jobs.update_one(
            {"_id": job_id, "state": {"$in": list(states)}, "attempt": attempt},
            {"$set": fields},
        )
        return result.modified_count == 1


def allocation_fields(
    tasks: Sequence[TaskPlacement], released: Iterable[tuple[str, int]] = ()
) -> dict[str, Any]:
    """A placed job's allocation as it changes without gang placement: tasks placed one
    by one, and the ended ones (``released``) given back."""
    return {
        "allocation": [t.model_dump(mode="json") for t in tasks],
        "released": [list(key) for key in sorted(released)],
    }


def requeued_fields(
    attempt: int, not_before: datetime, retries_used: int | None = None
) -> dict[str, Any]:
    # An interrupt's leftovers (a size, a stop, who preempted it) belong to the attempt
    # that ended; what of them carries over is written in the same update (retry_job).
    fields = {
        "state": P.QUEUED,
        "attempt": attempt,
        "not_before": not_before,
        "allocation": [],
        "reasons": [],
        "placed_published": False,
        "queued_notices": 0,
        "interrupt": None,
        "next_spec": None,
        "stop_reason": None,
        "preempted_by": None,
    }
    if retries_used is not None:
        fields["retries_used"] = retries_used
    return fields


def paused_fields(spec: JobSpec | None = None) -> dict[str, Any]:
    """-> paused, without an allocation (with the spec a scale left for the next attempt)."""
    fields: dict[str, Any] = {
        "state": P.PAUSED,
        "allocation": [],
        "reasons": [],
        "placed_published": False,
        "queued_notices": 0,
        "interrupt": None,
        "next_spec": None,
        "not_before": None,
        "preempted_by": None,
    }
    if spec is not None:
        fields["spec"] = spec.model_dump_json()
    return fields


def interrupting_fields(cause: str, reason: str) -> dict[str, Any]:
    return {"state": P.INTERRUPTING, "interrupt": {"cause": cause, "reason": reason}}


def next_attempt_fields(attempt: int, spec: JobSpec | None = None) -> dict[str, Any]:
    """-> queued as ``attempt``, due now: an interrupt or a resume spends no retry and
    waits out no backoff (``retries_used`` is left as it is)."""
    fields: dict[str, Any] = {
        "state": P.QUEUED,
        "attempt": attempt,
        "not_before": None,
        "allocation": [],
        "reasons": [],
        "placed_published": False,
        "queued_notices": 0,
        "interrupt": None,
        "next_spec": None,
        "stop_reason": None,
        "preempted_by": None,
    }
    if spec is not None:
        fields["spec"] = spec.model_dump_json()
    return fields


def spec_fields(spec: JobSpec) -> dict[str, Any]:
    return {"spec": spec.model_dump_json()}


def next_spec_fields(spec: JobSpec) -> dict[str, Any]:
    return {"next_spec": spec.model_dump_json()}


def stop_reason_fields(reason: str) -> dict[str, Any]:
    return {"stop_reason": reason}


def preempted_fields(by: str, preemptions: int) -> dict[str, Any]:
    """With ``interrupting_fields``: the job preempted it, and the count so far (the
    no-cycles rule reads it; it outlives the attempt)."""
    return {"preempted_by": by, "preemptions": preemptions, "interrupt_sent": False}


def interrupt_sent_fields() -> dict[str, Any]:
    return {"interrupt_sent": True}


# A redelivery comes within minutes (ack wait, a few naks), long before this many more
# restarts of the same job.
RESTARTS_KEPT = 16


def restart_handled_fields(restarts: Sequence[str], event_id: str) -> dict[str, Any]:
    """With the restart's own effect (in the same update): this RestartJob is handled."""
    return {"restarts": [*restarts, event_id][-RESTARTS_KEPT:]}


@dataclass
class MemoryJobStore:
    """The same contract as :class:`DocJobStore`, in a dict (for unit tests). Documents
    are copied in and out so a caller can never change stored state by reference."""

    docs: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def ensure_indexes(self) -> None:
        return None  # a dict needs none

    async def add_queued(
        self,
        job_id: str,
        *,
        attempt: int,
        arrival_seq: int,
        spec: JobSpec,
        state: JobStoreState = P.QUEUED,
    ) -> bool:
        return self._insert(
            queued_doc(job_id, attempt=attempt, arrival_seq=arrival_seq, spec=spec, state=state)
        )

    async def add_tombstone(self, job_id: str, *, attempt: int) -> bool:
        return self._insert(tombstone_doc(job_id, attempt=attempt))

    async def get(self, job_id: str) -> JobRecord | None:
        doc = self.docs.get(job_id)
        return record_from_doc(copy.deepcopy(doc)) if doc else None

    async def active(self) -> list[JobRecord]:
        return [
            record_from_doc(copy.deepcopy(doc))
            for doc in self.docs.values()
            if doc["state"] in ACTIVE_STATES
        ]

    async def mark_placed(self, job_id: str, tasks: Sequence[TaskPlacement]) -> bool:
        return self._update(job_id, P.QUEUED, {
            "state": P.PLACED,
            "allocation": [t.model_dump(mode="json") for t in tasks],
            "released": [],
            "placed_published": False,
            "placed_at": utcnow(),
        })  # fmt: skip

    async def mark_placed_published(self, job_id: str) -> None:
        self._update(job_id, P.PLACED, {"placed_published": True})

    async def note_reasons(self, job_id: str, reasons: Sequence[str], notices: int) -> None:
        self._update(job_id, P.QUEUED, {"reasons": list(reasons), "queued_notices": notices})

    async def mark_done(
        self, job_id: str, from_state: JobStoreState, *, stopped_in_queue: bool = False
    ) -> bool:
        return self._update(
            job_id, from_state, {"state": P.DONE, "stopped_in_queue": stopped_in_queue}
        )

    async def requeue(
        self,
        job_id: str,
        *,
        from_attempt: int,
        attempt: int,
        not_before: datetime,
        retries_used: int | None = None,
    ) -> bool:
        doc = self.docs.get(job_id)
        if doc is None or doc.get("attempt", 1) != from_attempt:
            return False
        return self._update(
            job_id,
            doc["state"] if doc["state"] == P.INTERRUPTING else P.PLACED,
            requeued_fields(attempt, not_before, retries_used),
        )

    async def change(
        self,
        job_id: str,
        *,
        states: Sequence[JobStoreState],
        attempt: int,
        fields: dict[str, Any],
    ) -> bool:
        checked(states, fields)
        doc = self.docs.get(job_id)
        if doc is None or doc["state"] not in states or doc.get("attempt", 1) != attempt:
            return False
        if all(k in doc and doc[k] == v for k, v in fields.items()):
            return False  # as the real stores count it: nothing modified
        doc.update(copy.deepcopy(fields))
        return True

    def _insert(self, doc: dict[str, Any]) -> bool:
        if doc["_id"] in self.docs:
            return False
        self.docs[doc["_id"]] = copy.deepcopy(doc)
        return True

    def _update(self, job_id: str, state: str, changes: dict[str, Any]) -> bool:
        checked([state], changes)
        doc = self.docs.get(job_id)
        if doc is None or doc["state"] != state:
            return False
        doc.update(copy.deepcopy(changes))
        return True
