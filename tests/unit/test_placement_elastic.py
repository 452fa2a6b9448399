"""Elastic roles: placed at the most replicas that fit up to the size asked, at least the
minimum, as one gang; ``growth`` says when a placed one could grow toward its maximum."""

from __future__ import annotations

import pytest

from trainyard_placement.domain import growth
from trainyard_placement.domain.sizes import at_step, last_step, sized_to

from .placement_cases import World, gpus, job, node, queue, role


def elastic(replicas: int = 4, low: int = 1, high: int = 4, **kw: object):  # type: ignore[no-untyped-def]
    return job(role(gpus=1, replicas=replicas, min_replicas=low, max_replicas=high), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("free_gpus", "replicas", "placed"),
    [
        (8, 4, 4),  # room for all it asks
        (3, 4, 3),  # fewer fit: as many as fit
        (1, 4, 1),  # down to its minimum
        (8, 2, 2),  # never more than asked (a ScaleJob sets what is asked)
    ],
)
def test_placed_at_the_most_that_fit(free_gpus: int, replicas: int, placed: int) -> None:
    w = World.of(node("n", gpus=free_gpus))
    w.submit("e", elastic(replicas=replicas))
    w.cycle()
    allocation = w.state.placed["e"]
    assert len(allocation.tasks) == placed
    # The placed spec says the size it runs at (the launcher reads it).
    assert allocation.spec.roles[0].replicas == placed


def test_below_the_minimum_it_waits() -> None:
    w = World.of(node("n", gpus=1))
    w.submit("e", elastic(low=2))
    w.cycle()
    assert w.placed() == []
    assert any("only 1 of 2 tasks fit" in r for r in w.waiting("e").reasons)


def test_fixed_roles_keep_their_size() -> None:
    spec = job(role("ps"), role("worker", gpus=1, replicas=3, min_replicas=1, max_replicas=3))
    assert last_step(spec) == 2
    assert [r.replicas for r in at_step(spec, 1).roles] == [1, 2]
    assert [r.replicas for r in at_step(spec, 9).roles] == [1, 1]


def test_elastic_size_counts_against_the_quota() -> None:
    w = World.of(node("n", gpus=8), queues=[queue("a", gpus=3, borrowing=False)])
    w.submit("e", elastic(queue="a"))
    w.cycle()
    assert len(w.state.placed["e"].tasks) == 3


def test_stored_allocation_is_sized_from_its_tasks() -> None:
    w = World.of(node("n", gpus=2))
    w.submit("e", elastic())
    w.cycle()
    tasks = w.state.placed["e"].tasks
    assert sized_to(elastic(), tasks).roles[0].replicas == 2


def test_growth_when_capacity_frees_and_nobody_waits() -> None:
    w = World.of(node("n", gpus=4))
    w.submit("blocker", gpus(2)).submit("e", elastic(replicas=4))
    w.cycle()
    assert len(w.state.placed["e"].tasks) == 2
    assert growth(w.state) == []  # no room
    w.state.release("blocker")
    assert growth(w.state) == [("e", "worker", 4)]


def test_growth_up_to_the_maximum_even_beyond_the_size_asked() -> None:
    w = World.of(node("n", gpus=8))
    w.submit("e", elastic(replicas=2, high=6))
    w.cycle()
    assert growth(w.state) == [("e", "worker", 6)]


def test_no_growth_while_a_job_waits_for_capacity() -> None:
    w = World.of(node("n", gpus=4))
    w.submit("blocker", gpus(3)).submit("e", elastic(replicas=1))
    w.cycle()
    w.submit("waiter", gpus(4))
    w.cycle()
    w.state.release("blocker")
    # Waiter comes first: the next cycle gives it the GPUs, not e's growth.
    assert growth(w.state) == []


def test_a_job_blocked_only_by_another_queues_quota_does_not_stop_growth() -> None:
    w = World.of(node("n", gpus=8), queues=[queue("a", gpus=1, borrowing=False), "b"])
    w.submit("a1", gpus(1, queue="a")).submit("a2", gpus(1, queue="a"))
    w.submit("e", elastic(replicas=1, queue="b"))
    w.cycle()
    assert "a2" not in w.placed()
    assert growth(w.state) == [("e", "worker", 4)]


def test_growth_respects_the_jobs_own_quota() -> None:
    w = World.of(node("n", gpus=8), queues=[queue("a", gpus=2, borrowing=False)])
    w.submit("e", elastic(replicas=1, queue="a"))
    w.cycle()
    assert growth(w.state) == [("e", "worker", 2)]
