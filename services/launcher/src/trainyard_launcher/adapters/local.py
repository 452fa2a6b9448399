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

Task directories are kept unless the job's clean-up policy says otherwise
(``clean_task``: everything but the logs and the wrapper's records goes); the logs
always outlive the job (the log API serves them), which also covers OpenPAI's isDebug
(``keep_failed_for_debug``, which adds the failed task's environment as ``env``).
Cleaning old jobs up is left to a retention policy.

Each log stream is capped (``log_max_bytes``, logs.py) and the task is held to its
resources as far as this machine allows (``mechanisms``, domain/limits.py). ``exec``
runs a command in a running task: its environment, its working directory, and its
mount namespace where it has one.
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

from trainyard_common.jobspec import Resources

from ..domain.lifecycle import removable
from ..domain.limits import LimitPlan, Mechanisms, cgroup_name, plan_limits
from ..domain.prepare import PreparePlan
from ..logs import DEFAULT_MAX_BYTES
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
    # What the task is held to here (domain.limits.LimitPlan.summary), when known.
    note: str | None = None


@dataclass(frozen=True)
class TaskOptions:
    """How a task runs besides its command."""

    # T9k's debug mode: prepared, then a keep-alive instead of the command.
    debug: bool = False
    # The role's resources, enforced as far as the machine allows.
    resources: Resources | None = None


@dataclass(frozen=True)
class Progress:
    """How far a task that is not yet known to run its command got."""

    command_started: bool
    step: str | None = None  # its preparation's last step


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass(frozen=True)
class TaskStatus:
    """How a task's process stands. ``lost``: it is gone and left no exit record."""

    running: bool
    exit_code: int | None = None
    signal: int | None = None
    lost: bool = False
    ended_at: float | None = None
    # Why it ended, when the wrapper knows better than the exit code (a failed
    # preparation, an exceeded memory limit).
    reason: str | None = None
    # How it ended when the wrapper could tell (domain.failure.EndKind: out_of_memory).
    end_kind: str | None = None

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
        self,
        ref: TaskRef,
        command: str,
        env: dict[str, str],
        ports: list[PortClaim],
        prepare: PreparePlan | None = None,
        options: TaskOptions | None = None,
    ) -> Launched: ...

    def write_debug_env(self, ref: TaskRef, text: str) -> Path: ...

    async def wait_started(self, ref: TaskRef, timeout_s: float) -> Launched | None: ...

    def poll(self, ref: TaskRef, pid: int | None, started: int | None) -> TaskStatus: ...

    async def kill(
        self, ref: TaskRef, pid: int | None, started: int | None, grace_s: float
    ) -> TaskStatus: ...

    def progress(self, ref: TaskRef) -> Progress: ...

    def clean_task(self, ref: TaskRef) -> list[str]: ...

    def clean_job(self, job_id: str) -> bool: ...

    async def exec(
        self,
        ref: TaskRef,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
        pid: int | None = None,
    ) -> ExecResult: ...


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
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_PRIVATE_ENV_PREFIXES) and k not in _PRIVATE_ENV_NAMES
    }
    return {**base, **env}


class LocalBackend:
    def __init__(
        self,
        root: Path,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        mechanisms: Mechanisms | None = None,
    ) -> None:
        self.root = root
        self.log_max_bytes = log_max_bytes
        # What this machine lets tasks be held to; None: no limits are set at all.
        self.mechanisms = mechanisms
        # Our own children, kept only to collect their exit status (no zombies).
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # Commands run in tasks (exec), by task key: ended with the task.
        self._execs: dict[str, set[subprocess.Popen[bytes]]] = {}

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    def task_dir(self, ref: TaskRef) -> Path:
        return self.job_dir(ref.job_id) / f"attempt-{ref.attempt}" / f"{ref.role}-{ref.index}"

    def write_debug_env(self, ref: TaskRef, text: str) -> Path:
        return _write_private(self.task_dir(ref) / "env", text)

    def was_launched(self, ref: TaskRef) -> bool:
        return (self.task_dir(ref) / "launched").exists()

    def launch(
        self,
        ref: TaskRef,
        command: str,
        env: dict[str, str],
        ports: list[PortClaim],
        prepare: PreparePlan | None = None,
        options: TaskOptions | None = None,
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
            # Private: the plan holds the task's environment and the repository URL,
            # which may carry a token.
            plan_file = _write_private(directory / "prepare.json", prepare.to_json())
            argv += ["--prepare", str(plan_file)]
        limits = self.limit_plan(ref, options)
        wrapper_options = {
            "debug": bool(options and options.debug),
            "log_max_bytes": self.log_max_bytes,
            "limits": json.loads(limits.to_json()) if limits is not None else None,
        }
        options_file = directory / "task.json"
        options_file.write_text(json.dumps(wrapper_options))
        argv += ["--options", str(options_file)]
        # The command goes in a private file, not on the command line: with its secrets
        # substituted it must not show in `ps` to every user of the node.
        argv += ["--", _bash(), str(_write_private(directory / "command.sh", command + "\n"))]
        with (
            open(directory / "stdout.log", "ab") as out,
            open(directory / "stderr.log", "ab") as err,
        ):
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=directory / "work",
                    env=_with_defaults(task_env(env)),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start the task wrapper: {exc}") from exc
        self._children[proc.pid] = proc
        return Launched(proc.pid, start_ticks(proc.pid), limits.summary if limits else None)

    def limit_plan(self, ref: TaskRef, options: TaskOptions | None) -> LimitPlan | None:
        if self.mechanisms is None or options is None or options.resources is None:
            return None
        cgroup = None
        if self.mechanisms.cgroup is not None:
            cgroup = os.path.join(
                self.mechanisms.cgroup, cgroup_name(ref.job_id, ref.attempt, ref.role, ref.index)
            )
        return plan_limits(options.resources, self.mechanisms, cgroup)

    def progress(self, ref: TaskRef) -> Progress:
        """Whether the task's command (or debug keep-alive) runs, and else the step its
        preparation is on (the last ``trainyard prepare:`` line of its stderr)."""
        directory = self.task_dir(ref)
        if (directory / "started").exists():
            return Progress(True)
        step = None
        try:
            with open(directory / "stderr.log", "rb") as log:
                log.seek(max(log.seek(0, os.SEEK_END) - 16 * 1024, 0))
                tail = log.read().decode(errors="replace")
        except FileNotFoundError:
            tail = ""
        for line in reversed(tail.splitlines()):
            if line.startswith("trainyard prepare: "):
                step = line.removeprefix("trainyard prepare: ").strip()[:200]
                break
        return Progress(False, step)

    def clean_task(self, ref: TaskRef) -> list[str]:
        """Remove the task's files but its logs and records (a clean-up policy);
        returns what was removed. Never crosses into another filesystem (a mount)."""
        directory = self.task_dir(ref)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        device = os.lstat(directory).st_dev
        removed = []
        for name in removable(names):
            _remove(directory / name, device)
            removed.append(name)
        return removed

    def clean_job(self, job_id: str) -> bool:
        """Remove the job's virtualenv (a clean-up policy, once the job has ended)."""
        venv = self.job_dir(job_id) / "venv"
        if not venv.exists():
            return False
        _remove(venv, os.lstat(venv).st_dev)
        for name in ("venv.json", "venv.lock"):
            (self.job_dir(job_id) / name).unlink(missing_ok=True)
        return True

    async def exec(
        self,
        ref: TaskRef,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
        pid: int | None = None,
        limit_bytes: int = 1024 * 1024,
    ) -> ExecResult:
        """Run ``command`` in the task: its environment, its working directory, and,
        where the task runs in a mount namespace of its own (mount paths, /dev/shm), in
        that namespace, so it sees what the task sees. Killed (its whole group) after
        ``timeout_s``; each output is cut to its last ``limit_bytes``."""
        # coreutils' timeout bounds the command even if this launcher dies meanwhile and
        # nothing is left to kill it (it runs in a session of its own, not the task's).
        argv = ["timeout", "-s", "KILL", f"{timeout_s + EXEC_KILL_MARGIN_S:g}", *command]
        target = self._namespace_target(ref, pid)
        if target is not None:
            argv = [*target, "--", *argv]
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.task_dir(ref) / "work",
                env=_with_defaults(task_env(env)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return ExecResult(127, "", f"trainyard: cannot run {command[0]!r}: {exc}\n")
        self._execs.setdefault(ref.key, set()).add(proc)
        timed_out = False
        try:
            try:
                out, err = await asyncio.to_thread(proc.communicate, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _signal_group(proc.pid, signal.SIGKILL)
                out, err = await asyncio.to_thread(proc.communicate)
        finally:
            self._execs.get(ref.key, set()).discard(proc)
        code = proc.returncode
        exit_code = 128 - code if code is not None and code < 0 else code
        return ExecResult(exit_code, _tail(out, limit_bytes), _tail(err, limit_bytes), timed_out)

    def _namespace_target(self, ref: TaskRef, pid: int | None) -> list[str] | None:
        """``nsenter`` into the mount (and user) namespace of the task's command, when
        it has its own; None when it shares ours."""
        if pid is None:
            return None
        mine = _namespace("self", "mnt")
        for member in session_members(pid):
            if member.pid == pid:
                continue  # the wrapper, in ours
            theirs = _namespace(str(member.pid), "mnt")
            if theirs is None or theirs == mine:
                continue
            nsenter = shutil.which("nsenter")
            if nsenter is None:
                return None
            argv = [nsenter, "-t", str(member.pid), "-m", "-r", "-w"]
            if _namespace(str(member.pid), "user") != _namespace("self", "user"):
                argv.insert(3, "-U")
            return argv
        return None

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
            running=False,
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            ended_at=data.get("ended_at"),
            reason=data.get("reason"),
            end_kind=data.get("end_kind"),
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
        group), SIGKILL to every process of the task's session after ``grace_s``; the
        commands run in it by ``exec`` end with it."""
        for proc in list(self._execs.pop(ref.key, ())):
            _signal_group(proc.pid, signal.SIGKILL)
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
                running=False,
                exit_code=128 + signal.SIGKILL,
                signal=signal.SIGKILL,
                ended_at=time.time(),
            )
        return status


# How long after its own timeout an exec'd command is killed by ``timeout`` (when this
# process, which kills it at the timeout, is no longer there to).
EXEC_KILL_MARGIN_S = 5.0


def _write_private(path: Path, text: str) -> Path:
    """Write ``text`` readable by the task's user only (mode 600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def _with_defaults(env: dict[str, str]) -> dict[str, str]:
    # Python's output reaches the log (and `yard logs -f`) as it is printed, not a
    # block later: its stdout is a pipe. A job that sets the variable keeps its value.
    return {"PYTHONUNBUFFERED": "1", **env}


def _namespace(pid: str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _tail(data: bytes | None, limit: int) -> str:
    data = data or b""
    return data[-limit:].decode(errors="replace")


def _remove(path: Path, device: int) -> None:
    """Remove ``path`` (a file, a link, or a tree), leaving alone whatever lies on
    another filesystem (a mount a task left behind) and never following links."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not os.path.isdir(path) or os.path.islink(path):
        path.unlink(missing_ok=True)
        return
    if info.st_dev != device:
        return
    for entry in os.scandir(path):
        _remove(Path(entry.path), device)
    try:
        path.rmdir()
    except OSError:
        pass  # something on another filesystem stays, and so does its directory


def _bash() -> str:
    # Resolved here, not through the task's PATH, which the job may set to anything.
    return shutil.which("bash") or "/bin/bash"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
