"""Each consumer's subscription is derived from its handler table: every event its
table handles reaches it, and nothing else does (checked with NATS's own wildcard rules
on one real subject of every event type)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trainyard_common.contracts import example_events
from trainyard_common.events import EVENT_TYPES, Event
from trainyard_common.subjects import (
    earlier_subject_for,
    subject_for,
    subjects_for,
    with_earlier_forms,
)
from trainyard_launcher import handlers as launcher
from trainyard_launcher.handlers import EVENT_HANDLERS as LAUNCHER
from trainyard_placement import handlers as placement
from trainyard_placement.handlers import EVENT_HANDLERS as PLACEMENT
from trainyard_validation import handlers as validation
from trainyard_validation.handlers import EVENT_HANDLERS as VALIDATION


def matches(filter_subject: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` the rest (one or more)."""
    wanted, tokens = filter_subject.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(tokens) == len(wanted)


def delivered(
    subjects: list[str], events: list[Event], subject: Callable[[Event], str] = subject_for
) -> set[type[Event]]:
    return {type(e) for e in events if any(matches(f, subject(e)) for f in subjects)}


def test_the_matcher_follows_nats() -> None:
    assert matches("yard.job.*.placed", "yard.job.j1.placed")
    assert not matches("yard.job.*.placed", "yard.job.j1.placed.x")
    assert not matches("yard.job.*.placed", "yard.cmd.j1.placed")
    assert matches("yard.job.>", "yard.job.j1.task")
    assert not matches("yard.job.>", "yard.job")


def test_every_event_type_has_an_example() -> None:
    # So the checks below see every type there is.
    assert {type(e) for e in example_events()} == set(EVENT_TYPES)


@pytest.mark.parametrize(
    "table", [LAUNCHER, PLACEMENT, VALIDATION], ids=["launcher", "placement", "validation"]
)
def test_a_subscription_delivers_exactly_what_its_table_handles(table: dict) -> None:
    assert delivered(subjects_for(table), example_events()) == set(table)


def test_the_services_consume_what_their_tables_derive() -> None:
    # Each service's __main__ consumes its handlers' SUBJECTS.
    assert launcher.SUBJECTS == subjects_for(LAUNCHER)
    assert placement.SUBJECTS == subjects_for(PLACEMENT)
    assert validation.SUBJECTS == subjects_for(VALIDATION)


@pytest.mark.parametrize(
    "table", [LAUNCHER, PLACEMENT, VALIDATION], ids=["launcher", "placement", "validation"]
)
def test_a_consumer_still_gets_what_the_stream_took_in_the_earlier_form(table: dict) -> None:
    filters = with_earlier_forms(subjects_for(table))
    assert delivered(filters, example_events()) == set(table)
    assert delivered(filters, example_events(), earlier_subject_for) == set(table)
    # Without the earlier forms, those messages would wait for ever.
    assert delivered(subjects_for(table), example_events(), earlier_subject_for) == set()


def test_no_subject_carries_the_job_id() -> None:
    # Every job would add its own subjects to the index JetStream keeps in memory.
    for event in example_events():
        assert event.job_id not in subject_for(event)
        assert len(subject_for(event).split(".")) == 3


@pytest.mark.parametrize("job_id", ["a.b", "../x", "j*", ""])
def test_a_job_id_that_is_no_token_is_never_published(job_id: str) -> None:
    event = example_events()[0].model_copy(update={"job_id": job_id})
    with pytest.raises(ValueError, match="not a valid token"):
        subject_for(event)
