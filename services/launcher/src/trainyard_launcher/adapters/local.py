"""The local backend: every task is a process on this machine.

A task lives in ``<root>/jobs/<job_id>/attempt-<n>/<role>-<index>/``: ``work/`` (its
working directory), ``stdout.log``, ``stderr.log``, ``launched`` (written before the
spawn), ``pid`` (written by the wrapper first thing) and ``exit.json`` (written by the
wrapper when the command ended). The wrapper (:mod:`trainyard_launcher.taskwrap`) runs
in a session of its own, so tasks outlive the launcher and are adopted by pid and
process start time when it comes back.

No duplicate launch, ever: the ``launched`` marker is created with O_EXCL before the
spawn, and a task whose marker exists is never spawned again; if its pid file never
appears it is reported lost rather than started a second time.

Task directories are never removed here: the logs must outlive the job (the log API
serves them), which also covers OpenPAI's isDebug (``keep_failed_for_debug``, which
adds the failed task's environment as ``env``). Cleaning old attempts up is left to a
retention policy.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..domain.prepare import PreparePlan
from .procfs import is_alive, proc_stat, session_members, start_ticks

# Launcher settings that must not reach a task (the admin token above all).
_PRIVATE_ENV_PREFIXES = ("YARD_",)
_PRIVATE_ENV_NAMES = {"NATS_URL", "MONGO_URL"}


@dataclass(frozen=True)
class TaskRef:
    job_id: str
    attempt: int
    role: str
    index: int

    @property
    def key(self) -> str:
        return f"{self.job_id}:{self.attempt}:{self.role}:{self.index}"


@dataclass(frozen=True)
class PortClaim:
    label: str
    host_ip: str
    port: int


@dataclass(frozen=True)
class Launched:
    pid: int
    start_ticks: int | None


@dataclass(frozen=True)
class TaskStatus:
    """How a task's process stands. ``lost``: it is gone and left no exit record."""

    running: bool
    exit_code: int | None = None
    signal: int | None = None
    lost: bool = False
    ended_at: float | None = None
    # Why it ended, when the wrapper knows better than the exit code (a failed preparation).
    reason: str | None = None

    @property
    def ended(self) -> bool:
        return not self.running


class LaunchError(Exception):
    """The task could not be started; ``str(exc)`` is the reason a person reads."""


class PortUnavailable(LaunchError):
    """A port the placement gave the task cannot be bound on this machine."""


class AlreadyLaunched(LaunchError):
    """The task was launched before; starting it again would run it twice."""


class TaskBackend(Protocol):
    def task_dir(self, ref: TaskRef) -> Path: ...

    def job_dir(self, job_id: str) -> Path: ...

    def was_launched(self, ref: TaskRef) -> bool: ...

    def launch(
        self, ref: TaskRef, command: str, env: dict[str, str], ports: list[PortClaim],
        prepare: PreparePlan | None = None,
    ) -> Launched: ...

    def write_debug_env(self, ref: TaskRef, text: str) -> Path: ...

    async def wait_started(self, ref: TaskRef, timeout_s: float) -> Launched | None: ...

    def poll(self, ref: TaskRef, pid: int | None, started: int | None) -> TaskStatus: ...

    async def kill(
        self, ref: TaskRef, pid: int | None, started: int | None, grace_s: float
    ) -> TaskStatus: ...


def port_problem(claim: PortClaim) -> str | None:
    """Why ``claim`` cannot be bound now, or None when it can."""
    for host in (claim.host_ip, "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # Servers set SO_REUSEADDR; without it a port in TIME_WAIT would look taken.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, claim.port))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL and host != "0.0.0.0":
                    continue  # a simulated node's address: check the port on this machine
                return (
                    f"port {claim.port} ({claim.label}) on {claim.host_ip} cannot be bound: "
                    f"{exc.strerror or exc}"
                )
            return None
    return None


def task_env(env: dict[str, str]) -> dict[str, str]:
    """This machine's environment (PATH, HOME, ...) without the launcher's own
    settings, under the task's."""
    base = {
        k: v for k, v in os.environ.items()
        if not k.startswith(_PRIVATE_ENV_PREFIXES) and k not in _PRIVATE_ENV_NAMES
    }
    return {**base, **env}


class LocalBackend:
    def __init__(self, root: Path) -> None:
        self.root = root
        # Our own children, kept only to collect their exit status (no zombies).
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    def task_dir(self, ref: TaskRef) -> Path:
        return self.job_dir(ref.job_id) / f"attempt-{ref.attempt}" / f"{ref.role}-{ref.index}"

    def write_debug_env(self, ref: TaskRef, text: str) -> Path:
        return _write_private(self.task_dir(ref) / "env", text)

    def was_launched(self, ref: TaskRef) -> bool:
        return (self.task_dir(ref) / "launched").exists()

    def launch(
        self, ref: TaskRef, command: str, env: dict[str, str], ports: list[PortClaim],
        prepare: PreparePlan | None = None,
    ) -> Launched:
        directory = self.task_dir(ref)
        (directory / "work").mkdir(parents=True, exist_ok=True)
        if self.was_launched(ref):
            raise AlreadyLaunched(f"task {ref.key} was launched before")
        for claim in ports:
            if (problem := port_problem(claim)) is not None:
                raise PortUnavailable(problem)
        try:
            fd = os.open(directory / "launched", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise AlreadyLaunched(f"task {ref.key} was launched before") from None
        os.write(fd, f"{time.time()}\n".encode())
        os.close(fd)

        # -I: the task's PYTHON* variables must not change how the wrapper starts.
        argv = [sys.executable, "-I", "-m", "trainyard_launcher.taskwrap", "--dir", str(directory)]
        if prepare is not None:
            plan_file = directory / "prepare.json"
            plan_file.write_text(prepare.to_json())
            argv += ["--prepare", str(plan_file)]
        # The command goes in a private file, not on the command line: with its secrets
        # substituted it must not show in `ps` to every user of the node.
        argv += ["--", _bash(), str(_write_private(directory / "command.sh", command + "\n"))]
        with open(directory / "stdout.log", "ab") as out, open(directory / "stderr.log", "ab") as err:
            try:
                proc = subprocess.Popen(
                    argv, cwd=directory / "work", env=task_env(env), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start the task wrapper: {exc}") from exc
        self._children[proc.pid] = proc
        return Launched(proc.pid, start_ticks(proc.pid))

    def read_pid(self, ref: TaskRef) -> Launched | None:
        try:
            fields = (self.task_dir(ref) / "pid").read_text().split()
        except FileNotFoundError:
            return None
        if not fields:
            return None
        started = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
        return Launched(int(fields[0]), started)

    async def wait_started(self, ref: TaskRef, timeout_s: float) -> Launched | None:
        deadline = time.monotonic() + timeout_s
        while True:
            if (launched := self.read_pid(ref)) is not None:
                return launched
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)

    def read_exit(self, ref: TaskRef) -> TaskStatus | None:
        try:
            data = json.loads((self.task_dir(ref) / "exit.json").read_text())
        except FileNotFoundError:
            return None
        return TaskStatus(
            running=False, exit_code=data.get("exit_code"), signal=data.get("signal"),
            ended_at=data.get("ended_at"), reason=data.get("reason"),
        )

    def _reap(self, pid: int | None) -> None:
        proc = self._children.get(pid) if pid is not None else None
        if proc is not None and proc.poll() is not None:
            del self._children[proc.pid]

    def poll(self, ref: TaskRef, pid: int | None, started: int | None) -> TaskStatus:
        self._reap(pid)
        if (ended := self.read_exit(ref)) is not None:
            return ended
        if pid is None:
            launched = self.read_pid(ref)
            if launched is None:
                return TaskStatus(running=False, lost=True, ended_at=time.time())
            pid, started = launched.pid, launched.start_ticks
        if is_alive(pid, started):
            return TaskStatus(running=True)
        # The wrapper may have written exit.json between the first look and its exit.
        if (ended := self.read_exit(ref)) is not None:
            return ended
        return TaskStatus(running=False, lost=True, ended_at=time.time())

    def _members(self, pid: int, started: int | None) -> list[int]:
        leader = proc_stat(pid)
        if leader is not None and started is not None and leader.start_ticks != started:
            # The pid now names a stranger, so our session (which kept the number
            # reserved while it had members) is gone.
            return []
        return [member.pid for member in session_members(pid)]

    async def kill(
        self, ref: TaskRef, pid: int | None, started: int | None, grace_s: float
    ) -> TaskStatus:
        """SIGTERM to the task's process group (the wrapper forwards it to the command's
        group), SIGKILL to every process of the task's session after ``grace_s``."""
        if pid is None:
            launched = self.read_pid(ref)
            if launched is None:
                return self.poll(ref, None, None)
            pid, started = launched.pid, launched.start_ticks
        if is_alive(pid, started):
            _signal_group(pid, signal.SIGTERM)
        else:
            # The wrapper is gone but the command may not be: signal its groups directly.
            members = set(self._members(pid, started))
            for pgid in {s.pgid for s in session_members(pid) if s.pid in members}:
                _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._members(pid, started) and time.monotonic() < deadline:
            self._reap(pid)
            await asyncio.sleep(0.05)
        forced = False
        for _ in range(100):
            survivors = self._members(pid, started)
            if not survivors:
                break
            forced = True
            for member in survivors:
                try:
                    os.kill(member, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await asyncio.sleep(0.02)
        self._reap(pid)
        status = self.poll(ref, pid, started)
        if status.lost and forced:
            # The wrapper died with the rest and could not write exit.json.
            return TaskStatus(
                running=False, exit_code=128 + signal.SIGKILL, signal=signal.SIGKILL,
                ended_at=time.time(),
            )
        return status


def _write_private(path: Path, text: str) -> Path:
    """Write ``text`` readable by the task's user only (mode 600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def _bash() -> str:
    # Resolved here, not through the task's PATH, which the job may set to anything.
    return shutil.which("bash") or "/bin/bash"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
