"""Decisions about a task's life beyond its command: debug mode, the start deadline,
and what a clean-up policy removes when the job ends. Plain functions over plain data.

- **Debug mode** (T9k ``runMode.debug``): every task is prepared as usual (code, data,
  the job's virtualenv, its environment and ports), then a keep-alive runs in place of
  the command, so a person can ``yard exec`` into it; the job runs until it is stopped.
- **Start deadline**: every task must have *started its command* (or its debug
  keep-alive) within ``limit_s`` of the attempt's placement; a preparation that hangs
  or a task that cannot be spawned fails the attempt as a platform failure.
- **Clean-up** (T9k ``cleanUpPolicy``, Kubeflow ``cleanPodPolicy``): ``None`` keeps every
  task's directory (the default), ``All`` removes every task's files and the job's
  virtualenv, ``Unfinished`` (Kubeflow's ``Running``) those of the tasks that were still
  running when the job ended (the ones it STOPPED). The logs are never removed, and
  with OpenPAI's ``isDebug`` a failed task keeps everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainyard_common.events import TaskState
from trainyard_common.jobspec import JobSpec, RunMode

DEBUG_REASON = "debug mode: command not run"

CLEANUP_NONE = "None"
CLEANUP_ALL = "All"
CLEANUP_UNFINISHED = "Unfinished"

# What a clean-up leaves in a task's directory: the logs (every part of them), the
# wrapper's records, and the markers that keep a task from being launched twice.
KEPT_FILES = frozenset(
    {
        "stdout.log",
        "stderr.log",
        "stdout.log.1",
        "stderr.log.1",
        "exit.json",
        "pid",
        "launched",
        "started",
    }
)


def is_debug(spec: JobSpec) -> bool:
    return spec.run_mode == RunMode.DEBUG


# --- start deadline -----------------------------------------------------------------------


@dataclass(frozen=True)
class StartView:
    """How far one task got towards running its command."""

    role: str
    index: int
    state: TaskState
    # The wrapper started the command (or the debug keep-alive).
    command_started: bool = False
    # The step the preparation is on (its last "trainyard prepare:" line), if known.
    step: str | None = None

    @property
    def started(self) -> bool:
        # A task that already ended did start (or failed on its own, which the
        # completion rules judge).
        return self.state.terminal or (self.state == TaskState.RUNNING and self.command_started)


def start_deadline(placed_at: datetime | None, limit_s: float | None) -> datetime | None:
    """When every task must have started; None when there is no limit."""
    if not limit_s or limit_s <= 0 or placed_at is None:
        return None
    return placed_at + timedelta(seconds=limit_s)


def late_tasks(tasks: list[StartView]) -> list[StartView]:
    return [t for t in sorted(tasks, key=lambda t: (t.role, t.index)) if not t.started]


def start_deadline_reason(limit_s: float, late: list[StartView]) -> str:
    """``not all tasks started within 600s: w[1] still STARTING (not spawned yet),
    w[0] still preparing ($ pip install torch)``."""
    parts = []
    for task in late:
        name = f"{task.role}[{task.index}]"
        if task.state == TaskState.STARTING:
            parts.append(f"{name} still STARTING (not spawned yet)")
        else:
            step = f" ({task.step})" if task.step else ""
            parts.append(f"{name} still preparing{step}")
    return f"not all tasks started within {limit_s:g}s: " + ", ".join(parts)


# --- clean-up ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanupView:
    role: str
    index: int
    state: TaskState


@dataclass(frozen=True)
class CleanupPlan:
    tasks: tuple[tuple[str, int], ...]  # whose files go (the logs stay)
    job_venv: bool  # the job's virtualenv goes too


def normal_policy(policy: str | None) -> str:
    return policy if policy in (CLEANUP_ALL, CLEANUP_UNFINISHED) else CLEANUP_NONE


def plan_cleanup(
    policy: str | None, keep_failed_for_debug: bool, tasks: list[CleanupView], job_ended: bool
) -> CleanupPlan:
    """What the end of an attempt removes. ``job_ended``: the job ends with this attempt
    (a retried attempt keeps the virtualenv for the next one)."""
    policy = normal_policy(policy)
    if policy == CLEANUP_NONE:
        return CleanupPlan((), False)
    chosen = []
    for task in sorted(tasks, key=lambda t: (t.role, t.index)):
        if not task.state.terminal:
            continue  # still running: never pulled from under a process
        if keep_failed_for_debug and task.state == TaskState.FAILED:
            continue  # OpenPAI isDebug: a failed task is kept whole
        if policy == CLEANUP_ALL or task.state == TaskState.STOPPED:
            chosen.append((task.role, task.index))
    return CleanupPlan(tuple(chosen), policy == CLEANUP_ALL and job_ended)


def removable(names: list[str]) -> list[str]:
    """The entries of a task's directory that a clean-up removes."""
    return sorted(n for n in names if n not in KEPT_FILES)
