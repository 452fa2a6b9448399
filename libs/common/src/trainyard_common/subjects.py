"""Subject names. Every subject carries the job id, so consumers can filter and order
per job: ``yard.job.<job_id>.<event>`` for events, ``yard.cmd.<job_id>.<command>`` for
control commands."""

from __future__ import annotations

import re

from .events import COMMAND_TYPES, Event

STREAM = "YARD"
STREAM_SUBJECTS = ["yard.job.>", "yard.cmd.>"]

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


ALL_EVENTS = "yard.job.>"
ALL_COMMANDS = "yard.cmd.>"
