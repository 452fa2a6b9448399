"""A task that adoption cannot start now does not stop the launcher. A restarted
launcher starts the tasks the store holds STARTING; on Kubernetes one pod refused for
now (429, 5xx, a quota used up, a namespace terminating: TransientError) or an error
nothing expected (the API server unreachable while the attempt is opened) left adopt()
and main(), and the launcher restarted into the same refusal for as long as it lasted
(found by a crash audit): watching nothing, starting nothing. Now the task is left to
the watcher, which starts it again later; the start deadline still covers it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from trainyard_common.errors import TransientError
from trainyard_common.events import JobState, TaskPlacement, TaskState
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import (
    Launched,
    TaskHandle,
    TaskLaunch,
    TaskRef,
    TaskStatus,
)
from trainyard_launcher.adapters.store import JOB_RUNNING, JobRecord, new_task, now_ms, task_id
from trainyard_launcher.domain.failure import EndKind
from trainyard_launcher.handlers import Deps, adopt, check_start_deadlines, watch_tasks

from ..support.launcher import ScriptedBackend, make_deps


class RefusingBackend(ScriptedBackend):
    """Refuses to launch the tasks in ``refused`` with the error given."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[str, Exception] = {}

    async def launch(self, task: TaskLaunch) -> Launched:
        if (error := self.refused.get(task.ref.key)) is not None:
            raise error
        return await super().launch(task)


REFUSALS = {
    "transient": TransientError("the pod could not be created now: 403 exceeded quota"),
    "unexpected": OSError("Cannot connect to host kube-apiserver:6443"),
}


async def restarted_with_two_starting_tasks(error: Exception) -> tuple[Deps, RefusingBackend]:
    """A launcher that died after recording both tasks STARTING, restarted over a
    backend that refuses the second one."""
    deps, _, _ = make_deps()
    backend = RefusingBackend()
    deps.backend = backend
    deps.start_deadline_s = 60
    spec = JobSpec(name="train", user="alice", roles=[RoleSpec(name="w", replicas=2, command="x")])
    tasks = [TaskPlacement(role="w", index=i, node="n1", host_ip="127.0.0.1") for i in (0, 1)]
    await deps.store.insert_job(
        JobRecord(job_id="j1", attempt=1, state=JOB_RUNNING, spec=spec, tasks=tasks, user="alice")
    )
    for p in tasks:
        await deps.store.insert_task(new_task("j1", 1, p.role, p.index, "/tasks", p.node))
    backend.refused["j1:1:w:1"] = error
    return deps, backend


@pytest.mark.parametrize("error", REFUSALS.values(), ids=REFUSALS.keys())
async def test_adoption_leaves_a_task_it_cannot_start_to_the_watcher(error: Exception) -> None:
    deps, backend = await restarted_with_two_starting_tasks(error)
    await adopt(deps)  # the launcher starts
    first = await deps.store.get_task(task_id("j1", 1, "w", 0))
    second = await deps.store.get_task(task_id("j1", 1, "w", 1))
    assert first is not None and first.state is TaskState.RUNNING
    assert second is not None and second.state is TaskState.STARTING
    assert set(deps.watching) == {first.id}
    assert ("j1", 1) in deps.unstarted and ("j1", 1) in deps.starting

    # Not tried before start_retry_s (found in review: this test never looked): with
    # the refusal over, a watcher round before the time starts nothing.
    del backend.refused["j1:1:w:1"]
    await watcher_rounds(deps)
    assert ("j1", 1) in deps.unstarted and len(backend.launches) == 1
    # Still refused when due: tried, and left for later again.
    backend.refused["j1:1:w:1"] = error
    deps.start_retry_s = 0
    deps.unstarted[("j1", 1)] = 0
    await watcher_rounds(deps)
    assert ("j1", 1) in deps.unstarted and len(backend.launches) == 1
    # The refusal ends: the watcher starts it, and is done with it.
    del backend.refused["j1:1:w:1"]
    await watcher_rounds(deps)
    second = await deps.store.get_task(task_id("j1", 1, "w", 1))
    assert second is not None and second.state is TaskState.RUNNING
    assert set(deps.watching) == {first.id, second.id} and deps.unstarted == {}
    assert [key for key, _, _ in backend.launches] == ["j1:1:w:0", "j1:1:w:1"]


async def test_a_task_refused_until_the_start_deadline_fails_the_attempt() -> None:
    deps, backend = await restarted_with_two_starting_tasks(REFUSALS["transient"])
    await adopt(deps)
    later = now_ms() + timedelta(seconds=61)
    deps.clock = lambda: later
    await check_start_deadlines(deps)
    second = await deps.store.get_task(task_id("j1", 1, "w", 1))
    assert second is not None and second.state is TaskState.FAILED
    assert second.end_kind == EndKind.START_TIMEOUT.value
    job = await deps.store.get_job("j1")
    assert job is not None and job.verdict is not None
    assert job.verdict.state is JobState.FAILED
    # Ended: the watcher no longer tries to start it.
    deps.unstarted[("j1", 1)] = 0
    await watcher_rounds(deps)
    assert deps.unstarted == {} and [k for k, _, _ in backend.launches] == ["j1:1:w:0"]


async def watcher_rounds(deps: Deps) -> None:
    """The watcher's loop, for a few rounds."""
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_tasks(deps, stop, interval_s=0.01))
    await asyncio.sleep(0.05)
    stop.set()
    await watcher


class StraysRefusedOnce(ScriptedBackend):
    """Its inventory holds two tasks the store does not know; the first look at it,
    and the first kill of one of them, are refused."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0
        self.refuse_kill = {"gone:1:w:0"}

    async def inventory(self) -> dict[TaskRef, TaskHandle] | None:
        self.looks += 1
        if self.looks == 1:
            raise TransientError("the API server answered 503")
        return {
            TaskRef("gone", 1, "w", i): TaskHandle(uid=f"u{i}")
            for i in (0, 1)
            if f"gone:1:w:{i}" not in self.killed
        }

    async def kill(self, ref: TaskRef, handle: TaskHandle, grace_s: float) -> TaskStatus:
        if ref.key in self.refuse_kill:
            self.refuse_kill.discard(ref.key)
            raise TransientError("the API server answered 503")
        return await super().kill(ref, handle, grace_s)


async def test_strays_adoption_could_not_stop_are_stopped_by_the_watcher() -> None:
    # Found in review: the strays were stopped only at adoption, which now does not
    # stop the launcher on an error: a refusal there left a duplicate running (on GPUs
    # placement had given to others) until the next restart, and one refused kill left
    # the strays after it running too.
    deps, _, _ = make_deps()
    backend = StraysRefusedOnce()
    deps.backend = backend
    deps.start_retry_s = 0
    await adopt(deps)  # the launcher starts
    assert backend.killed == [] and deps.strays_due is not None
    await watcher_rounds(deps)
    assert sorted(backend.killed) == ["gone:1:w:0", "gone:1:w:1"]
    assert deps.strays_due is None
