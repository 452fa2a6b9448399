"""The local backend with real processes: exits, signals, process-group kills, ports,
no second launch, and adoption by pid after the Popen handle is gone."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from trainyard_launcher.adapters.local import (
    AlreadyLaunched,
    LaunchError,
    LocalBackend,
    PortClaim,
    TaskRef,
    TaskStatus,
)
from trainyard_launcher.adapters.procfs import is_alive, session_members
from trainyard_launcher.domain.completion import exit_reason


def ref(name: str = "t") -> TaskRef:
    return TaskRef(job_id=f"job-{name}", attempt=1, role="worker", index=0)


async def wait_ended(backend: LocalBackend, task: TaskRef, timeout: float = 20.0) -> TaskStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launched = backend.read_pid(task)
        status = backend.poll(task, launched.pid if launched else None,
                              launched.start_ticks if launched else None)
        if launched and status.ended:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task.key} did not end within {timeout}s")


async def test_task_that_exits_zero_writes_logs_and_exit_record(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    task = ref("ok")
    launched = backend.launch(task, "echo hello $TRAINYARD_ROLE; echo oops >&2; pwd", {"TRAINYARD_ROLE": "worker"}, [])
    status = await wait_ended(backend, task)
    assert (status.exit_code, status.signal, status.lost) == (0, None, False)
    directory = tmp_path / "jobs" / "job-ok" / "attempt-1" / "worker-0"
    assert backend.task_dir(task) == directory
    assert (directory / "stdout.log").read_text() == f"hello worker\n{directory / 'work'}\n"
    assert (directory / "stderr.log").read_text() == "oops\n"
    assert (directory / "launched").exists()
    assert int((directory / "pid").read_text().split()[0]) == launched.pid
    assert (directory / "exit.json").exists()


async def test_task_that_exits_three(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.launch(ref(), "exit 3", {}, [])
    status = await wait_ended(backend, ref())
    assert status.exit_code == 3
    assert exit_reason(status.exit_code, status.signal) == "exited with code 3"


async def test_missing_command_is_127_command_not_found(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    # An empty PATH makes nvidia-smi missing even on a machine that has one.
    backend.launch(ref(), "nvidia-smi", {"PATH": str(empty)}, [])
    status = await wait_ended(backend, ref())
    assert status.exit_code == 127
    assert "command not found" in exit_reason(status.exit_code, status.signal)
    assert "nvidia-smi" in (backend.task_dir(ref()) / "stderr.log").read_text()


async def test_the_launcher_settings_do_not_reach_the_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YARD_TOKEN", "super-secret-value")
    backend = LocalBackend(tmp_path)
    backend.launch(ref(), 'echo "token=${YARD_TOKEN:-none} home=${HOME:+set}"', {}, [])
    await wait_ended(backend, ref())
    assert (backend.task_dir(ref()) / "stdout.log").read_text() == "token=none home=set\n"


async def test_no_second_launch(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.launch(ref(), "echo once >> ../../runs.txt", {}, [])
    assert backend.was_launched(ref())
    with pytest.raises(AlreadyLaunched):
        backend.launch(ref(), "echo once >> ../../runs.txt", {}, [])
    with pytest.raises(AlreadyLaunched):
        LocalBackend(tmp_path).launch(ref(), "echo once >> ../../runs.txt", {}, [])
    await wait_ended(backend, ref())
    assert (backend.task_dir(ref()).parent / "runs.txt").read_text() == "once\n"


async def test_a_port_in_use_fails_the_launch_naming_the_port(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} \\(http\\) on 127.0.0.1"):
            backend.launch(ref(), "true", {}, [PortClaim("http", "127.0.0.1", port)])
    # Nothing was started, so nothing blocks a later, successful launch.
    assert not backend.was_launched(ref())
    backend.launch(ref(), "true", {}, [PortClaim("http", "127.0.0.1", port)])
    assert (await wait_ended(backend, ref())).exit_code == 0


async def test_kill_leaves_no_process_of_the_group(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    # Children, a grandchild, and one that ignores SIGTERM (only SIGKILL ends it).
    command = (
        "sleep 300 & echo $! >> pids; "
        "bash -c 'sleep 300 & echo $! >> pids; wait' & echo $! >> pids; "
        "bash -c 'trap \"\" TERM; while true; do sleep 0.1; done' & echo $! >> pids; "
        "wait"
    )
    task = ref("kill")
    launched = backend.launch(task, command, {}, [])
    pids_file = backend.task_dir(task) / "work" / "pids"
    deadline = time.monotonic() + 10
    while (not pids_file.exists() or len(pids_file.read_text().split()) < 4) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    children = [int(p) for p in pids_file.read_text().split()]
    assert len(children) == 4 and all(is_alive(p, None) for p in children)

    started = time.monotonic()
    status = await backend.kill(task, launched.pid, launched.start_ticks, grace_s=1.0)
    assert time.monotonic() - started < 8
    assert status.ended
    assert session_members(launched.pid) == []
    assert not any(is_alive(p, None) for p in children)
    assert not is_alive(launched.pid, launched.start_ticks)


async def test_kill_with_sigterm_lets_the_wrapper_record_the_signal(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = backend.launch(ref(), "sleep 300", {}, [])
    await asyncio.sleep(0.3)
    status = await backend.kill(ref(), launched.pid, launched.start_ticks, grace_s=5.0)
    assert (status.exit_code, status.signal) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert exit_reason(status.exit_code, status.signal) == "killed by SIGTERM"


async def test_adoption_after_the_popen_handle_is_dropped(tmp_path: Path) -> None:
    first = LocalBackend(tmp_path)
    launched = first.launch(ref(), "sleep 1; exit 5", {}, [])
    del first
    gc.collect()

    adopter = LocalBackend(tmp_path)
    # The wrapper writes its pid file as it starts; a loaded machine may take a moment.
    from_file = await adopter.wait_started(ref(), 5.0)
    assert from_file is not None
    assert (from_file.pid, from_file.start_ticks) == (launched.pid, launched.start_ticks)
    assert adopter.poll(ref(), from_file.pid, from_file.start_ticks).running
    status = await wait_ended(adopter, ref())
    assert (status.exit_code, status.lost) == (5, False)


async def test_a_reused_pid_is_not_mistaken_for_the_task(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = backend.launch(ref(), "sleep 300", {}, [])
    assert launched.start_ticks is not None
    try:
        status = backend.poll(ref(), launched.pid, launched.start_ticks + 1)
        assert status.lost
    finally:
        await backend.kill(ref(), launched.pid, launched.start_ticks, grace_s=2.0)


async def test_a_wrapper_killed_from_outside_is_lost_and_its_command_is_cleaned_up(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = backend.launch(ref(), "sleep 300", {}, [])
    await asyncio.sleep(0.3)
    os.kill(launched.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while backend.poll(ref(), launched.pid, launched.start_ticks).running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    status = backend.poll(ref(), launched.pid, launched.start_ticks)
    assert status.lost
    # The command outlived its wrapper; a kill still finds it through the session.
    assert [m.pid for m in session_members(launched.pid)]
    await backend.kill(ref(), launched.pid, launched.start_ticks, grace_s=1.0)
    assert session_members(launched.pid) == []


async def test_the_command_and_its_secrets_stay_off_the_process_list(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    task = ref("private")
    secret = "s3cr3t-" + os.urandom(4).hex()
    launched = backend.launch(task, f"echo {secret} > seen; sleep 300", {}, [])
    seen = backend.task_dir(task) / "work" / "seen"
    deadline = time.monotonic() + 10
    while not seen.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert seen.read_text().strip() == secret  # the command really ran
    command_lines = []
    for pid in session_members(launched.pid):
        with open(f"/proc/{pid.pid}/cmdline", "rb") as cmdline:
            command_lines.append(cmdline.read().decode(errors="replace"))
    assert command_lines and not any(secret in line for line in command_lines), command_lines
    script = backend.task_dir(task) / "command.sh"
    assert script.stat().st_mode & 0o777 == 0o600
    await backend.kill(task, launched.pid, launched.start_ticks, grace_s=1.0)
