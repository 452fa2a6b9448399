"""Running a command in a task that runs (``yard exec``): a debug-mode task's whole
purpose, and a way to look into a normal one. The command gets the environment the
task's command got (the one OpenPAI's isDebug writes to a failed task's ``env`` file),
its working directory and its mount namespace; it runs at most ``timeout_s``."""

from __future__ import annotations

from dataclasses import dataclass

from trainyard_common.auth import Identity
from trainyard_common.events import TaskState

from .adapters.backend import ExecResult, ExecUnavailable
from .adapters.store import task_id
from .handlers import Deps, handle_of, task_full_env, task_ref


@dataclass(frozen=True)
class ExecRefused(Exception):
    status: int
    detail: str


def exec_argv(command: list[str] | str) -> list[str]:
    """A list runs as it is; a string through bash, like the task's own command."""
    words = [command] if isinstance(command, str) else command
    if any("\x00" in word for word in words):
        # No argument of a process can hold one (the kernel reads each up to its NUL).
        raise ExecRefused(422, "command: must not contain a NUL character")
    if isinstance(command, str):
        if not command.strip():
            raise ExecRefused(422, "command: must not be empty")
        return ["bash", "-c", command]
    if not command or not command[0]:
        raise ExecRefused(422, "command: must name what to run")
    return list(command)


async def exec_in_task(
    deps: Deps,
    identity: Identity,
    job_id: str,
    role: str,
    index: int,
    command: list[str] | str,
    timeout_s: float,
) -> ExecResult:
    argv = exec_argv(command)
    job = await deps.store.get_job(job_id)
    if job is None or job.spec is None or not identity.can_see(job.user):
        # As status answers: another user's job ids are not to be probed.
        raise ExecRefused(404, f"no job {job_id}")
    task = await deps.store.get_task(task_id(job_id, job.attempt, role, index))
    if task is None:
        raise ExecRefused(404, f"job {job_id} has no task {role}[{index}] in attempt {job.attempt}")
    if task.state != TaskState.RUNNING:
        raise ExecRefused(
            409,
            f"task {role}[{index}] of job {job_id} is {task.state.value}, "
            "not RUNNING: commands run only in a running task",
        )
    try:
        return await deps.backend.exec(
            task_ref(task), handle_of(task), argv, task_full_env(deps, job, task), timeout_s
        )
    except ExecUnavailable as exc:
        raise ExecRefused(409, f"cannot run commands in task {role}[{index}]: {exc}") from None
