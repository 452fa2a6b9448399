"""Launching single tasks on a backend the way the launcher's handlers do, for the
backend tests: one role, one task, the command and environment the test gives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, BinaryIO

from trainyard_common.events import Event, TaskPlacement
from trainyard_common.jobspec import EnvVar, JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import (
    AlreadyLaunched,
    AttemptEnd,
    AttemptSpec,
    ExecResult,
    Launched,
    LaunchError,
    LaunchRefused,
    LogChunk,
    PortClaim,
    Progress,
    Stream,
    TaskBackend,
    TaskHandle,
    TaskLaunch,
    TaskOptions,
    TaskRef,
    TaskStatus,
    Usage,
)
from trainyard_launcher.adapters.store import MemoryLauncherStore
from trainyard_launcher.domain.frameworks import FrameworkContext
from trainyard_launcher.handlers import Deps

if TYPE_CHECKING:
    from trainyard_launcher.adapters.local import LocalBackend


def one_task_launch(
    ref: TaskRef,
    command: str,
    env: dict[str, str] | None = None,
    ports: Sequence[PortClaim] = (),
    *,
    options: TaskOptions | None = None,
    spec: JobSpec | None = None,
    user: str = "alice",
) -> TaskLaunch:
    """A TaskLaunch for ``ref`` alone: ``spec`` (default: one role named like the
    task's, running ``command``) with the task placed on this machine."""
    if spec is None:
        spec = JobSpec(name=ref.job_id, user=user, roles=[RoleSpec(name=ref.role, command=command)])
    placement = TaskPlacement(role=ref.role, index=ref.index, node="local", host_ip="127.0.0.1")
    attempt = AttemptSpec(ref.job_id, ref.attempt, spec, (placement,))
    return TaskLaunch(
        ref=ref,
        attempt=attempt,
        placement=placement,
        env=dict(env or {}),
        command=command,
        ports=list(ports),
        options=options or TaskOptions(),
        secret_values=tuple(s.value for s in spec.secrets),
    )


async def launch(
    backend: TaskBackend,
    ref: TaskRef,
    command: str,
    env: dict[str, str] | None = None,
    ports: Sequence[PortClaim] = (),
    **kwargs: object,
) -> Launched:
    return await backend.launch(one_task_launch(ref, command, env, ports, **kwargs))  # type: ignore[arg-type]


def handle(launched: Launched) -> TaskHandle:
    return launched.handle


def env_vars(pairs: dict[str, str]) -> list[EnvVar]:
    return [EnvVar(name=k, value=v) for k, v in pairs.items()]


RUNNING = TaskStatus(running=True)


class ScriptedBackend:
    """A backend whose tasks' fate the test decides, for the handlers' unit tests."""

    name = "scripted"

    def __init__(self) -> None:
        self.launches: list[tuple[str, str, dict[str, str]]] = []
        self.launched: list[TaskLaunch] = []  # each launch as asked, whole
        self.status: dict[str, TaskStatus] = {}
        self.pids: dict[str, Launched] = {}
        self.marked: set[str] = set()
        self.killed: list[str] = []
        self.busy_ports: set[int] = set()
        # Tasks still preparing, with their step (start deadline); what was cleaned up.
        self.preparing: dict[str, str] = {}
        self.cleaned: list[str] = []
        self.opened: list[tuple[str, int]] = []
        self.closed: list[tuple[str, int, AttemptEnd]] = []
        # What the backend says it runs (None: it cannot tell), for adoption.
        self.running: dict[TaskRef, TaskHandle] | None = None
        self.refuse: str | None = None
        self.refuse_attempt: str | None = None  # open_attempt refuses, saying this

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def location(self, ref: TaskRef, spec: JobSpec | None = None) -> str:
        return f"/tasks/{ref.key}"

    def addressed(self, attempt: AttemptSpec) -> tuple[TaskPlacement, ...]:
        return attempt.tasks

    def framework_context(self, ref: TaskRef, attempt: AttemptSpec) -> FrameworkContext:
        return FrameworkContext(self.location(ref), "/usr/bin/python3", None)

    async def open_attempt(self, attempt: AttemptSpec) -> None:
        if self.refuse_attempt is not None:
            raise LaunchRefused(self.refuse_attempt)
        self.opened.append((attempt.job_id, attempt.attempt))

    async def close_attempt(self, attempt: AttemptSpec, end: AttemptEnd) -> None:
        self.closed.append((attempt.job_id, attempt.attempt, end))

    async def was_launched(self, ref: TaskRef) -> bool:
        return ref.key in self.marked

    async def launch(self, task: TaskLaunch) -> Launched:
        ref = task.ref
        if ref.key in self.marked:
            raise AlreadyLaunched(ref.key)
        if self.refuse is not None:
            raise LaunchRefused(self.refuse)
        for claim in task.ports:
            if claim.port in self.busy_ports:
                raise LaunchError(f"port {claim.port} ({claim.label}) on {claim.host_ip} is in use")
        self.marked.add(ref.key)
        self.launches.append((ref.key, task.command, task.env))
        self.launched.append(task)
        self.pids[ref.key] = Launched(TaskHandle(pid=1000 + len(self.launches), start_ticks=7))
        self.status[ref.key] = RUNNING
        return self.pids[ref.key]

    async def wait_started(self, ref: TaskRef, timeout_s: float) -> Launched | None:
        return self.pids.get(ref.key)

    async def poll(self, ref: TaskRef, handle: TaskHandle) -> TaskStatus:
        return self.status.get(ref.key, TaskStatus(running=False, lost=True))

    async def kill(self, ref: TaskRef, handle: TaskHandle, grace_s: float) -> TaskStatus:
        self.killed.append(ref.key)
        if self.status.get(ref.key, RUNNING).running:
            self.status[ref.key] = TaskStatus(running=False, exit_code=143, signal=15)
        return self.status[ref.key]

    async def usage(self, ref: TaskRef, handle: TaskHandle) -> Usage | None:
        return None

    async def progress(self, ref: TaskRef, handle: TaskHandle) -> Progress:
        return Progress(ref.key not in self.preparing, self.preparing.get(ref.key))

    async def clean_task(self, ref: TaskRef) -> list[str]:
        self.cleaned.append(ref.key)
        return ["work"]

    async def clean_job(self, job_id: str) -> bool:
        self.cleaned.append(job_id)
        return True

    def task_env(self, task: TaskLaunch) -> dict[str, str]:
        return dict(task.env)

    async def write_debug_env(self, ref: TaskRef, text: str) -> str:
        return f"{self.location(ref)}/env"

    async def exec(
        self,
        ref: TaskRef,
        handle: TaskHandle,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
    ) -> ExecResult:
        return ExecResult(0, " ".join(command), "")

    async def read_log(self, ref: TaskRef, stream: Stream, offset: int) -> LogChunk:
        return LogChunk(b"", offset)

    async def open_log(self, ref: TaskRef, stream: Stream) -> list[BinaryIO]:
        return []

    async def follow_log(
        self, ref: TaskRef, stream: Stream, offset: int, ended: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]:
        if False:
            yield b""

    async def inventory(self) -> dict[TaskRef, TaskHandle] | None:
        return self.running

    async def changes(self, timeout_s: float) -> None:
        await asyncio.sleep(0)

    def exit(self, job: str, role: str, index: int, code: int, at: float = 1.0) -> None:
        self.status[f"{job}:1:{role}:{index}"] = TaskStatus(
            running=False, exit_code=code, ended_at=at
        )


def make_deps() -> tuple[Deps, ScriptedBackend, list[Event]]:
    """Handlers' dependencies over the in-memory store and a scripted backend; what
    they publish is collected in the returned list."""
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    backend = ScriptedBackend()
    return Deps(MemoryLauncherStore(), backend, publish, kill_grace_s=0.1), backend, published


async def wait_ended(backend: LocalBackend, task: TaskRef, timeout: float = 20.0) -> TaskStatus:
    """The task's end, as the local backend polls it (its pid file, then its exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launched = backend.read_pid(task)
        status = await backend.poll(task, launched.handle if launched else TaskHandle())
        if launched and status.ended:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task.key} did not end within {timeout}s")
