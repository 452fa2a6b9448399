"""The task spawner (spawner.py): a wrapper it forks is what a fresh interpreter's
wrapper is for the task (session, directory, environment, descriptors, signals, logs,
exit record), its process image holds nothing of the launcher's environment, and a
spawner that died is replaced or done without."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

import pytest

from trainyard_common.jobspec import Resources
from trainyard_launcher import spawner as spawner_module
from trainyard_launcher.adapters.backend import LaunchError, TaskOptions, TaskRef
from trainyard_launcher.adapters.limits import find_mechanisms
from trainyard_launcher.adapters.local import LocalBackend
from trainyard_launcher.adapters.procfs import proc_stat
from trainyard_launcher.spawner import Spawner, SpawnerLost

from ..support.launcher import launch, wait_ended

# What the task's command reports of itself: the wrapper's and its own session, its
# directory, environment, descriptors and ignored signals.
REPORT = (
    "echo wrapper-sid=$(cut -d' ' -f6 /proc/$PPID/stat) own-sid=$(cut -d' ' -f6 /proc/$$/stat) "
    "wrapper-pid=$PPID; pwd; env | grep -v '^_=' | sort; ls /proc/$$/fd > ../fds; "
    "sort -n ../fds | tr '\\n' ' '; "
    "echo; grep -E '^Sig(Ign|Blk)' /proc/$$/status; echo to-stderr >&2; exit 7"
)


async def ended(backend: LocalBackend, task: TaskRef) -> None:
    status = await wait_ended(backend, task)
    assert status.exit_code == 7, status


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


async def test_a_spawner_lost_with_the_request_never_starts_a_second_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It forked the wrapper, then died before answering: the launch takes the wrapper
    from its pid file, and starts no other (two would run one task twice)."""
    backend = LocalBackend(tmp_path)
    spawner = backend._spawner
    assert spawner is not None
    real = spawner.spawn

    def lost(*args: object) -> tuple[int, int | None]:
        real(*args)  # type: ignore[arg-type]
        raise SpawnerLost("the spawner ended")

    monkeypatch.setattr(spawner, "spawn", lost)
    task = TaskRef(job_id="job-lost", attempt=1, role="worker", index=0)
    try:
        launched = await launch(backend, task, "exit 7")
        assert launched.handle.pid is not None and backend._children == {}
        assert launched.handle == backend.read_pid(task).handle  # type: ignore[union-attr]
        await ended(backend, task)
    finally:
        await backend.close()


def test_the_spawner_answers_each_request_once_even_after_one_too_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A line over the limit gets one answer, without the id it carried (the launcher
    finds that out of step and starts another spawner); the next line is answered as
    itself."""
    monkeypatch.setattr(spawner_module, "_MAX_LINE", 1000)
    monkeypatch.setattr(spawner_module, "_reap", lambda: None)  # this process's children
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    # More than one read holds (64 KiB): the first read has no end of line.
    data = b'{"id": 1, "args": ["' + b"x" * 200_000 + b'"]}\n{"id": 2}\n'

    def write() -> None:
        with os.fdopen(requests_w, "wb") as requests:
            requests.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    spawner_module.serve(requests_r, answers_w)
    writer.join()
    os.close(answers_w)
    with os.fdopen(answers_r, "rb") as answers:
        lines = [json.loads(line) for line in answers.read().splitlines()]
    assert lines == [
        {"id": None, "error": "request too long"},
        {"id": 2, "error": "bad request: KeyError('args')"},
    ]
    os.close(requests_r)


async def test_an_environment_exec_cannot_take_is_refused_at_launch(tmp_path: Path) -> None:
    """A fresh wrapper's own exec failed on it (E2BIG); a forked one would only have
    failed its command: the launch refuses it, naming the variable."""
    backend = LocalBackend(tmp_path)
    task = TaskRef(job_id="job-big", attempt=1, role="worker", index=0)
    try:
        with pytest.raises(LaunchError, match="environment variable 'HUGE' is 200006 bytes"):
            await launch(backend, task, "true", {"HUGE": "x" * 200_000})
        assert backend.read_pid(task) is None
    finally:
        await backend.close()
