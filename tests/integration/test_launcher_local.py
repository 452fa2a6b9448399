"""The local backend with real processes: exits, signals, process-group kills, ports,
no second launch, adoption by pid after the Popen handle is gone; capped and followed
logs, debug mode and exec, resource limits, clean-up."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from trainyard_common.events import FailureClass, TaskState
from trainyard_common.jobspec import Resources
from trainyard_launcher.adapters.backend import (
    AlreadyLaunched,
    LaunchError,
    PortClaim,
    TaskHandle,
    TaskOptions,
    TaskRef,
)
from trainyard_launcher.adapters.limits import find_cgroup, find_mechanisms, make_cgroup, oom_kills
from trainyard_launcher.adapters.local import LocalBackend
from trainyard_launcher.adapters.procfs import is_alive, session_members
from trainyard_launcher.domain.completion import exit_reason
from trainyard_launcher.domain.limits import Mechanisms
from trainyard_launcher.handlers.ending import _end_of
from trainyard_launcher.logs import CappedLog, follow, older_part, read_log

from ..support.launcher import launch, wait_ended


def ref(name: str = "t") -> TaskRef:
    return TaskRef(job_id=f"job-{name}", attempt=1, role="worker", index=0)


async def test_task_that_exits_zero_writes_logs_and_exit_record(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    task = ref("ok")
    launched = await launch(
        backend,
        task,
        "echo hello $TRAINYARD_ROLE; echo oops >&2; pwd",
        {"TRAINYARD_ROLE": "worker"},
        [],
    )
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
    await launch(backend, ref(), "exit 3", {}, [])
    status = await wait_ended(backend, ref())
    assert status.exit_code == 3
    assert exit_reason(status.exit_code, status.signal) == "exited with code 3"


async def test_missing_command_is_127_command_not_found(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    # An empty PATH makes nvidia-smi missing even on a machine that has one.
    await launch(backend, ref(), "nvidia-smi", {"PATH": str(empty)}, [])
    status = await wait_ended(backend, ref())
    assert status.exit_code == 127
    assert "command not found" in exit_reason(status.exit_code, status.signal)
    assert "nvidia-smi" in (backend.task_dir(ref()) / "stderr.log").read_text()


async def test_the_launcher_settings_do_not_reach_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("YARD_TOKEN", "super-secret-value")
    backend = LocalBackend(tmp_path)
    await launch(backend, ref(), 'echo "token=${YARD_TOKEN:-none} home=${HOME:+set}"', {}, [])
    await wait_ended(backend, ref())
    assert (backend.task_dir(ref()) / "stdout.log").read_text() == "token=none home=set\n"


async def test_no_second_launch(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    await launch(backend, ref(), "echo once >> ../../runs.txt", {}, [])
    assert await backend.was_launched(ref())
    with pytest.raises(AlreadyLaunched):
        await launch(backend, ref(), "echo once >> ../../runs.txt", {}, [])
    with pytest.raises(AlreadyLaunched):
        await launch(LocalBackend(tmp_path), ref(), "echo once >> ../../runs.txt", {}, [])
    await wait_ended(backend, ref())
    assert (backend.task_dir(ref()).parent / "runs.txt").read_text() == "once\n"


async def test_a_port_in_use_fails_the_launch_naming_the_port(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} \\(http\\) on 127.0.0.1"):
            await launch(backend, ref(), "true", {}, [PortClaim("http", "127.0.0.1", port)])
    # Nothing was started, so nothing blocks a later, successful launch.
    assert not await backend.was_launched(ref())
    await launch(backend, ref(), "true", {}, [PortClaim("http", "127.0.0.1", port)])
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
    launched = await launch(backend, task, command, {}, [])
    pids_file = backend.task_dir(task) / "work" / "pids"
    deadline = time.monotonic() + 10
    while (
        not pids_file.exists() or len(pids_file.read_text().split()) < 4
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    children = [int(p) for p in pids_file.read_text().split()]
    assert len(children) == 4 and all(is_alive(p, None) for p in children)

    started = time.monotonic()
    status = await backend.kill(task, launched.handle, grace_s=1.0)
    assert time.monotonic() - started < 8
    assert status.ended
    assert session_members(launched.pid) == []
    assert not any(is_alive(p, None) for p in children)
    assert not is_alive(launched.pid, launched.handle.start_ticks)


async def test_kill_with_sigterm_lets_the_wrapper_record_the_signal(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    await asyncio.sleep(0.3)
    status = await backend.kill(ref(), launched.handle, grace_s=5.0)
    assert (status.exit_code, status.signal) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert exit_reason(status.exit_code, status.signal) == "killed by SIGTERM"


async def test_adoption_after_the_popen_handle_is_dropped(tmp_path: Path) -> None:
    first = LocalBackend(tmp_path)
    launched = await launch(first, ref(), "sleep 1; exit 5", {}, [])
    del first
    gc.collect()

    adopter = LocalBackend(tmp_path)
    # The wrapper writes its pid file as it starts; a loaded machine may take a moment.
    from_file = await adopter.wait_started(ref(), 5.0)
    assert from_file is not None
    assert (from_file.pid, from_file.handle.start_ticks) == (
        launched.pid,
        launched.handle.start_ticks,
    )
    assert (await adopter.poll(ref(), from_file.handle)).running
    status = await wait_ended(adopter, ref())
    assert (status.exit_code, status.lost) == (5, False)


async def test_a_reused_pid_is_not_mistaken_for_the_task(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    assert launched.handle.start_ticks is not None
    try:
        status = await backend.poll(
            ref(), TaskHandle(pid=launched.pid, start_ticks=launched.handle.start_ticks + 1)
        )
        assert status.lost
    finally:
        await backend.kill(ref(), launched.handle, grace_s=2.0)


async def test_a_wrapper_killed_from_outside_is_lost_and_its_command_is_cleaned_up(
    tmp_path: Path,
) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    await asyncio.sleep(0.3)
    os.kill(launched.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while (await backend.poll(ref(), launched.handle)).running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    status = await backend.poll(ref(), launched.handle)
    assert status.lost
    # The command outlived its wrapper; a kill still finds it through the session.
    assert [m.pid for m in session_members(launched.pid)]
    await backend.kill(ref(), launched.handle, grace_s=1.0)
    assert session_members(launched.pid) == []


async def test_the_command_and_its_secrets_stay_off_the_process_list(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    task = ref("private")
    secret = "s3cr3t-" + os.urandom(4).hex()
    launched = await launch(backend, task, f"echo {secret} > seen; sleep 300", {}, [])
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
    await backend.kill(task, launched.handle, grace_s=1.0)


# --- logs, debug mode, exec, limits, clean-up ----------------------------------------------


def limited(memory_mb: int = 1024, shm_mb: int = 64) -> TaskOptions:
    return TaskOptions(resources=Resources(memory_mb=memory_mb, shm_mb=shm_mb))


async def test_a_log_is_capped_keeping_its_newest_part(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, log_max_bytes=4000)
    await launch(backend, ref(), "for i in $(seq 1 2000); do echo line $i; done", {}, [])
    assert (await wait_ended(backend, ref())).exit_code == 0
    log = backend.task_dir(ref()) / "stdout.log"
    kept = read_log(log)
    assert log.stat().st_size <= 2000 and older_part(log).stat().st_size <= 2000
    assert kept.endswith(b"line 1999\nline 2000\n")
    assert not kept.startswith(b"line 1\n")
    # Parts end at a line's end: what is kept is whole lines.
    assert all(line.startswith(b"line ") for line in kept.splitlines())


def test_a_capped_log_written_line_by_line_keeps_whole_lines(tmp_path: Path) -> None:
    # A line that does not fit in what is left of a part starts the next part instead of
    # being cut (the full run once read a part that began mid-line).
    path = tmp_path / "stdout.log"
    log = CappedLog(path, 40)
    for i in range(1, 31):
        log.write(f"line {i}\n".encode())
    log.close()
    assert path.stat().st_size <= 20 and older_part(path).stat().st_size <= 20
    for part in (older_part(path), path):
        assert all(line.startswith(b"line ") for line in part.read_bytes().splitlines())
    assert read_log(path).endswith(b"line 30\n")


async def test_following_a_log_goes_on_across_its_rotation(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    writer = CappedLog(path, 200)
    done = asyncio.Event()
    got: list[bytes] = []

    async def ended() -> bool:
        return done.is_set()

    async def read() -> None:
        async for chunk in follow(path, 0, ended, poll_s=0.01):
            got.append(chunk)

    reader = asyncio.create_task(read())
    for i in range(40):
        writer.write(f"line {i:02d}\n".encode())
        await asyncio.sleep(0.005)
    done.set()
    await asyncio.wait_for(reader, 5)
    assert b"".join(got) == b"".join(f"line {i:02d}\n".encode() for i in range(40))


async def test_a_debug_task_is_prepared_but_runs_a_keep_alive_until_stopped(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, mechanisms=find_mechanisms())
    task = ref("debug")
    launched = await launch(
        backend,
        task,
        "echo ran > ran; exit 3",
        {"GREETING": "hi"},
        [],
        options=TaskOptions(debug=True, resources=Resources()),
    )
    deadline = time.monotonic() + 10
    while (
        not (await backend.progress(task, launched.handle)).command_started
        and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert (await backend.poll(task, launched.handle)).running
    assert not (backend.task_dir(task) / "work" / "ran").exists()
    assert (
        "debug mode: the command is not run" in (backend.task_dir(task) / "stderr.log").read_text()
    )

    result = await backend.exec(
        task,
        launched.handle,
        ["bash", "-c", 'echo "$GREETING from $PWD"; exit 7'],
        {"GREETING": "hi"},
        10,
    )
    assert (result.exit_code, result.stdout, result.timed_out) == (
        7,
        f"hi from {backend.task_dir(task) / 'work'}\n",
        False,
    )

    # A command still running in the task ends with it, as does the keep-alive.
    hanging = asyncio.create_task(backend.exec(task, launched.handle, ["sleep", "300"], {}, 60))
    await asyncio.sleep(0.3)
    status = await backend.kill(task, launched.handle, grace_s=2.0)
    assert status.ended
    assert (await asyncio.wait_for(hanging, 5)).exit_code == 128 + signal.SIGKILL
    assert session_members(launched.pid) == []


async def test_an_exec_past_its_timeout_is_killed(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    started = time.monotonic()
    result = await backend.exec(
        ref(), launched.handle, ["bash", "-c", "echo begun; sleep 300"], {}, 0.5
    )
    assert result.timed_out and result.stdout == "begun\n" and time.monotonic() - started < 5
    # Nothing of an ended exec is kept (an entry per task ever exec'd in, for a task
    # that then ends by itself, was never removed).
    assert (await backend.exec(ref(), launched.handle, ["true"], {}, 5)).exit_code == 0
    assert backend._execs == {}
    await backend.kill(ref(), launched.handle, grace_s=1.0)


async def test_an_exec_holds_only_the_end_of_what_it_writes(tmp_path: Path) -> None:
    # 40 MB of output answered as its last 4 kB, read as it came: the launcher never
    # held it whole (a `yes` for ten minutes would have filled its memory).
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    tracemalloc.start()
    try:
        result = await backend.exec(
            ref(),
            launched.handle,
            ["bash", "-c", "head -c 40000000 /dev/zero | tr '\\0' x; printf end"],
            {},
            30,
            limit_bytes=4096,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (result.exit_code, result.timed_out) == (0, False)
    assert result.stdout == "x" * 4093 + "end"
    assert peak < 4 * 1024 * 1024, peak
    await backend.kill(ref(), launched.handle, grace_s=1.0)


def daemon_line(pid_file: str) -> str:
    """A shell line that starts a daemon in a session of its own, ignoring SIGTERM, and
    goes on once the daemon has written its pid to ``pid_file``. (``setsid prog & echo
    $!`` names setsid's parent, which forks the daemon when it leads its group and
    exits at once: a test reading that pid finds it dead whatever became of the
    daemon.)"""
    return (
        f"setsid sh -c 'echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file}; "
        f'trap "" TERM; exec sleep 300\' </dev/null >/dev/null 2>&1 & '
        f"while [ ! -s {pid_file} ]; do sleep 0.02; done"
    )


async def test_an_exec_ends_with_its_command_and_takes_its_background_along(
    tmp_path: Path,
) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    started = time.monotonic()
    result = await backend.exec(
        ref(), launched.handle, ["bash", "-c", "sleep 300 & echo $!; echo late >&2"], {}, 60
    )
    # Answered when bash ended, not after the timeout, though the sleep held its pipes.
    assert (result.exit_code, result.stderr, result.timed_out) == (0, "late\n", False)
    assert time.monotonic() - started < 10
    background = int(result.stdout)
    deadline = time.monotonic() + 5  # killed: its pipes closed as it exits, just before
    while is_alive(background, None):
        assert time.monotonic() < deadline, "the background sleep outlived its exec"
        await asyncio.sleep(0.02)
    # One that left the exec's session (setsid, ignoring SIGTERM) held the pipes open
    # and outlived the exec and the task: it ends with the exec too, and the launcher's
    # ends of the pipes are closed.
    fds = len(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    left = f"{daemon_line('left')}; cat left"
    result = await backend.exec(ref(), launched.handle, ["bash", "-c", left], {}, 60)
    daemon = int(result.stdout)
    try:
        assert (result.exit_code, result.timed_out) == (0, False)
        assert time.monotonic() - started < 10
        assert len(os.listdir("/proc/self/fd")) == fds
        deadline = time.monotonic() + 5
        while is_alive(daemon, None):
            assert time.monotonic() < deadline, "a setsid process outlived its exec"
            await asyncio.sleep(0.02)
    finally:
        if is_alive(daemon, None):
            os.kill(daemon, signal.SIGKILL)
    await backend.kill(ref(), launched.handle, grace_s=1.0)


async def test_an_exec_out_of_time_or_stopped_takes_what_left_its_session_along(
    tmp_path: Path,
) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    out = backend.task_dir(ref()) / "work"
    timed = await backend.exec(
        ref(), launched.handle, ["bash", "-c", f"{daemon_line('timed')}; sleep 300"], {}, 1.0
    )
    assert timed.timed_out
    stopping = asyncio.create_task(backend.exec(
        ref(), launched.handle, ["bash", "-c", f"{daemon_line('stopped')}; sleep 300"], {}, 60
    ))  # fmt: skip
    deadline = time.monotonic() + 10
    while not (out / "stopped").exists() or not (out / "stopped").read_text().strip():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    daemons = [int((out / name).read_text()) for name in ("timed", "stopped")]
    try:
        assert (await backend.kill(ref(), launched.handle, grace_s=1.0)).ended
        assert (await asyncio.wait_for(stopping, 10)).exit_code == 128 + signal.SIGKILL
        deadline = time.monotonic() + 5
        while any(is_alive(d, None) for d in daemons):
            assert time.monotonic() < deadline, "a setsid process outlived its exec"
            await asyncio.sleep(0.02)
    finally:
        for daemon in daemons:
            if is_alive(daemon, None):
                os.kill(daemon, signal.SIGKILL)


async def test_an_exec_leaves_no_deep_chain_behind_and_keeps_sigpipe(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    launched = await launch(backend, ref(), "sleep 300", {}, [])
    work = backend.task_dir(ref()) / "work"
    # Each level starts the next and waits: 150 levels, in a session of their own. The
    # reaper's sweep once killed one level a pass (its orphans), 100 passes in all.
    (work / "chain.sh").write_text(
        "echo $$ >> chain.pids\n"
        'if [ "$1" -gt 0 ]; then sh ./chain.sh $(($1 - 1)) & fi\n'
        "exec sleep 300\n"
    )
    start = (
        "setsid sh ./chain.sh 150 </dev/null >/dev/null 2>&1 & "
        "while [ $(wc -l < chain.pids 2>/dev/null || echo 0) -lt 151 ]; do sleep 0.05; done"
    )
    chain: list[int] = []
    try:
        result = await backend.exec(ref(), launched.handle, ["bash", "-c", start], {}, 60)
        chain = [int(line) for line in (work / "chain.pids").read_text().split()]
        assert (result.exit_code, len(chain)) == (0, 151), result
        deadline = time.monotonic() + 5
        while alive := [pid for pid in chain if is_alive(pid, None)]:
            assert time.monotonic() < deadline, f"{len(alive)} of the chain outlived the exec"
            await asyncio.sleep(0.05)
        # A writer to a closed pipe dies of SIGPIPE, as in a shell: Python, which runs
        # the reaper, ignores it, and an exec keeps what is ignored.
        piped = await backend.exec(
            ref(), launched.handle, ["bash", "-c", "yes | head -1; echo ${PIPESTATUS[0]}"], {}, 30
        )
        assert (piped.stdout, piped.stderr) == ("y\n141\n", "")
    finally:
        for pid in chain:
            if is_alive(pid, None):
                os.kill(pid, signal.SIGKILL)
        await backend.kill(ref(), launched.handle, grace_s=1.0)


async def test_a_process_that_left_the_session_ends_with_the_task(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    # setsid puts the sleep in a session of its own: a session kill would miss it.
    await launch(backend, ref(), f"{daemon_line('daemon')}; sleep 0.3; exit 0", {}, [])
    assert (await wait_ended(backend, ref())).exit_code == 0
    daemon = int((backend.task_dir(ref()) / "work" / "daemon").read_text())
    assert not is_alive(daemon, None)


async def test_a_process_that_left_the_session_ends_with_a_stopped_task(tmp_path: Path) -> None:
    # Stopped, the command ignores SIGTERM, so the wrapper is killed after the grace:
    # a daemon that left the session (ignoring SIGTERM too) must not outlive it.
    backend = LocalBackend(tmp_path)
    launched = await launch(
        backend,
        ref(),
        f"trap '' TERM; {daemon_line('daemon')}; sleep 300",
        {},
        [],
    )
    marker = backend.task_dir(ref()) / "work" / "daemon"
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    daemon = int(marker.read_text())
    try:
        status = await backend.kill(ref(), launched.handle, grace_s=0.5)
        assert status.ended
        assert not is_alive(daemon, None)
    finally:
        if is_alive(daemon, None):
            os.kill(daemon, signal.SIGKILL)


async def test_a_task_past_its_memory_limit_fails_as_out_of_memory(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, mechanisms=find_mechanisms())
    launched = await launch(
        backend,
        ref(),
        "python3 -c 'block = bytearray(512 * 1024 * 1024); print(len(block))'",
        {},
        [],
        options=limited(memory_mb=128),
    )
    assert launched.note is not None and "memory 128 MiB" in launched.note
    status = await wait_ended(backend, ref())
    assert status.exit_code != 0
    assert status.end_kind == "out_of_memory", (backend.task_dir(ref()) / "stderr.log").read_text()
    assert "limit of 128 MiB was reached" in (status.reason or "")
    state, fields = _end_of(status, "lost")
    assert state is TaskState.FAILED and fields["failure_class"] is FailureClass.USER


# Touches 300 MB of shared memory, which RLIMIT_DATA does not count.
SHARED = (
    "python3 -c 'import mmap, time; m = mmap.mmap(-1, 300 << 20, flags=mmap.MAP_SHARED); "
    '[m.__setitem__(i, 1) for i in range(0, 300 << 20, 4096)]; print("touched"); '
    "time.sleep(60)'"
)
# Four processes of 60 MB each: each within a per-process limit of 128 MiB.
FORKED = (
    "for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(60 << 20); time.sleep(60)' & "
    "done; wait"
)


@pytest.mark.parametrize("command", [SHARED, FORKED], ids=["shared-memory", "four-processes"])
async def test_a_task_whose_processes_together_pass_its_limit_is_ended(
    tmp_path: Path, command: str
) -> None:
    backend = LocalBackend(tmp_path, mechanisms=find_mechanisms())
    launched = await launch(backend, ref(), command, {}, [], options=limited(memory_mb=128))
    status = await wait_ended(backend, ref(), timeout=30)
    assert status.end_kind == "out_of_memory", (backend.task_dir(ref()) / "stderr.log").read_text()
    if "RLIMIT_DATA" in (launched.note or ""):
        assert "MiB together, sampled each second" in (status.reason or ""), status.reason
    assert session_members(launched.pid) == []


async def test_processes_sharing_their_pages_count_them_once(tmp_path: Path) -> None:
    # 80 MB written, then four forks that only read it: 400 MB resident, 80 held.
    backend = LocalBackend(tmp_path, mechanisms=find_mechanisms())
    command = (
        "python3 -c 'import os, time; b = bytearray(os.urandom(80 << 20)); "
        "[os.fork() or (time.sleep(3), os._exit(0)) for _ in range(4)]; time.sleep(3); "
        'print("done")\''
    )
    await launch(backend, ref(), command, {}, [], options=limited(memory_mb=200))
    status = await wait_ended(backend, ref(), timeout=30)
    assert (status.exit_code, status.end_kind) == (0, None), status.reason


async def test_a_task_within_its_memory_limit_runs(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, mechanisms=find_mechanisms())
    await launch(
        backend,
        ref(),
        "python3 -c 'block = bytearray(32 * 1024 * 1024); print(len(block))'",
        {},
        [],
        options=limited(memory_mb=256),
    )
    status = await wait_ended(backend, ref())
    assert (status.exit_code, status.end_kind) == (0, None)


async def test_shared_memory_is_a_tmpfs_of_the_size_asked_where_the_machine_allows(
    tmp_path: Path,
) -> None:
    found = find_mechanisms()
    if not found.shm_namespace:
        pytest.skip(f"no per-task /dev/shm here: {found.why_no_shm}")
    backend = LocalBackend(tmp_path, mechanisms=found)
    await launch(backend, ref(), "stat -f -c '%b %S' /dev/shm", {}, [], options=limited(shm_mb=16))
    assert (await wait_ended(backend, ref())).exit_code == 0
    blocks, size = (backend.task_dir(ref()) / "stdout.log").read_text().split()
    assert int(blocks) * int(size) == 16 * 1024 * 1024


async def test_no_shared_memory_is_an_empty_read_only_dev_shm_never_the_machines(
    tmp_path: Path,
) -> None:
    # shm_mb 0 gave the task the machine's /dev/shm: memory no limit charges to it, and
    # names shared with the services and every other user's tasks.
    found = find_mechanisms()
    if not found.shm_namespace:
        pytest.skip(f"no per-task /dev/shm here: {found.why_no_shm}")
    marker = Path("/dev/shm") / f"yard-test-{os.getpid()}"
    written = Path("/dev/shm") / f"yard-test-{os.getpid()}-task"
    marker.write_text("the machine's")
    try:
        backend = LocalBackend(tmp_path, mechanisms=found)
        script = f"ls -A /dev/shm; echo x > {written} 2>/dev/null && echo wrote; echo done"
        await launch(backend, ref(), script, {}, [], options=limited(shm_mb=0))
        assert (await wait_ended(backend, ref())).exit_code == 0
        assert (backend.task_dir(ref()) / "stdout.log").read_text() == "done\n"
        assert not written.exists()
    finally:
        marker.unlink()
        written.unlink(missing_ok=True)


async def test_clean_up_keeps_the_logs(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    await launch(
        backend, ref(), "echo out; echo err >&2; mkdir -p deep/er; echo x > deep/er/f", {}, []
    )
    await wait_ended(backend, ref())
    removed = await backend.clean_task(ref())
    assert "work" in removed and "command.sh" in removed
    directory = backend.task_dir(ref())
    assert sorted(os.listdir(directory)) == [
        "exit.json",
        "launched",
        "pid",
        "started",
        "stderr.log",
        "stdout.log",
    ]
    assert (directory / "stdout.log").read_text() == "out\n"


async def test_clean_up_removes_nothing_through_a_directory_swapped_for_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process of the task's user that outlived it swaps a directory of its working
    # tree for a link to somewhere else just after the clean-up listed it: what the
    # link names must stay (the clean-up runs as root).
    backend = LocalBackend(tmp_path / "root")
    await launch(backend, ref(), "mkdir sub; touch sub/victim", {}, [])
    await wait_ended(backend, ref())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("not the task's\n")
    sub = backend.task_dir(ref()) / "work" / "sub"
    real_listdir, real_scandir = os.listdir, os.scandir

    def swap_after(listing: Any, where: Any) -> Any:
        named = os.readlink(f"/proc/self/fd/{where}") if isinstance(where, int) else str(where)
        if named == str(sub):
            sub.rename(sub.with_name("moved"))
            sub.symlink_to(elsewhere)
        return listing

    monkeypatch.setattr(os, "listdir", lambda p=".": swap_after(real_listdir(p), p))
    monkeypatch.setattr(os, "scandir", lambda p=".": swap_after(list(real_scandir(p)), p))
    removed = await backend.clean_task(ref())
    monkeypatch.undo()
    assert "work" in removed
    assert (elsewhere / "victim").read_text() == "not the task's\n"


def test_a_delegated_cgroup_gets_the_task_limits_written(tmp_path: Path) -> None:
    # A stand-in for a delegated cgroup v2 directory (the files the kernel shows).
    base = tmp_path / "cg"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.subtree_control").write_text("cpu memory pids\n")
    found_base, controllers, why = find_cgroup(str(base))
    assert (found_base, controllers, why) == (str(base), frozenset({"memory", "cpu", "pids"}), "")
    mechanisms = Mechanisms(
        cgroup=found_base, controllers=controllers, shm_namespace=False, why_no_shm="test"
    )
    backend = LocalBackend(tmp_path / "root", mechanisms=mechanisms)
    plan = backend.limit_plan(ref(), limited(memory_mb=300))
    assert plan is not None and plan.cgroup == str(base / "yard-job-t-1-worker-0")
    made = make_cgroup(plan)
    assert made == plan.cgroup
    assert (Path(made) / "memory.max").read_text() == str(300 * 1024 * 1024)
    assert (Path(made) / "cpu.max").read_text() == "100000 100000"
    assert (Path(made) / "pids.max").read_text() == "16384"
    (Path(made) / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert oom_kills(made) == 1


def test_this_machine_says_why_it_has_no_usable_cgroup_or_which_it_uses() -> None:
    base, controllers, why = find_cgroup()
    assert (base is not None and "memory" in controllers) or why


async def test_usage_counts_every_process_of_the_task(tmp_path: Path) -> None:
    """GetJobMetrics' figures: a task busy on one core (in a child of its command) and
    holding ~64 MB reads as about one core and at least that memory; an ended task has
    none."""
    backend = LocalBackend(tmp_path)
    task = ref("usage")
    hog = (
        "python3 -c 'import time; b = bytearray(64 << 20); t = time.time()\n"
        "while time.time() - t < 30: pass' & wait"
    )
    launched = await launch(backend, task, hog, {}, [])
    deadline = time.monotonic() + 10
    used = None
    while time.monotonic() < deadline:
        used = await backend.usage(task, launched.handle)
        if used is not None and used.memory_bytes > 64 << 20 and used.cpu_cores > 0.5:
            break
        await asyncio.sleep(0.2)
    assert used is not None and used.memory_bytes > 64 << 20, used
    assert 0.5 < used.cpu_cores < 1.5, used
    await backend.kill(task, launched.handle, grace_s=1.0)
    assert await backend.usage(task, launched.handle) is None


def test_a_plain_tasks_wrapper_loads_neither_pydantic_nor_the_preparation(tmp_path: Path) -> None:
    # The wrapper's imports are paid by every task (bench/README.md: importing pydantic
    # made each 170 ms of CPU); a check of whether a command enters a view once imported
    # the preparation, and pydantic with it, for every task: 42 -> 9 jobs/s.
    (tmp_path / "work").mkdir()
    options = tmp_path / "options.json"
    options.write_text(json.dumps({"limits": {"memory_mb": 256, "memory_by": "rlimit"}}))
    code = (
        "import sys\n"
        "from trainyard_launcher import taskwrap\n"
        f"code = taskwrap.main(['--dir', {str(tmp_path)!r}, '--options', {str(options)!r},"
        " '--', 'true'])\n"
        "print(code, sorted(m for m in ('pydantic', 'trainyard_launcher.adapters.prepare')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "0 []", (done.stdout, done.stderr)


async def test_a_wrapper_that_ended_unseen_is_not_kept(tmp_path: Path) -> None:
    # Without the spawner the launcher keeps its wrappers' Popen to reap them; one the
    # watcher saw end by its exit file before it exited was never reaped, and stayed.
    backend = LocalBackend(tmp_path, spawner=False)
    first = await launch(backend, ref("a"), "true", {}, [])
    wrapper = backend._children[first.handle.pid]
    deadline = time.monotonic() + 10
    while (backend.read_exit(ref("a")) is None or wrapper.poll() is None) and (
        time.monotonic() < deadline
    ):
        await asyncio.sleep(0.05)  # ended, its wrapper too, never polled by the backend
    second = await launch(backend, ref("b"), "sleep 30", {}, [])
    assert list(backend._children) == [second.handle.pid]
    await backend.kill(ref("b"), second.handle, grace_s=1.0)
