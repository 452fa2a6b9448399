"""Submissions that systems publish onto the bus (``yard.submit.<user>.<submission id>``).

The body is a job exactly as ``POST /v1/jobs`` takes it (any dialect, JSON or YAML; a
``Trainyard-Dialect`` header forces one). The submitting user is the subject's, which
only that user's producer identity may publish to (the bus's permissions:
bus_access.py), never the payload's; the submission id works as an ``Idempotency-Key``,
so the job id is the one ``POST /v1/jobs`` with that key would give, and a submission
delivered twice is one job. A payload that is not a job is still made a job, rejected
with the reason, so its producer finds out through the status API like any user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard_common.auth import Identity
from trainyard_common.bus import Delivery
from trainyard_common.dialects import UnknownDialect, parse_job
from trainyard_common.parsing import BodyError
from trainyard_common.subjects import SUBMIT_PREFIX

from .handlers import Deps, submit_job

DURABLE = "intake"
DIALECT_HEADER = "Trainyard-Dialect"
MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True)
class Submission:
    user: str
    submission_id: str
    payload: Any
    dialect: str | None = None


def decode_submission(data: bytes, subject: str, headers: dict[str, str]) -> Submission:
    """The submission a message carries; ValueError when it is not one (its subject)."""
    parts = subject.split(".")
    if len(parts) != 4 or ".".join(parts[:2]) != SUBMIT_PREFIX or not all(parts[2:]):
        raise ValueError(f"{subject!r} is not a submission subject")
    return Submission(parts[2], parts[3], _payload(data), headers.get(DIALECT_HEADER) or None)


def _payload(data: bytes) -> Any:
    try:
        return parse_job(data, None, MAX_BODY)
    except BodyError as exc:
        # Not a job: a job all the same, whose rejection says why.
        return {"payload": f"the submission cannot be read: {exc}"}


async def submit_published(submission: Submission, _delivery: Delivery, deps: Deps) -> None:
    identity = Identity(submission.user, admin=False)
    try:
        await submit_job(
            submission.payload,
            identity,
            deps,
            dialect=submission.dialect,
            idempotency_key=submission.submission_id,
            refuse_used_name=False,
        )
    except UnknownDialect:
        # Not a job of any dialect: a job all the same, which validation rejects with
        # every problem the canonical shape finds.
        await submit_job(
            submission.payload,
            identity,
            deps,
            dialect="native",
            idempotency_key=submission.submission_id,
        )
