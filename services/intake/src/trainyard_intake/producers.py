"""Submissions that systems publish onto the bus (``yard.submit.<user>.<submission id>``).

The body is a job exactly as ``POST /v1/jobs`` takes it (any dialect, JSON or YAML; a
``Trainyard-Dialect`` header forces one). The submitting user is the subject's, which
only that user's producer identity may publish to (the bus's permissions:
bus_access.py), never the payload's; the submission id works as an ``Idempotency-Key``,
so the job id is the one ``POST /v1/jobs`` with that key would give, and a submission
delivered twice is one job. A payload that is not a job (unreadable, of no dialect, too large for
the bus) is still made a job, rejected with the reason, so its producer finds out
through the status API like any user.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from trainyard_common.auth import Identity
from trainyard_common.bus import Delivery
from trainyard_common.dialects import UnknownDialect, parse_job
from trainyard_common.dialects.translation import Translation, empty_spec
from trainyard_common.events import FieldIssue
from trainyard_common.parsing import BodyError
from trainyard_common.subjects import SUBMIT_PREFIX

from .handlers import Deps, PayloadTooLarge, submit_job

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
        return Unreadable(f"the submission cannot be read: {exc}")


@dataclass(frozen=True)
class Unreadable:
    """A message that holds no job: why."""

    reason: str


async def submit_published(submission: Submission, _delivery: Delivery, deps: Deps) -> None:
    identity = Identity(submission.user, admin=False)
    # Nobody to answer: a name already used is the job's error, never NameTaken (a claim
    # won meanwhile by another job raises it all the same, and the redelivery finds the
    # holder and says so).
    submit = partial(
        submit_job,
        identity=identity,
        deps=deps,
        idempotency_key=submission.submission_id,
        refuse_used_name=False,
    )
    payload = submission.payload
    try:
        if isinstance(payload, Unreadable):
            await _refuse(submit, identity, "$", "unreadable", payload.reason)
            return
        try:
            await submit(payload, dialect=submission.dialect)
        except UnknownDialect:
            # Not a job of any dialect: a job all the same, which validation rejects
            # with every problem the canonical shape finds.
            await submit(payload, dialect="native")
    except PayloadTooLarge as exc:
        # Retrying cannot make it smaller: a job all the same, without the payload (what
        # is too large), rejected with the reason, as any user finds out.
        await _refuse(submit, identity, "$", "too_large", str(exc))


async def _refuse(
    submit: Callable[..., Awaitable[Any]], identity: Identity, path: str, code: str, reason: str
) -> None:
    """Submit a job that is only its rejection: validation rejects it with ``reason``."""
    issue = FieldIssue(path=path, message=reason, code=code)
    translation = Translation(empty_spec(user=identity.user), "native", [issue])
    await submit({}, translation=translation)
