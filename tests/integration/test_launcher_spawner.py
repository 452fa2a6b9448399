"""The task spawner (spawner.py): a wrapper it forks is what a fresh interpreter's
wrapper is for the task (session, directory, environment, descriptors, signals, logs,
exit record), its process image holds nothing of the launcher's environment, and a
spawner that died is replaced or done without."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest

from trainyard_common.jobspec import Resources
from trainyard_launcher.adapters.backend import LaunchError, TaskHandle, TaskOptions, TaskRef
from trainyard_launcher.adapters.limits import find_mechanisms
from trainyard_launcher.adapters.local import LocalBackend
from trainyard_launcher.adapters.procfs import proc_stat
from trainyard_launcher.spawner import Spawner

from ..support.launcher import launch

# What the task's command reports of itself: the wrapper's and its own session, its
# directory, environment, descriptors and ignored signals.
REPORT = (
    "echo wrapper-sid=$(cut -d' ' -f6 /proc/$PPID/stat) own-sid=$(cut -d' ' -f6 /proc/$$/stat) "
    "wrapper-pid=$PPID; pwd; env | grep -v '^_=' | sort; ls /proc/$$/fd > ../fds; "
    "sort -n ../fds | tr '\\n' ' '; "
    "echo; grep -E '^Sig(Ign|Blk)' /proc/$$/status; echo to-stderr >&2; exit 7"
)


async def ended(backend: LocalBackend, task: TaskRef, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launched = backend.read_pid(task)
        status = await backend.poll(task, launched.handle if launched else TaskHandle())
        if launched and status.ended:
            assert status.exit_code == 7, status
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task.key} did not end")


async def report(tmp_path: Path, spawner: bool) -> tuple[str, str]:
    root = tmp_path / ("spawned" if spawner else "fresh")
    backend = LocalBackend(root, mechanisms=find_mechanisms(), spawner=spawner)
    task = TaskRef(job_id="job-same", attempt=1, role="worker", index=0)
    try:
        await launch(backend, task, REPORT, {"MY_VAR": "x y"},
                     options=TaskOptions(resources=Resources(cpu=1, memory_mb=512)))  # fmt: skip
        await ended(backend, task)
    finally:
        await backend.close()
    directory = backend.task_dir(task)
    out = (directory / "stdout.log").read_text().replace(str(root), "ROOT")
    err = (directory / "stderr.log").read_text()
    return out, err


async def test_a_forked_wrapper_runs_the_task_as_a_fresh_wrapper_does(tmp_path: Path) -> None:
    fresh, fresh_err = await report(tmp_path, spawner=False)
    spawned, spawned_err = await report(tmp_path, spawner=True)
    first = spawned.splitlines()[0]
    sessions = dict(re.findall(r"([\w-]+)=(\d+)", first))
    # The wrapper leads a session of its own; the command is in it.
    assert sessions["wrapper-sid"] == sessions["wrapper-pid"] == sessions["own-sid"], first
    # Everything else alike: directory, environment (the job's variable, no launcher
    # variable), the descriptors (0-2 and the listing's own), signals ignored or blocked.
    assert spawned.splitlines()[1:] == fresh.splitlines()[1:]
    assert "MY_VAR=x y" in spawned and "ROOT/jobs/job-same" in spawned
    assert spawned_err == fresh_err and "to-stderr" in spawned_err


async def test_a_forked_wrapper_shows_none_of_the_launchers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/<pid>/environ of a forked process is the environment its image started
    with: the spawner's, which is empty, not the launcher's."""
    monkeypatch.setenv("YARD_ADMIN_TOKEN", "launcher-secret")
    backend = LocalBackend(tmp_path)
    task = TaskRef(job_id="job-env", attempt=1, role="worker", index=0)
    try:
        launched = await launch(backend, task, "sleep 30", {"MINE": "task-value"})
        pid = launched.handle.pid
        assert pid is not None
        image = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"launcher-secret" not in image and b"YARD_" not in image
        stat = proc_stat(pid)
        assert stat is not None and stat.session == pid
        os.killpg(pid, signal.SIGKILL)
    finally:
        await backend.close()


async def test_a_dead_spawner_is_started_again_and_a_refusal_is_a_launch_error(
    tmp_path: Path,
) -> None:
    backend = LocalBackend(tmp_path)
    first = TaskRef(job_id="job-a", attempt=1, role="worker", index=0)
    try:
        await launch(backend, first, "exit 7")
        await ended(backend, first)
        spawner = backend._spawner
        assert isinstance(spawner, Spawner) and spawner._proc is not None
        old = spawner._proc.pid
        spawner._proc.kill()
        spawner._proc.wait()
        second = TaskRef(job_id="job-b", attempt=1, role="worker", index=0)
        await launch(backend, second, "exit 7")
        await ended(backend, second)
        assert spawner._proc is not None and spawner._proc.pid != old
        # What Popen would refuse, the spawner refuses too, naming it: a directory that
        # is not there, a variable the environment cannot hold (the child's refusal).
        with pytest.raises(OSError, match="no such directory: /nowhere"):
            spawner.spawn(["--dir", "/nowhere", "--", "true"], "/nowhere", {}, "/dev/null",
                          "/dev/null")  # fmt: skip
        with pytest.raises(OSError, match="embedded null byte"):
            spawner.spawn(["--dir", "/", "--", "true"], "/", {"BAD": "a\0b"}, "/dev/null",
                          "/dev/null")  # fmt: skip
        assert spawner._proc is not None and spawner._proc.poll() is None  # still serving
    finally:
        await backend.close()
    assert spawner._proc is None


async def test_a_spawner_gone_mid_request_leaves_the_wrapper_to_a_fresh_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    backend = LocalBackend(tmp_path)
    spawner = backend._spawner
    assert spawner is not None

    def gone(*_args: object) -> int:
        from trainyard_launcher.spawner import SpawnerGone

        raise SpawnerGone("the spawner ended")

    monkeypatch.setattr(spawner, "spawn", gone)
    task = TaskRef(job_id="job-alone", attempt=1, role="worker", index=0)
    try:
        launched = await launch(backend, task, "exit 7")
        # Started by this process (Popen), kept to be reaped; and it ran the task.
        assert launched.handle.pid in backend._children
        await ended(backend, task)
        assert "the task spawner is gone" in caplog.text
    finally:
        await backend.close()


async def test_a_launch_into_a_missing_directory_is_a_launch_error(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    assert backend._spawner is not None
    try:
        with pytest.raises(LaunchError, match="cannot start the task wrapper"):
            backend._start_wrapper(["--dir", str(tmp_path / "none"), "--", "true"],
                                   tmp_path / "none", {})  # fmt: skip
    finally:
        await backend.close()
