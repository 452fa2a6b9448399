"""Priority preemption: who may be preempted, the cheapest set that really makes the head
fit, and no preemption cycles."""

from __future__ import annotations

import pytest

from trainyard_common.cluster import ClusterSpec, NodeSpec, QueueQuota, QueueSpec
from trainyard_common.events import (
    InterruptCause,
    InterruptJob,
    JobInterrupted,
    JobPlaced,
    JobQueued,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_placement.domain import (
    Candidate,
    LeastWork,
    LowestPriority,
    Preempt,
    QueuedJob,
    Rules,
    SchedulerState,
)
from trainyard_placement.handlers import run_due_cycle

from .placement_cases import World, cycle_and_apply, gpus, job, node, queue, role
from .test_placement_handlers import Harness


def busy(n_gpus: int = 4) -> World:
    """One node of ``n_gpus`` GPUs, filled with 1-GPU jobs low0..lowN of priority 1."""
    w = World.of(node("n", gpus=n_gpus))
    for i in range(n_gpus):
        w.submit(f"low{i}", gpus(1, priority=1))
        w.cycle()
    return w


def test_higher_priority_preempts_the_least_work() -> None:
    w = busy()
    w.submit("urgent", gpus(2, priority=9))
    w.cycle()
    [preempt] = w.preempts()
    # The two placed last have run the fewest task-seconds.
    assert preempt.victims == ("low3", "low2")
    assert preempt.reason == "preempted by job urgent (priority 9)"
    assert w.waiting("urgent").reasons == (
        "waiting for preempted jobs low3, low2 to end: they hold capacity this job needs",
    )
    w.interrupted("low3")
    w.cycle()
    assert w.preempts() == [] and "urgent" not in w.placed()
    w.interrupted("low2")
    w.cycle()
    assert "urgent" in w.placed()
    assert w.waiting("low3").position == 1


def owned(spec: JobSpec, user: str) -> JobSpec:
    return spec.model_copy(update={"user": user})


def test_reasons_name_another_users_job_to_no_one_but_its_user() -> None:
    # Ids of other users' jobs are not to be learnt (docs/security.md): a reason that
    # names one told Bob which job of Alice's held him up, its priority and timing.
    w = World.of(node("n", gpus=2))
    w.submit("alice-low", owned(gpus(1, priority=1), "alice"))
    w.submit("bob-low", owned(gpus(1, priority=1), "bob"))
    w.cycle()
    w.submit("bob-urgent", owned(gpus(2, priority=9), "bob"))
    w.submit("alice-next", owned(gpus(2, priority=9), "alice"))
    w.submit("bob-next", owned(gpus(2, priority=9), "bob"))
    w.cycle()
    [preempt] = w.preempts()
    assert set(preempt.victims) == {"alice-low", "bob-low"}
    assert preempt.reason == "preempted by another user's job (priority 9)"
    assert w.waiting("bob-urgent").reasons == (
        "waiting for preempted job bob-low and 1 job of other users to end: they hold "
        "capacity this job needs",
    )
    assert w.waiting("alice-next").reasons == (
        "waiting behind another user's job at the head of the queue",
    )
    assert w.waiting("bob-next").reasons == (
        "waiting behind job bob-urgent at the head of the queue",
    )


@pytest.mark.parametrize("priority", [1, 5])
def test_equal_or_lower_priority_never_preempts(priority: int) -> None:
    w = World.of(node("n", gpus=2))
    w.submit("running", gpus(2, priority=5))
    w.cycle()
    w.submit("new", gpus(2, priority=priority))
    w.cycle()
    assert w.preempts() == []


def test_smallest_sufficient_set_rather_than_many_small_jobs() -> None:
    w = World.of(node("n", gpus=4))
    w.submit("big", gpus(2, priority=1))
    w.cycle()
    w.submit("s1", gpus(1, priority=1))
    w.cycle()
    w.submit("s2", gpus(1, priority=1))
    w.cycle()
    w.submit("urgent", gpus(1, priority=9))
    w.cycle()
    [preempt] = w.preempts()
    assert preempt.victims == ("s2",)


def test_no_victims_when_preempting_would_not_make_it_fit() -> None:
    w = World.of(node("n", gpus=4))
    w.submit("high", gpus(3, priority=9))
    w.cycle()
    w.submit("low", gpus(1, priority=1))
    w.cycle()
    w.submit("urgent", gpus(2, priority=9))  # needs 2: only low's 1 GPU may go
    w.cycle()
    assert w.preempts() == []
    assert "no node has 2 free GPUs" in " ".join(w.waiting("urgent").reasons)


def test_preemption_stays_within_the_queue() -> None:
    w = World.of(node("n", gpus=2), queues=["a", "b"])
    w.submit("a-low", gpus(2, queue="a", priority=1))
    w.cycle()
    w.submit("b-high", gpus(2, queue="b", priority=9))
    w.cycle()
    assert w.preempts() == []


def test_a_queue_may_turn_preemption_off() -> None:
    w = World.of(node("n", gpus=2), queues=[queue("default", preemption=False)])
    w.submit("low", gpus(2, priority=1))
    w.cycle()
    w.submit("high", gpus(2, priority=9))
    w.cycle()
    assert w.preempts() == []


def test_preemption_off_in_the_rules() -> None:
    w = World.of(node("n", gpus=2), rules=Rules(victims=None))
    w.submit("low", gpus(2, priority=1))
    w.cycle()
    w.submit("high", gpus(2, priority=9))
    w.cycle()
    assert w.preempts() == []


def test_a_job_preempted_max_times_is_no_longer_preempted() -> None:
    w = World.of(node("n", gpus=2), rules=Rules(max_preemptions=2))
    w.submit("victim", gpus(2, priority=1))
    w.cycle()
    for round_ in range(3):
        w.submit(f"high{round_}", gpus(2, priority=9))
        w.cycle()
        if round_ < 2:
            [preempt] = w.preempts()
            assert preempt.victims == ("victim",)
            w.interrupted("victim")
            w.cycle()  # high placed
            w.state.release(f"high{round_}")
            w.cycle()  # victim placed again
            assert w.placed() == ["victim"]
        else:
            assert w.preempts() == []
    assert w.state.preemptions["victim"] == 2


def test_victims_being_interrupted_are_not_chosen_again() -> None:
    w = busy(2)
    w.submit("urgent", gpus(1, priority=9))
    w.cycle()
    [first] = w.preempts()
    w.submit("urgent2", gpus(1, priority=9))
    w.cycle()
    # urgent waits for its victim; urgent2 waits behind it: only a queue's head preempts.
    assert w.preempts() == []
    assert w.waiting("urgent2").reasons == ("waiting behind job urgent at the head of the queue",)
    w.interrupted(first.victims[0])
    w.cycle()
    assert "urgent" in w.placed()
    [second] = w.preempts()
    assert second.job_id == "urgent2"
    assert set(first.victims).isdisjoint(second.victims)


def test_elastic_head_preempts_for_its_minimum_only() -> None:
    w = busy()
    w.submit("el", job(role(gpus=1, replicas=4, min_replicas=1, max_replicas=4), priority=9))
    w.cycle()
    [preempt] = w.preempts()
    assert preempt.victims == ("low3",)


def candidate(
    job_id: str, *, priority: int = 1, work: float = 1, placed_at: float = 0, borrowed: bool = False
) -> Candidate:
    return Candidate(job_id, "q", priority, 1, work, placed_at, borrowed)


@pytest.mark.parametrize(
    ("chooser", "expected"),
    [
        (LeastWork(), ("borrowed-new", "borrowed-old", "cheap")),
        (LowestPriority(), ("borrowed-new", "borrowed-old", "lowest")),
    ],
)
def test_choosers_rank_borrowed_capacity_first(chooser: object, expected: tuple[str, ...]) -> None:
    candidates = [
        candidate("cheap", priority=4, work=1),
        candidate("lowest", priority=1, work=50),
        candidate("borrowed-old", work=100, placed_at=1, borrowed=True),
        candidate("borrowed-new", work=100, placed_at=5, borrowed=True),
    ]
    chosen = chooser.choose(candidates, lambda ids: len(ids) >= 3)  # type: ignore[attr-defined]
    assert chosen == expected


def test_greedy_drops_victims_it_did_not_need() -> None:
    candidates = [candidate("a", work=1), candidate("b", work=2), candidate("c", work=3)]
    # Only c matters: a and b were taken on the way and are dropped again.
    assert LeastWork().choose(candidates, lambda ids: "c" in ids) == ("c",)
    assert LeastWork().choose(candidates, lambda ids: False) is None


# --- the service: InterruptJob once per victim, counted in the store ------------------------


def urgent_spec(priority: int) -> JobSpec:
    return JobSpec(name="train", priority=priority, roles=[RoleSpec(
        name="worker", command="python train.py",
        resources=Resources(cpu=1, gpu=2, gpu_type="V100"))])  # fmt: skip


async def test_service_interrupts_each_victim_once_and_survives_a_restart() -> None:
    h = await Harness().boot()
    await h.accept("low", urgent_spec(1))
    await h.accept("high", urgent_spec(9))
    [interrupt] = h.pub.of(InterruptJob)
    assert isinstance(interrupt, InterruptJob)
    assert (interrupt.job_id, interrupt.attempt, interrupt.cause) == (
        "low",
        1,
        InterruptCause.PREEMPTED,
    )
    assert interrupt.event_id == derived_id("low", 1, "interrupt", "preempted")
    assert interrupt.reason == "preempted by job high (priority 9)"
    doc = h.store.docs["low"]
    assert (doc["state"], doc["preemptions"], doc["preempted_by"], doc["interrupt_sent"]) == (
        "interrupting",
        1,
        "high",
        True,
    )
    [queued] = h.pub.of(JobQueued, "high")
    assert queued.reasons == [  # type: ignore[attr-defined]
        "waiting for preempted job low to end: it holds capacity this job needs"
    ]
    # Another cycle (any event) and a restart send nothing again.
    await h.accept("other", urgent_spec(1))
    again = await Harness(h.store, h.seq).boot()
    assert again.deps.state.interrupting == {"low": "high"}
    assert again.deps.state.preemptions == {"low": 1}
    assert again.pub.of(InterruptJob) == [] and len(h.pub.of(InterruptJob)) == 1
    # The victim ends: its capacity goes to the preemptor, it queues as attempt 2.
    await again.send(
        JobInterrupted(
            job_id="low",
            attempt=1,
            cause=InterruptCause.PREEMPTED,
            reason="preempted by job high (priority 9)",
        )
    )
    [placed] = again.pub.of(JobPlaced, "high")
    assert again.store.docs["low"]["state"] == "queued"
    assert again.store.docs["low"]["preemptions"] == 1


async def test_a_crash_before_the_interrupt_went_out_sends_it_at_restart() -> None:
    h = await Harness().boot()
    await h.accept("low", urgent_spec(1))
    await h.accept("high", urgent_spec(9))
    h.store.docs["low"]["interrupt_sent"] = False  # as if the process died before sending
    again = await Harness(h.store, h.seq).boot()
    [interrupt] = again.pub.of(InterruptJob)
    assert interrupt.event_id == derived_id("low", 1, "interrupt", "preempted")
    assert again.store.docs["low"]["interrupt_sent"] is True


class FailingInterrupt:
    """The bus refuses the first InterruptJob and passes everything else."""

    def __init__(self, pub: object) -> None:
        self.pub, self.refused = pub, 0

    async def publish(self, event: object) -> int:
        if isinstance(event, InterruptJob) and not self.refused:
            self.refused += 1
            raise ConnectionError("bus unavailable")
        return await self.pub.publish(event)  # type: ignore[attr-defined]


async def test_an_interrupt_the_cycle_could_not_send_is_sent_by_the_next_one() -> None:
    # A cycle's preemption has no message to be redelivered: the victim, stored as
    # interrupting, would wait for an InterruptJob never sent, and its preemptor with it.
    h = await Harness().boot()
    h.deps.defer_cycles = True
    await h.accept("low", urgent_spec(1))
    await run_due_cycle(h.deps)
    await h.accept("high", urgent_spec(9))
    h.deps.publisher = FailingInterrupt(h.deps.publisher)
    with pytest.raises(ConnectionError):
        await run_due_cycle(h.deps)
    assert h.store.docs["low"]["state"] == "interrupting" and not h.pub.of(InterruptJob)
    await run_due_cycle(h.deps)  # the failed cycle stays due
    [interrupt] = h.pub.of(InterruptJob)
    assert interrupt.event_id == derived_id("low", 1, "interrupt", "preempted")
    assert h.store.docs["low"]["interrupt_sent"] is True
    # Memory knows whom the victim makes room for, counted once, as without the failure.
    assert h.deps.state.interrupting == {"low": "high"}
    assert h.deps.state.preemptions == {"low": 1}
    await h.send(
        JobInterrupted(job_id="low", attempt=1, cause=InterruptCause.PREEMPTED, reason="x")
    )
    await run_due_cycle(h.deps)
    assert [e.job_id for e in h.pub.of(JobPlaced)] == ["low", "high"]


def test_two_heads_never_choose_the_same_victim_in_one_cycle() -> None:
    # Found by the interleaving property: job5 (qa, higher priority) and job4 (qb,
    # reclaiming what qa borrows) were both heads in one cycle and both chose job2, so
    # job2 was interrupted twice and its capacity promised to two jobs.
    def small(name: str, gpus: int = 0) -> NodeSpec:
        return NodeSpec(name=name, cpu=1, memory_mb=1024, gpus=gpus, port_range=(30000, 30000))

    def gpu_job(queue: str, gpu: float, priority: int = 1) -> JobSpec:
        role = RoleSpec(
            name="worker",
            replicas=1,
            command="true",
            resources=Resources(cpu=0.5, memory_mb=256, gpu=gpu),
        )
        return JobSpec(name="j", queue=queue, priority=priority, roles=[role])

    cluster = ClusterSpec(
        nodes=[small("n0"), small("n1"), small("n2"), small("n3", gpus=1)],
        queues=[
            QueueSpec(name="qa", quota=QueueQuota(gpus=0.0), borrowing=True, preemption=True),
            QueueSpec(name="qb", borrowing=False, preemption=False),
        ],
    )
    state = SchedulerState(cluster, rules=Rules(max_preemptions=1))

    def cycle() -> list:
        return cycle_and_apply(state)

    for seq, spec in enumerate(
        [gpu_job("qa", 0.5), gpu_job("qa", 1), gpu_job("qa", 0), gpu_job("qb", 1)], start=1
    ):
        state.enqueue(QueuedJob(f"job{seq}", spec, arrival_seq=seq))
        cycle()
    state.release("job1")  # preempted for job4; its tasks ended
    cycle()
    assert "job2" in state.placed
    state.enqueue(QueuedJob("job5", gpu_job("qa", 0.5, priority=2), arrival_seq=5))
    preempts = [d for d in cycle() if isinstance(d, Preempt)]
    assert [(p.job_id, p.victims) for p in preempts] == [("job5", ("job2",))]


def test_a_new_head_is_no_news_whoever_its_user_is() -> None:
    from trainyard_placement.handlers.common import notice_key

    own = ("waiting behind job a1 at the head of the queue gpu",)
    other = ("waiting behind another user's job at the head of the queue gpu",)
    assert notice_key(own, 5) == notice_key(other, 5)
    assert notice_key(own, 5) != notice_key(
        ("waiting behind job a1 at the head of the queue cpu",), 5
    )
