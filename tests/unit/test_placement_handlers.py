"""Placement handlers over the in-memory store and a publisher that collects events."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from trainyard_common.bus import Delivery
from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import (
    Event,
    FailureClass,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobRetrying,
    JobState,
    StopJob,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, PortSpec, Resources, RoleSpec
from trainyard_placement.adapters.store import MemoryJobStore
from trainyard_placement.domain import QueuedJob
from trainyard_placement.domain.queue import _Cycle
from trainyard_placement.handlers import Deps, handle, load, queue_view, run_due_cycle, start
from trainyard_placement.handlers.common import NotLeader, publish

CLUSTER = ClusterSpec(
    nodes=[NodeSpec(name="n1", host_ip="10.0.0.1", cpu=8, memory_mb=16384, gpus=2, gpu_type="V100")]
)


@pytest.fixture(autouse=True)
def memory_follows_the_store_unaided(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No flow here loses a reply: catch_up must never find memory behind the store
    (a reload there would be a spurious cycle, or state lost)."""
    yield
    assert not [r for r in caplog.get_records("call") if "not as stored" in r.getMessage()]


@dataclass
class ListPublisher:
    events: list[Event] = field(default_factory=list)
    fail_next: int = 0

    async def publish(self, event: Event) -> int:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("bus unavailable")
        self.events.append(event)
        return len(self.events)

    def of(self, kind: type[Event], job_id: str | None = None) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind) and job_id in (None, e.job_id)]


def spec(gpus: int = 2, replicas: int = 1) -> JobSpec:
    return JobSpec(name="train", roles=[RoleSpec(
        name="worker", replicas=replicas, command="python train.py",
        resources=Resources(cpu=1, gpu=gpus, gpu_type="V100"), ports=[PortSpec(label="http")],
    )])  # fmt: skip


class Harness:
    def __init__(self, store: MemoryJobStore | None = None, seq: int = 0) -> None:
        self.store = store or MemoryJobStore()
        self.pub = ListPublisher()
        self.seq = seq  # the stream sequence only grows, across restarts too
        self.deps: Deps

    async def boot(self) -> Harness:
        self.deps = await load(self.store, self.pub, CLUSTER)
        await start(self.deps)
        return self

    async def send(self, event: Event, seq: int | None = None) -> None:
        if seq is None:
            self.seq += 1
            seq = self.seq
        await handle(event, Delivery(stream_seq=seq, num_delivered=1, subject="x"), self.deps)

    async def accept(self, job_id: str, job: JobSpec | None = None) -> JobAccepted:
        event = JobAccepted(event_id=f"acc-{job_id}", job_id=job_id, spec=job or spec())
        await self.send(event)
        return event

    async def finish(self, job_id: str) -> None:
        await self.send(JobFinished(job_id=job_id, state=JobState.SUCCEEDED, reason="done"))

    async def stop(self, job_id: str) -> None:
        await self.send(StopJob(job_id=job_id, requested_by="alice"))


@pytest.fixture
async def h() -> Harness:
    return await Harness().boot()


async def test_accepted_job_is_placed_once_despite_redelivery(h: Harness) -> None:
    accepted = await h.accept("a")
    await h.send(accepted, seq=1)  # the same message again
    (placed,) = h.pub.of(JobPlaced)
    assert isinstance(placed, JobPlaced)
    assert placed.event_id == derived_id("a", 1, "placed")
    assert placed.spec == accepted.spec
    (task,) = placed.tasks
    assert (task.node, task.host_ip, task.gpu_indices) == ("n1", "10.0.0.1", [0, 1])
    assert task.ports[0].label == "http" and len(task.ports[0].ports) == 1
    doc = h.store.docs["a"]
    assert (doc["state"], doc["placed_published"], doc["arrival_seq"]) == ("placed", True, 1)


async def test_job_that_does_not_fit_waits_with_reasons_and_position(h: Harness) -> None:
    await h.accept("a")
    await h.accept("b")
    await h.accept("c", spec(gpus=1))
    queued = h.pub.of(JobQueued)
    assert [(e.job_id, e.position) for e in queued] == [("b", 1), ("c", 2)]  # type: ignore[attr-defined]
    assert queued[0].reasons == [  # type: ignore[attr-defined]
        "role worker task 0: no node has 2 free GPUs of type V100 (largest free: n1 0 GPUs V100)"
    ]
    assert queued[1].reasons == ["waiting behind job b at the head of the queue"]  # type: ignore[attr-defined]
    assert h.store.docs["b"]["reasons"] == queued[0].reasons  # type: ignore[attr-defined]
    assert [(r["job_id"], r["position"]) for r in queue_view(h.deps)] == [("b", 1), ("c", 2)]
    # Unchanged reasons are not announced again.
    await h.accept("b")
    assert len(h.pub.of(JobQueued)) == 2


async def test_finish_releases_capacity_and_the_queued_job_is_placed(h: Harness) -> None:
    await h.accept("a")
    await h.accept("b")
    assert not h.pub.of(JobPlaced, "b")
    await h.finish("a")
    (placed_b,) = h.pub.of(JobPlaced, "b")
    assert placed_b.tasks[0].gpu_indices == [0, 1]  # type: ignore[attr-defined]
    assert h.store.docs["a"]["state"] == "done"
    assert queue_view(h.deps) == []
    # A redelivered JobFinished of "a" must not release what "b" now holds.
    await h.finish("a")
    await h.accept("c")
    assert not h.pub.of(JobPlaced, "c")


async def test_ended_jobs_leave_no_entries_behind(h: Harness) -> None:
    """Placement kept the attempt and the retry count of every job it ever placed: one
    entry each per job in its history (bench/README.md, "--history"). Ended jobs' entries
    go, a while after they end (amortized); a job still in memory keeps its own."""
    for i in range(1100):
        job_id = f"done-{i:04}"
        await h.accept(job_id, spec(gpus=1))
        assert h.pub.of(JobPlaced, job_id)  # placed, so it had an attempt in memory
        h.deps.state.preemptions[job_id] = 1  # as if it had been preempted once
        await h.finish(job_id)
    await h.accept("running", spec(gpus=1))
    h.deps.state.preemptions["running"] = 2
    await h.accept("waiting", spec(gpus=2))
    assert set(h.deps.state.placed) == {"running"} and set(h.deps.state.queued) == {"waiting"}
    kept = (h.deps.attempts, h.deps.retries_used, h.deps.traces, h.deps.state.preemptions)
    for entries in kept:
        assert len(entries) <= 1000 + 2 * 2 + 1
    assert h.deps.attempts["running"] == 1 and h.deps.state.preemptions["running"] == 2
    assert h.deps.retries_used["running"] == 0 and h.deps.retries_used["waiting"] == 0


async def test_stop_while_queued(h: Harness) -> None:
    await h.accept("a")
    await h.accept("b")
    await h.accept("c", spec(gpus=0))
    await h.stop("b")
    (finished,) = h.pub.of(JobFinished)
    assert isinstance(finished, JobFinished)
    assert finished.event_id == derived_id("b", 1, "finished")
    assert (finished.state, finished.reason) == (JobState.STOPPED, "stopped while queued")
    assert h.store.docs["b"]["state"] == "done"
    # The job that waited behind "b" is no longer blocked.
    assert h.pub.of(JobPlaced, "c")
    # A later stop, or our own JobFinished coming back, changes nothing.
    await h.stop("b")
    await h.send(finished)
    await h.finish("a")
    assert not h.pub.of(JobPlaced, "b")


async def test_stop_before_accepted(h: Harness) -> None:
    await h.stop("a")
    assert h.store.docs["a"]["state"] == "stopped_early"
    assert h.pub.events == []
    accepted = await h.accept("a")
    (finished,) = h.pub.events
    assert isinstance(finished, JobFinished)
    assert finished.event_id == derived_id("a", 1, "finished")
    assert finished.reason == "stopped before it was placed"
    await h.send(accepted)
    assert len(h.pub.events) == 1 and not h.pub.of(JobPlaced)


async def test_stop_of_a_placed_job_is_left_to_the_launcher(h: Harness) -> None:
    await h.accept("a")
    await h.stop("a")
    assert [type(e) for e in h.pub.events] == [JobPlaced]
    assert h.store.docs["a"]["state"] == "placed"


async def test_restart_keeps_allocations_and_the_queue(h: Harness) -> None:
    await h.accept("a", spec(gpus=1))
    await h.accept("b")
    again = await Harness(h.store, h.seq).boot()
    assert again.pub.events == []  # nothing to re-announce
    assert set(again.deps.state.placed) == {"a"} and set(again.deps.state.queued) == {"b"}
    await again.accept("c", spec(gpus=1))  # one GPU is left, but c waits behind b
    assert not again.pub.of(JobPlaced)
    await again.finish("a")
    assert [e.job_id for e in again.pub.of(JobPlaced)] == ["b"]


async def test_placement_stored_but_not_announced_is_announced_on_restart(h: Harness) -> None:
    h.pub.fail_next = 1
    with pytest.raises(ConnectionError):
        await h.accept("a")
    assert h.store.docs["a"]["state"] == "placed"
    assert h.store.docs["a"]["placed_published"] is False
    again = await Harness(h.store, h.seq).boot()
    (placed,) = again.pub.of(JobPlaced)
    assert placed.event_id == derived_id("a", 1, "placed")
    assert placed.tasks[0].gpu_indices == [0, 1]  # type: ignore[attr-defined]
    assert again.store.docs["a"]["placed_published"] is True


async def test_failed_publish_is_retried_on_redelivery_in_the_same_process(h: Harness) -> None:
    h.pub.fail_next = 1
    with pytest.raises(ConnectionError):
        await h.accept("a")
    await h.send(JobAccepted(event_id="acc-a", job_id="a", spec=spec()), seq=1)
    (placed,) = h.pub.of(JobPlaced)
    assert placed.event_id == derived_id("a", 1, "placed")
    assert h.store.docs["a"]["placed_published"] is True


async def test_changed_reasons_are_announced_with_new_ids(h: Harness) -> None:
    await h.accept("a")
    await h.accept("b", spec(gpus=1))
    await h.accept("c")
    first = [e.event_id for e in h.pub.of(JobQueued, "c")]
    await h.stop("b")  # c is now the head: its reason changes
    reasons = [e.reasons for e in h.pub.of(JobQueued, "c")]  # type: ignore[attr-defined]
    assert reasons[0] == ["waiting behind job b at the head of the queue"]
    assert "no node has 2 free GPUs" in reasons[1][0]
    ids = [e.event_id for e in h.pub.of(JobQueued, "c")]
    assert ids[0] == first[0] and len(set(ids)) == 2


async def test_stop_whose_announcement_failed_is_announced_on_redelivery(h: Harness) -> None:
    await h.accept("a")
    await h.accept("b")
    stop = StopJob(job_id="b", requested_by="alice")
    h.pub.fail_next = 1
    with pytest.raises(ConnectionError):
        await h.send(stop)
    assert h.store.docs["b"]["state"] == "done"
    await h.send(stop)
    (finished,) = h.pub.of(JobFinished, "b")
    assert finished.reason == "stopped while queued"  # type: ignore[attr-defined]


async def test_waiting_jobs_are_told_again_only_when_it_means_something(h: Harness) -> None:
    # 120 jobs that each need the whole node: one runs, the others wait, and every end
    # puts a new job at the head. Telling every waiting job about each new head would be
    # 120²/2 notices; each job is told when it starts waiting, when its position's order
    # of magnitude changes (…100, …10, the head) and when it heads the queue.
    count = 120
    for i in range(count):
        await h.accept(f"j{i:03d}")
    for i in range(count - 1):
        await h.finish(f"j{i:03d}")
    queued = h.pub.of(JobQueued)
    per_job = collections.Counter(e.job_id for e in queued)
    assert len(per_job) == count - 1  # every waiting job was told why
    assert max(per_job.values()) <= 5, per_job.most_common(3)
    assert len(queued) <= 5 * count
    # What a notice says is still the whole truth at that moment.
    told_j119 = [" ".join(e.reasons) for e in queued if e.job_id == "j119"]
    assert any("waiting behind job j" in text for text in told_j119), told_j119
    # ...and once at the head, the notice names what the head itself waits for.
    assert "GPU" in told_j119[-1], told_j119


async def test_with_cycles_deferred_a_batch_of_messages_costs_one_cycle() -> None:
    """The service's consumer defers cycles to the end of each batch: its messages' own
    effects are stored at once, the placements come from one cycle after them."""
    h = await Harness().boot()
    h.deps.defer_cycles = True
    cycles = 0
    real = h.deps.state.cycle

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal cycles
        cycles += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    h.deps.state.cycle = counted  # type: ignore[method-assign]
    for job_id in ("a", "b", "c"):
        await h.accept(job_id, spec(gpus=0))
    assert not h.pub.of(JobPlaced) and cycles == 0 and h.deps.cycle_due
    assert {r.job_id for r in await h.store.active()} == {"a", "b", "c"}  # stored, queued
    await run_due_cycle(h.deps)
    assert {e.job_id for e in h.pub.of(JobPlaced)} == {"a", "b", "c"} and cycles == 1
    await run_due_cycle(h.deps)  # nothing due: no cycle
    assert cycles == 1 and not h.deps.cycle_due


async def test_a_deferred_cycle_that_fails_stays_due() -> None:
    h = await Harness().boot()
    h.deps.defer_cycles = True
    await h.accept("a", spec(gpus=0))
    h.pub.fail_next = 1
    with pytest.raises(ConnectionError):
        await run_due_cycle(h.deps)
    assert h.deps.cycle_due
    await run_due_cycle(h.deps)
    assert [e.job_id for e in h.pub.of(JobPlaced)] == ["a"]


async def test_arrivals_behind_a_full_node_are_handled_alone_and_shown_with_the_rest(
    h: Harness,
) -> None:
    """A cycle whose only news is arrivals carries the last one on: only the new jobs'
    verdicts are handled (each told once, at its place), the queue view shows them all;
    a pass whose notices did not all go out is followed by one that handles every
    verdict."""
    carried: list[int] = []
    real = h.deps.state.cycle

    def spied(*args: object, **kwargs: object) -> object:
        decisions = real(*args, **kwargs)  # type: ignore[arg-type]
        carried.append(h.deps.state.carried)
        return decisions

    h.deps.state.cycle = spied  # type: ignore[method-assign]
    for job_id in "abcde":
        await h.accept(job_id)
    assert carried[-2:] == [2, 3]  # d, then e, carried the cycle before on
    told = [(e.job_id, e.position) for e in h.pub.of(JobQueued)]  # type: ignore[attr-defined]
    assert told == [("b", 1), ("c", 2), ("d", 3), ("e", 4)]
    view = [(r["job_id"], r["position"]) for r in queue_view(h.deps)]
    assert view == [("b", 1), ("c", 2), ("d", 3), ("e", 4)]

    h.pub.fail_next = 1  # f's notice does not go out
    with pytest.raises(ConnectionError):
        await h.accept("f")
    await h.accept("f")  # redelivered
    assert [(e.job_id, e.position) for e in h.pub.of(JobQueued, "f")] == [("f", 5)]  # type: ignore[attr-defined]
    assert len(h.pub.of(JobQueued)) == 5

    await h.finish("a")  # b is placed; the others move up
    assert [e.job_id for e in h.pub.of(JobPlaced)] == ["a", "b"]
    view = [(r["job_id"], r["position"]) for r in queue_view(h.deps)]
    assert view == [("c", 1), ("d", 2), ("e", 3), ("f", 4)]


async def test_an_arrival_whose_cycle_failed_is_placed_in_the_queue_when_redelivered(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    for job_id in "abc":
        await h.accept(job_id)  # a placed, b and c wait
    real = _Cycle._consider
    failed: list[str] = []

    def once(self: _Cycle, job: QueuedJob) -> None:
        if job.job_id == "d" and not failed:
            failed.append(job.job_id)
            raise MemoryError("transient")
        real(self, job)

    monkeypatch.setattr(_Cycle, "_consider", once)
    with pytest.raises(MemoryError):
        await h.accept("d")
    await h.accept("d")  # redelivered: stored already, the cycle runs again
    await h.accept("e")
    assert failed == ["d"]
    view = [(r["job_id"], r["position"]) for r in queue_view(h.deps)]
    assert view == [("b", 1), ("c", 2), ("d", 3), ("e", 4)]
    told = [(e.job_id, e.position) for e in h.pub.of(JobQueued)]  # type: ignore[attr-defined]
    assert told == [("b", 1), ("c", 2), ("d", 3), ("e", 4)]


async def test_a_retry_in_backoff_is_told_its_place_while_arrivals_carry_cycles_on(
    h: Harness,
) -> None:
    """Retries in backoff are listed after the queue; when arrivals carry cycles on,
    their place still moves and is told when it means something (from the tens)."""
    await h.accept("a")
    await h.send(JobRetrying(
        event_id=derived_id("a", 1, "retry"), job_id="a", attempt=2, previous_attempt=1,
        reason="attempt failed", failure_class=FailureClass.PLATFORM,
        not_before=h.deps.clock() + timedelta(hours=1),
    ))  # fmt: skip
    await h.accept("z")  # placed: the node is full
    for job_id in "bcdefghijk":
        await h.accept(job_id)
    assert h.deps.state.carried  # the arrivals carried cycles on
    told = [(e.job_id, e.position) for e in h.pub.of(JobQueued, "a")]  # type: ignore[attr-defined]
    assert told[-1] == ("a", 11), told


async def test_a_lease_lost_during_a_cycle_stores_nothing_it_decided() -> None:
    # Found by a crash audit: the lease was checked when a cycle began and before each
    # publish, not before its store writes; a loop that stalled past the lease in the
    # cycle wrote one stale placement after the next leader had loaded its state.
    h = await Harness().boot()
    h.deps.defer_cycles = True
    await h.accept("a", spec(gpus=0))
    answers = iter([True, True])  # the cycle's two looks; then the lease is gone
    h.deps.leading = lambda: next(answers, False)
    with pytest.raises(NotLeader):
        await run_due_cycle(h.deps)
    assert h.store.docs["a"]["state"] == "queued" and not h.pub.of(JobPlaced)
    assert h.deps.cycle_due  # the next leader's cycle places it


async def test_a_replica_that_lost_the_lease_places_and_publishes_nothing() -> None:
    # Its event loop stalled past the lease: another replica leads now, and what this one
    # decided from its own memory could promise the same capacity twice.
    h = await Harness().boot()
    h.deps.defer_cycles = True
    await h.accept("a", spec(gpus=0))
    leads = False
    h.deps.leading = lambda: leads
    await run_due_cycle(h.deps)
    assert not h.pub.of(JobPlaced) and h.deps.cycle_due
    assert h.store.docs["a"]["state"] == "queued"
    with pytest.raises(NotLeader):
        await publish(h.deps, StopJob(job_id="a", requested_by="alice"))
    leads = True
    await run_due_cycle(h.deps)
    assert [e.job_id for e in h.pub.of(JobPlaced)] == ["a"]
