"""The start deadline: every task must run its command within YARD_START_DEADLINE_S of
the placement; otherwise the attempt fails as a platform failure (so it is retried while
the budget lasts), naming the late tasks and what they were doing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainyard_common.events import (
    Event,
    FailureClass,
    JobFinished,
    JobPlaced,
    JobRetrying,
    JobState,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher.adapters.store import JOB_RUNNING, JobRecord, now_ms
from trainyard_launcher.domain.failure import EndKind, classify
from trainyard_launcher.domain.lifecycle import (
    StartView,
    late_tasks,
    start_deadline,
    start_deadline_reason,
)
from trainyard_launcher.handlers import (
    Deps,
    check_deadlines,
    check_start_deadlines,
    check_tasks,
    launch_job,
)

from ..support.bus import RECEIVED
from ..support.launcher import make_deps

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def test_the_deadline_counts_from_the_placement() -> None:
    assert start_deadline(T0, 600) == T0 + timedelta(seconds=600)
    assert start_deadline(T0, 0) is None
    assert start_deadline(None, 600) is None


def test_late_tasks_are_those_not_yet_running_their_command() -> None:
    views = [
        StartView("w", 1, TaskState.STARTING),
        StartView("w", 0, TaskState.RUNNING, command_started=False, step="$ pip install torch"),
        StartView("ps", 0, TaskState.RUNNING, command_started=True),
        StartView("w", 2, TaskState.FAILED),  # ended on its own: the rules judge it
    ]
    late = late_tasks(views)
    assert [(t.role, t.index) for t in late] == [("w", 0), ("w", 1)]
    assert start_deadline_reason(600, late) == (
        "not all tasks started within 600s: w[0] still preparing ($ pip install torch), "
        "w[1] still STARTING (not spawned yet)"
    )


def test_a_start_timeout_is_a_platform_failure() -> None:
    assert classify(None, None, EndKind.START_TIMEOUT) is FailureClass.PLATFORM


def past_the_deadline(deps: Deps) -> None:
    """Move the launcher's clock 61 s past the real now (the tests' deadlines are 60 s)."""
    later = now_ms() + timedelta(seconds=61)
    deps.clock = lambda: later


def placed(retry_limit: int = 0, job_id: str = "j1") -> JobPlaced:
    spec = JobSpec(
        name="train",
        user="alice",
        retry_limit=retry_limit,
        roles=[RoleSpec(name="w", replicas=2, command="run")],
    )
    tasks = [TaskPlacement(role="w", index=i, node="n1", host_ip="127.0.0.1") for i in (0, 1)]
    return JobPlaced(
        event_id=derived_id(job_id, 1, "placed"), job_id=job_id, spec=spec, tasks=tasks
    )


async def test_an_attempt_whose_task_still_prepares_past_the_deadline_fails() -> None:
    deps, backend, published = make_deps()
    deps.start_deadline_s = 60
    await launch_job(placed(), RECEIVED, deps)
    backend.preparing["j1:1:w:1"] = "$ pip install torch"
    past_the_deadline(deps)
    await check_start_deadlines(deps)

    [end] = [e for e in published if isinstance(e, JobFinished)]
    assert end.state is JobState.FAILED and end.failure_class is FailureClass.PLATFORM
    assert end.reason == (
        "not all tasks started within 60s: w[1] still preparing ($ pip install torch)"
    )
    tasks = {(e.index, e.state): e for e in published if isinstance(e, TaskStateChanged)}
    assert tasks[(1, TaskState.FAILED)].failure_class is FailureClass.PLATFORM
    assert (0, TaskState.STOPPED) in tasks  # the one that started is stopped with the job
    assert "j1:1:w:1" in backend.killed


async def test_a_start_timeout_is_retried_while_the_budget_lasts() -> None:
    deps, backend, published = make_deps()
    deps.start_deadline_s = 60
    await launch_job(placed(retry_limit=1), RECEIVED, deps)
    backend.preparing["j1:1:w:0"] = "$ git clone repo"
    past_the_deadline(deps)
    await check_start_deadlines(deps)
    [retry] = [e for e in published if isinstance(e, JobRetrying)]
    assert retry.failure_class is FailureClass.PLATFORM and retry.attempt == 2


async def test_tasks_that_all_started_are_not_failed_and_not_looked_at_again() -> None:
    deps, backend, published = make_deps()
    deps.start_deadline_s = 60
    await launch_job(placed(), RECEIVED, deps)
    past_the_deadline(deps)
    await check_start_deadlines(deps)
    assert deps.start_deadlines[("j1", 1)] is None
    backend.preparing["j1:1:w:1"] = "never looked at"
    past_the_deadline(deps)
    await check_start_deadlines(deps)
    await check_tasks(deps)
    assert not [e for e in published if isinstance(e, JobFinished)]


async def test_no_deadline_before_its_time() -> None:
    deps, backend, published = make_deps()
    deps.start_deadline_s = 600
    await launch_job(placed(), RECEIVED, deps)
    backend.preparing["j1:1:w:1"] = "$ pip install torch"
    past_the_deadline(deps)
    await check_start_deadlines(deps)
    assert not [e for e in published if isinstance(e, JobFinished)]


def failing_once(deps: Deps, kind: type) -> None:
    """The bus refuses the first event of ``kind`` the launcher publishes."""
    publish, refused = deps.publish, []

    async def flaky(event: Event) -> None:
        if isinstance(event, kind) and not refused:
            refused.append(event)
            raise ConnectionError("nats: no servers available")
        await publish(event)

    deps.publish = flaky


@pytest.mark.parametrize("deadline", ["start", "run"])
async def test_a_deadlines_end_that_could_not_be_published_is_published_later(
    deadline: str,
) -> None:
    deps, backend, published = make_deps()
    event = placed()
    if deadline == "start":
        deps.start_deadline_s = 60
        backend.preparing["j1:1:w:1"] = "$ pip install torch"
        check, said = check_start_deadlines, "not all tasks started"
    else:
        event.spec.max_running_minutes = 1
        check, said = check_deadlines, "maximum running time of 1 minute"
    await launch_job(event, RECEIVED, deps)
    past_the_deadline(deps)
    failing_once(deps, JobFinished)
    with pytest.raises(ConnectionError):
        await check(deps)
    assert not [e for e in published if isinstance(e, JobFinished)]
    # The verdict is stored (the job no longer runs): the deadline is not looked at
    # again, the watcher's next round publishes the end.
    await check(deps)
    await check_tasks(deps)
    [end] = [e for e in published if isinstance(e, JobFinished)]
    assert end.state is JobState.FAILED and said in end.reason


async def test_an_attempt_the_backend_cannot_open_is_failed_by_the_start_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its tasks were recorded STARTING and never watched: each redelivery failed the
    # same way until the dead letters, and the attempt held its placement for ever.
    deps, backend, published = make_deps()
    deps.start_deadline_s = 60

    async def cannot(_attempt: object) -> None:
        raise ConnectionError("the API server is not answering")

    monkeypatch.setattr(backend, "open_attempt", cannot)
    with pytest.raises(ConnectionError):
        await launch_job(placed(retry_limit=1), RECEIVED, deps)
    assert deps.watching == {} and ("j1", 1) in deps.starting
    past_the_deadline(deps)
    await check_start_deadlines(deps)
    [retry] = [e for e in published if isinstance(e, JobRetrying)]
    assert retry.failure_class is FailureClass.PLATFORM and "not all tasks started" in retry.reason
    assert deps.starting == set()
    # Without a start deadline nothing waits on such an attempt, and nothing of it is
    # kept: it stayed in the start watch for the launcher's life.
    deps.start_deadline_s = 0
    with pytest.raises(ConnectionError):
        await launch_job(placed(job_id="j2"), RECEIVED, deps)
    await check_start_deadlines(deps)
    assert deps.starting == set()


async def test_an_attempt_whose_tasks_all_started_leaves_the_start_watch_at_once() -> None:
    deps, _backend, _published = make_deps()
    deps.start_deadline_s = 60
    await launch_job(placed(), RECEIVED, deps)
    assert deps.starting == set() and len(deps.watching) == 2


async def test_a_starting_attempt_with_no_task_recorded_yet_gets_its_deadline_later() -> None:
    # Its first try failed before any task was recorded: "no deadline" was cached then,
    # and kept after a redelivery recorded the tasks.
    deps, _backend, _published = make_deps()
    deps.start_deadline_s = 60
    deps.starting.add(("j1", 1))
    await deps.store.insert_job(JobRecord(job_id="j1", attempt=1, state=JOB_RUNNING))
    await check_start_deadlines(deps)
    assert ("j1", 1) not in deps.start_deadlines and ("j1", 1) in deps.starting
    # And an attempt that ended before any task was recorded is let go.
    deps.starting.add(("gone", 1))
    await check_start_deadlines(deps)
    assert ("gone", 1) not in deps.starting
