"""The local backend: every task is a process on this machine.

A task lives in ``<root>/jobs/<job_id>/attempt-<n>/<role>-<index>/``: ``work/`` (its
working directory), ``stdout.log``, ``stderr.log``, ``launched`` (written before the
spawn), ``pid`` (written by the wrapper first thing) and ``exit.json`` (written by the
wrapper when the command ended). The wrapper (:mod:`trainyard_launcher.taskwrap`) runs
in a session of its own, so tasks outlive the launcher and are adopted by pid and
process start time when it comes back. It is forked by a warm process that has it
loaded (:mod:`trainyard_launcher.spawner`: a fresh interpreter per task was about half
of a one-task job's CPU on two cores), or, where that process is gone, started fresh.

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
import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec
from trainyard_common.runtimes import needs_image

from .. import frameworkwrap
from ..domain.frameworks import FrameworkContext, port_to_reserve
from ..domain.lifecycle import removable
from ..domain.limits import LimitPlan, Mechanisms, cgroup_name, plan_limits
from ..domain.prepare import (
    PlanProblem,
    PreparePlan,
    needs_preparation,
    plan_preparation,
    prepared_env,
)
from ..logs import DEFAULT_MAX_BYTES, follow, older_part, open_parts, read_from
from ..spawner import Spawner, SpawnerGone, SpawnerLost
from .backend import (
    EXEC_OUTPUT_BYTES,
    AlreadyLaunched,
    AttemptEnd,
    AttemptSpec,
    ExecResult,
    ExecUnavailable,
    Launched,
    LaunchError,
    LaunchRefused,
    LogChunk,
    PortClaim,
    PortUnavailable,
    Progress,
    Stream,
    Tail,
    TaskHandle,
    TaskLaunch,
    TaskOptions,
    TaskRef,
    TaskStatus,
    Usage,
)
from .identity import RunAs, for_root, restore_argv
from .procfs import (
    is_alive,
    proc_stat,
    session_members,
    session_usage,
    signal_below,
    signal_held,
    start_ticks,
)
from .rendezvous import reserve_port
from .uids import TaskUids, UidsExhausted

log = logging.getLogger(__name__)

FILES_DIR = frameworkwrap.FILES_DIR
# How long a task's CPU time is sampled for its usage (GetJobMetrics).
USAGE_SAMPLE_S = 0.2

# Launcher settings that must not reach a task (the admin token above all).
_PRIVATE_ENV_PREFIXES = ("YARD_",)
_PRIVATE_ENV_NAMES = {"NATS_URL", "MONGO_URL"}


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


def machine_env(env: dict[str, str]) -> dict[str, str]:
    """This machine's environment (PATH, HOME, ...) without the launcher's own
    settings, under the task's."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_PRIVATE_ENV_PREFIXES) and k not in _PRIVATE_ENV_NAMES
    }
    return {**base, **env}


class LocalBackend:
    """Tasks as process groups on this machine (see the module's docstring)."""

    name = "local"

    def __init__(
        self,
        root: Path,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        mechanisms: Mechanisms | None = None,
        pip_args: tuple[str, ...] = (),
        poll_interval_s: float = 0.3,
        uids: TaskUids | None = None,
        task_python: str | None = None,
        spawner: bool = True,
    ) -> None:
        self.root = root
        self.log_max_bytes = log_max_bytes
        # What this machine lets tasks be held to; None: no limits are set at all.
        self.mechanisms = mechanisms
        # Extra ``pip install`` arguments for the jobs' virtualenvs (YARD_PIP_ARGS).
        self.pip_args = pip_args
        # Processes are looked at, not watched: how often the watcher looks.
        self.poll_interval_s = poll_interval_s
        # Our own children, kept only to collect their exit status (no zombies).
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # The warm process that forks the wrappers (spawner.py); None: each wrapper a
        # fresh interpreter.
        self._spawner = Spawner() if spawner else None
        # Commands run in tasks (exec), by task key: ended with the task.
        self._execs: dict[str, set[int]] = {}
        # Where each user's tasks run as (docs/security.md); None: as this process.
        self.uids = uids
        # The interpreter and the framework helper a task's user can run (start()).
        self.task_python = task_python or sys.executable
        self.wrapper = str(Path(frameworkwrap.__file__).resolve())

    @property
    def isolated(self) -> bool:
        return self.uids is not None

    async def start(self) -> None:
        """With isolation: make the task root reachable by the tasks' users (and only
        that: every directory on the way is traversable, not readable), and install the
        framework helper and pick an interpreter that they can run."""
        if not self.isolated:
            return
        jobs = self.root / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        for directory in (self.root, jobs):
            os.chmod(directory, 0o711)
        if (blocked := untraversable(self.root)) is not None:
            raise IsolationError(
                f"tasks could not reach their directories under {self.root}: {blocked} is "
                "not traversable by other users (chmod o+x it, or put the data directory "
                "elsewhere)"
            )
        helpers = self.root / "bin"
        helpers.mkdir(mode=0o755, exist_ok=True)
        os.chmod(helpers, 0o755)
        installed = helpers / "frameworkwrap.py"
        tmp = helpers / ".frameworkwrap.py.tmp"
        shutil.copyfile(frameworkwrap.__file__, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, installed)
        self.wrapper = str(installed)
        self.task_python = runnable_python(self.task_python)

    async def close(self) -> None:
        if self._spawner is not None:
            self._spawner.close()

    # --- where things are ---------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    def task_dir(self, ref: TaskRef) -> Path:
        return self.job_dir(ref.job_id) / f"attempt-{ref.attempt}" / f"{ref.role}-{ref.index}"

    def location(self, ref: TaskRef, spec: JobSpec | None = None) -> str:
        return str(self.task_dir(ref))

    def addressed(self, attempt: AttemptSpec) -> tuple[TaskPlacement, ...]:
        # Tasks reach each other at their node's address (127.0.0.1 for this machine).
        return attempt.tasks

    def framework_context(self, ref: TaskRef, attempt: AttemptSpec) -> FrameworkContext:
        """The task's directory and, when the job's rendezvous task declared no port, the
        port reserved for the attempt (the same for every task: domain/frameworks.py)."""
        task_dir = self.task_dir(ref)
        port = None
        if (master := port_to_reserve(attempt.spec, list(attempt.tasks))) is not None:
            port = reserve_port(task_dir.parent, master.host_ip)
        return FrameworkContext(
            str(task_dir / FILES_DIR), self.task_python, port, wrapper=self.wrapper
        )

    def _plan(self, task: TaskLaunch) -> PreparePlan | PlanProblem | None:
        if not needs_preparation(task.spec):
            return None
        ref = task.ref
        return plan_preparation(
            task.spec,
            str(self.task_dir(ref)),
            str(self.job_dir(ref.job_id)),
            ref.attempt,
            self.pip_args,
            python=self.task_python,
            tmpfs_mb=task.spec.role(ref.role).resources.memory_mb,
        )

    def _base_env(self, task: TaskLaunch) -> dict[str, str]:
        if not self.isolated:
            return machine_env(task.env)
        # Only what describes the machine: nothing of the services reaches the task.
        work = str(self.task_dir(task.ref) / "work")
        user = task.spec.user or "nobody"
        identity = {"HOME": work, "USER": user, "LOGNAME": user}
        return {**host_env(), **identity, **task.env}

    def task_env(self, task: TaskLaunch) -> dict[str, str]:
        plan = self._plan(task)
        return prepared_env(self._base_env(task), plan if isinstance(plan, PreparePlan) else None)

    async def write_debug_env(self, ref: TaskRef, text: str) -> str:
        return str(_write_private(self.task_dir(ref) / "env", text))

    # --- an attempt ---------------------------------------------------------------

    async def open_attempt(self, attempt: AttemptSpec) -> None:
        return None  # nothing is shared by an attempt's processes but their directories

    async def close_attempt(self, attempt: AttemptSpec, end: AttemptEnd) -> None:
        return None  # the clean-up policy decides what goes (clean_task, clean_job)

    async def was_launched(self, ref: TaskRef) -> bool:
        return (self.task_dir(ref) / "launched").exists()

    async def launch(self, task: TaskLaunch) -> Launched:
        ref = task.ref
        role = task.spec.role(ref.role)
        if needs_image(task.spec, role):
            raise LaunchRefused(
                f"the container of role {role.name!r} has no command of its own, so it "
                f"would run its image's entrypoint ({role.image or 'no image named'}); "
                "the local backend runs no images: give the container a command"
            )
        plan = self._plan(task)
        if isinstance(plan, PlanProblem):
            raise LaunchRefused(plan.reason)
        run_as = await self._run_as(task)
        directory = self.task_dir(ref)
        for name in ("work", FILES_DIR):
            (directory / name).mkdir(parents=True, exist_ok=True)
        if run_as is not None:
            self._hand_over(ref, run_as, plan)
            if plan is not None:
                plan = dataclasses.replace(plan, run_as=run_as)
        if await self.was_launched(ref):
            raise AlreadyLaunched(f"task {ref.key} was launched before")
        for claim in task.ports:
            if (problem := port_problem(claim)) is not None:
                raise PortUnavailable(problem)
        try:
            fd = os.open(directory / "launched", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise AlreadyLaunched(f"task {ref.key} was launched before") from None
        os.write(fd, f"{time.time()}\n".encode())
        os.close(fd)

        args = ["--dir", str(directory)]  # the wrapper's
        if plan is not None:
            # Private: the plan holds the task's environment and the repository URL,
            # which may carry a token.
            plan_file = _write_private(directory / "prepare.json", plan.to_json())
            args += ["--prepare", str(plan_file)]
        limits = self.limit_plan(ref, task.options)
        wrapper_options = {
            "debug": task.options.debug,
            "log_max_bytes": self.log_max_bytes,
            "limits": json.loads(limits.to_json()) if limits is not None else None,
            "run_as": list(run_as) if run_as is not None else None,
        }
        options_file = directory / "task.json"
        options_file.write_text(json.dumps(wrapper_options))
        args += ["--options", str(options_file)]
        # The command goes in a private file, not on the command line: with its secrets
        # substituted it must not show in `ps` to every user of the node.
        command_file = _write_private(directory / "command.sh", task.command + "\n")
        if run_as is not None:
            # Readable by the task's own group (its user), by no other task.
            os.chown(command_file, 0, run_as[1])
            os.chmod(command_file, 0o640)
        args += ["--", _bash(), str(command_file)]
        started = self._start_wrapper(args, directory, _with_defaults(self._base_env(task)))
        if started is None:
            # The spawner died holding the request: the wrapper's pid file says whether
            # it started (the marker above keeps it from being started twice).
            launched = await self.wait_started(ref, SPAWN_LOST_WAIT_S)
            handle = launched.handle if launched is not None else TaskHandle()
        else:
            pid, ticks = started
            handle = TaskHandle(
                pid=pid, start_ticks=ticks if ticks is not None else start_ticks(pid)
            )
        notes = [limits.summary] if limits else []
        if run_as is not None:
            notes.append(f"runs as uid {run_as[0]}")
        return Launched(handle, "; ".join(notes) or None)

    def _start_wrapper(
        self, args: list[str], directory: Path, env: dict[str, str]
    ) -> tuple[int, int | None] | None:
        """The pid (and start ticks, when known) of the wrapper run with ``args``:
        forked by the warm spawner (spawner.py), or, where there is none, a fresh
        interpreter; either way in a session of its own. None: the spawner died with
        the request, and whether the wrapper started is not known here."""
        if (problem := exec_size_problem(args, env)) is not None:
            raise LaunchError(f"cannot start the task wrapper: {problem}")
        # The wrapper is root's: the job's loader variables reach its command only.
        env = for_root(env)
        if self._spawner is not None:
            try:
                return self._spawner.spawn(args, str(directory / "work"), env,
                                           str(directory / "stdout.log"),
                                           str(directory / "stderr.log"))  # fmt: skip
            except SpawnerGone as exc:
                log.warning("the task spawner is gone (%s); starting the wrapper alone", exc)
            except SpawnerLost as exc:
                log.warning("the task spawner was lost with a request (%s)", exc)
                return None
            except OSError as exc:
                raise LaunchError(f"cannot start the task wrapper: {exc}") from exc
        with (
            open(directory / "stdout.log", "ab") as out,
            open(directory / "stderr.log", "ab") as err,
        ):
            try:
                proc = subprocess.Popen(
                    # -I: the task's PYTHON* variables must not change how it starts.
                    [sys.executable, "-I", "-m", "trainyard_launcher.taskwrap", *args],
                    cwd=directory / "work",
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start the task wrapper: {exc}") from exc
        # Those that ended unseen go (a task's end is read from its exit file, which
        # its wrapper writes before it exits: a poll between the two never reaps it).
        self._children = {pid: c for pid, c in self._children.items() if c.poll() is None}
        self._children[proc.pid] = proc
        return proc.pid, start_ticks(proc.pid)

    async def _run_as(self, task: TaskLaunch) -> tuple[int, int] | None:
        if self.uids is None:
            return None
        try:
            uid = await self.uids.uid_for(task.spec.user or "nobody")
        except UidsExhausted as exc:
            raise LaunchError(str(exc)) from exc
        return uid, uid

    def _hand_over(self, ref: TaskRef, run_as: tuple[int, int], plan: object) -> None:
        """The directories on the way to the task's are the platform's, traversable by
        the task's group alone; what the task writes (its working directory, its
        framework files, its staged mounts, the job's virtualenv) is its user's."""
        uid, gid = run_as
        task_dir = self.task_dir(ref)
        for directory in (self.job_dir(ref.job_id), task_dir.parent, task_dir):
            os.chown(directory, 0, gid)
            os.chmod(directory, 0o710)
        owned = [task_dir / "work", task_dir / FILES_DIR]
        if isinstance(plan, PreparePlan):
            if plan.checkout is not None:
                owned.append(task_dir / "mounts")
            if plan.pip is not None:
                owned.append(Path(plan.pip.venv))
        for directory in owned:
            directory.mkdir(parents=True, exist_ok=True)
            os.chown(directory, uid, gid)
            os.chmod(directory, 0o700)

    def limit_plan(self, ref: TaskRef, options: TaskOptions | None) -> LimitPlan | None:
        if self.mechanisms is None or options is None or options.resources is None:
            return None
        cgroup = None
        if self.mechanisms.cgroup is not None:
            cgroup = os.path.join(
                self.mechanisms.cgroup, cgroup_name(ref.job_id, ref.attempt, ref.role, ref.index)
            )
        return plan_limits(options.resources, self.mechanisms, cgroup)

    async def progress(self, ref: TaskRef, handle: TaskHandle) -> Progress:
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

    async def usage(self, ref: TaskRef, handle: TaskHandle) -> Usage | None:
        """The task's session (its command and everything it started): CPU cores over
        a 0.2 s sample, resident memory now."""
        if handle.pid is None or not is_alive(handle.pid, handle.start_ticks):
            return None
        stat = proc_stat(handle.pid)
        if stat is None:
            return None
        before, _ = session_usage(stat.session)
        await asyncio.sleep(USAGE_SAMPLE_S)
        after, memory = session_usage(stat.session)
        ticks = os.sysconf("SC_CLK_TCK")
        return Usage(max(0.0, (after - before) / ticks / USAGE_SAMPLE_S), memory)

    async def clean_task(self, ref: TaskRef) -> list[str]:
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

    async def clean_job(self, job_id: str) -> bool:
        """Remove the job's virtualenv (a clean-up policy, once the job has ended)."""
        venv = self.job_dir(job_id) / "venv"
        if not venv.exists():
            return False
        _remove(venv, os.lstat(venv).st_dev)
        for name in ("venv.json", "venv.lock"):
            (self.job_dir(job_id) / name).unlink(missing_ok=True)
        return True

    # --- logs ---------------------------------------------------------------------

    async def read_log(self, ref: TaskRef, stream: Stream, offset: int) -> LogChunk:
        # The offset counts in the current part (logs.py); from 0 the older part, if
        # the log was rotated, comes first.
        path = self.task_dir(ref) / f"{stream}.log"
        data = read_from(path, offset)
        older = read_from(older_part(path), 0) if offset == 0 else b""
        return LogChunk(older + data, offset + len(data))

    async def open_log(self, ref: TaskRef, stream: Stream) -> list[BinaryIO]:
        return open_parts(self.task_dir(ref) / f"{stream}.log")

    def follow_log(
        self, ref: TaskRef, stream: Stream, offset: int, ended: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]:
        path = self.task_dir(ref) / f"{stream}.log"
        return follow(path, offset, ended, with_older=offset == 0)

    # --- running commands in a task ------------------------------------------------

    async def exec(
        self,
        ref: TaskRef,
        handle: TaskHandle,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
        limit_bytes: int = EXEC_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run ``command`` in the task: its environment, its working directory, and,
        where the task runs in a mount namespace of its own (mount paths, /dev/shm), in
        that namespace, so it sees what the task sees. It ends when the command does:
        what the command left running (``sleep 100 &``, and what left its session with
        ``setsid``) is killed then by the command's own reaper (``execwrap``), as is
        everything after ``timeout_s``. Each output is read as it comes and cut to its
        last ``limit_bytes``."""
        # coreutils' timeout bounds the command even if this launcher dies meanwhile and
        # nothing is left to kill it (it runs in a session of its own, not the task's).
        argv = ["timeout", "-s", "KILL", f"{timeout_s + EXEC_KILL_MARGIN_S:g}", *command]
        # Root starts it (setpriv, nsenter) without the job's loader variables; a shell
        # that runs first as the task's user gives them back (when it has any).
        env = _with_defaults(env)
        argv = [*restore_argv(env), *argv]
        argv = as_task_argv(
            argv, self._recorded_run_as(ref), self._namespace_target(ref, handle.pid)
        )
        # Under a reaper of the launcher's user, which the command's cannot kill.
        argv = [sys.executable, "-I", "-m", "trainyard_launcher.execwrap", *argv]
        out, err = Tail(limit_bytes), Tail(limit_bytes)
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.task_dir(ref) / "work",
                env=for_root(env),
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
            )
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            return ExecResult(127, "", f"trainyard: cannot run {command[0]!r}: {exc}\n")
        os.close(out_w)
        os.close(err_w)
        self._execs.setdefault(ref.key, set()).add(proc.pid)
        pipes = [open(out_r, "rb", buffering=0), open(err_r, "rb", buffering=0)]  # noqa: SIM115
        reading = asyncio.gather(_read_into(pipes[0], out), _read_into(pipes[1], err))
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                await _end_exec(proc)
            # Ended: nothing it started is left (execwrap), and the pipes close once
            # what it wrote is read. A process it handed them to elsewhere (a task's
            # own, over a socket) may hold them open: the answer does not wait for it.
            await asyncio.wait([reading], timeout=EXEC_DRAIN_S)
        finally:
            running = self._execs.get(ref.key, set())
            running.discard(proc.pid)
            if not running:  # one entry per task ever exec'd in would grow with history
                self._execs.pop(ref.key, None)
            if proc.returncode is None:  # this call cancelled meanwhile
                _signal(proc.pid, signal.SIGTERM)
            if not reading.done():
                reading.cancel()
                await asyncio.wait([reading])  # its own cancellation, not the caller's
                if not reading.cancelled():
                    reading.exception()  # gather's, a CancelledError: seen
            for pipe in pipes:
                pipe.close()
        code = proc.returncode
        exit_code = 128 - code if code is not None and code < 0 else code
        return ExecResult(exit_code, out.text(), err.text(), timed_out)

    def _recorded_run_as(self, ref: TaskRef) -> tuple[int, int] | None:
        try:
            options = json.loads((self.task_dir(ref) / "task.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        run_as = options.get("run_as")
        return (int(run_as[0]), int(run_as[1])) if run_as else None

    def _namespace_target(self, ref: TaskRef, pid: int | None) -> list[str] | None:
        """``nsenter`` into the mount (and user) namespace of the task's command, when
        it has its own; None when it shares ours (as_task_argv says who runs it)."""
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

    # --- watching -----------------------------------------------------------------

    def read_pid(self, ref: TaskRef) -> Launched | None:
        try:
            fields = (self.task_dir(ref) / "pid").read_text().split()
        except FileNotFoundError:
            return None
        if not fields:
            return None
        started = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
        return Launched(TaskHandle(pid=int(fields[0]), start_ticks=started))

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

    async def poll(self, ref: TaskRef, handle: TaskHandle) -> TaskStatus:
        return self._poll(ref, handle.pid, handle.start_ticks)

    def _poll(self, ref: TaskRef, pid: int | None, started: int | None) -> TaskStatus:
        self._reap(pid)
        if (ended := self.read_exit(ref)) is not None:
            return ended
        if pid is None:
            launched = self.read_pid(ref)
            if launched is None:
                return TaskStatus(running=False, lost=True, ended_at=time.time())
            pid, started = launched.handle.pid, launched.handle.start_ticks
        if pid is not None and is_alive(pid, started):
            return TaskStatus(running=True)
        # The wrapper may have written exit.json between the first look and its exit.
        if (ended := self.read_exit(ref)) is not None:
            return ended
        return TaskStatus(running=False, lost=True, ended_at=time.time())

    async def inventory(self) -> dict[TaskRef, TaskHandle] | None:
        # Every process this backend started is in the store first (STARTING before
        # its spawn), so the store's records are the inventory.
        return None

    async def changes(self, timeout_s: float) -> None:
        await asyncio.sleep(min(timeout_s, self.poll_interval_s))

    def _members(self, pid: int, started: int | None) -> list[int]:
        leader = proc_stat(pid)
        if leader is not None and started is not None and leader.start_ticks != started:
            # The pid now names a stranger, so our session (which kept the number
            # reserved while it had members) is gone.
            return []
        return [member.pid for member in session_members(pid)]

    async def kill(self, ref: TaskRef, handle: TaskHandle, grace_s: float) -> TaskStatus:
        """SIGTERM to the task's process group (the wrapper forwards it to the command's
        group), SIGKILL to every process of the task's session after ``grace_s``; the
        commands run in it by ``exec`` end with it."""
        for reaper in list(self._execs.pop(ref.key, ())):
            _signal(reaper, signal.SIGTERM)  # execwrap ends the exec's command, and all
        pid, started = handle.pid, handle.start_ticks
        if pid is None:
            launched = self.read_pid(ref)
            if launched is None:
                return self._poll(ref, None, None)
            pid, started = launched.handle.pid, launched.handle.start_ticks
            assert pid is not None
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
            # The wrapper last: while it lives, a process that left the session (setsid,
            # SIGTERM ignored) is still below it, its subreaper; once it is gone, such
            # a process would belong to init and outlive the task.
            wrapper = is_alive(pid, started)
            others = [p for p in survivors if p != pid]
            for member in others:
                signal_held(member, signal.SIGKILL, lambda s: s.session == pid)
            below = signal_below(pid, signal.SIGKILL, started) if wrapper else []
            if not others and not below:
                signal_held(pid, signal.SIGKILL, lambda s: started in (None, s.start_ticks))
            await asyncio.sleep(0.02)
        self._reap(pid)
        status = self._poll(ref, pid, started)
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
# How long an exec's answer waits, once its group is killed, for the rest of its output.
EXEC_DRAIN_S = 2.0


def _write_private(path: Path, text: str) -> Path:
    """Write ``text`` readable by the task's user only (mode 600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file there before keeps its mode otherwise
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


# What execve takes (linux/binfmts.h: MAX_ARG_STRLEN, one string; ARG_MAX, all of them
# with their pointers): above it the command cannot start, so the launch is refused.
MAX_ARG_STRLEN = 32 * 4096
SPAWN_LOST_WAIT_S = 2.0


def exec_size_problem(args: list[str], env: dict[str, str]) -> str | None:
    """Why a wrapper with ``args`` and ``env`` (which its command gets) could not
    exec, or None. Checked for every launch: a fresh wrapper's own exec failed there
    (E2BIG), a forked one would only fail its command's."""
    total = 0
    for name, value in env.items():
        size = len(name.encode()) + len(value.encode()) + 2
        if size > MAX_ARG_STRLEN:
            return (f"environment variable {name!r} is {size} bytes; the most one may "
                    f"hold is {MAX_ARG_STRLEN}")  # fmt: skip
        total += size + 8
    total += sum(len(a.encode()) + 9 for a in args)
    limit = os.sysconf("SC_ARG_MAX")
    if total > limit:
        return f"the environment and arguments take {total} bytes; the most is {limit}"
    return None


def _with_defaults(env: dict[str, str]) -> dict[str, str]:
    # Python's output reaches the log (and `yard logs -f`) as it is printed, not a
    # block later: its stdout is a pipe. A job that sets the variable keeps its value.
    return {"PYTHONUNBUFFERED": "1", **env}


def _namespace(pid: str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


async def _read_into(pipe: BinaryIO, tail: Tail) -> None:
    """What is written into ``pipe`` until its end, into ``tail``."""
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    try:
        while chunk := await reader.read(64 * 1024):
            tail.add(chunk)
    finally:
        transport.close()


def _remove(path: Path, device: int) -> None:
    """Remove ``path`` (a file, a link, or a tree), leaving alone whatever lies on
    another filesystem (a mount a task left behind) and never following links. The
    tree is walked by descriptor: a process of the task's user still running may swap
    a directory in it for a link to anywhere, and a walk by path would then remove
    (as root) what the link names. ``path``'s own directory must be the platform's."""
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _remove_at(parent, path.name, device, REMOVE_DEPTH)
    finally:
        os.close(parent)


# How deep a task's tree is removed (each level holds a descriptor while it is walked);
# what lies deeper stays, and its directories with it.
REMOVE_DEPTH = 256


def _remove_at(parent: int, name: str, device: int, depth: int) -> None:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        # Swapped for a directory meanwhile (EISDIR): the next clean-up sees it.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(name, dir_fd=parent)
        return
    if info.st_dev != device:
        return
    if depth <= 0:
        log.warning("left a tree deeper than %d directories in place", REMOVE_DEPTH)
        return
    try:
        directory = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
        )
    except OSError:
        return  # swapped for a link or removed meanwhile: the next clean-up sees it
    try:
        opened = os.fstat(directory)
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            return  # swapped for another directory between the look and the open
        for entry in os.listdir(directory):
            _remove_at(directory, entry, device, depth - 1)
    finally:
        os.close(directory)
    with contextlib.suppress(OSError):
        # Something on another filesystem stays, and so does its directory.
        os.rmdir(name, dir_fd=parent)


class IsolationError(RuntimeError):
    """Tasks cannot be run under their users' uids here (``str(exc)`` says why)."""


# What a task started under its own uid gets of this machine's environment: what
# describes the machine (its paths, locale, GPU libraries), nothing of the services.
HOST_ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH"})
HOST_ENV_PREFIXES = ("LC_", "CUDA_", "NCCL_", "NVIDIA_")


def host_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k in HOST_ENV_NAMES or k.startswith(HOST_ENV_PREFIXES)
    }
    if "PATH" in env:
        # Without the services' private directories (a home the task may not enter):
        # a command found nowhere else is "not found" (127), not "permission denied".
        env["PATH"] = ":".join(
            d for d in env["PATH"].split(":") if d and untraversable(Path(d)) is None
        )
    return env


def as_task_argv(argv: list[str], run_as: RunAs, target: list[str] | None) -> list[str]:
    """``argv`` as ``yard exec`` runs it in a task: as the task's user, in the task's
    namespaces where ``target`` (an ``nsenter`` argv) enters them. Root never runs
    anything of the task's view, which its user shapes (a data source may be mounted
    over /usr/bin/setpriv): a mount namespace the launcher built is entered by root,
    which becomes the user there (``nsenter -S -G``, after ``setpriv --no-new-privs``
    outside) before the first program of the view runs; a user namespace the task made
    for itself is entered by the user, who owns it, never by root."""
    joins_user = target is not None and "-U" in target
    if target is not None and joins_user:
        # Entered as who enters it, who owns it: nsenter would switch to the namespace's
        # root, which one that denies setgroups (as each made here does) refuses.
        target = [*target, "--preserve-credentials"]
    if run_as is None:
        return [*target, "--", *argv] if target is not None else argv
    if target is None:
        return [*drop_to(run_as), *argv]
    if joins_user:
        return [*drop_to(run_as), *target, "--", *argv]
    if not _nsenter_drops(target[0]):
        raise ExecUnavailable(
            "this machine's nsenter cannot become the task's user inside its namespace "
            "(-S/-G without -U: util-linux 2.26 or later)"
        )
    uid, gid = run_as
    return [machine_tool("setpriv"), "--no-new-privs", "--", *target,
            "-S", str(uid), "-G", str(gid), "--", *argv]  # fmt: skip


def drop_to(run_as: tuple[int, int]) -> list[str]:
    """The argv prefix that runs a command as ``run_as`` with no supplementary groups
    and no way back up (no setuid binary can raise it again)."""
    uid, gid = run_as
    setpriv = machine_tool("setpriv")
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--"]


def machine_tool(name: str) -> str:
    """The machine's own ``name``, found on this process's PATH: never looked up on a
    job's (what runs it is given the job's environment)."""
    found = shutil.which(name)
    if found is None:
        raise ExecUnavailable(f"{name} (util-linux) is not installed on this machine")
    return found


@functools.cache
def _nsenter_drops(nsenter: str) -> bool:
    """Whether ``nsenter -S/-G`` becomes that user when entering only a mount namespace
    (before util-linux 2.26 it did so only with -U, and the view's programs would then
    run as root): tried once, entering this process's own namespace."""
    try:
        done = subprocess.run(
            [nsenter, "-t", str(os.getpid()), "-m", "-S", "65534", "-G", "65534", "--",
             machine_tool("id"), "-u"],
            capture_output=True, text=True, timeout=10, env={"PATH": os.defpath},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired, ExecUnavailable):
        return False
    return done.returncode == 0 and done.stdout.strip() == "65534"


def untraversable(path: Path) -> Path | None:
    """The first directory from ``/`` down to ``path`` that other users cannot pass."""
    current = Path("/")
    for part in path.resolve().parts[1:]:
        current = current / part
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return current
        if not mode & stat.S_IXOTH:
            return current
    return None


def runnable_python(preferred: str) -> str:
    """``preferred`` when every user may run it, else a ``python3`` of this machine that
    they may (the services' own interpreter may live in a private home)."""
    for candidate in (preferred, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if candidate and _runnable_by_others(Path(candidate)):
            return candidate
    raise IsolationError(
        f"no Python that other users may run: {preferred} is not, nor is a python3 in "
        "/usr/local/bin, /usr/bin or /bin; framework helpers and job virtualenvs need one"
    )


def _runnable_by_others(path: Path) -> bool:
    try:
        real = path.resolve(strict=True)
        mode = os.stat(real).st_mode
    except OSError:
        return False
    # Every directory on the way to the link and to its target must be passable.
    blocked = untraversable(path.parent) or untraversable(real.parent)
    return blocked is None and bool(mode & stat.S_IXOTH) and bool(mode & stat.S_IROTH)


def _bash() -> str:
    # Resolved here, not through the task's PATH, which the job may set to anything.
    return shutil.which("bash") or "/bin/bash"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def _end_exec(proc: asyncio.subprocess.Process) -> None:
    """An exec out of time: its reaper (execwrap) ends the command and everything the
    command started, then itself; should it not, within EXEC_DRAIN_S, everything below
    it is killed, then it."""
    _signal(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), EXEC_DRAIN_S)
    except TimeoutError:
        signal_below(proc.pid, signal.SIGKILL)
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
