"""Queues with quota and borrowing: what a queue may use, and reclaiming what it lent."""

from __future__ import annotations

import pytest

from trainyard_common.cluster import ClusterSpec, QueueSpec
from trainyard_placement.domain import Fifo, Placed, PriorityFifo, QueuedJob, Rules

from .placement_cases import World, gpus, node, queue


def test_cluster_file_queues_are_names_or_specs() -> None:
    cluster = ClusterSpec.model_validate({
        "nodes": [],
        "queues": ["default", {"name": "gpu-a", "quota": {"gpus": 8}, "borrowing": False}],
    })  # fmt: skip
    assert cluster.queue_names() == ["default", "gpu-a"]
    a = cluster.queue("gpu-a")
    assert (a.quota.gpus, a.borrowing, a.preemption) == (8, False, True)
    # A plain name, or one the file does not list, has no quota.
    assert cluster.queue("default") == QueueSpec(name="default")
    assert cluster.queue("other").quota.gpus is None


@pytest.mark.parametrize(
    ("borrowing", "placed"),
    [(False, ["a1", "a2"]), (True, ["a1", "a2", "a3"])],
)
def test_beyond_quota_only_when_the_queue_borrows(borrowing: bool, placed: list[str]) -> None:
    w = World.of(node("n", gpus=8), queues=[queue("a", gpus=4, borrowing=borrowing)])
    for name in ("a1", "a2", "a3"):
        w.submit(name, gpus(2, queue="a"))
    w.cycle()
    assert w.placed() == placed


def test_quota_reason_has_the_numbers() -> None:
    w = World.of(node("n", gpus=16), queues=[queue("gpu-a", gpus=8, borrowing=False)])
    w.submit("a1", gpus(6, queue="gpu-a")).submit("a2", gpus(4, queue="gpu-a"))
    w.cycle()
    reasons = w.waiting("a2").reasons
    assert reasons == (
        "queue gpu-a uses 6 of its 8 GPUs quota; this job needs 4 (its queue does not borrow)",
    )


def test_borrowing_job_waits_with_quota_and_capacity_reasons() -> None:
    w = World.of(node("n", gpus=4), queues=[queue("a", gpus=2)])
    w.submit("a1", gpus(2, queue="a")).submit("a2", gpus(4, queue="a"))
    w.cycle()
    first, *rest = w.waiting("a2").reasons
    assert first.startswith("queue a uses 2 of its 2 GPUs quota; this job needs 4; beyond")
    assert any("no node has 4 free GPUs" in r for r in rest)


def test_queue_below_quota_reclaims_newest_borrowed_first() -> None:
    w = World.of(node("n", gpus=8), queues=[queue("a", gpus=4), queue("b", gpus=4)])
    # Queue a fills the cluster: two jobs within its quota, then two borrowing.
    for name in ("a1", "a2", "a3", "a4"):
        w.submit(name, gpus(2, queue="a"))
        w.cycle()
    assert w.placed() == ["a1", "a2", "a3", "a4"]
    w.submit("b1", gpus(2, queue="b"))
    w.cycle()
    [preempt] = w.preempts()
    assert preempt.victims == ("a4",)
    assert preempt.reason == "preempted by job b1 (priority 5) to reclaim queue b's quota"
    # The victim keeps its capacity until it ends; b1 waits, naming it.
    assert "a4" in w.placed() and "b1" not in w.placed()
    assert w.waiting("b1").reasons == (
        "waiting for preempted job a4 to end: it holds capacity this job needs",
    )
    w.cycle()
    assert w.preempts() == []  # not preempted twice
    w.interrupted("a4")
    w.cycle()
    assert "b1" in w.placed()
    # a4 queued again: within a's quota? no (a uses 4 of 4), borrowing: nothing is idle.
    assert "a4" not in w.placed()


def test_jobs_within_quota_are_never_reclaimed() -> None:
    w = World.of(node("n", gpus=4), queues=[queue("a", gpus=4), queue("b", gpus=4)])
    w.submit("a1", gpus(4, queue="a"))
    w.cycle()
    w.submit("b1", gpus(2, queue="b"))
    w.cycle()
    assert w.preempts() == []
    assert w.placed() == ["a1"]


def test_a_borrower_may_not_reclaim() -> None:
    w = World.of(node("n", gpus=4), queues=[queue("a", gpus=0), queue("b", gpus=0)])
    w.submit("a1", gpus(4, queue="a"))
    w.cycle()
    w.submit("b1", gpus(2, queue="b", priority=9))
    w.cycle()
    assert w.preempts() == [] and w.placed() == ["a1"]


def test_a_job_reclaimed_too_often_stops_borrowing() -> None:
    w = World.of(
        node("n", gpus=4),
        queues=[queue("a", gpus=0), queue("b", gpus=4)],
        rules=Rules(max_preemptions=1),
    )
    w.submit("a1", gpus(2, queue="a"))
    w.cycle()
    w.submit("b1", gpus(4, queue="b"))
    w.cycle()
    w.interrupted("a1")
    w.cycle()
    assert w.placed() == ["b1"]
    w.state.release("b1")
    w.cycle()
    assert w.placed() == []
    assert "no longer borrows" in w.waiting("a1").reasons[0]


def test_queue_orders() -> None:
    jobs = [QueuedJob("low", gpus(1, priority=1), 1), QueuedJob("high", gpus(1, priority=9), 2)]
    assert [j.job_id for j in PriorityFifo().order(jobs)] == ["high", "low"]
    assert [j.job_id for j in Fifo().order(jobs)] == ["low", "high"]


def test_priority_then_fifo_across_queues() -> None:
    w = World.of(node("n", gpus=2), queues=["a", "b"])
    w.submit("a-early", gpus(2, queue="a", priority=3))
    w.submit("b-urgent", gpus(2, queue="b", priority=8))
    decisions = w.cycle()
    assert [d.job_id for d in decisions if isinstance(d, Placed)] == ["b-urgent"]
