"""When a job ends, by OpenPAI's completion rules, and how an exit reads to a person.

Per role (``minFailedTaskCount`` / ``minSucceededTaskCount`` in OpenPAI):

- ``min_failed`` set: the job FAILS as soon as that many of the role's tasks failed;
  ``None`` means failures of that role never fail the job.
- ``min_succeeded`` set: the job SUCCEEDS as soon as that many of the role's tasks
  succeeded; ``None`` means the role alone never succeeds the job.
- otherwise the job SUCCEEDS once every task has ended and no failure rule fired.

Before those, a job's own rules (T9k GenericJob ``successRules`` / ``failureRules``, and
the master-decides rule of the training kinds and Kubeflow): the job FAILS (SUCCEEDS) as
soon as every task of any one ``failure_rules`` (``success_rules``) entry has failed
(succeeded), failure rules first. A job with success rules whose tasks all ended without
meeting one FAILS: nothing it names as success happened.

``decide`` looks at a snapshot. When two rules hold in the same snapshot (two tasks ended
between two looks) the failure rule wins: reporting success for a job that also crossed
its failure threshold would hide the failure.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from trainyard_common.events import FailureClass, JobState, TaskState
from trainyard_common.jobspec import ALL_TASKS, JobSpec, TaskRef

TaskKey = tuple[str, int]


@dataclass(frozen=True)
class TaskOutcome:
    state: TaskState
    exit_code: int | None = None
    reason: str | None = None
    # When the task ended (any increasing number); picks the task that tipped a rule.
    ended_at: float | None = None
    signal: int | None = None
    # A failed task's class and how it ended (a domain.failure.EndKind value).
    failure_class: FailureClass | None = None
    kind: str | None = None


@dataclass(frozen=True)
class Verdict:
    state: JobState
    reason: str
    exit_code: int | None = None
    task: TaskKey | None = None
    # For a FAILED verdict: the class of the failure that decided it (domain.failure).
    failure_class: FailureClass | None = None


def _ended_order(item: tuple[TaskKey, TaskOutcome]) -> tuple[float, str, int]:
    key, outcome = item
    return (outcome.ended_at if outcome.ended_at is not None else 0.0, key[0], key[1])


def _nth_ended(items: list[tuple[TaskKey, TaskOutcome]], n: int) -> tuple[TaskKey, TaskOutcome]:
    return sorted(items, key=_ended_order)[n - 1]


def _task_name(key: TaskKey) -> str:
    return f"{key[0]}[{key[1]}]"


def decide(spec: JobSpec, states: dict[TaskKey, TaskOutcome]) -> Verdict | None:
    """The job's end, or None while it goes on. Tasks missing from ``states`` have not
    ended."""
    per_role: dict[str, dict[TaskState, list[tuple[TaskKey, TaskOutcome]]]] = {}
    for role in spec.roles:
        buckets: dict[TaskState, list[tuple[TaskKey, TaskOutcome]]] = {
            TaskState.SUCCEEDED: [],
            TaskState.FAILED: [],
            TaskState.STOPPED: [],
        }
        for index in range(role.replicas):
            outcome = states.get((role.name, index))
            if outcome is not None and outcome.state in buckets:
                buckets[outcome.state].append(((role.name, index), outcome))
        per_role[role.name] = buckets

    ruled = _by_rules(spec, states)
    if ruled is not None:
        return ruled

    for role in spec.roles:
        failed = per_role[role.name][TaskState.FAILED]
        if role.min_failed is not None and len(failed) >= role.min_failed:
            key, outcome = _nth_ended(failed, role.min_failed)
            detail = f": {outcome.reason}" if outcome.reason else ""
            return Verdict(
                JobState.FAILED,
                f"{len(failed)} of {role.replicas} {role.name} task(s) failed, reaching "
                f"minFailedTaskCount={role.min_failed}; {_task_name(key)} failed{detail}",
                outcome.exit_code,
                key,
            )

    for role in spec.roles:
        succeeded = per_role[role.name][TaskState.SUCCEEDED]
        if role.min_succeeded is not None and len(succeeded) >= role.min_succeeded:
            key, outcome = _nth_ended(succeeded, role.min_succeeded)
            return Verdict(
                JobState.SUCCEEDED,
                f"{len(succeeded)} of {role.replicas} {role.name} task(s) succeeded, "
                f"reaching minSucceededTaskCount={role.min_succeeded}",
                outcome.exit_code,
                key,
            )

    ended = [item for buckets in per_role.values() for items in buckets.values() for item in items]
    if len(ended) < spec.task_count():
        return None
    counts = "; ".join(
        f"{role.name}: {len(per_role[role.name][TaskState.SUCCEEDED])} succeeded, "
        f"{len(per_role[role.name][TaskState.FAILED])} failed"
        for role in spec.roles
    )
    if spec.success_rules:
        reason = f"all {spec.task_count()} task(s) ended and no success rule was met ({counts})"
        if not ended:
            return Verdict(JobState.FAILED, reason, TaskOutcome(TaskState.FAILED).exit_code, None)
        last, outcome = _nth_ended(ended, len(ended))
        return Verdict(JobState.FAILED, reason, outcome.exit_code, last)
    reason = (
        f"all {spec.task_count()} task(s) ended and no minFailedTaskCount was reached ({counts})"
    )
    if not ended:
        return Verdict(JobState.SUCCEEDED, reason)
    # The last task to end is the one that decided.
    key, outcome = _nth_ended(ended, len(ended))
    return Verdict(JobState.SUCCEEDED, reason, outcome.exit_code, key)


def _rule_text(rule: list[TaskRef]) -> str:
    return ", ".join(
        f"every {ref.role}" if ref.index == ALL_TASKS else _task_name((ref.role, ref.index))
        for ref in rule
    )


def _rule_tasks(spec: JobSpec, rule: list[TaskRef]) -> list[TaskKey]:
    """The tasks a rule names, every task of a role for ALL_TASKS (as many as the role
    has now: an elastic job's may have changed)."""
    replicas = {role.name: role.replicas for role in spec.roles}
    keys: list[TaskKey] = []
    for ref in rule:
        if ref.index == ALL_TASKS:
            keys.extend((ref.role, index) for index in range(replicas.get(ref.role, 0)))
        else:
            keys.append((ref.role, ref.index))
    return keys


def _by_rules(spec: JobSpec, states: dict[TaskKey, TaskOutcome]) -> Verdict | None:
    for wanted, rules, label, verdict in (
        (TaskState.FAILED, spec.failure_rules, "failure", JobState.FAILED),
        (TaskState.SUCCEEDED, spec.success_rules, "success", JobState.SUCCEEDED),
    ):
        for i, rule in enumerate(rules):
            items = [(key, states.get(key)) for key in _rule_tasks(spec, rule)]
            if items and all(o is not None and o.state is wanted for _, o in items):
                met = [(k, o) for k, o in items if o is not None]
                key, outcome = _nth_ended(met, len(met))
                detail = (
                    f"; {_task_name(key)}: {outcome.reason}"
                    if (outcome.reason and wanted is TaskState.FAILED)
                    else ""
                )
                return Verdict(
                    verdict,
                    f"{label} rule {i} met: {_rule_text(rule)} "
                    f"{'failed' if wanted is TaskState.FAILED else 'succeeded'}"
                    f"{detail}",
                    outcome.exit_code,
                    key,
                )
    return None


def exit_reason(exit_code: int | None, signal: int | None = None) -> str:
    """A person's reading of how a task's process ended."""
    if signal:
        return f"killed by {_signal_name(signal)}"
    if exit_code is None:
        return "ended without an exit code"
    if exit_code == 127:
        return "command not found (exit code 127)"
    if exit_code == 126:
        return "command not executable (exit code 126)"
    if 128 < exit_code < 128 + 65 and _known_signal(exit_code - 128):
        # A shell reports a child killed by signal N as 128+N.
        return f"exited with code {exit_code} (killed by {_signal_name(exit_code - 128)})"
    return f"exited with code {exit_code}"


def _known_signal(number: int) -> bool:
    try:
        _signal.Signals(number)
    except ValueError:
        return False
    return True


def _signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
