"""The lifecycle model (trainyard_common.lifecycle) is what the services do: the launcher
and placement cannot store a move it does not have, status's projection only makes its
moves, and docs/lifecycle.md's tables are generated from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard_common.contracts import example_events
from trainyard_common.events import (
    InterruptCause,
    JobFinished,
    JobInterrupted,
    JobState,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.lifecycle import (
    JOB,
    MACHINES,
    PLACEMENT,
    TASK,
    InvalidTransition,
    PlacementState,
    with_tables,
)
from trainyard_launcher.adapters.store import MemoryLauncherStore, new_task
from trainyard_placement.adapters.store import MemoryJobStore
from trainyard_status.domain.projection import project

DOC = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"


def test_the_documents_tables_are_the_model() -> None:
    text = DOC.read_text()
    assert with_tables(text) == text, "docs/lifecycle.md is stale: run `make contracts`"
    for machine in MACHINES:
        assert machine.markdown() in text


def test_check_names_the_move_it_refuses() -> None:
    TASK.check([TaskState.STARTING, TaskState.RUNNING], TaskState.STOPPED)
    assert TASK.allows(None, TaskState.STARTING) and not TASK.allows(None, TaskState.RUNNING)
    with pytest.raises(InvalidTransition, match=r"^task: SUCCEEDED -> RUNNING is not"):
        TASK.check([TaskState.SUCCEEDED], TaskState.RUNNING)
    # An end is an end: no terminal state leads anywhere.
    for machine, ends in [
        (TASK, {s for s in TaskState if s.terminal}),
        (JOB, {s for s in JobState if s.terminal}),
        (PLACEMENT, {PlacementState.DONE}),
    ]:
        assert not {source for source, _ in machine.moves} & ends, machine.name
    # Every state is reachable from a start.
    for machine in MACHINES:
        reached = {t for s, t in machine.moves if s is None}
        while True:
            more = {t for s, t in machine.moves if s in reached} - reached
            if not more:
                break
            reached |= more
        assert reached == machine.states(), machine.name


def variants(event):
    if isinstance(event, JobFinished):
        return [
            event.model_copy(update={"state": s})
            for s in JobState
            if s.terminal and s != JobState.REJECTED
        ]
    if isinstance(event, JobInterrupted):
        return [event.model_copy(update={"cause": c}) for c in InterruptCause]
    if isinstance(event, TaskStateChanged):
        return [event.model_copy(update={"state": s}) for s in TaskState]
    return [event]


def test_status_projects_only_the_models_moves() -> None:
    seen = set()
    for example in example_events():
        for event in variants(example):
            change = project(event).job
            if change is None or change.state is None:
                continue
            name = type(event).__name__
            targets = {t.target for t in JOB.transitions if name in t.event}
            assert change.state in targets, (name, change.state)
            seen.add(change.state)
    assert seen == JOB.states()  # and every state of the model is projected by some event


async def test_the_launcher_cannot_store_a_task_move_the_model_lacks() -> None:
    store = MemoryLauncherStore()
    task = new_task("j1", 1, "worker", 0, "/tmp/x")
    assert await store.insert_task(task)
    running = await store.transition(task, TaskState.RUNNING)
    assert running is not None
    done = await store.transition(running, TaskState.SUCCEEDED, exit_code=0)
    assert done is not None
    with pytest.raises(InvalidTransition):
        await store.transition(done, TaskState.RUNNING)
    with pytest.raises(InvalidTransition):
        await store.transition(task, TaskState.SUCCEEDED)  # never ran
    stored = await store.get_task(task.id)
    assert stored is not None and stored.state == TaskState.SUCCEEDED


async def test_placement_cannot_store_a_move_the_model_lacks() -> None:
    store = MemoryJobStore()
    with pytest.raises(InvalidTransition, match="placement: done -> queued"):
        await store.change("j1", states=("done",), attempt=1, fields={"state": "queued"})
    with pytest.raises(InvalidTransition, match="placement: paused -> placed"):
        await store.change("j1", states=("paused",), attempt=1, fields={"state": "placed"})
    # A change that leaves the state alone is not a transition.
    assert not await store.change("j1", states=("queued",), attempt=1, fields={"reasons": []})
