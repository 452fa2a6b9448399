"""Placement's side of a retry: JobRetrying gives the failed attempt's allocation back and
queues the job as the next attempt, which waits out its backoff without holding up the
queue and is then placed with a JobPlaced of that attempt; redelivery and a restart
change nothing twice; a stop during the backoff ends the new attempt."""

from __future__ import annotations

from datetime import timedelta

from trainyard_common.events import (
    FailureClass,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobRetrying,
    JobState,
    derived_id,
    utcnow,
)
from trainyard_placement.handlers import queue_view, run_cycle

from .test_placement_handlers import Harness, spec


def retrying(job_id: str, attempt: int = 2, wait_s: float = 0.0) -> JobRetrying:
    return JobRetrying(
        event_id=derived_id(job_id, attempt - 1, "retry"),
        job_id=job_id,
        attempt=attempt,
        previous_attempt=attempt - 1,
        reason="attempt failed",
        failure_class=FailureClass.PLATFORM,
        not_before=utcnow() + timedelta(seconds=wait_s),
    )


async def test_a_retry_is_placed_again_as_its_next_attempt() -> None:
    h = await Harness().boot()
    await h.accept("a")
    event = retrying("a")
    await h.send(event)
    placed = h.pub.of(JobPlaced, "a")
    assert [(p.attempt, p.event_id) for p in placed] == [
        (1, derived_id("a", 1, "placed")),
        (2, derived_id("a", 2, "placed")),
    ]
    assert placed[1].tasks[0].gpu_indices == [0, 1]  # the old allocation was given back
    doc = h.store.docs["a"]
    assert (doc["state"], doc["attempt"], doc["placed_published"]) == ("placed", 2, True)
    # Redelivered: nothing new.
    await h.send(event)
    assert len(h.pub.of(JobPlaced, "a")) == 2
    # The next attempt's end releases its capacity; the old attempt's does nothing.
    await h.send(JobFinished(job_id="a", attempt=1, state=JobState.FAILED, reason="x"))
    assert h.store.docs["a"]["state"] == "placed"
    await h.send(JobFinished(job_id="a", attempt=2, state=JobState.SUCCEEDED, reason="ok"))
    assert h.store.docs["a"]["state"] == "done"


async def test_a_retry_waits_out_its_backoff_without_holding_up_the_queue() -> None:
    h = await Harness().boot()
    await h.accept("a", spec(gpus=1))
    await h.send(retrying("a", wait_s=60))
    queued = h.pub.of(JobQueued, "a")
    assert [q.attempt for q in queued] == [2]
    assert queued[0].reasons[0].startswith("retrying attempt 2 after backoff until ")
    assert [r["job_id"] for r in queue_view(h.deps)] == ["a"]
    # Its capacity is free for a later job meanwhile.
    await h.accept("b", spec(gpus=2))
    assert [p.attempt for p in h.pub.of(JobPlaced, "b")] == [1]
    assert len(h.pub.of(JobPlaced, "a")) == 1

    # A restart keeps the attempt and its not_before.
    again = await Harness(h.store, h.seq).boot()
    assert "a" in again.deps.deferred and again.deps.deferred["a"][0].attempt == 2
    # When it is due (and fits), it is placed as attempt 2.
    await again.finish("b")
    job, _ = again.deps.deferred["a"]
    again.deps.deferred["a"] = (job, utcnow() - timedelta(seconds=1))
    async with again.deps.lock:
        await run_cycle(again.deps)
    [placed] = again.pub.of(JobPlaced, "a")
    assert placed.attempt == 2 and placed.event_id == derived_id("a", 2, "placed")


async def test_a_stop_during_the_backoff_ends_the_new_attempt() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(retrying("a", wait_s=60))
    await h.stop("a")
    [done] = h.pub.of(JobFinished, "a")
    assert (done.attempt, done.state, done.event_id) == (
        2,
        JobState.STOPPED,
        derived_id("a", 2, "finished"),
    )
    assert "a" not in h.deps.deferred and queue_view(h.deps) == []


async def test_a_retry_of_an_older_attempt_changes_nothing() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(retrying("a", attempt=2))
    await h.send(retrying("a", attempt=3))
    assert [p.attempt for p in h.pub.of(JobPlaced, "a")] == [1, 2, 3]
    await h.send(retrying("a", attempt=2))  # a late redelivery of the first retry
    assert [p.attempt for p in h.pub.of(JobPlaced, "a")] == [1, 2, 3]
    assert (h.store.docs["a"]["attempt"], h.store.docs["a"]["state"]) == (3, "placed")
