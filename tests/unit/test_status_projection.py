"""What each event means for the read model (pure)."""

import random
from typing import Any

import pytest

from trainyard_common.contracts import example_events
from trainyard_common.events import (
    FailureClass,
    InterruptCause,
    JobFinished,
    JobInterrupted,
    JobQueued,
    JobState,
    TaskState,
    TaskStateChanged,
)
from trainyard_status.adapters.views import job_view
from trainyard_status.domain.projection import STATE_RANK, job_rank, project, task_id

EVENTS = {type(e).__name__: e for e in example_events()}


def test_job_states_rank_forward_and_terminal_states_rank_last() -> None:
    order = [
        JobState.SUBMITTED,
        JobState.ACCEPTED,
        JobState.QUEUED,
        JobState.PLACED,
        JobState.RUNNING,
    ]
    assert [STATE_RANK[s] for s in order] == sorted(STATE_RANK[s] for s in order)
    assert all(STATE_RANK[s] > STATE_RANK[JobState.RUNNING] for s in JobState if s.terminal)


def test_submitted_sets_the_job_fields_and_keeps_the_original() -> None:
    change = project(EVENTS["JobSubmitted"]).job
    assert change.state is JobState.SUBMITTED
    assert change.always["name"] == "pi-estimate" and change.always["user"] == "alice"
    assert change.always["dialect"] == "native"


def test_only_the_submission_sets_the_fields_lists_count_by_and_always_with_a_state() -> None:
    """A list leaves out its "state set" test (which reads every document) when it
    filters on one of these (views._list_query): no other event may set them, nor the
    submission without its state."""
    from trainyard_status.adapters.views import SUBMITTED_FIELDS

    for name, event in EVENTS.items():
        change = project(event).job
        if change is None:
            continue
        fields = {
            *change.always, *change.with_state, *change.add_to_set, *change.pull,
            *(f for group in change.ordered.values() for f in group),
            *(f for group in change.ranked.values() for f in group),
        }  # fmt: skip
        if name == "JobSubmitted":
            assert SUBMITTED_FIELDS <= fields and change.state is not None
        else:
            assert not fields & SUBMITTED_FIELDS, (name, fields & SUBMITTED_FIELDS)


@pytest.mark.parametrize(
    ("where", "tests_state"),
    [
        ({"user": "alice"}, False),
        ({"name": {"$gte": "a", "$lt": "b"}}, False),
        ({"dialect": {"$in": ["ti", "dlc"]}}, False),
        ({"labels.team": "vision"}, False),
        ({"name": {"$regex": "x", "$options": "i"}}, False),
        # These match a job seen only in part (no user, no dialect) too: it has no state.
        ({"dialect": {"$ne": "ti"}}, True),
        ({"dialect": {"$nin": ["ti"]}}, True),
        ({"queue": {"$in": ["a", None]}}, True),
        ({"queue": None}, True),
        ({"tags": "x"}, True),  # not a field only the submission sets
        ({}, True),
    ],
)
def test_a_list_leaves_out_its_state_test_only_where_a_filter_implies_it(
    where: dict[str, Any], tests_state: bool
) -> None:
    from trainyard_status.adapters.views import _list_query

    query = _list_query(None, None, dict(where))
    assert (query.get("state") == {"$ne": None}) is tests_state, query
    assert _list_query("bob", "RUNNING", dict(where))["state"] == "RUNNING"


def test_a_cursors_bound_on_the_id_keeps_the_querys_own() -> None:
    from trainyard_status.adapters.views import _and_bound

    assert _and_bound(None, "$lt", "j5") == {"$lt": "j5"}
    # An id prefix: the tighter end holds (the cursor's replaced it: other ids came in).
    prefix = {"$gte": "ab", "$lt": "ab\U0010ffff"}
    assert _and_bound(prefix, "$lt", "abc") == {"$gte": "ab", "$lt": "abc"}
    assert _and_bound(prefix, "$gt", "abc") == {**prefix, "$gt": "abc"}
    assert _and_bound({"$lt": "a"}, "$lt", "b") == {"$lt": "a"}
    # Ids (a rare label's; DLC's JobId): kept beside the bound.
    assert _and_bound({"$in": ["j1", "j7"]}, "$lt", "j5") == {"$in": ["j1", "j7"], "$lt": "j5"}
    assert _and_bound("j1", "$gt", "j0") == {"$in": ["j1"], "$gt": "j0"}


def test_a_page_searches_only_the_days_its_submission_times_can_fall_on() -> None:
    from datetime import date, datetime, timedelta, timezone

    from trainyard_status.adapters.views import _days

    first, last = date(2026, 11, 20), date(2026, 11, 29)
    every = [f"2026-11-{d}" for d in range(20, 30)]
    assert _days(first, last, None) == every
    at = datetime(2026, 11, 25, 23, 30, tzinfo=timezone(timedelta(hours=-2)))  # 26th, UTC
    assert _days(first, last, at) == ["2026-11-26"]  # a cursor's second
    assert _days(first, last, {"$lt": at}) == every[:7]  # the cursor's rest, newest first
    assert _days(first, last, {"$gt": at, "$lte": datetime(2026, 12, 9)}) == every[6:]
    assert _days(first, last, {"$gte": datetime(2026, 11, 22), "$lt": at}) == every[2:7]
    assert _days(first, last, {"$in": [at, datetime(2026, 11, 21, 1)]}) == every[1:7]
    assert _days(first, last, {"$lt": datetime(2026, 11, 1)}) == []  # before any job
    # Anything else is no bound (the query's own condition still holds).
    assert _days(first, last, {"$ne": at, "$lt": "2026-11-22", "$in": []}) == every


def test_rejected_is_terminal_with_every_error_in_the_reason() -> None:
    change = project(EVENTS["JobRejected"]).job
    assert change.state is JobState.REJECTED
    assert "$.taskRoles[0].memoryMB" in change.with_state["reason"]
    assert change.always["errors"][0]["path"] == "$.taskRoles[0].memoryMB"


def test_queued_may_repeat_at_the_same_rank() -> None:
    change = project(EVENTS["JobQueued"]).job
    assert change.state is JobState.QUEUED and change.same_rank_ok
    assert change.with_state["queue_reasons"] == ["needs 4 CPU, most free on any node is 2"]


def test_placed_creates_each_task_with_its_node_and_ports() -> None:
    changes = project(EVENTS["JobPlaced"])
    assert changes.job.state is JobState.PLACED
    assert [t.task_id for t in changes.tasks] == [
        task_id(EVENTS["JobPlaced"].job_id, 1, "worker", i) for i in (0, 1)
    ]
    assert all(t.seq is None for t in changes.tasks)  # placement fields never race a transition
    assert changes.tasks[1].fields["ports"] == [{"label": "http", "ports": [20101]}]


def test_a_partly_placed_job_says_its_tasks_wait_and_more_tasks_add_placements() -> None:
    placed = EVENTS["JobPlaced"]
    partial = placed.model_copy(update={"tasks": placed.tasks[:1]})
    assert project(placed).job.with_state["reason"] is None
    assert project(partial).job.with_state["reason"].startswith("1 of 2 tasks placed")
    more = project(EVENTS["TasksPlaced"])
    assert more.job is None  # the job's state is its tasks' to move
    assert [t.fields["index"] for t in more.tasks] == [0, 1]
    assert all(t.seq is None for t in more.tasks)


def test_a_tag_is_added_to_or_removed_from_the_set_whatever_the_state() -> None:
    tagged = EVENTS["JobTagged"]
    added = project(tagged).job
    assert (added.add_to_set, added.pull, added.state) == ({"tags": "nightly"}, {}, None)
    removed = project(tagged.model_copy(update={"present": False})).job
    assert (removed.add_to_set, removed.pull) == ({}, {"tags": "nightly"})


def test_the_images_and_commands_are_kept_as_text_for_searches() -> None:
    search = project(EVENTS["JobSubmitted"]).job.always["search"]
    assert search == {"images": "", "commands": "python3 train.py"}


def test_a_running_task_makes_the_job_running_other_transitions_do_not() -> None:
    base = EVENTS["TaskStateChanged"]
    running = base.model_copy(update={"state": TaskState.RUNNING, "seq": 2, "exit_code": None})
    assert project(running).job.state is JobState.RUNNING
    changes = project(base)
    assert changes.job is None and changes.tasks[0].seq == 3
    assert changes.tasks[0].fields["exit_code"] == 0


def test_finished_carries_reason_and_exit_code() -> None:
    change = project(EVENTS["JobFinished"]).job
    assert change.state is JobState.SUCCEEDED
    assert change.with_state["exit_code"] == 0 and change.with_state["reason"] == "all tasks ended"


def test_stop_command_is_recorded_without_moving_the_state() -> None:
    change = project(EVENTS["StopJob"]).job
    assert change.state is None and change.always == {"stop_requested_by": "alice"}
    assert isinstance(EVENTS["TaskStateChanged"], TaskStateChanged)


# --- attempts ----------------------------------------------------------------------------


def two_attempts(job_id: str = "j") -> list:
    """Attempt 1 runs and fails, is retried; attempt 2 is queued, placed, runs, succeeds."""
    by_type = {type(e).__name__: e for e in example_events()}
    sub, acc = by_type["JobSubmitted"], by_type["JobAccepted"]
    placed, retry = by_type["JobPlaced"], by_type["JobRetrying"]

    def task(attempt: int, seq: int, state: TaskState, **extra) -> TaskStateChanged:
        return TaskStateChanged(
            job_id=job_id, attempt=attempt, role="worker", index=0, seq=seq, state=state, **extra
        )

    return [
        sub.model_copy(update={"job_id": job_id}),
        acc.model_copy(update={"job_id": job_id}),
        placed.model_copy(update={"job_id": job_id}),
        task(1, 1, TaskState.STARTING),
        task(1, 2, TaskState.RUNNING),
        task(1, 3, TaskState.FAILED, exit_code=1, failure_class=FailureClass.USER),
        retry.model_copy(update={"job_id": job_id}),
        JobQueued(job_id=job_id, attempt=2, reasons=["retrying attempt 2 after backoff until x"]),
        placed.model_copy(update={"job_id": job_id, "attempt": 2}),
        task(2, 1, TaskState.STARTING),
        task(2, 2, TaskState.RUNNING),
        task(2, 3, TaskState.SUCCEEDED, exit_code=0),
        JobFinished(job_id=job_id, attempt=2, state=JobState.SUCCEEDED, reason="ok", exit_code=0),
    ]


def fold(events: list) -> tuple[str | None, int, int]:
    """The job state the view store keeps (adapters/views.py): a change applies only
    above the stored rank (or at it, where same_rank_ok)."""
    state, attempt, rank = None, 1, -1
    for event in events:
        change = project(event).job
        if change is None or change.state is None:
            continue
        if change.rank > rank or (change.same_rank_ok and change.rank == rank):
            state, rank = change.state.value, change.rank
            attempt = change.with_state.get("attempt", attempt)
    return state, attempt, rank


def test_a_later_attempt_ranks_above_every_step_of_an_earlier_one() -> None:
    steps = [
        (JobState.SUBMITTED, 1),
        (JobState.ACCEPTED, 1),
        (JobState.QUEUED, 1),
        (JobState.PLACED, 1),
        (JobState.RUNNING, 1),
        (JobState.QUEUED, 2),
        (JobState.PLACED, 2),
        (JobState.RUNNING, 2),
        (JobState.QUEUED, 3),
    ]
    ranks = [job_rank(state, attempt) for state, attempt in steps]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert all(job_rank(s, 1) > job_rank(JobState.RUNNING, 99) for s in JobState if s.terminal)


def test_retrying_puts_the_job_back_in_line_as_its_next_attempt() -> None:
    event = EVENTS["JobRetrying"]
    change = project(event).job
    assert change.state is JobState.QUEUED and change.with_state["attempt"] == 2
    # Below the new attempt's own JobQueued and JobPlaced, above all of attempt 1.
    assert job_rank(JobState.RUNNING, 1) < change.rank < job_rank(JobState.QUEUED, 2)
    assert change.with_state["reason"] == event.reason
    assert change.add_to_set["attempts"] == {
        "attempt": 1,
        "state": "FAILED",
        "reason": event.reason,
        "exit_code": None,
        "failure_class": "platform",
        "ended_at": event.occurred_at,
        "retried_as": 2,
        "not_before": event.not_before,
    }


def test_a_failed_task_and_a_failed_job_carry_their_failure_class() -> None:
    failed = TaskStateChanged(
        job_id="j",
        role="w",
        index=0,
        seq=3,
        state=TaskState.FAILED,
        exit_code=127,
        failure_class=FailureClass.USER,
    )
    assert project(failed).tasks[0].fields["failure_class"] == "user"
    assert project(EVENTS["TaskStateChanged"]).tasks[0].fields["failure_class"] is None
    finished = JobFinished(
        job_id="j", attempt=2, state=JobState.FAILED, reason="r", failure_class=FailureClass.UNKNOWN
    )
    change = project(finished).job
    assert change.with_state["failure_class"] == "unknown"
    assert change.add_to_set["attempts"]["attempt"] == 2


def test_two_attempts_end_the_same_in_any_order_and_with_repeats() -> None:
    events = two_attempts()
    expected = fold(events)
    assert expected[:2] == ("SUCCEEDED", 2)
    rng = random.Random(5)
    for _ in range(200):
        shuffled = events * 2
        rng.shuffle(shuffled)
        assert fold(shuffled) == expected
    # Before the end: attempt 2 runs, whatever attempt 1's late events say.
    running = events[:11]
    for _ in range(200):
        shuffled = running + running[:6]
        rng.shuffle(shuffled)
        assert fold(shuffled)[:2] == ("RUNNING", 2), shuffled


# --- interrupts: pause, preemption, scale ------------------------------------------------


def interrupted(attempt: int, cause: InterruptCause, job_id: str = "j") -> JobInterrupted:
    return JobInterrupted(job_id=job_id, attempt=attempt, cause=cause, reason=f"{cause.value}!")


def test_paused_ends_its_attempt_without_ending_the_job() -> None:
    assert not JobState.PAUSED.terminal
    # Above every step of its attempt, below every step of the next one.
    assert (
        job_rank(JobState.RUNNING, 1)
        < job_rank(JobState.PAUSED, 1)
        < job_rank(JobState.SUBMITTED, 2)
    )
    assert job_rank(JobState.PAUSED, 5) < job_rank(JobState.STOPPED, 1)
    changes = project(interrupted(1, InterruptCause.PAUSED))
    assert changes.job.state is JobState.PAUSED and changes.job.rank == job_rank(JobState.PAUSED, 1)
    assert changes.job.with_state["reason"] == "paused!"
    assert changes.job.add_to_set["attempts"] == {
        "attempt": 1,
        "state": "STOPPED",
        "reason": "paused!",
        "exit_code": None,
        "failure_class": None,
        "interrupted": "paused",
    }
    # The attempt's tasks that had not ended are STOPPED; the others keep their end.
    assert (changes.end_tasks.job_id, changes.end_tasks.attempt) == ("j", 1)
    assert changes.end_tasks.fields["state"] == "STOPPED"


def test_any_other_interrupt_puts_the_job_back_in_line_as_its_next_attempt() -> None:
    for cause in (InterruptCause.PREEMPTED, InterruptCause.SCALED, InterruptCause.NODE_REMOVED):
        change = project(interrupted(2, cause)).job
        assert change.state is JobState.QUEUED and change.with_state["attempt"] == 3
        assert change.with_state["reason"] == f"{cause.value}!"
        assert job_rank(JobState.PAUSED, 2) < change.rank < job_rank(JobState.QUEUED, 3)
        assert change.add_to_set["attempts"]["retried_as"] == 3


def paused_and_resumed(job_id: str = "j") -> list:
    """Attempt 1 runs and is paused; a resume queues, places and runs attempt 2."""
    events = two_attempts(job_id)
    first, second = events[:5], events[8:]
    return [
        *first,
        interrupted(1, InterruptCause.PAUSED, job_id),
        JobQueued(job_id=job_id, attempt=2),
        *second,
    ]


def test_pause_and_resume_end_the_same_in_any_order() -> None:
    events = paused_and_resumed()
    assert fold(events)[:2] == ("SUCCEEDED", 2)
    paused = events[:6]
    rng = random.Random(7)
    for _ in range(200):
        shuffled = paused * 2
        rng.shuffle(shuffled)
        assert fold(shuffled)[:2] == ("PAUSED", 1), shuffled
    resumed = events[:-1]
    for _ in range(200):
        shuffled = list(resumed)
        rng.shuffle(shuffled)
        assert fold(shuffled)[:2] == ("RUNNING", 2), shuffled


def test_a_restart_puts_the_job_back_in_line_and_is_no_retry() -> None:
    change = project(interrupted(1, InterruptCause.RESTARTED)).job
    assert change.state is JobState.QUEUED and change.with_state["attempt"] == 2
    assert change.with_state["reason"] == "restarted!"
    ended = change.add_to_set["attempts"]
    assert (ended["state"], ended["interrupted"], ended["retried_as"]) == (
        "STOPPED",
        "restarted",
        2,
    )
    view = job_view({"_id": "j", "attempt": 2, "attempts": [ended]}, [])
    assert (view["attempt"], view["retries"]) == (2, 0)
    # Attempt 1 runs and is restarted; attempt 2 is placed and runs, in any order.
    events = two_attempts()
    restarted = [*events[:5], interrupted(1, InterruptCause.RESTARTED), *events[8:-2]]
    assert fold(restarted)[:2] == ("RUNNING", 2)
    rng = random.Random(11)
    for _ in range(200):
        shuffled = restarted * 2
        rng.shuffle(shuffled)
        assert fold(shuffled)[:2] == ("RUNNING", 2), shuffled


def test_a_jobs_state_as_of_any_past_moment() -> None:
    from datetime import timedelta

    from trainyard_status.domain.projection import job_as_of

    start = EVENTS["JobSubmitted"].occurred_at
    steps = [
        EVENTS[name].model_copy(update={"job_id": "j", "occurred_at": start + timedelta(seconds=i)})
        for i, name in enumerate(["JobSubmitted", "JobAccepted", "JobQueued", "JobPlaced"])
    ]
    running = TaskStateChanged(
        job_id="j", role="worker", index=0, state=TaskState.RUNNING, seq=2,
        occurred_at=start + timedelta(seconds=4),
    )  # fmt: skip
    done = JobFinished(
        job_id="j", state=JobState.SUCCEEDED, reason="all ended", exit_code=0,
        occurred_at=start + timedelta(seconds=5),
    )  # fmt: skip
    history = [*steps, running, done]
    assert job_as_of(history, start - timedelta(seconds=1)) is None
    as_of = {
        s: job_as_of(history, start + timedelta(seconds=s, milliseconds=500)) for s in range(6)
    }
    assert [as_of[s]["state"] for s in range(6)] == [
        "SUBMITTED", "ACCEPTED", "QUEUED", "PLACED", "RUNNING", "SUCCEEDED",
    ]  # fmt: skip
    assert as_of[2]["queue_reasons"] == list(EVENTS["JobQueued"].reasons)
    assert as_of[5]["reason"] == "all ended"
    # In whatever order the stream holds them, the same answer (the rank rule).
    shuffled = history[:]
    random.Random(7).shuffle(shuffled)
    assert job_as_of(shuffled, start + timedelta(seconds=10))["state"] == "SUCCEEDED"
    assert job_as_of(shuffled, start + timedelta(seconds=3.5))["state"] == "PLACED"
