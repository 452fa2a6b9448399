"""The launcher's side of a retry, over the in-memory store and a scripted backend: the
failed attempt's verdict and retry are stored, then JobRetrying (not JobFinished) is
published under a derived id; the next attempt's JobPlaced starts new tasks with the new
TRAINYARD_ATTEMPT; a stop between attempts keeps the next one from starting."""

from __future__ import annotations

from trainyard_common.events import (
    FailureClass,
    JobFinished,
    JobPlaced,
    JobRetrying,
    JobState,
    PortAssignment,
    StopJob,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, RestartPolicy, RoleSpec
from trainyard_launcher.adapters.backend import TaskStatus
from trainyard_launcher.adapters.store import JOB_FINISHED
from trainyard_launcher.handlers import adopt, check_tasks, launch_job, stop_job

from ..support.bus import RECEIVED
from ..support.launcher import make_deps


def placed(
    attempt: int = 1, retry_limit: int = 2, policy: RestartPolicy = RestartPolicy.ON_FAILURE
) -> JobPlaced:
    spec = JobSpec(
        name="train",
        user="alice",
        retry_limit=retry_limit,
        roles=[RoleSpec(name="worker", replicas=2, command="run", restart_policy=policy)],
    )
    tasks = [TaskPlacement(role="worker", index=i, node="n1", host_ip="127.0.0.1") for i in (0, 1)]
    return JobPlaced(
        event_id=derived_id("j1", attempt, "placed"),
        job_id="j1",
        attempt=attempt,
        spec=spec,
        tasks=tasks,
    )


def end(backend, attempt: int, index: int, **status) -> None:
    backend.status[f"j1:{attempt}:worker:{index}"] = TaskStatus(
        running=False, ended_at=1.0, **status
    )


def of(published, kind):
    return [e for e in published if isinstance(e, kind)]


async def test_a_failed_attempt_is_retried_instead_of_finished() -> None:
    deps, backend, published = make_deps()
    deps.retry_backoff_s = 0.5
    await launch_job(placed(), RECEIVED, deps)
    end(backend, 1, 1, exit_code=3)
    await check_tasks(deps)
    assert of(published, JobFinished) == []
    [retry] = of(published, JobRetrying)
    assert retry.event_id == derived_id("j1", 1, "retry")
    assert (retry.attempt, retry.previous_attempt, retry.failure_class) == (2, 1, FailureClass.USER)
    assert "retrying as attempt 2 of at most 3 after 0.5s" in retry.reason
    assert (retry.not_before - retry.occurred_at).total_seconds() < 1.0
    failed = [e for e in of(published, TaskStateChanged) if e.state is TaskState.FAILED]
    assert [(e.index, e.failure_class) for e in failed] == [(1, FailureClass.USER)]
    stopped = [e for e in of(published, TaskStateChanged) if e.state is TaskState.STOPPED]
    assert stopped[0].failure_class is None
    assert stopped[0].reason.startswith("stopped because attempt 1 failed: ")
    assert published[-1] is retry
    job = await deps.store.get_job("j1")
    assert job.state == JOB_FINISHED and job.retry is not None and job.finished_published

    # A restarted launcher re-publishes the same JobRetrying when it had not been marked.
    deps.store.jobs["j1"]["finished_published"] = False
    await adopt(deps)
    assert [e.event_id for e in of(published, JobRetrying)] == [retry.event_id] * 2
    assert of(published, JobRetrying)[1] == retry

    # The next attempt: new tasks, the new TRAINYARD_ATTEMPT.
    launches = len(backend.launches)
    await launch_job(placed(attempt=2), RECEIVED, deps)
    new = backend.launches[launches:]
    assert [key for key, _, _ in new] == ["j1:2:worker:0", "j1:2:worker:1"]
    assert {env["TRAINYARD_ATTEMPT"] for _, _, env in new} == {"2"}
    # A late JobPlaced of the old attempt launches nothing.
    await launch_job(placed(attempt=1), RECEIVED, deps)
    assert len(backend.launches) == launches + 2
    end(backend, 2, 0, exit_code=0)
    end(backend, 2, 1, exit_code=0)
    await check_tasks(deps)
    [done] = of(published, JobFinished)
    assert (done.attempt, done.state, done.failure_class) == (2, JobState.SUCCEEDED, None)


async def test_the_last_attempt_finishes_the_job_with_the_attempts_in_its_reason() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(attempt=3), RECEIVED, deps)
    end(backend, 3, 0, exit_code=1)
    await check_tasks(deps)
    assert of(published, JobRetrying) == []
    [done] = of(published, JobFinished)
    assert (done.state, done.attempt, done.failure_class) == (JobState.FAILED, 3, FailureClass.USER)
    assert done.reason.endswith("; gave up after 3 attempt(s): the retry limit of 2 is used up")


async def test_a_lost_task_is_a_platform_failure_retried_under_restart_policy_never() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(policy=RestartPolicy.NEVER), RECEIVED, deps)
    backend.status["j1:1:worker:0"] = TaskStatus(running=False, lost=True)
    await check_tasks(deps)
    [retry] = of(published, JobRetrying)
    assert retry.failure_class is FailureClass.PLATFORM
    [lost] = [e for e in of(published, TaskStateChanged) if e.state is TaskState.FAILED]
    assert lost.failure_class is FailureClass.PLATFORM and lost.reason.startswith("lost")


async def test_a_port_that_cannot_be_bound_is_a_platform_failure() -> None:
    deps, backend, published = make_deps()
    event = placed(policy=RestartPolicy.NEVER)
    event.tasks[0].ports.append(PortAssignment(label="http", ports=[30001]))
    backend.busy_ports.add(30001)
    await launch_job(event, RECEIVED, deps)
    [failed] = [e for e in of(published, TaskStateChanged) if e.state is TaskState.FAILED]
    assert failed.failure_class is FailureClass.PLATFORM
    assert of(published, JobRetrying)[0].failure_class is FailureClass.PLATFORM


async def test_a_user_failure_under_restart_policy_never_ends_the_job() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(policy=RestartPolicy.NEVER), RECEIVED, deps)
    end(backend, 1, 0, exit_code=2)
    await check_tasks(deps)
    assert of(published, JobRetrying) == []
    [done] = of(published, JobFinished)
    assert "not retried after attempt 1: user failures are not retried" in done.reason


async def test_a_stop_between_attempts_keeps_the_next_one_from_starting() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    end(backend, 1, 0, exit_code=1)
    await check_tasks(deps)
    assert len(of(published, JobRetrying)) == 1
    await stop_job(StopJob(job_id="j1", requested_by="alice", reason="enough"), RECEIVED, deps)
    launches = len(backend.launches)
    await launch_job(placed(attempt=2), RECEIVED, deps)
    assert len(backend.launches) == launches
    [done] = of(published, JobFinished)
    assert (done.attempt, done.state, done.reason) == (2, JobState.STOPPED, "enough")
    assert done.event_id == derived_id("j1", 2, "finished")
