"""Clean-up policies (T9k cleanUpPolicy, Kubeflow cleanPodPolicy): what the end of an
attempt removes — never the logs, never a failed task's files under OpenPAI's isDebug,
the job's virtualenv only with All and only once the job has ended."""

from __future__ import annotations

from trainyard_common.events import JobFinished, JobPlaced, TaskPlacement, TaskState, derived_id
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import TaskStatus
from trainyard_launcher.domain.lifecycle import CleanupView, plan_cleanup, removable
from trainyard_launcher.handlers import check_tasks, launch_job

from ..support.bus import RECEIVED
from ..support.launcher import make_deps

ENDED = [
    CleanupView("w", 0, TaskState.SUCCEEDED),
    CleanupView("w", 1, TaskState.FAILED),
    CleanupView("w", 2, TaskState.STOPPED),
]


def test_none_or_no_policy_keeps_everything() -> None:
    for policy in (None, "None"):
        plan = plan_cleanup(policy, False, ENDED, job_ended=True)
        assert (plan.tasks, plan.job_venv) == ((), False)


def test_all_removes_every_task_and_the_venv_once_the_job_ended() -> None:
    plan = plan_cleanup("All", False, ENDED, job_ended=True)
    assert plan.tasks == (("w", 0), ("w", 1), ("w", 2)) and plan.job_venv
    # A retried attempt: the next one reuses the virtualenv.
    assert not plan_cleanup("All", False, ENDED, job_ended=False).job_venv


def test_unfinished_removes_only_what_the_end_of_the_job_stopped() -> None:
    plan = plan_cleanup("Unfinished", False, ENDED, job_ended=True)
    assert (plan.tasks, plan.job_venv) == ((("w", 2),), False)


def test_is_debug_keeps_a_failed_task_whatever_the_policy() -> None:
    assert plan_cleanup("All", True, ENDED, job_ended=True).tasks == (("w", 0), ("w", 2))


def test_a_task_still_running_is_never_cleaned() -> None:
    running = [CleanupView("w", 0, TaskState.RUNNING)]
    assert plan_cleanup("All", False, running, job_ended=True).tasks == ()


def test_the_logs_and_the_records_stay() -> None:
    names = [
        "stdout.log",
        "stderr.log",
        "stdout.log.1",
        "exit.json",
        "launched",
        "pid",
        "started",
        "work",
        "mounts",
        "root",
        "env",
        "command.sh",
        "prepare.json",
        "task.json",
    ]
    assert removable(names) == [
        "command.sh",
        "env",
        "mounts",
        "prepare.json",
        "root",
        "task.json",
        "work",
    ]


def placed(policy: str | None, min_failed: int | None = None) -> JobPlaced:
    spec = JobSpec(
        name="train",
        user="alice",
        cleanup_policy=policy,
        roles=[RoleSpec(name="w", replicas=2, command="run", min_failed=min_failed)],
    )
    tasks = [TaskPlacement(role="w", index=i, node="n1", host_ip="127.0.0.1") for i in (0, 1)]
    return JobPlaced(event_id=derived_id("j1", 1, "placed"), job_id="j1", spec=spec, tasks=tasks)


async def test_the_launcher_cleans_up_all_after_publishing_the_end() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed("All"), RECEIVED, deps)
    backend.status["j1:1:w:0"] = TaskStatus(running=False, exit_code=0, ended_at=1.0)
    backend.status["j1:1:w:1"] = TaskStatus(running=False, exit_code=3, ended_at=2.0)
    await check_tasks(deps)
    assert [e for e in published if isinstance(e, JobFinished)]
    assert backend.cleaned == ["j1:1:w:0", "j1:1:w:1", "j1"]


async def test_unfinished_cleans_the_task_the_end_of_the_job_stopped() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed("Unfinished", min_failed=1), RECEIVED, deps)
    backend.status["j1:1:w:1"] = TaskStatus(running=False, exit_code=3, ended_at=2.0)
    await check_tasks(deps)
    assert [e for e in published if isinstance(e, JobFinished)]
    assert backend.cleaned == ["j1:1:w:0"]


async def test_no_policy_no_clean_up() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(None), RECEIVED, deps)
    backend.status["j1:1:w:0"] = TaskStatus(running=False, exit_code=0, ended_at=1.0)
    backend.status["j1:1:w:1"] = TaskStatus(running=False, exit_code=0, ended_at=2.0)
    await check_tasks(deps)
    assert [e for e in published if isinstance(e, JobFinished)]
    assert backend.cleaned == []
