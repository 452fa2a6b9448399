"""Conservative backfill: a job behind a blocked head is placed only on capacity the
head's reservation does not need."""

from __future__ import annotations

from trainyard_placement.domain import Rules

from .placement_cases import World, gpus, job, node, queue, role


def two_nodes(rules: Rules | None = None) -> World:
    """n1 (4 GPUs) holds a 3-GPU job of the head's priority; n2 (3 GPUs) a 2-GPU one: one
    GPU free on each."""
    w = World.of(node("n1", gpus=4, labels={"pool": "big"}), node("n2", gpus=3), rules=rules)
    # Pinned: a policy may well put a 3-GPU job on the 3-GPU node (FGD does).
    w.submit("r1", job(role(gpus=3, selector={"pool": "big"}), priority=9))
    w.cycle()
    w.submit("r2", gpus(2, priority=9))
    w.cycle()
    assert w.nodes_of("r1") == {"n1"} and w.nodes_of("r2") == {"n2"}
    return w


def test_small_job_backfills_where_the_head_will_not_go() -> None:
    w = two_nodes()
    # The head needs 4 GPUs: only n1 can ever hold it, so n1 is reserved.
    w.submit("head", gpus(4, priority=9)).submit("small", gpus(1, priority=9))
    w.cycle()
    assert "head" not in w.placed()
    assert "small" in w.placed() and w.nodes_of("small") == {"n2"}


def test_backfill_never_takes_the_heads_capacity() -> None:
    w = two_nodes()
    w.submit("head", gpus(4, priority=9))
    w.submit("n1-only", job(role(gpus=1, selector={"pool": "big"}), priority=9))
    w.submit("also", gpus(1, priority=9))
    w.cycle()
    # n1 has 1 GPU free now, but all 4 are the head's once r1 ends.
    assert w.placed() == ["also", "r1", "r2"]
    assert w.waiting("n1-only").reasons == ("waiting behind job head at the head of the queue",)
    w.state.release("r1")
    w.cycle()
    assert "head" in w.placed()


def test_backfill_off_keeps_strict_fifo() -> None:
    w = two_nodes(Rules(backfill=False))
    w.submit("head", gpus(4, priority=9)).submit("small", gpus(1, priority=9))
    w.cycle()
    assert "small" not in w.placed()


def test_the_head_reserves_the_nodes_freest_now() -> None:
    w = World.of(node("n1", gpus=2), node("n2", gpus=2))
    w.submit("busy", gpus(2, priority=9))
    w.cycle()
    assert w.nodes_of("busy") == {"n1"}
    w.submit("other", gpus(1, priority=9))
    w.cycle()
    # The head (2 GPUs) reserves n2, where one GPU frees soonest; a 1-GPU job finds no
    # room outside that reservation.
    w.submit("head", gpus(2, priority=9)).submit("small", gpus(1, priority=9))
    w.cycle()
    assert w.nodes_of("other") == {"n2"}
    assert "small" not in w.placed()


def test_backfill_respects_the_quota_kept_for_the_head() -> None:
    w = World.of(node("n1", gpus=8), queues=[queue("a", gpus=4, borrowing=False)])
    w.submit("a1", gpus(2, queue="a"))
    w.cycle()
    w.submit("head", gpus(4, queue="a")).submit("small", gpus(2, queue="a"))
    w.cycle()
    # small fits the quota on its own (2 + 2 of 4) but not beside the head's 4.
    assert w.placed() == ["a1"]
    assert w.waiting("head").reasons == (
        "queue a uses 2 of its 4 GPUs quota; this job needs 4 (its queue does not borrow)",
    )


def test_other_queues_within_quota_are_not_held_up_by_a_head() -> None:
    w = World.of(node("n1", gpus=4), queues=[queue("a", gpus=4), queue("b", gpus=4)])
    w.submit("a1", gpus(2, queue="a"))
    w.cycle()
    w.submit("a-head", gpus(4, queue="a")).submit("b1", gpus(2, queue="b"))
    w.cycle()
    assert "b1" in w.placed()


def test_positions_count_every_waiting_job_from_one() -> None:
    w = two_nodes()
    for name in ("h", "x", "y"):
        w.submit(name, gpus(4, priority=9))
    w.cycle()
    assert [w.waiting(n).position for n in ("h", "x", "y")] == [1, 2, 3]


def test_alike_jobs_behind_the_head_are_answered_by_what_decides_their_fit() -> None:
    """A long queue of one shape asks the cycle the same question once per job, and one
    alike job's misfit answers the next (queue._Cycle._behind_key): but only as far as
    the answer is the same. Two one-CPU jobs behind a head that fits nowhere, beyond
    their queue's quota: the first was preempted too often to borrow idle capacity, so
    it waits; the second may borrow, and is placed."""
    w = World.of(node("n1", cpu=8), queues=[queue("qa", cpu=2)])
    w.submit("head", job(role(cpu=10), queue="qa"))
    w.submit("reclaimed", job(role(cpu=1), queue="qa"))
    w.submit("fresh", job(role(cpu=1), queue="qa"))
    w.state.preemptions["reclaimed"] = w.state.rules.max_preemptions
    reference = w.state.reference_cycle()
    assert w.cycle() == reference
    assert w.placed() == ["fresh"]
    assert w.waiting("reclaimed").reasons == ("waiting behind job head at the head of the queue",)
