"""Whose failure a task's end was, and whether a failed attempt runs again.

Every FAILED task end is classified (``classify``) from its exit code, its signal and
how it ended (``EndKind``: the command ran and ended, the task was lost, it could not
start, its preparation failed, ...). A failed attempt is then judged (``judge``): it is
retried as a whole new attempt (``Retry``) or the job fails for good, with a reason that
says why it was not retried. The rules, and why, are in docs/lifecycle.md ("Failures and
retries"); in short:

- PLATFORM failures are retried while the budget (``spec.retry_limit``) lasts, for
  ever with RETRY_UNLIMITED; with RETRY_ALWAYS every end runs again, a success and a
  user's failure too (OpenPAI's retryCount -1 and -2);
- UNKNOWN failures too (OpenPAI retries its unknown failures up to ``retryCount``, and a
  failure nobody can pin on the user should not be held against them), except where
  the role's restart policy is ``ExitCode`` and the exit code is not a retryable one;
- USER failures only where the deciding task's role asks for it with its restart policy
  (``OnFailure``/``Always``: any; ``ExitCode``: a code in ``retryable_exit_codes``;
  ``Never``: none), and never a *permanent* one (command not found or not executable,
  an input the platform cannot use) that a new attempt would only repeat;
- a run past ``max_running_minutes`` is never retried (Kubernetes' activeDeadlineSeconds
  and OpenPAI's DeadlineExceeded are not either).
"""

from __future__ import annotations

import dataclasses
import re
import signal as _signal
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from trainyard_common.events import FailureClass, JobState, TaskState
from trainyard_common.jobspec import RETRY_ALWAYS, RETRY_UNLIMITED, JobSpec, RestartPolicy

from .completion import TaskKey, TaskOutcome, Verdict

BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 300.0


class EndKind(StrEnum):
    """How a task ended, as far as the launcher can tell."""

    EXITED = "exited"  # the command ran and ended (exit code and/or signal)
    KILLED_BY_PLATFORM = "killed_by_platform"  # the platform killed it (eviction, preemption)
    LOST = "lost"  # the process is gone and left no exit record
    NODE_LOST = "node_lost"
    PORT_UNAVAILABLE = "port_unavailable"  # a port placement gave it could not be bound
    START_FAILED = "start_failed"  # the launcher could not start it (wrapper, no placement)
    UNSUPPORTED = "unsupported"  # the spec asks for what this backend cannot do
    PREPARE_USER = "prepare_user"  # preparation failed because of the user's input
    PREPARE_UNKNOWN = "prepare_unknown"  # preparation failed for another reason (network, disk)
    # The task went past the memory limit the launcher held it to (its memory_mb): the
    # cgroup's OOM killer ended it, or an allocation failed under its rlimit.
    OUT_OF_MEMORY = "out_of_memory"
    START_TIMEOUT = "start_timeout"  # not started within the start deadline


_PLATFORM_KINDS = frozenset(
    {
        EndKind.KILLED_BY_PLATFORM,
        EndKind.LOST,
        EndKind.NODE_LOST,
        EndKind.PORT_UNAVAILABLE,
        EndKind.START_FAILED,
        EndKind.START_TIMEOUT,
    }
)
_USER_KINDS = frozenset({EndKind.UNSUPPORTED, EndKind.PREPARE_USER})
# Raised by the program's own instructions (OpenPAI's job exit spec puts them on the user).
_FAULT_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL})
COMMAND_NOT_FOUND = 127
COMMAND_NOT_EXECUTABLE = 126


def signal_of(exit_code: int | None, signal: int | None) -> int | None:
    """The signal that ended the command: reported directly, or by a shell as 128+N."""
    if signal:
        return signal
    if exit_code is not None and 128 < exit_code <= 128 + 64:
        try:
            return int(_signal.Signals(exit_code - 128))
        except ValueError:
            return None
    return None


def classify(
    exit_code: int | None, signal: int | None, kind: EndKind = EndKind.EXITED
) -> FailureClass | None:
    """Whose failure a task's end was; None for a success (exit code 0, no signal)."""
    if kind in _PLATFORM_KINDS:
        return FailureClass.PLATFORM
    if kind in _USER_KINDS:
        return FailureClass.USER
    if kind is EndKind.PREPARE_UNKNOWN:
        return FailureClass.UNKNOWN
    if kind is EndKind.OUT_OF_MEMORY:
        # Past the memory the job asked for (and was held to): the program's own use.
        # Not permanent: memory use varies between runs, and a retry is the user's call.
        return FailureClass.USER
    number = signal_of(exit_code, signal)
    if number is not None:
        if number in _FAULT_SIGNALS:
            return FailureClass.USER
        # SIGKILL that the platform did not send (those are KILLED_BY_PLATFORM) is most
        # often the kernel's OOM killer, which the local backend cannot tell from a
        # person's kill -9: no cgroup reports it. Neither is surely the user's program's
        # fault, so OOM stays UNKNOWN. Any other signal came from outside the program.
        return FailureClass.UNKNOWN
    if exit_code is None:
        return FailureClass.UNKNOWN  # ended without an exit code, reason unknown
    if exit_code == 0:
        return None
    return FailureClass.USER


def permanent(exit_code: int | None, signal: int | None, kind: EndKind = EndKind.EXITED) -> bool:
    """A failure a new attempt of the same job would only repeat."""
    if kind in _USER_KINDS:
        return True
    return (
        kind is EndKind.EXITED
        and signal_of(exit_code, signal) is None
        and exit_code in (COMMAND_NOT_FOUND, COMMAND_NOT_EXECUTABLE)
    )


# What git, pip and the data mounts say when the user's input is wrong (a package that
# does not exist, a branch or commit that is not there, a path that is missing); any
# other preparation failure (no network, an index down, a full disk) is UNKNOWN.
_USER_PREPARATION = re.compile(
    r"no matching distribution found|could not find a version that satisfies"
    r"|invalid requirement|no requirements file at|does not exist|not found"
    r"|does not appear to be a git repository|did not match any|cannot be checked out"
    r"|unknown revision|not a tree|two sources are mounted at",
    re.IGNORECASE,
)


def preparation_kind(reason: str) -> EndKind:
    """How a failed preparation (code checkout, data sources, packages) ended."""
    return EndKind.PREPARE_USER if _USER_PREPARATION.search(reason) else EndKind.PREPARE_UNKNOWN


@dataclass(frozen=True)
class Retry:
    """A failed attempt runs again as ``attempt``, not before ``not_before``."""

    attempt: int
    backoff_s: float
    reason: str
    failure_class: FailureClass | None  # None: a success that runs again (RETRY_ALWAYS)
    not_before: datetime | None = None


def backoff_s(
    failed_attempt: int, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S
) -> float:
    """Exponential: base, 2×base, 4×base, ... after attempts 1, 2, 3, ..., capped."""
    return min(base_s * 2 ** max(failed_attempt - 1, 0), cap_s)


@dataclass(frozen=True)
class Deciding:
    """The failure that decided an attempt: its task's class, code and permanence."""

    failure_class: FailureClass
    exit_code: int | None
    permanent: bool
    role: str | None


def deciding_failure(verdict: Verdict, outcomes: dict[TaskKey, TaskOutcome]) -> Deciding:
    if verdict.task is None:
        # No task decided: the run deadline (max_running_minutes), the user's own limit.
        return Deciding(FailureClass.USER, verdict.exit_code, True, None)
    key = verdict.task
    outcome = outcomes.get(key)
    if outcome is None or outcome.state is not TaskState.FAILED:
        # A success rule that was not met decides with the last task to end; the
        # failure, if any, is the first one that failed.
        failed = sorted(
            ((k, o) for k, o in outcomes.items() if o.state is TaskState.FAILED),
            key=lambda item: (item[1].ended_at or 0.0, item[0]),
        )
        if not failed:
            # Every task did what it does and none was what a success rule asks for.
            return Deciding(FailureClass.USER, verdict.exit_code, True, key[0])
        key, outcome = failed[0]
    kind = EndKind(outcome.kind) if outcome.kind else EndKind.EXITED
    cls = outcome.failure_class or classify(outcome.exit_code, outcome.signal, kind)
    return Deciding(
        cls or FailureClass.UNKNOWN,
        outcome.exit_code,
        permanent(outcome.exit_code, outcome.signal, kind),
        key[0],
    )


def _refusal(spec: JobSpec, failure: Deciding, verdict: Verdict) -> str | None:
    """Why this failure is not retried (whatever the budget), or None when it may be."""
    if failure.role is None and verdict.task is None:
        return "a run past max_running_minutes is not retried"
    policy, codes = RestartPolicy.NEVER, []
    if failure.role is not None:
        try:
            role = spec.role(failure.role)
        except KeyError:
            role = None
        if role is not None:
            policy, codes = role.restart_policy, role.retryable_exit_codes
    if failure.failure_class is FailureClass.PLATFORM:
        return None
    if failure.permanent:
        return (
            f"a {failure.failure_class.value} failure that a new attempt would repeat "
            f"is not retried{_code_text(failure.exit_code)}"
        )
    if policy is RestartPolicy.EXIT_CODE:
        if failure.exit_code in codes:
            return None
        return (
            f"exit code {failure.exit_code} is not one of the retryable exit codes "
            f"{sorted(codes)} of role {failure.role}"
        )
    if failure.failure_class is FailureClass.UNKNOWN:
        return None
    if policy in (RestartPolicy.ON_FAILURE, RestartPolicy.ALWAYS):
        return None
    return f"user failures are not retried with restart policy {policy.value} (role {failure.role})"


def _code_text(exit_code: int | None) -> str:
    if exit_code == COMMAND_NOT_FOUND:
        return " (exit code 127: command not found)"
    if exit_code == COMMAND_NOT_EXECUTABLE:
        return " (exit code 126: command not executable)"
    return ""


def judge(
    spec: JobSpec,
    attempt: int,
    verdict: Verdict,
    outcomes: dict[TaskKey, TaskOutcome],
    *,
    now: datetime,
    base_s: float = BACKOFF_BASE_S,
    retries_used: int | None = None,
) -> tuple[Verdict, Retry | None]:
    """The attempt's verdict as it is stored (with its failure class, and for a job that
    fails for good a reason saying why it was not retried) and the retry, if any.

    ``retries_used`` is the budget spent so far: attempt - 1 while every new attempt
    comes from a failure (a preemption or a manual restart would start one without
    spending it)."""
    always = spec.retry_limit == RETRY_ALWAYS
    if verdict.state is JobState.SUCCEEDED and always:
        # FrameworkLauncher's extended-unlimited retry: the job runs until it is stopped.
        wait = base_s
        reason = (
            f"attempt {attempt} succeeded: {verdict.reason}; running again as attempt "
            f"{attempt + 1} after {wait:g}s (retryCount -2: after every end, until stopped)"
        )
        return verdict, Retry(attempt + 1, wait, reason, None, now + timedelta(seconds=wait))
    if verdict.state is not JobState.FAILED:
        return verdict, None
    failure = deciding_failure(verdict, outcomes)
    verdict = dataclasses.replace(verdict, failure_class=failure.failure_class)
    used = attempt - 1 if retries_used is None else retries_used
    # Extended-unlimited retries every end, whoever's failure it was (no fancy policy).
    refusal = None if always else _refusal(spec, failure, verdict)
    unlimited = spec.retry_limit in (RETRY_UNLIMITED, RETRY_ALWAYS)
    if refusal is None and (unlimited or used < spec.retry_limit):
        # Counted in failures, not attempts: an interrupted attempt lengthens no backoff.
        wait = backoff_s(used + 1, base_s)
        bound = "without limit" if unlimited else f"of at most {attempt + spec.retry_limit - used}"
        reason = (
            f"attempt {attempt} failed ({failure.failure_class.value} failure): "
            f"{verdict.reason}; retrying as attempt {attempt + 1} {bound} after {wait:g}s"
        )
        return verdict, Retry(
            attempt + 1, wait, reason, failure.failure_class, now + timedelta(seconds=wait)
        )
    if spec.retry_limit == 0 and used == 0:
        return verdict, None  # no retries were asked for: the reason stays as it was
    if refusal is None:
        note = (
            f"gave up after {attempt} attempt(s): the retry limit of {spec.retry_limit} is used up"
        )
    else:
        note = f"not retried after attempt {attempt}: {refusal}"
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; {note}"), None


def retry_decision(
    spec: JobSpec,
    attempt: int,
    verdict: Verdict,
    outcomes: dict[TaskKey, TaskOutcome],
    *,
    now: datetime,
    base_s: float = BACKOFF_BASE_S,
    retries_used: int | None = None,
) -> Retry | None:
    """The new attempt a failed one gets, or None when the job ends with it."""
    return judge(
        spec, attempt, verdict, outcomes, now=now, base_s=base_s, retries_used=retries_used
    )[1]
