"""Node administration over the handlers, the in-memory stores and a collecting
publisher: add, drain, undrain, remove, and a restart that rebuilds the same cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from trainyard_common.bus import Delivery
from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import (
    Event,
    InterruptCause,
    InterruptJob,
    JobAccepted,
    JobInterrupted,
    JobPlaced,
    derived_id,
)
from trainyard_common.jobspec import EnvVar, JobSpec, Resources, RoleSpec
from trainyard_placement.adapters.nodes import MemoryNodeStore, NodeRecord
from trainyard_placement.adapters.store import MemoryJobStore
from trainyard_placement.handlers import Deps, handle, load, start
from trainyard_placement.node_admin import NodeAdmin, NodeError

CLUSTER = ClusterSpec(nodes=[
    NodeSpec(name="n1", host_ip="10.0.0.1", cpu=8, memory_mb=16384, gpus=2, gpu_type="V100",
             labels=[EnvVar(name="zone", value="a")]),
    NodeSpec(name="n2", host_ip="10.0.0.2", cpu=8, memory_mb=16384, gpus=2, gpu_type="V100"),
])  # fmt: skip


@dataclass
class ListPublisher:
    events: list[Event] = field(default_factory=list)
    fail_next: bool = False

    async def publish(self, event: Event) -> int:
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("bus unavailable")
        self.events.append(event)
        return len(self.events)

    def of(self, kind: type[Event], job_id: str | None = None) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind) and job_id in (None, e.job_id)]


def spec(gpus: int = 2) -> JobSpec:
    return JobSpec(name="train", roles=[RoleSpec(
        name="worker", command="true", resources=Resources(cpu=1, memory_mb=1024, gpu=gpus,
                                                           gpu_type="V100"))])  # fmt: skip


class Harness:
    def __init__(self) -> None:
        self.jobs = MemoryJobStore()
        self.nodes = MemoryNodeStore()
        self.pub = ListPublisher()
        self.seq = 0
        self.deps: Deps
        self.admin: NodeAdmin

    async def boot(self) -> Harness:
        """Start (or restart) the service over what the stores hold."""
        self.deps = await load(self.jobs, self.pub, CLUSTER)
        self.admin = NodeAdmin(self.deps, self.nodes)
        await self.admin.restore()
        await start(self.deps)
        return self

    async def send(self, event: Event) -> None:
        self.seq += 1
        await handle(event, Delivery(stream_seq=self.seq, num_delivered=1, subject="x"), self.deps)

    async def accept(self, job_id: str, gpus: int = 2) -> None:
        await self.send(JobAccepted(event_id=f"acc-{job_id}", job_id=job_id, spec=spec(gpus)))

    def node_of(self, job_id: str) -> str:
        (placed, *_) = reversed(self.pub.of(JobPlaced, job_id))
        return placed.tasks[0].node  # type: ignore[attr-defined]

    def view(self) -> dict[str, dict]:
        return {node["name"]: node for node in self.admin.view()}


@pytest.fixture
async def h() -> Harness:
    return await Harness().boot()


async def test_the_view_shows_capacity_allocated_free_state_and_labels(h: Harness) -> None:
    await h.accept("a", gpus=1)
    view = h.view()
    assert list(view) == ["n1", "n2"]
    n1 = view["n1"]
    assert (n1["state"], n1["labels"], n1["jobs"]) == ("ready", {"zone": "a"}, ["a"])
    assert n1["capacity"] == {"cpu": 8, "memory_mb": 16384, "gpus": 2}
    assert n1["allocated"] == {"cpu": 1, "memory_mb": 1024, "gpus": 1}
    assert n1["free"] == {"cpu": 7, "memory_mb": 15360, "gpus": 1, "whole_gpus": 1}
    assert view["n2"]["free"]["gpus"] == 2 and view["n2"]["jobs"] == []


async def test_a_drained_node_takes_nothing_new_until_undrained(h: Harness) -> None:
    await h.accept("a")
    assert h.node_of("a") == "n1"
    await h.admin.drain("n2")
    await h.accept("b")
    assert not h.pub.of(JobPlaced, "b")
    view = h.view()
    assert (view["n1"]["state"], view["n2"]["state"]) == ("ready", "drained")
    # Drained, not gone: what runs there still counts.
    await h.admin.drain("n1")
    assert h.view()["n1"]["allocated"]["gpus"] == 2
    await h.admin.undrain("n2")
    assert h.node_of("b") == "n2"
    with pytest.raises(NodeError) as missing:
        await h.admin.drain("n9")
    assert missing.value.status == 404


async def test_an_added_node_places_a_waiting_job_and_names_are_unique(h: Harness) -> None:
    await h.accept("a")
    await h.accept("b")
    await h.accept("c")
    assert not h.pub.of(JobPlaced, "c")
    added = await h.admin.add(NodeSpec(name="n3", cpu=4, memory_mb=8192, gpus=2, gpu_type="V100"))
    assert added["name"] == "n3" and added["jobs"] == ["c"]
    assert h.node_of("c") == "n3"
    with pytest.raises(NodeError) as taken:
        await h.admin.add(NodeSpec(name="n1", cpu=1, memory_mb=1))
    assert taken.value.status == 409 and "name: node n1 already exists" in str(taken.value)


async def test_removing_a_node_interrupts_its_jobs_and_they_run_again_elsewhere(
    h: Harness,
) -> None:
    await h.accept("a")
    assert h.node_of("a") == "n1"
    answer = await h.admin.remove("n1")
    assert answer == {"name": "n1", "state": "removed", "interrupted": ["a"]}
    (interrupt,) = h.pub.of(InterruptJob, "a")
    assert isinstance(interrupt, InterruptJob)
    assert interrupt.event_id == derived_id("a", 1, "interrupt", "node_removed")
    assert (interrupt.attempt, interrupt.cause) == (1, InterruptCause.NODE_REMOVED)
    assert h.jobs.docs["a"]["state"] == "interrupting"
    assert list(h.view()) == ["n2"]
    # The name is taken while the interrupted job still holds the removed node.
    with pytest.raises(NodeError) as held:
        await h.admin.add(NodeSpec(name="n1", cpu=1, memory_mb=1))
    assert held.value.status == 409 and "a" in str(held.value)

    # The launcher ended the attempt: the job runs again on what is left.
    await h.send(
        JobInterrupted(
            event_id=derived_id("a", 1, "interrupted"),
            job_id="a",
            attempt=1,
            cause=InterruptCause.NODE_REMOVED,
            reason=interrupt.reason,
        )
    )
    placed = h.pub.of(JobPlaced, "a")
    assert [p.attempt for p in placed] == [1, 2]  # type: ignore[attr-defined]
    assert h.node_of("a") == "n2"


async def test_a_restart_rebuilds_the_same_nodes(h: Harness) -> None:
    await h.accept("a")
    await h.admin.add(NodeSpec(name="n3", cpu=4, memory_mb=8192, gpus=1, gpu_type="V100"))
    await h.admin.add(NodeSpec(name="n4", cpu=4, memory_mb=8192))
    await h.admin.drain("n2")
    await h.admin.drain("n3")
    await h.admin.undrain("n3")
    await h.admin.remove("n4")
    before = h.view()
    events = len(h.pub.events)

    await h.boot()
    assert h.view() == before
    assert [n.name for n in h.deps.state.cluster.nodes] == ["n1", "n2", "n3"]
    assert h.deps.state.drained == {"n2"}
    assert len(h.pub.events) == events  # nothing to announce again


async def test_a_removal_stored_but_not_announced_is_announced_after_a_restart(
    h: Harness,
) -> None:
    await h.accept("a")
    # The process died right after storing the removal.
    await h.nodes.put(NodeRecord("n1", "removed"))
    await h.boot()
    (interrupt,) = h.pub.of(InterruptJob, "a")
    assert interrupt.event_id == derived_id("a", 1, "interrupt", "node_removed")
    assert list(h.view()) == ["n2"]
    assert h.jobs.docs["a"]["state"] == "interrupting"
    # Until the launcher answers, every restart says it again, under the same id (which
    # JetStream drops as a duplicate).
    await h.boot()
    again = [e.event_id for e in h.pub.of(InterruptJob, "a")]
    assert len(again) >= 2 and set(again) == {interrupt.event_id}


async def test_removing_again_resends_an_interrupt_the_bus_lost(h: Harness) -> None:
    await h.accept("a")
    h.pub.fail_next = True
    with pytest.raises(ConnectionError):
        await h.admin.remove("n1")
    assert h.jobs.docs["a"]["state"] == "interrupting" and not h.pub.of(InterruptJob)
    answer = await h.admin.remove("n1")
    assert answer == {"name": "n1", "state": "removed", "interrupted": ["a"]}
    (interrupt,) = h.pub.of(InterruptJob, "a")
    assert interrupt.event_id == derived_id("a", 1, "interrupt", "node_removed")
    with pytest.raises(NodeError) as missing:
        await h.admin.remove("n7")
    assert missing.value.status == 404


async def test_a_configured_node_removed_and_added_again_comes_back_as_added(
    h: Harness,
) -> None:
    await h.admin.remove("n1")
    await h.admin.add(NodeSpec(name="n1", cpu=2, memory_mb=2048))
    before = h.view()
    assert list(before) == ["n2", "n1"] and before["n1"]["capacity"]["cpu"] == 2
    await h.boot()
    assert h.view() == before


async def test_a_record_for_a_node_the_cluster_file_lost_is_ignored(h: Harness) -> None:
    await h.nodes.put(NodeRecord("gone", "drained"))
    await h.boot()
    assert [n.name for n in h.deps.state.cluster.nodes] == ["n1", "n2"]
