"""The launcher's backend port: what runs tasks, whatever runs them.

Two adapters implement it: ``local`` (each task a process group on this machine, the
embedded default: adapters/local.py) and ``kubernetes`` (each task a pod bound to the
node placement chose: adapters/kubernetes.py). Everything above the port (handlers.py:
the task records, completion rules, retries, deadlines, failure classes, adoption) is
the same for both.

An attempt is a *task set*: ``open_attempt`` before its tasks start (the Kubernetes
backend creates the job's headless Service and the attempt's owner object there),
``launch`` per task, ``close_attempt`` once every task of it has ended. A started task
is found again by its :class:`TaskHandle` (a pid on this machine, a pod's uid on
Kubernetes), which the launcher stores with the task, so a restarted launcher adopts it.
``poll`` answers how a task stands now; ``changes`` lets the watcher sleep until
something may have changed. Nothing here may spawn a task twice: ``launch`` refuses a
task that was launched before (:class:`AlreadyLaunched`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import BinaryIO, Literal, Protocol

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, Resources

from ..domain.frameworks import FrameworkContext

Stream = Literal["stdout", "stderr"]


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
class TaskHandle:
    """How the backend finds a started task again (stored with the task)."""

    # Local: the wrapper's pid and its start time in clock ticks (a pid can be reused).
    pid: int | None = None
    start_ticks: int | None = None
    # Kubernetes: the pod's uid (a pod of the same name made later is another pod).
    uid: str | None = None


@dataclass(frozen=True)
class Usage:
    """What a running task uses now: CPU cores (over a short sample) and resident memory."""

    cpu_cores: float
    memory_bytes: int


@dataclass(frozen=True)
class Launched:
    handle: TaskHandle
    # What the task is held to here (limits), or anything else a person should read.
    note: str | None = None

    @property
    def pid(self) -> int | None:
        return self.handle.pid


@dataclass(frozen=True)
class TaskOptions:
    """How a task runs besides its command."""

    # T9k's debug mode: prepared, then a keep-alive instead of the command.
    debug: bool = False
    # The role's resources, enforced as far as the backend allows.
    resources: Resources | None = None


class AttemptEnd(StrEnum):
    """How an attempt ended, for what a backend removes once its tasks are gone."""

    FINISHED = "finished"  # the job ended by its own tasks (or its run deadline)
    RETRYING = "retrying"  # it failed and runs again as a new attempt
    INTERRUPTED = "interrupted"  # placement took its capacity back (pause, preemption)
    STOPPED = "stopped"  # a person stopped the job


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt of a job: the task set a backend opens, launches and closes."""

    job_id: str
    attempt: int
    spec: JobSpec
    tasks: tuple[TaskPlacement, ...]


@dataclass(frozen=True)
class TaskLaunch:
    """Everything a backend needs to start one task."""

    ref: TaskRef
    attempt: AttemptSpec
    placement: TaskPlacement
    # TRAINYARD_*, PAI_*, the framework's variables, the job's and the role's env.
    env: dict[str, str]
    # The shell command line (secrets substituted, framework wrapper around it where the
    # backend runs one); container argv roles carry theirs in the role (entrypoint/args).
    command: str
    ports: list[PortClaim] = field(default_factory=list)
    options: TaskOptions = field(default_factory=TaskOptions)
    # The job's secret values: kept out of anything shown (debug env files, logs).
    secret_values: tuple[str, ...] = ()
    # Whether ``command`` has any of them substituted in it (kept out of a pod's spec).
    carries_secrets: bool = False

    @property
    def spec(self) -> JobSpec:
        return self.attempt.spec


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


# What an exec answers of each output: its last MiB (docs/lifecycle.md, yard exec).
EXEC_OUTPUT_BYTES = 1024 * 1024


class Tail:
    """The last ``limit`` bytes of an output read as it comes: a command may write for
    as long as its timeout lets it (``yes`` for ten minutes), and only its end is
    answered, so no more than twice ``limit`` is ever held."""

    def __init__(self, limit: int = EXEC_OUTPUT_BYTES) -> None:
        self.limit = limit
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > 2 * self.limit:
            del self._data[: len(self._data) - self.limit]

    def text(self) -> str:
        return bytes(self._data[-self.limit :]).decode(errors="replace")


@dataclass(frozen=True)
class TaskStatus:
    """How a task stands. ``lost``: it is gone and left no exit record."""

    running: bool
    exit_code: int | None = None
    signal: int | None = None
    lost: bool = False
    ended_at: float | None = None
    # Why it ended, when the backend knows better than the exit code (a failed
    # preparation, an exceeded memory limit, an image that cannot be pulled).
    reason: str | None = None
    # How it ended when the backend could tell (domain.failure.EndKind values).
    end_kind: str | None = None

    @property
    def ended(self) -> bool:
        return not self.running


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    # Where to read on from (the offset counts in the backend's own terms).
    next_offset: int


class LaunchError(Exception):
    """The task could not be started; ``str(exc)`` is the reason a person reads."""


class PortUnavailable(LaunchError):
    """A port the placement gave the task cannot be bound on its node."""


class AlreadyLaunched(LaunchError):
    """The task was launched before; starting it again would run it twice."""


class LaunchRefused(LaunchError):
    """The backend cannot run this task as asked (no retry can help): an image
    entrypoint on the local backend, a data source it cannot mount."""


class ExecUnavailable(Exception):
    """The backend cannot run a command in this task (``str(exc)`` says why)."""


class TaskBackend(Protocol):
    """What runs tasks. Every method is safe to call again after a crash."""

    name: str

    async def start(self) -> None:
        """Begin watching (Kubernetes: the pod and node watches); before adopt."""

    async def close(self) -> None: ...

    def location(self, ref: TaskRef, spec: JobSpec) -> str:
        """Where the task is, for people and the task record (a directory, a pod)."""
        ...

    def addressed(self, attempt: AttemptSpec) -> tuple[TaskPlacement, ...]:
        """The attempt's placements with each task's address as the others reach it
        (``host_ip``): the node's IP here, a pod's DNS name on Kubernetes. Framework
        variables (MASTER_ADDR, TF_CONFIG, PAI_HOST_IP_*) are built from these."""
        ...

    def framework_context(self, ref: TaskRef, attempt: AttemptSpec) -> FrameworkContext:
        """Where a task's framework files live and whether helper wrappers run."""
        ...

    async def open_attempt(self, attempt: AttemptSpec) -> None: ...

    async def launch(self, task: TaskLaunch) -> Launched: ...

    async def was_launched(self, ref: TaskRef) -> bool: ...

    async def wait_started(self, ref: TaskRef, timeout_s: float) -> Launched | None:
        """The handle of a task launched before (by this run or an earlier one)."""
        ...

    async def poll(self, ref: TaskRef, handle: TaskHandle) -> TaskStatus: ...

    async def kill(self, ref: TaskRef, handle: TaskHandle, grace_s: float) -> TaskStatus: ...

    async def progress(self, ref: TaskRef, handle: TaskHandle) -> Progress: ...

    async def usage(self, ref: TaskRef, handle: TaskHandle) -> Usage | None:
        """What the running task uses now; None when it does not run, or where the
        backend cannot see it (Kubernetes: the nodes' kubelets measure pods)."""
        ...

    async def close_attempt(self, attempt: AttemptSpec, end: AttemptEnd) -> None:
        """Every task of the attempt has ended: remove what ``end`` leaves unneeded
        (Kubernetes: a stopped or interrupted attempt's pods, a finished job's Service)."""
        ...

    async def clean_task(self, ref: TaskRef) -> list[str]: ...

    async def clean_job(self, job_id: str) -> bool: ...

    def task_env(self, task: TaskLaunch) -> dict[str, str]:
        """The whole environment the task's command gets (for its debug env file and
        for commands run in it)."""
        ...

    async def write_debug_env(self, ref: TaskRef, text: str) -> str:
        """Keep a failed task's environment (OpenPAI isDebug); where it is."""
        ...

    async def exec(
        self,
        ref: TaskRef,
        handle: TaskHandle,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
    ) -> ExecResult: ...

    async def read_log(self, ref: TaskRef, stream: Stream, offset: int) -> LogChunk: ...

    async def open_log(self, ref: TaskRef, stream: Stream) -> list[BinaryIO]:
        """The log's parts, oldest first, open for reading (the caller closes them): a
        tail reads only their end (logs.read_end)."""
        ...

    def follow_log(
        self, ref: TaskRef, stream: Stream, offset: int, ended: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]: ...

    async def inventory(self) -> dict[TaskRef, TaskHandle] | None:
        """Every task this backend runs now, or None where it cannot tell cheaply
        (adoption then trusts the store's records alone)."""
        ...

    async def changes(self, timeout_s: float) -> None:
        """Return when a task may have changed, or after ``timeout_s``."""
        ...
