"""Placement's control verbs across failures: a stop, pause or scale that meets a failed
attempt's retry, publishes that fail, a crash between writes, a restart while a
preemption victim is paused (found in review; each failed before its fix)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from trainyard_common.events import (
    FailureClass,
    InterruptCause,
    InterruptJob,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobRetrying,
    JobState,
    PauseJob,
    RestartJob,
    ResumeJob,
    ScaleJob,
    SetPriority,
    StopJob,
    derived_id,
    utcnow,
)
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_placement.adapters.store import JobStoreState, MemoryJobStore
from trainyard_placement.handlers import start

from .test_placement_control import elastic, elastic_gpus, interrupted, pause
from .test_placement_handlers import Harness, spec


def retrying(job_id: str, previous: int = 1, not_before_s: float = 0.0) -> JobRetrying:
    return JobRetrying(
        event_id=derived_id(job_id, previous, "retry"), job_id=job_id,
        attempt=previous + 1, previous_attempt=previous, reason="exit 1",
        failure_class=FailureClass.USER, not_before=utcnow() + timedelta(seconds=not_before_s),
    )  # fmt: skip


class FlakyChangeStore(MemoryJobStore):
    """The in-memory store whose next ``change`` calls fail as a lost connection would:
    the process stops between two writes of one handler."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_changes = 0

    async def change(
        self, job_id: str, *, states: Any, attempt: int, fields: dict[str, Any]
    ) -> bool:
        if self.fail_changes:
            self.fail_changes -= 1
            raise ConnectionError("store unavailable")
        return await super().change(job_id, states=states, attempt=attempt, fields=fields)


def finished(h: Harness, job_id: str) -> list[JobFinished]:
    return h.pub.of(JobFinished, job_id)  # type: ignore[return-value]


async def test_a_stop_carried_to_a_retry_is_announced_after_a_failed_publish() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))  # interrupting
    await h.send(StopJob(job_id="a", requested_by="alice", reason="enough"))
    event = retrying("a")  # the attempt failed before the launcher saw the interrupt
    h.pub.fail_next = 1
    with pytest.raises(ConnectionError):
        await h.send(event)  # stored as done, JobFinished lost on the way
    await h.send(event)  # JetStream redelivers it
    assert [(f.attempt, f.state) for f in finished(h, "a")] == [(2, JobState.STOPPED)]


async def test_a_pause_carried_to_a_retry_is_announced_after_a_failed_publish() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    event = retrying("a")
    h.pub.fail_next = 1
    with pytest.raises(ConnectionError):
        await h.send(event)  # stored as paused in attempt 2, JobInterrupted lost
    await h.send(event)
    announced = h.pub.of(JobInterrupted, "a")
    assert [(e.attempt, e.cause) for e in announced] == [  # type: ignore[attr-defined]
        (2, InterruptCause.PAUSED)
    ]


async def test_a_stop_carried_to_a_retry_survives_a_failure_between_the_two_writes() -> None:
    store = FlakyChangeStore()
    h = await Harness(store).boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.send(StopJob(job_id="a", requested_by="alice", reason="enough"))
    event = retrying("a")
    store.fail_changes = 1
    with pytest.raises(ConnectionError):
        await h.send(event)  # requeued as attempt 2; the stop was not applied yet
    again = await Harness(store, h.seq).boot()  # a restart, then the redelivery
    await again.send(event)
    assert [p.attempt for p in again.pub.of(JobPlaced, "a")] == []
    assert [(f.attempt, f.state) for f in finished(again, "a")] == [(2, JobState.STOPPED)]
    state: JobStoreState = store.docs["a"]["state"]
    assert state == "done"


async def test_a_scale_of_a_queued_retry_is_not_reverted_by_a_later_pause() -> None:
    h = await Harness().boot()
    now = [utcnow()]
    h.deps.clock = lambda: now[0]  # the test moves time instead of sleeping
    await h.accept("e", elastic(replicas=1))
    await h.send(ScaleJob(job_id="e", requested_by="alice", role="worker", replicas=3))
    # Attempt 1 failed before the scale's interrupt reached it: attempt 2 takes size 3
    # and waits out a backoff.
    await h.send(retrying("e", not_before_s=30))
    # While it waits, the user settles on 2.
    await h.send(ScaleJob(job_id="e", requested_by="alice", role="worker", replicas=2))
    await start(h.deps)
    assert h.pub.of(JobPlaced, "e")[-1].attempt == 1  # type: ignore[attr-defined]
    now[0] += timedelta(seconds=31)
    await start(h.deps)  # the backoff is over: a cycle places it
    second = h.pub.of(JobPlaced, "e")[-1]
    assert (second.attempt, len(second.tasks)) == (2, 2)  # type: ignore[attr-defined]
    await h.send(PauseJob(job_id="e", requested_by="alice", reason="lunch"))
    await h.send(interrupted("e", attempt=2))
    await h.send(ResumeJob(job_id="e", requested_by="alice"))
    third = h.pub.of(JobPlaced, "e")[-1]
    assert (third.attempt, len(third.tasks)) == (3, 2)  # type: ignore[attr-defined]


def one_gpu(priority: int) -> JobSpec:
    return JobSpec(name="train", priority=priority, roles=[RoleSpec(
        name="worker", command="python train.py",
        resources=Resources(cpu=1, gpu=1, gpu_type="V100"))])  # fmt: skip


async def test_pausing_a_preempted_victim_does_not_cost_a_second_victim_after_a_restart() -> None:
    h = await Harness().boot()
    await h.accept("low1", one_gpu(1))
    await h.accept("low2", one_gpu(1))
    await h.accept("high", one_gpu(9))  # one GPU: one victim is enough
    [first] = h.pub.of(InterruptJob)
    victim = first.job_id
    # The user pauses the victim while it is on its way out.
    await h.send(PauseJob(job_id=victim, requested_by="alice", reason="lunch"))
    again = await Harness(h.store, h.seq).boot()
    assert [
        e.job_id for e in again.pub.of(InterruptJob) if e.cause is InterruptCause.PREEMPTED
    ] == []  # type: ignore[attr-defined]
    assert again.store.docs["low1" if victim == "low2" else "low2"]["state"] == "placed"


class LostReplyStore(MemoryJobStore):
    """The in-memory store whose named writes land but whose answer is lost, as when the
    store dies between applying a write and replying (pymongo's AutoReconnect)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose: set[str] = set()

    def _lost(self, name: str) -> None:
        if name in self.lose:
            self.lose.discard(name)
            raise ConnectionError(f"{name}: connection closed before the reply")

    async def add_queued(self, *args: Any, **kwargs: Any) -> bool:
        done = await super().add_queued(*args, **kwargs)
        self._lost("add_queued")
        return done

    async def mark_done(self, *args: Any, **kwargs: Any) -> bool:
        done = await super().mark_done(*args, **kwargs)
        self._lost("mark_done")
        return done


async def test_an_accepted_job_whose_insert_lost_its_reply_is_still_placed() -> None:
    # Found by the crash test: the store was killed as a JobAccepted was handled; the
    # redelivery found the job stored and took it as known in memory, so it was never
    # placed.
    store = LostReplyStore()
    h = await Harness(store).boot()
    store.lose.add("add_queued")
    with pytest.raises(ConnectionError):
        await h.accept("a")
    assert h.pub.of(JobPlaced, "a") == []
    await h.accept("a")  # JetStream redelivers it
    assert len(h.pub.of(JobPlaced, "a")) == 1


async def one_waiting_behind_another(lose: str) -> Harness:
    """a placed, b waiting for a's GPUs, and the store's next ``lose`` losing its reply."""
    store = LostReplyStore()
    h = await Harness(store).boot()
    await h.accept("a")
    await h.accept("b")
    store.lose.add(lose)
    return h


async def test_a_finished_job_whose_release_lost_its_reply_gives_its_capacity_back() -> None:
    h = await one_waiting_behind_another("mark_done")
    with pytest.raises(ConnectionError):
        await h.finish("a")
    await h.finish("a")  # redelivered: done in the store, still held in memory
    assert len(h.pub.of(JobPlaced, "b")) == 1


async def test_a_job_stopped_in_the_queue_whose_stop_lost_its_reply_is_never_placed() -> None:
    h = await one_waiting_behind_another("mark_done")
    with pytest.raises(ConnectionError):
        await h.stop("b")
    await h.stop("b")  # redelivered
    assert [f.state for f in finished(h, "b")] == [JobState.STOPPED]
    await h.finish("a")
    assert h.pub.of(JobPlaced, "b") == []


class LostChange(LostReplyStore):
    async def change(self, *args: Any, **kwargs: Any) -> bool:
        done = await super().change(*args, **kwargs)
        self._lost("change")
        return done


async def test_a_resume_whose_requeue_lost_its_reply_is_still_placed() -> None:
    store = LostChange()
    h = await Harness(store).boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.send(interrupted("a", attempt=1))  # the launcher ended its tasks: paused
    store.lose.add("change")
    resume = ResumeJob(job_id="a", requested_by="alice")
    with pytest.raises(ConnectionError):
        await h.send(resume)  # stored as queued (attempt 2), memory never got it
    await h.send(resume)  # redelivered
    assert [p.attempt for p in h.pub.of(JobPlaced, "a")] == [1, 2]  # type: ignore[attr-defined]


async def waiting_behind_a_placed_job(waiting: JobSpec | None = None) -> Harness:
    """a placed on every GPU, b waiting for them, and a store whose ``change`` can lose
    its reply."""
    h = await Harness(LostChange()).boot()
    await h.accept("a")
    await h.accept("b", waiting)
    assert h.pub.of(JobPlaced, "b") == []
    return h


async def test_a_pause_whose_release_lost_its_reply_gives_its_capacity_back() -> None:
    # Found by an audit: the redelivered JobInterrupted found the job paused in the
    # store and matched no case, so memory held a's GPUs for ever and b never ran.
    h = await waiting_behind_a_placed_job()
    await h.send(pause("a"))
    h.store.lose.add("change")  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        await h.send(interrupted("a"))  # stored as paused, memory still holds a
    await h.send(interrupted("a"))  # redelivered
    assert h.store.docs["a"]["state"] == "paused"
    assert len(h.pub.of(JobPlaced, "b")) == 1


async def test_a_restart_whose_requeue_lost_its_reply_runs_its_next_attempt() -> None:
    h = await waiting_behind_a_placed_job()
    await h.send(RestartJob(job_id="a", requested_by="alice", event_id="restart-1"))
    [interrupt] = h.pub.of(InterruptJob, "a")
    h.store.lose.add("change")  # type: ignore[attr-defined]
    ended = interrupted("a", cause=interrupt.cause)  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        await h.send(ended)  # stored as queued in attempt 2, memory still holds a
    await h.send(ended)
    # Its capacity given back and taken again by attempt 2 (which keeps its place
    # ahead of b, as a restart spends nothing).
    assert [p.attempt for p in h.pub.of(JobPlaced, "a")] == [1, 2]  # type: ignore[attr-defined]
    assert h.pub.of(JobPlaced, "b") == []


async def test_a_scale_of_a_queued_job_whose_change_lost_its_reply_takes_its_size() -> None:
    # The store took the new size; the redelivery's change modified nothing (False) and
    # memory kept the old size, so the job was placed as it was submitted.
    h = await waiting_behind_a_placed_job(elastic_gpus(replicas=1))
    scale = ScaleJob(job_id="b", requested_by="alice", role="worker", replicas=2)
    h.store.lose.add("change")  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        await h.send(scale)
    await h.send(scale)
    await h.finish("a")
    [placed] = h.pub.of(JobPlaced, "b")
    assert len(placed.tasks) == 2  # type: ignore[attr-defined]


async def test_a_priority_whose_change_lost_its_reply_orders_the_queue() -> None:
    h = await waiting_behind_a_placed_job()
    await h.accept("c", spec(gpus=2))  # behind b, same priority
    lower_b = SetPriority(job_id="b", requested_by="alice", priority=1)
    h.store.lose.add("change")  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        await h.send(lower_b)
    await h.send(lower_b)
    await h.finish("a")
    assert len(h.pub.of(JobPlaced, "c")) == 1 and h.pub.of(JobPlaced, "b") == []
