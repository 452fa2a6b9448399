"""Placement's side of pause, resume, scale and interrupts, over the in-memory store: a
placed attempt is interrupted through the launcher and its capacity comes back only
with JobInterrupted; a queued job is paused here; the next attempt spends no retry;
stops work in every state; a restart keeps all of it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from trainyard_common.auth import Identity
from trainyard_common.bus import Delivery
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    FailureClass,
    FieldIssue,
    InterruptCause,
    InterruptJob,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobRejected,
    JobRetrying,
    JobState,
    PauseJob,
    ResumeJob,
    ScaleJob,
    StopJob,
    derived_id,
    utcnow,
)
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec, RunMode
from trainyard_placement.handlers import (
    PAUSED_STOP,
    SUBMITTED_PAUSED,
    JobEnded,
    JobNotFound,
    ScaleRefused,
    handle,
    interrupt_placed,
    queue_view,
    request_scale,
)

from .test_placement_handlers import Harness, spec


@pytest.fixture(autouse=True)
def memory_follows_the_store_unaided(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No flow here loses a reply: catch_up must never find memory behind the store
    (a reload there would be a spurious cycle, or state lost)."""
    yield
    assert not [r for r in caplog.get_records("call") if "not as stored" in r.getMessage()]


def pause(job_id: str) -> PauseJob:
    return PauseJob(job_id=job_id, requested_by="alice", reason="paused by alice")


def resume(job_id: str) -> ResumeJob:
    return ResumeJob(job_id=job_id, requested_by="alice")


def interrupted(
    job_id: str, attempt: int = 1, cause: InterruptCause = InterruptCause.PAUSED
) -> JobInterrupted:
    return JobInterrupted(
        event_id=derived_id(job_id, attempt, "interrupted"),
        job_id=job_id,
        attempt=attempt,
        cause=cause,
        reason=f"{cause.value} by test",
    )


def elastic(replicas: int = 1, user: str = "alice") -> JobSpec:
    return JobSpec(
        name="elastic",
        user=user,
        roles=[
            RoleSpec(
                name="worker",
                replicas=replicas,
                min_replicas=1,
                max_replicas=3,
                command="train",
                resources=Resources(cpu=2),
            )
        ],
    )


def placed(h: Harness, job_id: str) -> list[JobPlaced]:
    return h.pub.of(JobPlaced, job_id)  # type: ignore[return-value]


async def test_pausing_a_placed_job_frees_its_capacity_only_when_the_launcher_says_so() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.accept("b")  # needs the same two GPUs: waits
    await h.send(pause("a"))
    [command] = h.pub.of(InterruptJob, "a")
    assert (command.attempt, command.cause, command.reason) == (
        1,
        InterruptCause.PAUSED,
        "paused by alice",
    )
    assert command.event_id == derived_id("a", 1, "interrupt", "paused")
    assert h.store.docs["a"]["state"] == "interrupting"
    assert placed(h, "b") == []  # the tasks may still run: the GPUs are not free yet
    # Placement announces nothing for a placed job: the launcher's event says PAUSED.
    assert h.pub.of(JobInterrupted, "a") == []

    await h.send(interrupted("a"))
    assert (h.store.docs["a"]["state"], h.store.docs["a"]["attempt"]) == ("paused", 1)
    [b] = placed(h, "b")
    assert b.tasks[0].gpu_indices == [0, 1]
    # Redelivered, and paused again: nothing new.
    await h.send(interrupted("a"))
    await h.send(pause("a"))
    assert len(h.pub.of(InterruptJob, "a")) == 1 and len(placed(h, "b")) == 1
    assert h.pub.of(JobInterrupted, "a") == []


async def test_a_resumed_job_runs_as_its_next_attempt_without_spending_a_retry() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.send(interrupted("a"))
    await h.send(resume("a"))
    [first, second] = placed(h, "a")
    assert (first.attempt, first.retries_used) == (1, 0)
    assert (second.attempt, second.retries_used) == (2, 0)
    assert second.event_id == derived_id("a", 2, "placed")
    await h.send(resume("a"))  # running already: nothing to resume
    assert len(placed(h, "a")) == 2


async def test_only_a_retry_spends_the_budget_and_any_interrupt_cause_requeues() -> None:
    h = await Harness().boot()
    await h.accept("a")
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
    # Preempted (sent by placement core) or a node removed: queued again at once.
    await h.send(interrupted("a", attempt=2, cause=InterruptCause.PREEMPTED))
    await h.send(interrupted("a", attempt=3, cause=InterruptCause.NODE_REMOVED))
    assert [(p.attempt, p.retries_used) for p in placed(h, "a")] == [(1, 0), (2, 1), (3, 1), (4, 1)]
    # A late event of an older attempt changes nothing.
    await h.send(interrupted("a", attempt=2, cause=InterruptCause.PREEMPTED))
    assert len(placed(h, "a")) == 4
    # A restart reads the budget from the store.
    again = await Harness(h.store, h.seq).boot()
    assert again.deps.retries_used["a"] == 1


async def test_pausing_a_queued_job_announces_the_pause_itself() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.accept("b")
    assert [r["job_id"] for r in queue_view(h.deps)] == ["b"]
    await h.send(pause("b"))
    [event] = h.pub.of(JobInterrupted, "b")
    assert (event.attempt, event.cause, event.event_id) == (
        1,
        InterruptCause.PAUSED,
        derived_id("b", 1, "interrupted"),
    )
    assert h.store.docs["b"]["state"] == "paused" and queue_view(h.deps) == []
    assert h.pub.of(InterruptJob, "b") == []
    # Its own event comes back to it: nothing changes.
    await h.send(event)
    await h.finish("a")
    assert placed(h, "b") == []
    await h.send(resume("b"))
    [b] = placed(h, "b")
    assert (b.attempt, b.retries_used) == (2, 0)


async def test_a_job_submitted_to_start_paused_waits_for_a_resume() -> None:
    h = await Harness().boot()
    accepted = await h.accept("a", spec().model_copy(update={"run_mode": RunMode.PAUSE}))
    assert placed(h, "a") == []
    [event] = h.pub.of(JobInterrupted, "a")
    assert (event.attempt, event.cause, event.reason) == (
        1,
        InterruptCause.PAUSED,
        SUBMITTED_PAUSED,
    )
    await h.send(accepted, seq=1)  # redelivered: the same announcement, nothing placed
    assert {e.event_id for e in h.pub.of(JobInterrupted, "a")} == {event.event_id}
    assert placed(h, "a") == []
    await h.send(resume("a"))
    [p] = placed(h, "a")
    assert (p.attempt, p.retries_used) == (2, 0)


async def test_a_pause_before_placement_knows_the_job_is_tried_again() -> None:
    h = await Harness().boot()
    with pytest.raises(TransientError):
        await h.send(pause("ghost"))
    with pytest.raises(TransientError):
        await h.send(resume("ghost"))


async def test_stop_ends_a_paused_job_and_one_being_interrupted() -> None:
    h = await Harness().boot()
    await h.accept("a", spec(gpus=1))
    await h.accept("b", spec(gpus=1))
    await h.send(pause("a"))
    await h.send(interrupted("a"))
    await h.stop("a")
    [done] = h.pub.of(JobFinished, "a")
    assert (done.attempt, done.state, done.reason) == (1, JobState.STOPPED, PAUSED_STOP)
    assert done.event_id == derived_id("a", 1, "finished")
    assert h.store.docs["a"]["state"] == "done"
    await h.send(resume("a"))  # ended: nothing to resume
    assert len(placed(h, "a")) == 1

    await h.send(pause("b"))
    await h.stop("b")  # arrives before the launcher's answer
    assert h.pub.of(JobFinished, "b") == []
    await h.send(interrupted("b"))
    [done] = h.pub.of(JobFinished, "b")
    assert (done.attempt, done.state, done.reason) == (1, JobState.STOPPED, "stopped by user")
    assert h.store.docs["b"]["state"] == "done" and "b" not in h.deps.state.placed


async def test_an_attempt_that_ends_while_being_interrupted_ends_as_it_did() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.finish("a")  # the launcher ended it first and ignores the InterruptJob
    assert h.store.docs["a"]["state"] == "done" and "a" not in h.deps.state.placed


async def test_an_attempt_that_fails_while_being_paused_is_paused_as_its_retry() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    await h.send(
        JobRetrying(
            job_id="a",
            attempt=2,
            previous_attempt=1,
            reason="failed",
            failure_class=FailureClass.USER,
            not_before=utcnow() + timedelta(seconds=60),
        )
    )
    doc = h.store.docs["a"]
    assert (doc["state"], doc["attempt"], doc["retries_used"]) == ("paused", 2, 1)
    [event] = h.pub.of(JobInterrupted, "a")
    assert (event.attempt, event.cause) == (2, InterruptCause.PAUSED)
    assert "a" not in h.deps.deferred and "a" not in h.deps.state.queued
    await h.send(resume("a"))
    assert [(p.attempt, p.retries_used) for p in placed(h, "a")] == [(1, 0), (3, 1)]


async def test_a_job_paused_while_it_was_being_preempted_ends_up_paused() -> None:
    h = await Harness().boot()
    await h.accept("a")
    record = await h.store.get("a")
    assert record is not None
    async with h.deps.lock:
        assert await interrupt_placed(h.deps, record, InterruptCause.PREEMPTED, "make room")
    await h.send(pause("a"))
    await h.send(interrupted("a", cause=InterruptCause.PREEMPTED))
    doc = h.store.docs["a"]
    assert (doc["state"], doc["attempt"]) == ("paused", 2)
    [event] = h.pub.of(JobInterrupted, "a")
    assert (event.attempt, event.cause) == (2, InterruptCause.PAUSED)
    assert len(placed(h, "a")) == 1


async def test_resuming_a_job_still_being_paused_waits() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    with pytest.raises(TransientError):
        await h.send(resume("a"))


async def test_an_interrupting_job_keeps_its_capacity_across_a_restart() -> None:
    h = await Harness().boot()
    await h.accept("a")
    await h.send(pause("a"))
    again = await Harness(h.store, h.seq).boot()
    assert "a" in again.deps.state.placed
    await again.accept("b")
    assert placed(again, "b") == []
    await again.send(interrupted("a"))
    assert len(placed(again, "b")) == 1


async def test_scaling_a_placed_job_restarts_it_at_the_new_size() -> None:
    h = await Harness().boot()
    await h.accept("e", elastic())
    command = await request_scale("e", "worker", 2, Identity("alice"), h.deps)
    [sent] = h.pub.of(ScaleJob, "e")
    assert sent == command and (sent.role, sent.replicas, sent.requested_by) == (
        "worker",
        2,
        "alice",
    )
    await h.send(command)
    [interrupt] = h.pub.of(InterruptJob, "e")
    assert interrupt.cause is InterruptCause.SCALED
    assert "worker to 2 replica(s)" in interrupt.reason
    await h.send(interrupted("e", cause=InterruptCause.SCALED))
    first, second = placed(h, "e")
    assert (len(first.tasks), len(second.tasks)) == (1, 2)
    assert (second.attempt, second.retries_used, second.spec.roles[0].replicas) == (2, 0, 2)
    assert h.store.docs["e"].get("next_spec") is None
    # The same size again: nothing to do.
    await h.send(ScaleJob(job_id="e", requested_by="alice", role="worker", replicas=2))
    assert len(h.pub.of(InterruptJob, "e")) == 1


async def test_scaling_a_queued_or_paused_job_changes_the_size_it_starts_with() -> None:
    h = await Harness().boot()
    await h.accept("e", elastic().model_copy(update={"run_mode": RunMode.PAUSE}))
    await h.send(ScaleJob(job_id="e", requested_by="alice", role="worker", replicas=3))
    assert placed(h, "e") == [] and h.pub.of(InterruptJob, "e") == []
    await h.send(resume("e"))
    [p] = placed(h, "e")
    assert len(p.tasks) == 3 and p.spec.roles[0].replicas == 3


async def test_a_scale_request_is_checked_against_the_roles_bounds() -> None:
    h = await Harness().boot()
    await h.accept("e", elastic())
    await h.accept(
        "fixed", JobSpec(name="f", user="alice", roles=[RoleSpec(name="worker", command="x")])
    )
    alice = Identity("alice")
    with pytest.raises(ScaleRefused) as refused:
        await request_scale("e", "worker", 4, alice, h.deps)
    assert refused.value.field == "replicas" and "[1, 3]" in str(refused.value)
    with pytest.raises(ScaleRefused) as refused:
        await request_scale("e", "ps", 2, alice, h.deps)
    assert refused.value.field == "role" and "'ps'" in str(refused.value)
    with pytest.raises(ScaleRefused) as refused:
        await request_scale("fixed", "worker", 2, alice, h.deps)
    assert refused.value.field == "role" and "not elastic" in str(refused.value)
    with pytest.raises(JobNotFound):
        await request_scale("ghost", "worker", 2, alice, h.deps)
    with pytest.raises(JobNotFound):  # someone else's job looks missing
        await request_scale("e", "worker", 2, Identity("bob"), h.deps)
    await request_scale("e", "worker", 2, Identity("root", admin=True), h.deps)
    await h.finish("fixed")
    with pytest.raises(JobEnded):
        await request_scale("fixed", "worker", 1, alice, h.deps)
    assert len(h.pub.of(ScaleJob)) == 1
    # A command that skipped the door is dropped by the consumer.
    await h.send(ScaleJob(job_id="e", requested_by="bob", role="worker", replicas=9))
    assert h.pub.of(InterruptJob, "e") == []


async def test_scaling_a_queued_job_changes_what_waits() -> None:
    h = await Harness().boot()
    await h.accept("a")
    big = elastic().model_copy(
        update={
            "roles": [elastic().roles[0].model_copy(update={"resources": Resources(cpu=1, gpu=1)})]
        }
    )
    await h.accept("e", big)
    assert placed(h, "e") == []
    await h.send(ScaleJob(job_id="e", requested_by="alice", role="worker", replicas=2))
    assert h.deps.state.queued["e"].spec.roles[0].replicas == 2
    await h.finish("a")
    [p] = placed(h, "e")
    assert (p.attempt, len(p.tasks)) == (1, 2)


async def test_a_command_waits_for_its_job_for_as_long_as_validation_takes() -> None:
    # Was dropped after ten deliveries (~40 s): a user's pause lost while validation
    # was down or behind, though the job came later and ran.
    h = await Harness().boot()
    late = Delivery(stream_seq=1, num_delivered=40, subject="x")
    with pytest.raises(TransientError, match="not known to placement yet"):
        await handle(pause("a"), late, h.deps)
    await h.accept("a")
    await handle(pause("a"), late, h.deps)
    assert [e.job_id for e in h.pub.of(InterruptJob)] == ["a"]


async def test_a_command_for_a_job_validation_rejected_finds_it_ended() -> None:
    h = await Harness().boot()
    rejected = JobRejected(job_id="ghost", errors=[FieldIssue(path="$.name", message="no")])
    for _ in range(2):  # a redelivery changes nothing
        await h.send(rejected)
    for command in (pause("ghost"), resume("ghost"), StopJob(job_id="ghost", requested_by="a")):
        await h.send(command)
    assert h.pub.events == [] and h.store.docs["ghost"]["state"] == "done"
    assert "ghost" not in h.deps.state.queued


async def test_a_job_stopped_then_rejected_is_ended_without_a_stop_announced() -> None:
    h = await Harness().boot()
    await h.send(StopJob(job_id="j", requested_by="alice"))
    await h.send(JobRejected(job_id="j", errors=[FieldIssue(path="$.name", message="no")]))
    assert h.store.docs["j"]["state"] == "done" and h.pub.events == []


def elastic_gpus(replicas: int) -> JobSpec:
    return JobSpec(
        name="elastic",
        user="alice",
        roles=[
            RoleSpec(
                name="worker",
                replicas=replicas,
                min_replicas=1,
                max_replicas=3,
                command="train",
                resources=Resources(cpu=1, gpu=1, gpu_type="V100"),
            )
        ],
    )


async def test_an_elastic_job_placed_small_grows_to_its_size_when_capacity_frees() -> None:
    h = await Harness().boot()
    h.deps.growth_after_s = 0
    await h.accept("a", spec(gpus=1))
    await h.accept("e", elastic_gpus(2))  # asks for 2 GPUs, 1 is free: runs at 1
    [first] = placed(h, "e")
    assert first.spec.role("worker").replicas == 1
    assert h.pub.of(InterruptJob, "e") == []

    await h.finish("a")  # a GPU frees, nobody waits: restart e at the size it asked for
    [command] = h.pub.of(InterruptJob, "e")
    assert (command.attempt, command.cause) == (1, InterruptCause.SCALED)
    assert command.reason == "growing into freed capacity: worker 1 -> 2 replica(s)"
    await h.send(interrupted("e", cause=InterruptCause.SCALED))
    [_, second] = placed(h, "e")
    assert (second.attempt, second.retries_used) == (2, 0)
    assert second.spec.role("worker").replicas == 2  # never beyond the size asked for (3)
    await h.accept("b", spec(gpus=1))  # nothing left: b waits, e does not grow again
    assert len(h.pub.of(InterruptJob, "e")) == 1


async def test_a_job_waiting_only_for_its_queues_quota_does_not_stop_growth_elsewhere() -> None:
    # growth() leaves such a wait to its own queue, but the service asked it nothing
    # while any job waited at all: one queue's quota kept every elastic job small.
    from trainyard_common.cluster import ClusterSpec, NodeSpec, QueueQuota, QueueSpec
    from trainyard_placement.handlers import load, start

    h = Harness()
    cluster = ClusterSpec(
        nodes=[NodeSpec(name="n1", host_ip="10.0.0.1", cpu=8, memory_mb=16384, gpus=4, gpu_type="V100")],
        queues=["default", QueueSpec(name="a", quota=QueueQuota(gpus=1), borrowing=False)],
    )  # fmt: skip
    h.deps = await load(h.store, h.pub, cluster)
    await start(h.deps)
    h.deps.growth_after_s = 0
    in_a = spec(gpus=1).model_copy(update={"queue": "a"})
    await h.accept("a1", in_a)
    await h.accept("a2", in_a)  # waits for queue a's quota, not for capacity
    await h.accept("big", spec(gpus=2))
    await h.accept("e", elastic_gpus(2))  # 1 GPU left: runs at 1
    assert placed(h, "a2") == [] and len(placed(h, "e")) == 1
    await h.finish("big")
    [command] = h.pub.of(InterruptJob, "e")
    assert command.reason == "growing into freed capacity: worker 1 -> 2 replica(s)"
    assert placed(h, "a2") == []  # still waiting for its quota


async def test_an_elastic_job_does_not_grow_while_others_wait_or_too_soon() -> None:
    h = await Harness().boot()
    await h.accept("a", spec(gpus=1))
    await h.accept("e", elastic_gpus(2))
    await h.finish("a")
    assert h.pub.of(InterruptJob, "e") == []  # it has run for less than growth_after_s

    h.deps.growth_after_s = 0
    await h.accept("c", spec(gpus=2))  # waits for both GPUs: freed capacity is its first
    assert h.pub.of(InterruptJob, "e") == []
