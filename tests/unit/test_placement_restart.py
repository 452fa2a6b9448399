"""Placement's side of a manual restart (RestartJob), over the in-memory store: a placed
attempt is interrupted (cause restarted) and the next one queued at once with the retry
budget it had; a paused job is resumed; a queued one stays as it is; an ended one is
left alone; and a redelivered RestartJob never restarts the attempt it started."""

from __future__ import annotations

import pytest

from trainyard_common.bus import Delivery
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    FailureClass,
    InterruptCause,
    InterruptJob,
    JobInterrupted,
    JobRetrying,
    RestartJob,
    derived_id,
    utcnow,
)
from trainyard_placement.adapters.store import RESTARTS_KEPT, next_attempt_fields
from trainyard_placement.handlers import handle, interrupt_placed

from .test_placement_control import interrupted, pause, placed
from .test_placement_handlers import Harness


def restart(job_id: str, event_id: str | None = None) -> RestartJob:
    return RestartJob(
        event_id=event_id or f"restart-{job_id}",
        job_id=job_id,
        requested_by="alice",
        reason="restarted by alice",
    )


async def redeliver(h: Harness, event: RestartJob, times: int = 2) -> None:
    await handle(event, Delivery(stream_seq=h.seq, num_delivered=times, subject="x"), h.deps)


def interrupts(h: Harness, job_id: str) -> list[tuple[int, InterruptCause]]:
    return [(e.attempt, e.cause) for e in h.pub.of(InterruptJob, job_id)]  # type: ignore[attr-defined]


async def test_restarting_a_placed_job_runs_its_next_attempt_on_the_same_budget() -> None:
    h = await Harness().boot()
    await h.accept("a")
    # One retry spent first: the restart must neither spend another nor give it back.
    await h.send(
        JobRetrying(
            job_id="a",
            attempt=2,
            previous_attempt=1,
            reason="failed",
            failure_class=FailureClass.USER,
            not_before=utcnow(),
        )
    )
    await h.accept("b")  # needs the same two GPUs: waits
    command = restart("a")
    await h.send(command)
    [sent] = h.pub.of(InterruptJob, "a")
    assert (sent.attempt, sent.cause, sent.reason) == (
        2,
        InterruptCause.RESTARTED,  # type: ignore[attr-defined]
        "restarted by alice",
    )
    assert sent.event_id == derived_id("a", 2, "interrupt", "restarted")
    doc = h.store.docs["a"]
    assert (doc["state"], doc["restarts"]) == ("interrupting", ["restart-a"])
    assert placed(h, "b") == []  # its tasks may still run: the GPUs stay taken

    await h.send(interrupted("a", attempt=2, cause=InterruptCause.RESTARTED))
    assert [(p.attempt, p.retries_used) for p in placed(h, "a")] == [(1, 0), (2, 1), (3, 1)]
    assert placed(h, "b") == []  # a restart goes first: it keeps its place of arrival
    # No JobInterrupted of placement's own: the launcher's says restarted already.
    assert h.pub.of(JobInterrupted, "a") == []

    # The same command again, now that attempt 3 runs: nothing happens to attempt 3.
    await redeliver(h, command)
    await redeliver(h, command, times=5)
    assert interrupts(h, "a") == [(2, InterruptCause.RESTARTED)]
    assert len(placed(h, "a")) == 3 and h.store.docs["a"]["state"] == "placed"
    # A new restart (another command) restarts attempt 3.
    await h.send(restart("a", "restart-a-2"))
    assert interrupts(h, "a")[-1] == (3, InterruptCause.RESTARTED)
    assert h.store.docs["a"]["restarts"] == ["restart-a", "restart-a-2"]


async def test_a_restart_stored_but_not_sent_is_sent_on_redelivery_once() -> None:
    h = await Harness().boot()
    await h.accept("a")
    command = restart("a")
    h.pub.fail_next = 1  # the bus fails between storing the restart and sending it
    with pytest.raises(ConnectionError):
        await h.send(command)
    assert h.store.docs["a"]["state"] == "interrupting" and h.pub.of(InterruptJob, "a") == []
    await redeliver(h, command)
    [sent] = h.pub.of(InterruptJob, "a")
    assert (sent.attempt, sent.cause) == (1, InterruptCause.RESTARTED)  # type: ignore[attr-defined]
    await h.send(interrupted("a", cause=InterruptCause.RESTARTED))
    await redeliver(h, command, times=3)
    assert interrupts(h, "a") == [(1, InterruptCause.RESTARTED)]
    assert [p.attempt for p in placed(h, "a")] == [1, 2]


async def test_a_restart_survives_a_placement_restart() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(restart("a"))
    again = await Harness(h.store, h.seq).boot()
    assert "a" in again.deps.state.placed  # still holds its capacity
    # Its InterruptJob is sent again at start (the same id), in case it never went out.
    assert interrupts(again, "a") == [(1, InterruptCause.RESTARTED)]
    await again.send(interrupted("a", cause=InterruptCause.RESTARTED))
    [second] = placed(again, "a")
    assert (second.attempt, second.retries_used) == (2, 0)
    await redeliver(again, restart("a"))
    assert len(interrupts(again, "a")) == 1


async def test_restarting_a_paused_job_resumes_it_as_its_next_attempt() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.send(interrupted("a"))
    assert h.store.docs["a"]["state"] == "paused"
    command = restart("a")
    await h.send(command)
    [_, second] = placed(h, "a")
    assert (second.attempt, second.retries_used) == (2, 0)
    assert interrupts(h, "a") == [(1, InterruptCause.PAUSED)]  # the pause's only
    await redeliver(h, command)
    assert len(placed(h, "a")) == 2 and len(interrupts(h, "a")) == 1


async def test_a_resume_stored_but_not_taken_into_memory_is_on_redelivery() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.send(interrupted("a"))
    command = restart("a")
    # As if the store took the restart but the handler failed before memory did.
    h.store.docs["a"].update(next_attempt_fields(2), restarts=[command.event_id])
    assert "a" not in h.deps.state.queued
    await redeliver(h, command)
    [_, second] = placed(h, "a")
    assert (second.attempt, second.retries_used) == (2, 0)


async def test_restarting_a_queued_job_leaves_it_as_it_is() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.accept("b")
    command = restart("b")
    await h.send(command)
    doc = h.store.docs["b"]
    assert (doc["state"], doc["attempt"], doc["restarts"]) == ("queued", 1, ["restart-b"])
    assert h.pub.of(InterruptJob, "b") == [] and h.pub.of(JobInterrupted, "b") == []
    assert "b" in h.deps.state.queued
    await h.finish("a")
    [b] = placed(h, "b")
    assert (b.attempt, b.retries_used) == (1, 0)
    # Delivered again once it runs: the restart was for the job as it waited, not for
    # the attempt that started since.
    await redeliver(h, command)
    assert h.pub.of(InterruptJob, "b") == []


async def test_restarting_an_ended_job_does_nothing() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.finish("a")
    before = dict(h.store.docs["a"])
    published = len(h.pub.events)
    await h.send(restart("a"))
    assert h.store.docs["a"] == before and len(h.pub.events) == published
    await h.stop("ghost")  # a tombstone: stopped before placement knew it
    await h.send(restart("ghost"))
    assert h.store.docs["ghost"]["state"] == "stopped_early"


async def test_restarting_a_job_being_paused_resumes_it_once_paused() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    with pytest.raises(TransientError):
        await h.send(restart("a"))
    await h.send(interrupted("a"))
    await redeliver(h, restart("a"))
    [_, second] = placed(h, "a")
    assert (second.attempt, second.retries_used) == (2, 0)


async def test_restarting_a_job_leaving_for_another_cause_adds_nothing() -> None:
    h = await Harness().boot()
    await h.accept("a")
    record = await h.store.get("a")
    assert record is not None
    async with h.deps.lock:
        assert await interrupt_placed(h.deps, record, InterruptCause.PREEMPTED, "make room")
    command = restart("a")
    await h.send(command)
    assert interrupts(h, "a") == [(1, InterruptCause.PREEMPTED)]
    assert h.store.docs["a"]["interrupt"]["cause"] == "preempted"
    await h.send(interrupted("a", cause=InterruptCause.PREEMPTED))
    [_, second] = placed(h, "a")
    assert (second.attempt, second.retries_used) == (2, 0)
    # Its next attempt was the fresh start asked for: a redelivery leaves it running.
    await redeliver(h, command)
    assert interrupts(h, "a") == [(1, InterruptCause.PREEMPTED)]


async def test_a_restart_before_placement_knows_the_job_is_tried_again() -> None:
    h = await Harness().boot()
    with pytest.raises(TransientError):
        await h.send(restart("ghost"))


async def test_only_the_last_restarts_are_remembered() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.accept("b")  # waits: a's restarts never free the GPUs for long enough
    for n in range(RESTARTS_KEPT + 2):
        await h.send(restart("a", f"r{n}"))
        attempt = h.store.docs["a"]["attempt"]
        await h.send(interrupted("a", attempt=attempt, cause=InterruptCause.RESTARTED))
    doc = h.store.docs["a"]
    assert doc["restarts"] == [f"r{n}" for n in range(2, RESTARTS_KEPT + 2)]
    assert (doc["state"], doc["attempt"], doc["retries_used"]) == ("placed", RESTARTS_KEPT + 3, 0)
    assert placed(h, "b") == []
