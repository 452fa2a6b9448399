"""Node selectors, drained nodes and removed nodes."""

from __future__ import annotations

import pytest

from trainyard_common.jobspec import EnvVar
from trainyard_placement.domain.eligible import selector_matches

from .placement_cases import World, gpus, job, node, role


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({}, True),
        ({"zone": "a"}, True),
        ({"zone": "a", "disk": "ssd"}, True),
        ({"zone": "b"}, False),
        ({"zone": "a", "rack": "1"}, False),
    ],
)
def test_selector_needs_every_label(selector: dict[str, str], matches: bool) -> None:
    n = node("n", labels={"zone": "a", "disk": "ssd"})
    pairs = [EnvVar(name=k, value=v) for k, v in selector.items()]
    assert selector_matches(pairs, n) is matches


def test_role_goes_only_to_matching_nodes() -> None:
    w = World.of(node("a", gpus=4), node("b", gpus=4, labels={"disk": "ssd"}))
    w.submit("j", job(role(gpus=1, replicas=2, selector={"disk": "ssd"})))
    w.cycle()
    assert w.nodes_of("j") == {"b"}


def test_roles_with_different_selectors_in_one_gang() -> None:
    w = World.of(node("cpu", labels={"kind": "cpu"}), node("gpu", gpus=2, labels={"kind": "gpu"}))
    spec = job(
        role("ps", cpu=2, selector={"kind": "cpu"}),
        role("worker", gpus=1, replicas=2, selector={"kind": "gpu"}),
    )
    w.submit("j", spec)
    w.cycle()
    tasks = w.state.placed["j"].tasks
    assert [(t.role, t.index, t.node) for t in tasks] == [
        ("ps", 0, "cpu"),
        ("worker", 0, "gpu"),
        ("worker", 1, "gpu"),
    ]


def test_gang_is_whole_or_absent_across_selector_groups() -> None:
    w = World.of(node("cpu", labels={"kind": "cpu"}), node("gpu", gpus=1, labels={"kind": "gpu"}))
    spec = job(
        role("ps", selector={"kind": "cpu"}),
        role("worker", gpus=1, replicas=2, selector={"kind": "gpu"}),
    )
    w.submit("j", spec)
    w.cycle()
    assert w.placed() == []
    assert any("no node has 1 free GPU" in r for r in w.waiting("j").reasons)


def test_no_matching_node_is_explained() -> None:
    w = World.of(node("a"))
    w.submit("j", job(role(selector={"zone": "mars"})))
    w.cycle()
    assert w.waiting("j").reasons == ("role worker: no node matches its node selector zone=mars",)


def test_drained_node_keeps_its_jobs_and_takes_no_new_ones() -> None:
    w = World.of(node("a", gpus=2), node("b", gpus=2))
    w.submit("old", gpus(1))
    w.cycle()
    [where] = w.nodes_of("old")
    w.state.drain_node(where)
    w.submit("new", gpus(1))
    w.cycle()
    assert "old" in w.placed() and where not in w.nodes_of("new")
    w.submit("big", gpus(2))
    w.cycle()
    assert "big" not in w.placed()  # the drained node's free GPU does not count
    w.state.undrain_node(where)
    w.state.release("new")
    w.cycle()
    assert "big" in w.placed()


def test_every_node_drained() -> None:
    w = World.of(node("a"))
    w.state.drain_node("a")
    w.submit("j", job())
    w.cycle()
    assert w.waiting("j").reasons == ("role worker: no node is left that is not drained",)


def test_removed_node_names_its_jobs_and_its_capacity_is_gone() -> None:
    w = World.of(node("a", gpus=2), node("b", gpus=2))
    w.submit("x", gpus(2)).submit("y", gpus(2))
    w.cycle()
    [on_a] = [j for j in ("x", "y") if w.nodes_of(j) == {"a"}]
    assert w.state.remove_node("a") == [on_a]
    assert [n.name for n in w.state.cluster.nodes] == ["b"]
    w.state.release(on_a)
    w.submit("z", gpus(2))
    w.cycle()
    assert "z" not in w.placed()


def test_added_node_is_used() -> None:
    w = World.of(node("a", gpus=1))
    w.submit("j", gpus(2))
    w.cycle()
    assert w.placed() == []
    w.state.add_node(node("b", gpus=2))
    with pytest.raises(ValueError, match="already exists"):
        w.state.add_node(node("b", gpus=2))
    w.cycle()
    assert w.nodes_of("j") == {"b"}


def test_unknown_node_cannot_be_drained() -> None:
    w = World.of(node("a"))
    with pytest.raises(KeyError):
        w.state.drain_node("nope")
