"""Failure classification and retry decisions (launcher domain/failure.py), as tables."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from trainyard_common.events import FailureClass, JobState, TaskState
from trainyard_common.jobspec import RETRY_ALWAYS, RETRY_UNLIMITED, JobSpec, RestartPolicy, RoleSpec
from trainyard_launcher.domain.completion import TaskOutcome, Verdict, decide
from trainyard_launcher.domain.failure import (
    EndKind,
    backoff_s,
    classify,
    judge,
    permanent,
    preparation_kind,
    retry_decision,
)

USER, PLATFORM, UNKNOWN = FailureClass.USER, FailureClass.PLATFORM, FailureClass.UNKNOWN
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("exit_code", "sig", "kind", "expected", "is_permanent"),
    [
        (0, None, EndKind.EXITED, None, False),
        (1, None, EndKind.EXITED, USER, False),
        (2, None, EndKind.EXITED, USER, False),
        (3, None, EndKind.EXITED, USER, False),
        (127, None, EndKind.EXITED, USER, True),  # command not found
        (126, None, EndKind.EXITED, USER, True),  # not executable
        (255, None, EndKind.EXITED, USER, False),
        (139, signal.SIGSEGV, EndKind.EXITED, USER, False),  # the program's own fault
        (139, None, EndKind.EXITED, USER, False),  # ... as a shell reports it
        (136, None, EndKind.EXITED, USER, False),  # SIGFPE
        (137, signal.SIGKILL, EndKind.EXITED, UNKNOWN, False),  # OOM killer or kill -9
        (137, None, EndKind.EXITED, UNKNOWN, False),
        (143, signal.SIGTERM, EndKind.EXITED, UNKNOWN, False),
        (130, None, EndKind.EXITED, UNKNOWN, False),  # SIGINT from outside
        (134, None, EndKind.EXITED, UNKNOWN, False),  # SIGABRT
        (None, None, EndKind.EXITED, UNKNOWN, False),  # ended without an exit code
        (137, signal.SIGKILL, EndKind.KILLED_BY_PLATFORM, PLATFORM, False),
        (None, None, EndKind.LOST, PLATFORM, False),
        (None, None, EndKind.NODE_LOST, PLATFORM, False),
        (None, None, EndKind.PORT_UNAVAILABLE, PLATFORM, False),
        (None, None, EndKind.START_FAILED, PLATFORM, False),
        (None, None, EndKind.UNSUPPORTED, USER, True),  # e.g. an oss:// data source here
        (None, None, EndKind.PREPARE_USER, USER, True),  # e.g. a package that does not exist
        (None, None, EndKind.PREPARE_UNKNOWN, UNKNOWN, False),  # e.g. no network
        (1, None, EndKind.PREPARE_UNKNOWN, UNKNOWN, False),
    ],
)
def test_classification(
    exit_code: int | None,
    sig: int | None,
    kind: EndKind,
    expected: FailureClass | None,
    is_permanent: bool,
) -> None:
    assert classify(exit_code, sig, kind) == expected
    assert permanent(exit_code, sig, kind) is is_permanent


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        (
            "dependency install failed: pip install of nosuchpkg exited with code 1: ERROR: Could not "
            "find a version that satisfies the requirement nosuchpkg",
            EndKind.PREPARE_USER,
        ),
        (
            "dependency install failed: pip install of x exited with code 1: ERROR: No matching "
            "distribution found for x",
            EndKind.PREPARE_USER,
        ),
        (
            "dependency install failed: no requirements file at /code/requirements.txt",
            EndKind.PREPARE_USER,
        ),
        (
            "code source: git clone of /nowhere at branch main failed: fatal: repository '/nowhere' "
            "does not exist",
            EndKind.PREPARE_USER,
        ),
        (
            "code source: git clone of r at branch b failed: warning: Could not find remote branch b "
            "to clone. fatal: Remote branch b not found in upstream origin",
            EndKind.PREPARE_USER,
        ),
        (
            "code source: commit abc of r cannot be checked out: fatal: reference is not a tree: abc",
            EndKind.PREPARE_USER,
        ),
        ("data_sources[0]: /mnt/x does not exist on host-1", EndKind.PREPARE_USER),
        (
            "dependency install failed: pip install of x exited with code 1: Temporary failure in "
            "name resolution",
            EndKind.PREPARE_UNKNOWN,
        ),
        (
            "code source: git clone of https://git.example/r failed: Could not resolve host",
            EndKind.PREPARE_UNKNOWN,
        ),
        ("the task's mount paths cannot be made: Operation not permitted", EndKind.PREPARE_UNKNOWN),
    ],
)
def test_a_failed_preparation_is_the_users_when_their_input_caused_it(
    reason: str, kind: EndKind
) -> None:
    assert preparation_kind(reason) is kind


def test_backoff_doubles_from_the_base_and_is_capped_at_five_minutes() -> None:
    assert [backoff_s(a) for a in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 300, 300]
    assert [backoff_s(a, 0.2) for a in (1, 2, 3)] == [0.2, 0.4, 0.8]


def job(
    retry_limit: int,
    policy: RestartPolicy = RestartPolicy.NEVER,
    codes: tuple[int, ...] = (),
    replicas: int = 1,
) -> JobSpec:
    return JobSpec(
        name="j",
        retry_limit=retry_limit,
        roles=[
            RoleSpec(
                name="w",
                replicas=replicas,
                command="train",
                restart_policy=policy,
                retryable_exit_codes=list(codes),
            )
        ],
    )


def failed(
    exit_code: int | None = 1,
    sig: int | None = None,
    kind: EndKind = EndKind.EXITED,
    at: float = 1.0,
) -> TaskOutcome:
    return TaskOutcome(
        TaskState.FAILED, exit_code, "ended", at, sig, classify(exit_code, sig, kind), kind.value
    )


def verdict_of(spec: JobSpec, outcomes: dict) -> Verdict:
    verdict = decide(spec, outcomes)
    assert verdict is not None and verdict.state is JobState.FAILED
    return verdict


N, F, A, X = (
    RestartPolicy.NEVER,
    RestartPolicy.ON_FAILURE,
    RestartPolicy.ALWAYS,
    RestartPolicy.EXIT_CODE,
)


@pytest.mark.parametrize(
    ("limit", "policy", "codes", "attempt", "outcome", "retried"),
    [
        # Platform failures: retried while the budget lasts, whatever the policy.
        (2, N, (), 1, failed(None, kind=EndKind.LOST), True),
        (2, N, (), 2, failed(None, kind=EndKind.PORT_UNAVAILABLE), True),
        (2, N, (), 3, failed(None, kind=EndKind.LOST), False),  # budget used up
        (0, N, (), 1, failed(None, kind=EndKind.LOST), False),  # no budget
        (1, X, (137,), 1, failed(None, kind=EndKind.START_FAILED), True),
        # User failures: only where the policy asks for it.
        (2, N, (), 1, failed(1), False),
        (2, F, (), 1, failed(1), True),
        (2, A, (), 1, failed(2), True),
        (2, F, (), 3, failed(1), False),
        (2, X, (130, 137, 143), 1, failed(1), False),  # not a retryable code
        (2, X, (3,), 1, failed(3), True),
        # ... and never a permanent one.
        (5, F, (), 1, failed(127), False),
        (5, F, (), 1, failed(126), False),
        (5, X, (127,), 1, failed(127), False),
        (5, F, (), 1, failed(None, kind=EndKind.PREPARE_USER), False),
        (5, F, (), 1, failed(None, kind=EndKind.UNSUPPORTED), False),
        # Unknown failures: retried, except under ExitCode with a code it does not list.
        (1, N, (), 1, failed(137, signal.SIGKILL), True),  # OOM
        (1, N, (), 1, failed(None, kind=EndKind.PREPARE_UNKNOWN), True),
        (1, X, (137,), 1, failed(137, signal.SIGKILL), True),
        (1, X, (130, 143), 1, failed(137, signal.SIGKILL), False),
    ],
)
def test_retry_decisions(
    limit: int,
    policy: RestartPolicy,
    codes: tuple[int, ...],
    attempt: int,
    outcome: TaskOutcome,
    retried: bool,
) -> None:
    spec = job(limit, policy, codes)
    outcomes = {("w", 0): outcome}
    retry = retry_decision(spec, attempt, verdict_of(spec, outcomes), outcomes, now=NOW)
    assert (retry is not None) is retried
    if retry is not None:
        assert retry.attempt == attempt + 1
        assert retry.failure_class is outcome.failure_class
        assert retry.not_before == NOW + timedelta(seconds=backoff_s(attempt))


def test_a_retry_says_why_and_when() -> None:
    spec = job(2, F)
    outcomes = {("w", 0): failed(1)}
    verdict, retry = judge(spec, 2, verdict_of(spec, outcomes), outcomes, now=NOW, base_s=0.5)
    assert retry is not None and retry.backoff_s == 1.0
    assert retry.reason.startswith("attempt 2 failed (user failure): 1 of 1 w task(s) failed")
    assert retry.reason.endswith("; retrying as attempt 3 of at most 3 after 1s")
    assert verdict.failure_class is USER


def test_the_final_reason_names_the_attempts_or_why_not_retried() -> None:
    spec = job(1, F)
    outcomes = {("w", 0): failed(1)}
    verdict, retry = judge(spec, 2, verdict_of(spec, outcomes), outcomes, now=NOW)
    assert retry is None
    assert verdict.reason.endswith("; gave up after 2 attempt(s): the retry limit of 1 is used up")
    spec = job(3, N)
    verdict, _ = judge(spec, 1, verdict_of(spec, outcomes), outcomes, now=NOW)
    assert verdict.reason.endswith(
        "; not retried after attempt 1: user failures are not retried with restart policy Never (role w)"
    )
    # Without a budget the reason stays as the completion rules wrote it.
    spec = job(0, F)
    plain = verdict_of(spec, outcomes)
    assert judge(spec, 1, plain, outcomes, now=NOW)[0].reason == plain.reason


def test_success_and_stop_are_never_retried() -> None:
    spec = job(3, A)
    for state in (JobState.SUCCEEDED, JobState.STOPPED):
        verdict = Verdict(state, "done")
        assert judge(spec, 1, verdict, {}, now=NOW) == (verdict, None)


def test_a_run_past_its_deadline_is_not_retried() -> None:
    spec = job(3, A)
    verdict, retry = judge(
        spec,
        1,
        Verdict(JobState.FAILED, "exceeded its maximum running time of 2 minutes"),
        {},
        now=NOW,
    )
    assert retry is None and verdict.failure_class is USER
    assert "a run past max_running_minutes is not retried" in verdict.reason


def test_the_task_that_decided_the_attempt_decides_its_class() -> None:
    spec = job(1, N, replicas=2)
    # The user's task failed first and tipped minFailedTaskCount; the lost one came later.
    outcomes = {("w", 0): failed(1, at=1.0), ("w", 1): failed(None, kind=EndKind.LOST, at=2.0)}
    verdict = verdict_of(spec, outcomes)
    assert verdict.task == ("w", 0)
    assert retry_decision(spec, 1, verdict, outcomes, now=NOW) is None
    outcomes = {("w", 0): failed(1, at=3.0), ("w", 1): failed(None, kind=EndKind.LOST, at=2.0)}
    retry = retry_decision(spec, 1, verdict_of(spec, outcomes), outcomes, now=NOW)
    assert retry is not None and retry.failure_class is PLATFORM


def test_the_budget_counts_retries_spent_not_attempts_started() -> None:
    # A preemption or a manual restart starts an attempt without spending the budget.
    spec = job(1, F)
    outcomes = {("w", 0): failed(1)}
    verdict = verdict_of(spec, outcomes)
    assert retry_decision(spec, 3, verdict, outcomes, now=NOW) is None
    assert retry_decision(spec, 3, verdict, outcomes, now=NOW, retries_used=0) is not None


def test_an_unlimited_budget_retries_every_failure_a_new_attempt_may_mend() -> None:
    # OpenPAI retryCount -1: no limit on the count, the rules on whose failure stay.
    spec = job(RETRY_UNLIMITED, F)
    outcomes = {("w", 0): failed(1)}
    verdict, retry = judge(spec, 40, verdict_of(spec, outcomes), outcomes, now=NOW)
    assert retry is not None and retry.attempt == 41
    assert "retrying as attempt 41 without limit" in retry.reason
    outcomes = {("w", 0): failed(127)}
    assert retry_decision(spec, 1, verdict_of(spec, outcomes), outcomes, now=NOW) is None


def test_retry_always_runs_the_job_again_after_every_end_but_a_stop() -> None:
    # OpenPAI retryCount -2 (FrameworkLauncher's extended unlimited): success too, and a
    # failure the other rules would not retry; only a stop ends the job.
    spec = job(RETRY_ALWAYS, N)
    verdict = Verdict(JobState.SUCCEEDED, "1 of 1 w task(s) succeeded")
    kept, retry = judge(spec, 3, verdict, {}, now=NOW, base_s=2.0)
    assert kept == verdict
    assert retry is not None and (retry.attempt, retry.failure_class) == (4, None)
    assert retry.not_before == NOW + timedelta(seconds=2.0)
    assert retry.reason.startswith("attempt 3 succeeded")
    outcomes = {("w", 0): failed(127)}
    retry = retry_decision(spec, 5, verdict_of(spec, outcomes), outcomes, now=NOW)
    assert retry is not None and retry.failure_class is USER
    stopped = Verdict(JobState.STOPPED, "stopped by its user")
    assert judge(spec, 1, stopped, {}, now=NOW) == (stopped, None)
