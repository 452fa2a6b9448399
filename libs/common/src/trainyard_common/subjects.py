"""Subject names: ``yard.job.<event>`` for events, ``yard.cmd.<command>`` for control
commands, one subject per kind of message. The job id is in the event, not the subject:
JetStream keeps an index of every subject its stream holds in memory, and with the job
id in the subject (as before 2026-11-28) that index grew by ~2.5 kB a job for as long as
the stream kept the job's messages (for ever: `bench/README.md`, "NATS's memory and the
subjects"). Consumers filter by kind; nothing reads a job's messages by subject.

Besides: ``yard.submit.<user>.<submission id>``, an external producer's submission (any
dialect's payload, the user taken from the subject, which only that producer may publish
to); ``yard.replay.<durable>.<rest>``, a dead letter an admin sends back to the consumer
that gave up on it; and, in a stream of their own, ``yard.dead.<durable>.<original
subject>``, the dead letters."""

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
_KINDS = ("yard.job", "yard.cmd")


def subject_for(event: Event) -> str:
    if not _TOKEN.match(event.job_id):
        # Checked at every publish and delivery: a job id also names the job's files,
        # pods and URLs.
        raise ValueError(f"job id {event.job_id!r} is not a valid token")
    prefix = "yard.cmd" if isinstance(event, COMMAND_TYPES) else "yard.job"
    return f"{prefix}.{event.subject_suffix}"


def events_of(*suffixes: str) -> list[str]:
    """The subjects of the given event suffixes."""
    return [f"yard.job.{suffix}" for suffix in suffixes]


def commands_of(*suffixes: str) -> list[str]:
    return [f"yard.cmd.{suffix}" for suffix in suffixes]


def subjects_for(types: Iterable[type[Event]]) -> list[str]:
    """The subjects that carry exactly these event and command types: a consumer's
    subscription derived from its handler table, so a handler cannot be added without
    the subject that feeds it (nor a subject consumed with nothing to handle it)."""
    found = []
    for kind in types:
        prefix = "yard.cmd" if issubclass(kind, COMMAND_TYPES) else "yard.job"
        found.append(f"{prefix}.{kind.subject_suffix}")
    return sorted(set(found))


def earlier_subject_for(event: Event) -> str:
    """The subject ``event`` had before 2026-11-28: the job id after the kind (what a
    stream may still hold; tests and ``bench/nats_subjects.py`` publish it)."""
    kind, suffix = subject_for(event).rsplit(".", 1)
    return f"{kind}.{event.job_id}.{suffix}"


def with_earlier_forms(subjects: Iterable[str]) -> list[str]:
    """``subjects`` and, for each event or command subject, the form it had before
    2026-11-28 (``yard.job.<job_id>.<event>``): a consumer's filters, so that messages a
    stream took before the upgrade and no consumer had yet handled are still delivered."""
    found = list(subjects)
    for subject in list(found):
        prefix, _, suffix = subject.rpartition(".")
        if prefix in _KINDS and suffix not in ("*", ">"):
            found.append(f"{prefix}.*.{suffix}")
    return found


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
    """A subject with its user or id tokens named, not spelled: what a span's name
    carries (one name per kind of message). An event's subject is its own template; one
    of the earlier form reads as today's."""
    parts = subject.split(".")
    if len(parts) == 4 and f"{parts[0]}.{parts[1]}" in _KINDS:
        return f"{parts[0]}.{parts[1]}.{parts[3]}"
    if len(parts) == 4 and f"{parts[0]}.{parts[1]}" == SUBMIT_PREFIX:
        return f"{SUBMIT_PREFIX}.{{user}}.{{submission_id}}"
    return subject
