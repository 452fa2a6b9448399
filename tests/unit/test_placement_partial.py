"""Jobs without gang placement (OpenPAI ``gangAllocation: false``): placed with the tasks
that fit, the others one by one as capacity frees (domain/sizes.py, domain/partial.py),
and through placement's handlers: JobPlaced with the job as submitted, then TasksPlaced."""

from __future__ import annotations

import pytest

from trainyard_common.events import (
    JobFinished,
    JobPlaced,
    JobState,
    TasksPlaced,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.jobspec import JobSpec
from trainyard_placement.domain.partial import more_tasks
from trainyard_placement.domain.sizes import at_step, last_step, remaining_tasks, sized_to
from trainyard_placement.handlers import queue_view

from .placement_cases import World, job, node, queue, role
from .test_placement_handlers import Harness


def ungang(*roles, **kw):  # type: ignore[no-untyped-def]
    return job(*roles, **kw).model_copy(update={"gang": False})


def test_its_sizes_are_its_first_tasks_in_role_order() -> None:
    spec = ungang(role("a", replicas=2), role("b", replicas=3))
    assert last_step(spec) == 4
    sizes = [[r.replicas for r in at_step(spec, k).roles] for k in range(5)]
    assert sizes == [[2, 3], [2, 2], [2, 1], [2, 0], [1, 0]]
    # A gang job of the same shape has one size.
    gang = spec.model_copy(update={"gang": True})
    assert last_step(gang) == 0 and at_step(gang, 0) is gang


def test_placed_with_the_tasks_that_fit_instead_of_waiting() -> None:
    w = World.of(node("n1", gpus=2), node("n2", gpus=1))
    w.submit("p", ungang(role(gpus=1, replicas=5)))
    w.cycle()
    allocation = w.state.placed["p"]
    assert len(allocation.tasks) == 3
    # What it holds counts only the tasks placed (quota, capacity, the target workload).
    assert allocation.spec.roles[0].replicas == 3
    # The same job as a gang waits whole.
    g = World.of(node("n1", gpus=2), node("n2", gpus=1))
    g.submit("g", job(role(gpus=1, replicas=5)))
    g.cycle()
    assert g.placed() == [] and "g" in {d.job_id for d in g.last}


def test_its_waiting_tasks_are_placed_one_by_one_as_capacity_frees() -> None:
    w = World.of(node("n1", gpus=2))
    w.submit("other", job(role(gpus=1)))
    w.submit("p", ungang(role(gpus=1, replicas=3)))
    w.cycle()
    assert "p" not in w.state.queued and len(w.state.placed["p"].tasks) == 1
    full = ungang(role(gpus=1, replicas=3))
    assert more_tasks(w.state, "p", full, w.state.placed["p"].tasks) == []
    w.state.release("other")
    added = more_tasks(w.state, "p", full, w.state.placed["p"].tasks)
    assert [(t.role, t.index) for t in added] == [("worker", 1)]
    tasks = (*w.state.placed["p"].tasks, *added)
    assert remaining_tasks(full, tasks) == [("worker", 2)]
    assert sized_to(full, tasks).roles[0].replicas == 2
    # Distinct GPUs for the tasks of the job.
    assert sorted(i for t in tasks for i in t.gpu_indices) == [0, 1]


def test_waiting_tasks_keep_to_the_queue_quota_and_skip_an_interrupted_job() -> None:
    w = World.of(node("n1", gpus=4), queues=[queue("q", gpus=2, borrowing=False)])
    spec = ungang(role(gpus=1, replicas=4), queue="q")
    w.submit("p", spec)
    w.cycle()
    assert len(w.state.placed["p"].tasks) == 2  # its quota, not the node, is the limit
    assert more_tasks(w.state, "p", spec, w.state.placed["p"].tasks) == []
    w2 = World.of(node("n1", gpus=1), node("n2", gpus=1))
    spec2 = ungang(role(gpus=1, replicas=2))
    w2.submit("x", job(role(gpus=1)))
    w2.submit("p", spec2)
    w2.cycle()
    w2.state.release("x")
    w2.state.interrupting["p"] = None
    assert more_tasks(w2.state, "p", spec2, w2.state.placed["p"].tasks) == []


def test_its_waiting_tasks_leave_a_higher_heads_reservation_and_borrow_within_the_rules() -> None:
    # Placed before every cycle, its tasks took capacity the last cycle reserved for a
    # head of a higher priority, and borrowed after it had been reclaimed too often.
    def world(head_priority: int) -> tuple[World, JobSpec]:
        w = World.of(node("n1", gpus=4))
        w.submit("x", job(role(gpus=2)))
        spec = ungang(role(gpus=1, replicas=3))
        w.submit("p", spec)
        w.cycle()
        assert len(w.state.placed["p"].tasks) == 2
        w.submit("h", job(role(gpus=4), priority=head_priority))
        w.cycle()  # h waits, its reservation on n1
        assert w.state.last_reservations()[0][1].job_id == "h"
        w.state.release("x")
        return w, spec

    w, spec = world(head_priority=9)
    assert more_tasks(w.state, "p", spec, w.state.placed["p"].tasks) == []
    w, spec = world(head_priority=5)  # no higher than p: a started job is ahead
    assert len(more_tasks(w.state, "p", spec, w.state.placed["p"].tasks)) == 1

    b = World.of(node("n1", gpus=4), queues=[queue("q", gpus=1)])
    b.submit("x", job(role(gpus=3), queue="q"))
    spec = ungang(role(gpus=1, replicas=3), queue="q")
    b.submit("p", spec)
    b.cycle()
    b.state.release("x")
    b.state.preemptions["p"] = b.state.rules.max_preemptions  # reclaimed too often
    assert more_tasks(b.state, "p", spec, b.state.placed["p"].tasks) == []
    b.state.preemptions["p"] = 0
    assert len(more_tasks(b.state, "p", spec, b.state.placed["p"].tasks)) == 2


async def test_the_service_announces_the_job_as_submitted_then_each_new_task() -> None:
    h = await Harness().boot()  # one node: 2 GPUs
    await h.accept("big", _ungang_spec(replicas=3))
    (placed,) = h.pub.of(JobPlaced, "big")
    assert isinstance(placed, JobPlaced)
    assert len(placed.tasks) == 2
    assert placed.spec.roles[0].replicas == 3 and placed.spec.gang is False
    # Its waiting task does not make it wait in the queue.
    assert queue_view(h.deps) == []
    await h.accept("small", _gang_spec())
    assert not h.pub.of(JobPlaced, "small")
    assert not h.pub.of(TasksPlaced)
    # A restart keeps it partial and announces again what it holds (a TasksPlaced lost
    # in a crash would leave its tasks unlaunched; a repeat is nothing new to anyone).
    h2 = await Harness(h.store, seq=h.seq).boot()
    (again,) = h2.pub.of(TasksPlaced, "big")
    assert isinstance(again, TasksPlaced) and len(again.tasks) == 2
    await h2.send(JobFinished(job_id="big", state=JobState.SUCCEEDED, reason="done"))
    assert [e.job_id for e in h2.pub.of(JobPlaced)] == ["small"]


async def test_the_service_places_the_waiting_tasks_when_another_job_ends() -> None:
    h = await Harness().boot()
    await h.accept("first", _gang_spec(gpus=1))
    await h.accept("big", _ungang_spec(replicas=3))
    (placed,) = h.pub.of(JobPlaced, "big")
    assert len(placed.tasks) == 1  # type: ignore[attr-defined]
    await h.send(JobFinished(job_id="first", state=JobState.SUCCEEDED, reason="done"))
    (more,) = h.pub.of(TasksPlaced, "big")
    assert isinstance(more, TasksPlaced)
    assert [(t.role, t.index) for t in more.tasks] == [("worker", 0), ("worker", 1)]
    assert more.event_id == derived_id("big", 1, "tasks", 2)
    assert [t["index"] for t in h.store.docs["big"]["allocation"]] == [0, 1]
    # Redelivered, nothing new is placed or announced.
    await h.send(JobFinished(job_id="first", state=JobState.SUCCEEDED, reason="done"))
    assert len(h.pub.of(TasksPlaced, "big")) == 1


def _ungang_spec(replicas: int):  # type: ignore[no-untyped-def]
    from .test_placement_handlers import spec

    return spec(gpus=1, replicas=replicas).model_copy(update={"gang": False})


def _gang_spec(gpus: int = 1):  # type: ignore[no-untyped-def]
    from .test_placement_handlers import spec

    return spec(gpus=gpus)


@pytest.mark.parametrize("gang", [True, False])
def test_a_job_of_one_task_is_the_same_either_way(gang: bool) -> None:
    spec = job(role(gpus=1)).model_copy(update={"gang": gang})
    assert last_step(spec) == 0 and at_step(spec, 0) is spec


async def test_an_ended_task_gives_its_capacity_back_while_the_job_goes_on() -> None:
    h = await Harness().boot()  # 2 GPUs
    await h.accept("big", _ungang_spec(replicas=3))
    await h.accept("gang", _gang_spec(gpus=1))
    assert len(h.pub.of(JobPlaced, "big")[0].tasks) == 2  # type: ignore[attr-defined]
    ended = TaskStateChanged(
        job_id="big", role="worker", index=1, state=TaskState.SUCCEEDED, seq=3, exit_code=0
    )
    await h.send(ended)
    # Its waiting task takes the GPU first (it has started), not the queued gang job.
    (more,) = h.pub.of(TasksPlaced, "big")
    assert [(t.index, t.gpu_indices) for t in more.tasks] == [(0, [0]), (2, [1])]  # type: ignore[attr-defined]
    assert h.store.docs["big"]["released"] == [["worker", 1]]
    assert not h.pub.of(JobPlaced, "gang")
    # A redelivery, a running task, a gang job's task: nothing changes.
    await h.send(ended)
    await h.send(ended.model_copy(update={"index": 0, "state": TaskState.RUNNING}))
    assert len(h.pub.of(TasksPlaced)) == 1
    # Every task placed or ended: the next one to end frees a GPU for the queue.
    await h.send(ended.model_copy(update={"index": 0}))
    (gang,) = h.pub.of(JobPlaced, "gang")
    assert gang.tasks[0].gpu_indices == [0]  # type: ignore[attr-defined]
    # The last task's capacity goes back with the job's end, not before.
    h2 = await Harness(h.store, seq=h.seq).boot()
    assert h2.deps.released["big"] == {("worker", 0), ("worker", 1)}
    await h2.send(ended.model_copy(update={"index": 2}))
    assert [t.index for t in h2.deps.state.placed["big"].tasks] == [2]
