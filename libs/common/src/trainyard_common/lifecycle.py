"""The life of a job and of its tasks as one model: every state, every transition, the
event that makes it and who may make it. Plain data, no I/O.

Three machines:

- ``JOB``: the job as a user sees it (``JobState``), which status projects from events.
- ``TASK``: a task of an attempt (``TaskState``), which the launcher stores and publishes.
- ``PLACEMENT``: placement's own record of a job (``queued``, ``placed``, ...), from which
  it decides what to place, interrupt or release.

The services use it to refuse a move the model does not have (``check``): the launcher
before it stores a task transition, placement before it changes a job's record, so an
invalid transition cannot be written. ``docs/lifecycle.md``'s transition tables are
generated from it (``markdown``; a test keeps them current).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, TypeVar

from .events import JobState, TaskState

S = TypeVar("S", bound=str)


class PlacementState(StrEnum):
    """Placement's record of a job (its store's ``state``)."""

    QUEUED = "queued"
    PLACED = "placed"
    # A placed attempt being interrupted: it keeps its allocation until the launcher's
    # JobInterrupted says its tasks ended.
    INTERRUPTING = "interrupting"
    PAUSED = "paused"
    DONE = "done"
    # A stop that came before the job did (a tombstone the JobAccepted finds).
    STOPPED_EARLY = "stopped_early"


@dataclass(frozen=True)
class Transition(Generic[S]):
    """``sources`` → ``target`` (no sources: how a record starts), made by ``by`` on
    ``event``, ``when`` it happens."""

    sources: tuple[S, ...]
    target: S
    event: str
    by: str
    when: str


class InvalidTransition(ValueError):
    """A move the model does not have: a bug in the service that tried it."""


@dataclass(frozen=True)
class Machine(Generic[S]):
    name: str
    transitions: tuple[Transition[S], ...]

    @cached_property
    def moves(self) -> frozenset[tuple[S | None, S]]:
        """Every (source, target) pair; a None source is a record's start (computed
        once: every store write checks against it)."""
        found: set[tuple[S | None, S]] = set()
        for t in self.transitions:
            for source in t.sources or (None,):
                found.add((source, t.target))
        return frozenset(found)

    def allows(self, source: S | None, target: S) -> bool:
        return (source, target) in self.moves

    def check(self, sources: Iterable[S | None], target: S) -> None:
        """Raise InvalidTransition unless every one of ``sources`` may move to ``target``."""
        bad = [s for s in sources if (s, target) not in self.moves]
        if bad:
            shown = ", ".join("(new)" if s is None else str(s) for s in bad)
            raise InvalidTransition(f"{self.name}: {shown} -> {target} is not a transition")

    def states(self) -> set[S]:
        return {s for pair in self.moves for s in pair if s is not None}

    def markdown(self) -> str:
        """The transition table, as docs/lifecycle.md shows it."""
        rows = ["| from | to | event | made by | when |", "| --- | --- | --- | --- | --- |"]
        for t in self.transitions:
            sources = ", ".join(str(s) for s in t.sources) or "—"
            rows.append(f"| {sources} | {t.target} | {t.event} | {t.by} | {t.when} |")
        return "\n".join(rows)


J = JobState
T = TaskState
P = PlacementState

JOB: Machine[JobState] = Machine("job", (
    Transition((), J.SUBMITTED, "`JobSubmitted`", "intake",
               "`POST /v1/jobs` (or a dialect's submit route) translated the payload"),
    Transition((J.SUBMITTED,), J.ACCEPTED, "`JobAccepted`", "validation",
               "every rule passed, the queue and GPU type exist, each task fits some node, "
               "the name is free"),
    Transition((J.SUBMITTED,), J.REJECTED, "`JobRejected`", "validation",
               "a rule failed; the issues carry JSON paths of the payload"),
    Transition((J.ACCEPTED,), J.QUEUED, "`JobQueued`", "placement",
               "the gang does not fit now; reasons carry numbers, position in the queue"),
    Transition((J.QUEUED,), J.QUEUED, "`JobQueued`", "placement",
               "the reasons or the position's order of magnitude changed (same rank, "
               "applied again)"),
    Transition((J.ACCEPTED, J.QUEUED), J.PLACED, "`JobPlaced`", "placement",
               "every task got a node, GPUs and ports; or capacity came back"),
    Transition((J.PLACED,), J.RUNNING, "`TaskStateChanged(RUNNING)`", "launcher",
               "the first task's wrapper started (its preparation runs inside RUNNING)"),
    Transition((J.PLACED, J.RUNNING), J.SUCCEEDED, "`JobFinished`", "launcher",
               "completion rules (`min_succeeded`, or every task ended and no "
               "`min_failed` was reached)"),
    Transition((J.PLACED, J.RUNNING), J.FAILED, "`JobFinished`", "launcher",
               "`min_failed` of a role reached (a failed command, a failed preparation, a "
               "task that could not start) or the **run deadline** passed, and the attempt "
               "is not retried"),
    Transition((J.PLACED, J.RUNNING), J.QUEUED, "`JobRetrying`", "launcher",
               "attempt n failed and may be retried (budget left, a retryable failure): "
               "placement gives the allocation back and queues attempt n+1"),
    Transition((J.PLACED, J.RUNNING), J.STOPPED, "`JobFinished`", "launcher",
               "a user's stop (intake publishes `StopJob`)"),
    Transition((J.SUBMITTED, J.ACCEPTED, J.QUEUED), J.STOPPED, "`JobFinished`", "placement",
               "`StopJob` for a job not placed yet (a tombstone catches a later "
               "`JobAccepted`)"),
    Transition((J.PLACED, J.RUNNING), J.PAUSED, "`JobInterrupted(paused)`", "launcher",
               "a user's pause (intake publishes `PauseJob`; placement sends "
               "`InterruptJob`): the tasks ended, the capacity is free"),
    Transition((J.ACCEPTED, J.QUEUED), J.PAUSED, "`JobInterrupted(paused)`", "placement",
               "`PauseJob` for a job not placed; or the `JobAccepted` of a job submitted "
               "with run mode pause (T9k `runMode.pause`, Kubeflow `runPolicy.suspend`)"),
    Transition((J.PAUSED,), J.QUEUED, "`JobQueued`", "placement",
               "a user's resume (`ResumeJob`) or restart (`RestartJob`): attempt n+1"),
    Transition((J.PAUSED,), J.PLACED, "`JobPlaced`", "placement",
               "a resume or restart that fits at once: attempt n+1"),
    Transition((J.PAUSED,), J.STOPPED, "`JobFinished`", "placement",
               "`StopJob` (`stopped while paused`)"),
    Transition((J.PLACED, J.RUNNING), J.QUEUED, "`JobInterrupted(restarted, preempted, "
               "scaled, node_removed, shutdown)`", "launcher",
               "placement interrupted the attempt (a restart, a preemption, a scale, a node "
               "removed, the platform shutting down) and queues the next at once"),
))  # fmt: skip

TASK: Machine[TaskState] = Machine("task", (
    Transition((), T.STARTING, "`JobPlaced`", "launcher (`launch_job`)",
               "every task of the attempt is recorded before any is spawned"),
    Transition((), T.STARTING, "`TasksPlaced`", "launcher (`launch_more`)",
               "a job without gang placement: its tasks placed after its start"),
    Transition((T.STARTING,), T.RUNNING, "spawned", "launcher (`start_task`)",
               "the wrapper process was spawned (or, after a restart, its pid file "
               "appeared)"),
    Transition((T.STARTING,), T.FAILED, "cannot start", "launcher (`start_task`)",
               "the spec asks for what this backend cannot do (`could not start: "
               "data_sources[i].source: data source 'oss://…': … nothing is fetched from "
               "elsewhere (oss://)`; submission refuses such a source, so only a job "
               "accepted before it was), a port cannot be bound, or a task launched by an "
               "earlier launcher never wrote its pid"),
    Transition((T.RUNNING,), T.SUCCEEDED, "exit 0", "launcher watcher (`check_tasks`)",
               "the command exited with code 0"),
    Transition((T.RUNNING,), T.FAILED, "exit ≠ 0, signal, lost", "launcher watcher",
               "non-zero exit or a signal; a failed preparation; the process vanished "
               "without an exit record (`lost…`); past its memory limit"),
    Transition((T.STARTING, T.RUNNING), T.FAILED, "start deadline",
               "launcher watcher (`check_start_deadlines`)",
               "its command had not started within the **start deadline**"),
    Transition((T.STARTING, T.RUNNING), T.STOPPED, "job ended", "launcher (`finish_job`)",
               "the job ended (stop, a completion rule, the run deadline): SIGTERM to the "
               "process group, SIGKILL after the grace period"),
    Transition((T.STARTING, T.RUNNING), T.STOPPED, "`InterruptJob`",
               "launcher (`interrupt_job`)",
               "pause, restart, preemption, scale, node removed: as a stop, the reason is "
               "the interrupt's, the task directories are kept"),
))  # fmt: skip

PLACEMENT: Machine[PlacementState] = Machine("placement", (
    Transition((), P.QUEUED, "`JobAccepted`", "placement", "a job to place"),
    Transition((), P.PAUSED, "`JobAccepted`", "placement", "a job submitted with run mode pause"),
    Transition((), P.STOPPED_EARLY, "`StopJob`, `JobRejected`", "placement",
               "a stop for a job not seen yet, or a job validation rejected (a tombstone)"),
    Transition((P.STOPPED_EARLY,), P.DONE, "`JobAccepted`, `JobRejected`", "placement",
               "the job the tombstone waited for: stopped at once; or rejected: never "
               "comes, its commands find it ended"),
    Transition((P.QUEUED,), P.PLACED, "cycle", "placement", "the gang fits"),
    Transition((P.QUEUED,), P.DONE, "`StopJob`", "placement", "stopped while queued"),
    Transition((P.QUEUED,), P.PAUSED, "`PauseJob`", "placement", "paused while queued"),
    Transition((P.PLACED,), P.DONE, "`JobFinished`", "placement", "the attempt ended"),
    Transition((P.PLACED,), P.INTERRUPTING, "`InterruptJob`", "placement",
               "pause, restart, scale, elastic growth, preemption, node removed"),
    Transition((P.PLACED, P.INTERRUPTING), P.QUEUED, "`JobRetrying`", "placement",
               "a failed attempt that runs again: its next attempt, after a backoff"),
    Transition((P.INTERRUPTING,), P.INTERRUPTING, "interrupt noted", "placement",
               "a second cause or a note on the interrupt in flight"),
    Transition((P.PLACED, P.INTERRUPTING), P.QUEUED, "`JobInterrupted`", "placement",
               "the tasks ended (the launcher's word): the next attempt is queued"),
    Transition((P.PLACED, P.INTERRUPTING), P.PAUSED, "`JobInterrupted(paused)`", "placement",
               "the tasks ended and the job was paused"),
    Transition((P.PLACED, P.INTERRUPTING), P.DONE, "`JobFinished`, `StopJob`", "placement",
               "the attempt ended, or a stop came while it was being interrupted"),
    Transition((P.PAUSED,), P.QUEUED, "`ResumeJob`, `RestartJob`", "placement",
               "the next attempt"),
    Transition((P.PAUSED,), P.DONE, "`StopJob`", "placement", "stopped while paused"),
))  # fmt: skip

MACHINES = (JOB, TASK, PLACEMENT)


def marker(machine: Machine[Any]) -> tuple[str, str]:
    return (
        f"<!-- lifecycle: {machine.name} transitions, generated from "
        "trainyard_common.lifecycle by `make contracts`; do not edit -->",
        f"<!-- end of {machine.name} transitions -->",
    )


def with_tables(markdown: str) -> str:
    """``markdown`` with each machine's table written between its markers."""
    for machine in MACHINES:
        begin, end = marker(machine)
        start, stop = markdown.index(begin), markdown.index(end)
        markdown = f"{markdown[: start + len(begin)]}\n{machine.markdown()}\n{markdown[stop:]}"
    return markdown
