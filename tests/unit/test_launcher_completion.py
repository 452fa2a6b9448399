"""OpenPAI's completion rules (minFailedTaskCount / minSucceededTaskCount with null
semantics) and how an exit reads."""

from __future__ import annotations

import pytest

from trainyard_common.events import JobState, TaskState
from trainyard_common.jobspec import JobSpec, RoleSpec, TaskRef
from trainyard_launcher.domain.completion import TaskOutcome, decide, exit_reason

S, F, R, X = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.RUNNING, TaskState.STOPPED


def job(*roles: tuple[str, int, int | None, int | None]) -> JobSpec:
    return JobSpec(
        name="j",
        roles=[
            RoleSpec(name=name, replicas=n, command="true", min_failed=mf, min_succeeded=ms)
            for name, n, mf, ms in roles
        ],
    )


def outcomes(**tasks: TaskState) -> dict[tuple[str, int], TaskOutcome]:
    """worker_0=S → {("worker", 0): succeeded}; exit code 0 for S, 1 for F."""
    result = {}
    for order, (key, state) in enumerate(tasks.items()):
        role, index = key.rsplit("_", 1)
        code = {S: 0, F: 1}.get(state)
        result[(role, int(index))] = TaskOutcome(
            state, code, f"exited with code {code}", float(order)
        )
    return result


# (roles, task states, expected state or None, deciding task)
CASES = [
    # default rules: one failure fails the job; success needs every task
    ([("w", 2, 1, None)], dict(w_0=S), None, None),
    ([("w", 2, 1, None)], dict(w_0=S, w_1=R), None, None),
    ([("w", 2, 1, None)], dict(w_0=S, w_1=S), JobState.SUCCEEDED, ("w", 1)),
    ([("w", 2, 1, None)], dict(w_0=F), JobState.FAILED, ("w", 0)),
    ([("w", 2, 1, None)], dict(w_0=R, w_1=F), JobState.FAILED, ("w", 1)),
    # min_failed=None: failures of that role never fail the job
    ([("w", 2, None, None)], dict(w_0=F), None, None),
    ([("w", 2, None, None)], dict(w_0=F, w_1=F), JobState.SUCCEEDED, ("w", 1)),
    # min_failed=2: the first failure is tolerated, the second fails the job
    ([("w", 3, 2, None)], dict(w_0=F), None, None),
    ([("w", 3, 2, None)], dict(w_0=F, w_1=S), None, None),
    ([("w", 3, 2, None)], dict(w_0=F, w_1=S, w_2=F), JobState.FAILED, ("w", 2)),
    ([("w", 3, 2, None)], dict(w_0=F, w_1=S, w_2=S), JobState.SUCCEEDED, ("w", 2)),
    # min_succeeded: early success while other tasks still run
    (
        [("chief", 1, 1, 1), ("ps", 2, 1, None)],
        dict(chief_0=S, ps_0=R, ps_1=R),
        JobState.SUCCEEDED,
        ("chief", 0),
    ),
    ([("w", 4, None, 2)], dict(w_0=S, w_1=R, w_2=R, w_3=R), None, None),
    ([("w", 4, None, 2)], dict(w_0=S, w_1=F, w_2=S, w_3=R), JobState.SUCCEEDED, ("w", 2)),
    # a role with no min_succeeded never succeeds the job on its own
    ([("chief", 1, 1, None), ("w", 2, None, None)], dict(w_0=S, w_1=S), None, None),
    # failure rule of one role while another role succeeds early: failure wins
    ([("chief", 1, 1, 1), ("w", 1, 1, None)], dict(chief_0=S, w_0=F), JobState.FAILED, ("w", 0)),
    # a failed task in a tolerant role does not block success by another role's rule
    (
        [("chief", 1, 1, 1), ("w", 2, None, None)],
        dict(w_0=F, chief_0=S),
        JobState.SUCCEEDED,
        ("chief", 0),
    ),
    # every task ended, one stopped, no failure rule reached
    ([("w", 2, 1, None)], dict(w_0=S, w_1=X), JobState.SUCCEEDED, ("w", 1)),
    # nothing reported yet
    ([("w", 1, 1, None)], {}, None, None),
]


@pytest.mark.parametrize(("roles", "states", "expected", "deciding"), CASES)
def test_completion_table(roles, states, expected, deciding) -> None:
    verdict = decide(job(*roles), outcomes(**states))
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert (verdict.state, verdict.task) == (expected, deciding)


def test_failure_reason_names_role_counts_rule_and_task() -> None:
    spec = job(("worker", 3, 2, None))
    verdict = decide(spec, outcomes(worker_0=F, worker_1=S, worker_2=F))
    assert verdict is not None
    assert verdict.exit_code == 1
    assert "2 of 3 worker task(s) failed" in verdict.reason
    assert "minFailedTaskCount=2" in verdict.reason
    assert "worker[2] failed: exited with code 1" in verdict.reason


def test_deciding_task_follows_the_order_tasks_ended() -> None:
    spec = job(("w", 2, 1, None))
    states = {
        ("w", 0): TaskOutcome(F, 3, "exited with code 3", ended_at=20.0),
        ("w", 1): TaskOutcome(F, 7, "exited with code 7", ended_at=10.0),
    }
    verdict = decide(spec, states)
    assert verdict is not None and (verdict.task, verdict.exit_code) == (("w", 1), 7)


def test_early_success_reason_and_exit_code() -> None:
    verdict = decide(job(("chief", 1, 1, 1), ("ps", 1, 1, None)), outcomes(chief_0=S, ps_0=R))
    assert verdict is not None
    assert verdict.exit_code == 0
    assert "minSucceededTaskCount=1" in verdict.reason and "chief" in verdict.reason


def test_all_done_reason_lists_counts_per_role() -> None:
    verdict = decide(job(("a", 1, None, None), ("b", 1, 1, None)), outcomes(a_0=F, b_0=S))
    assert verdict is not None and verdict.state == JobState.SUCCEEDED
    assert "a: 0 succeeded, 1 failed" in verdict.reason
    assert "b: 1 succeeded, 0 failed" in verdict.reason


@pytest.mark.parametrize(
    ("code", "sig", "text"),
    [
        (0, None, "exited with code 0"),
        (3, None, "exited with code 3"),
        (127, None, "command not found (exit code 127)"),
        (126, None, "command not executable (exit code 126)"),
        (137, 9, "killed by SIGKILL"),
        (143, 15, "killed by SIGTERM"),
        (None, 2, "killed by SIGINT"),
        (137, None, "exited with code 137 (killed by SIGKILL)"),
        (255, None, "exited with code 255"),
        (None, None, "ended without an exit code"),
    ],
)
def test_exit_reason(code: int | None, sig: int | None, text: str) -> None:
    assert exit_reason(code, sig) == text


# --- a job's own rules: T9k successRules / failureRules, Kubeflow's master rule --------


def ruled(
    success: list[list[tuple[str, int]]],
    failure: list[list[tuple[str, int]]],
    *roles: tuple[str, int, int | None, int | None],
) -> JobSpec:
    spec = job(*roles)
    as_refs = lambda rules: [[TaskRef(role=r, index=i) for r, i in rule] for rule in rules]  # noqa: E731
    return spec.model_copy(
        update={"success_rules": as_refs(success), "failure_rules": as_refs(failure)}
    )


# (success rules, failure rules, roles, task states, expected, deciding task)
RULE_CASES = [
    # T9k's GenericJob example: success on worker 0, failure on worker 0 or worker 1
    (
        [[("w", 0)]],
        [[("w", 0)], [("w", 1)]],
        [("w", 4, None, None)],
        dict(w_0=S, w_1=R, w_2=R, w_3=R),
        JobState.SUCCEEDED,
        ("w", 0),
    ),
    (
        [[("w", 0)]],
        [[("w", 0)], [("w", 1)]],
        [("w", 4, None, None)],
        dict(w_1=F, w_0=R),
        JobState.FAILED,
        ("w", 1),
    ),
    # a failure outside every failure rule does not end the job
    (
        [[("w", 0)]],
        [[("w", 0)], [("w", 1)]],
        [("w", 4, None, None)],
        dict(w_2=F, w_3=F),
        None,
        None,
    ),
    # a rule needs every task it names
    (
        [[("m", 2), ("w", 0), ("w", 1)]],
        [],
        [("m", 3, None, None), ("w", 2, None, None)],
        dict(m_2=S, w_0=S),
        None,
        None,
    ),
    (
        [[("m", 2), ("w", 0), ("w", 1)]],
        [],
        [("m", 3, None, None), ("w", 2, None, None)],
        dict(m_2=S, w_0=S, w_1=S),
        JobState.SUCCEEDED,
        ("w", 1),
    ),
    # any one rule is enough
    (
        [[("m", 0)], [("w", 0), ("w", 1)]],
        [],
        [("m", 1, None, None), ("w", 2, None, None)],
        dict(w_0=S, w_1=S),
        JobState.SUCCEEDED,
        ("w", 1),
    ),
    # failure rules before success rules in one snapshot
    (
        [[("w", 0)]],
        [[("w", 1)]],
        [("w", 2, None, None)],
        dict(w_0=S, w_1=F),
        JobState.FAILED,
        ("w", 1),
    ),
    # rules come before the role counts: the master's success ends a job whose worker
    # failed in the same snapshot (Kubeflow / T9k training kinds: the master decides)
    (
        [[("Master", 0)]],
        [],
        [("Master", 1, 1, None), ("Worker", 2, 1, None)],
        dict(Worker_1=F, Master_0=S),
        JobState.SUCCEEDED,
        ("Master", 0),
    ),
    # ... while a worker failure alone still fails it by min_failed
    (
        [[("Master", 0)]],
        [],
        [("Master", 1, 1, None), ("Worker", 2, 1, None)],
        dict(Worker_1=F),
        JobState.FAILED,
        ("Worker", 1),
    ),
    # every task ended and no success rule met: failed
    ([[("w", 0)]], [], [("w", 2, None, None)], dict(w_0=F, w_1=S), JobState.FAILED, ("w", 1)),
]


@pytest.mark.parametrize(
    ("success", "failure", "roles", "states", "expected", "deciding"), RULE_CASES
)
def test_completion_rules_table(success, failure, roles, states, expected, deciding) -> None:
    verdict = decide(ruled(success, failure, *roles), outcomes(**states))
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert (verdict.state, verdict.task) == (expected, deciding)


def test_rule_reason_names_the_rule_and_its_tasks() -> None:
    verdict = decide(ruled([], [[("w", 0)], [("w", 1)]], ("w", 2, None, None)), outcomes(w_1=F))
    assert verdict is not None
    assert verdict.reason == "failure rule 1 met: w[1] failed; w[1]: exited with code 1"
    assert verdict.exit_code == 1
