"""Subject names. Every subject carries the job id, so consumers can filter and order
per job: ``yard.job.<job_id>.<event>`` for events, ``yard.cmd.<job_id>.<command>`` for
control commands. Besides: ``yard.submit.<user>.<submission id>``, an external
producer's submission (any dialect's payload, the user taken from the subject, which
only that producer may publish to); ``yard.replay.<durable>.<rest>``, a dead letter an
admin sends back to the consumer that gave up on it; and, in a stream of their own,
``yard.dead.<durable>.<original subject>``, the dead letters."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .events import COMMAND_TYPES, Event

STREAM = "YARD"
SUBMIT_PREFIX = "yard.submit"
REPLAY_PREFIX = "yard.replay"
STREAM_SUBJECTS = ["yard.job.>", "yard.cmd.>", f"{SUBMIT_PREFIX}.>", f"{REPLAY_PREFIX}.>"]
DEAD_LETTER_STREAM = "YARD_DEAD"
DEAD_LETTER_PREFIX = "yard.dead"

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def subject_for(event: Event) -> str:
    if not _TOKEN.match(event.job_id):
        # A '.', '*' or '>' in a job id would change which consumers see the message.
        raise ValueError(f"job id {event.job_id!r} is not a valid subject token")
    prefix = "yard.cmd" if isinstance(event, COMMAND_TYPES) else "yard.job"
    return f"{prefix}.{event.job_id}.{event.subject_suffix}"


def events_of(*suffixes: str) -> list[str]:
    """Filter subjects for the given event suffixes, across every job."""
    return [f"yard.job.*.{suffix}" for suffix in suffixes]


def commands_of(*suffixes: str) -> list[str]:
    return [f"yard.cmd.*.{suffix}" for suffix in suffixes]


def subjects_for(types: Iterable[type[Event]]) -> list[str]:
    """The filter subjects that deliver exactly these event and command types: a
    consumer's subscription derived from its handler table, so a handler cannot be added
    without the subject that feeds it (nor a subject consumed with nothing to handle it)."""
    found = []
    for kind in types:
        prefix = "yard.cmd" if issubclass(kind, COMMAND_TYPES) else "yard.job"
        found.append(f"{prefix}.*.{kind.subject_suffix}")
    return sorted(set(found))


def submissions() -> list[str]:
    return [f"{SUBMIT_PREFIX}.*.*"]


def submit_subject(user: str, submission_id: str) -> str:
    for token in (user, submission_id):
        if not _TOKEN.match(token):
            raise ValueError(f"{token!r} is not a valid subject token")
    return f"{SUBMIT_PREFIX}.{user}.{submission_id}"


def replay_subject(durable: str, rest: str) -> str:
    return f"{REPLAY_PREFIX}.{durable}.{rest}"


def replays_of(durable: str) -> str:
    return replay_subject(durable, ">")


def dead_letter_subject(durable: str, original: str) -> str:
    return f"{DEAD_LETTER_PREFIX}.{durable}.{original}"


ALL_EVENTS = "yard.job.>"
ALL_COMMANDS = "yard.cmd.>"


def subject_template(subject: str) -> str:
    """A subject with its job, user or id tokens named, not spelled: what a span's name
    carries (one name per kind of message, whatever job it is for)."""
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] == "yard" and parts[1] in ("job", "cmd"):
        return f"yard.{parts[1]}.{{job_id}}.{parts[3]}"
    if len(parts) == 4 and f"{parts[0]}.{parts[1]}" == SUBMIT_PREFIX:
        return f"{SUBMIT_PREFIX}.{{user}}.{{submission_id}}"
    return subject
