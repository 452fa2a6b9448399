"""Gang placement and the queue cycle: table tests over small fluent builders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import pytest

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, PortSpec, Resources, RoleSpec
from trainyard_placement.domain import (
    Allocation,
    Placed,
    Plan,
    QueuedJob,
    SchedulerState,
    Snapshot,
    Unschedulable,
    Waiting,
    place_gang,
    schedule,
)

# --- builders ----------------------------------------------------------------------------


@dataclass
class NodeBuilder:
    name: str
    _cpu: float = 8
    _memory_mb: int = 32768
    _gpus: int = 0
    _gpu_type: str | None = None
    _ports: tuple[int, int] = (20000, 40000)

    def cpu(self, n: float) -> Self:
        self._cpu = n
        return self

    def mem(self, mb: int) -> Self:
        self._memory_mb = mb
        return self

    def gpus(self, n: int, gpu_type: str | None = None) -> Self:
        self._gpus, self._gpu_type = n, gpu_type
        return self

    def ports(self, lo: int, hi: int) -> Self:
        self._ports = (lo, hi)
        return self

    def build(self) -> NodeSpec:
        return NodeSpec(
            name=self.name, host_ip=f"10.0.0.{sum(map(ord, self.name)) % 250}", cpu=self._cpu,
            memory_mb=self._memory_mb, gpus=self._gpus, gpu_type=self._gpu_type,
            port_range=self._ports,
        )  # fmt: skip


@dataclass
class RoleBuilder:
    name: str
    replicas: int = 1
    resources: dict[str, object] = field(default_factory=lambda: {"cpu": 1, "memory_mb": 1024})
    port_specs: list[PortSpec] = field(default_factory=list)

    def cpu(self, n: float) -> Self:
        self.resources["cpu"] = n
        return self

    def mem(self, mb: int) -> Self:
        self.resources["memory_mb"] = mb
        return self

    def gpus(self, n: float, gpu_type: str | None = None) -> Self:
        self.resources["gpu"], self.resources["gpu_type"] = n, gpu_type
        return self

    def port(self, label: str, count: int = 1) -> Self:
        self.port_specs.append(PortSpec(label=label, count=count))
        return self

    def fixed_port(self, label: str, begin_at: int, count: int = 1) -> Self:
        self.port_specs.append(PortSpec(label=label, begin_at=begin_at, count=count))
        return self

    def build(self) -> RoleSpec:
        return RoleSpec(
            name=self.name, replicas=self.replicas, command="true",
            resources=Resources.model_validate(self.resources), ports=self.port_specs,
        )  # fmt: skip


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def role(name: str, replicas: int = 1) -> RoleBuilder:
    return RoleBuilder(name, replicas)


def job(*roles: RoleBuilder, priority: int = 5, name: str = "job") -> JobSpec:
    return JobSpec(name=name, priority=priority, roles=[r.build() for r in roles])


def cluster(*nodes: NodeBuilder) -> ClusterSpec:
    return ClusterSpec(nodes=[n.build() for n in nodes])


def snap(c: ClusterSpec, *allocations: Allocation) -> Snapshot:
    return Snapshot.of(c, allocations)


def where(plan: Plan | Unschedulable) -> list[str]:
    assert isinstance(plan, Plan), plan
    return [t.node for t in plan.tasks]


def reasons(outcome: Plan | Unschedulable) -> str:
    assert isinstance(outcome, Unschedulable), outcome
    return "\n".join(outcome.reasons)


def occupy(c: ClusterSpec, job_id: str, spec: JobSpec) -> Allocation:
    plan = place_gang(spec, snap(c), job_id=job_id)
    assert isinstance(plan, Plan)
    return Allocation(job_id, spec, plan.tasks)


# --- placement table -----------------------------------------------------------------------

FOUR_GPU_NODES = cluster(
    node("a").gpus(4, "V100"), node("b").gpus(4, "V100"), node("c").gpus(4, "V100")
)
MIXED = cluster(node("v").gpus(4, "V100"), node("x").gpus(4, "A100"))


@pytest.mark.parametrize(
    ("spec", "c", "expected"),
    [
        pytest.param(
            job(role("w", 4).gpus(1, "V100")), FOUR_GPU_NODES, ["a"] * 4, id="pack-one-node"
        ),
        pytest.param(
            job(role("w", 2).gpus(3)), FOUR_GPU_NODES, ["a", "b"], id="one-task-per-node-when-big"
        ),
        pytest.param(
            job(role("w", 6).gpus(1)), FOUR_GPU_NODES, ["a"] * 4 + ["b"] * 2, id="spill-to-next"
        ),
        pytest.param(job(role("w", 2).gpus(1, "A100")), MIXED, ["x", "x"], id="gpu-type"),
        pytest.param(job(role("w").gpus(1, "a100")), MIXED, ["x"], id="gpu-type-any-case"),
        pytest.param(job(role("w", 2).gpus(2)), MIXED, ["v", "v"], id="any-type"),
        pytest.param(
            job(role("w").gpus(0.5)),
            cluster(node("a").gpus(1, "T4")),
            ["a"],
            id="fraction-is-one-gpu",
        ),
        pytest.param(
            job(role("w", 2).cpu(4)),
            cluster(node("a").cpu(6), node("b").cpu(6)),
            ["a", "b"],
            id="cpu",
        ),
        pytest.param(
            job(role("w", 2).mem(3000)),
            cluster(node("a").mem(4000), node("b").mem(8000)),
            ["a", "b"],
            id="memory",
        ),
        pytest.param(
            job(role("w", 3).cpu(0.1)), cluster(node("a").cpu(0.3)), ["a"] * 3, id="float-cpu"
        ),
        pytest.param(job(role("cpu-only", 2)), MIXED, ["v", "v"], id="no-gpu-on-gpu-node"),
    ],
)
def test_places(spec: JobSpec, c: ClusterSpec, expected: list[str]) -> None:
    assert where(place_gang(spec, snap(c), job_id="j")) == expected


@pytest.mark.parametrize(
    ("spec", "c", "expected"),
    [
        pytest.param(
            job(role("worker", 2).gpus(2, "V100")),
            cluster(node("node-a").gpus(3, "V100")),
            "role worker task 1: no node has 2 free GPUs of type V100 (largest free: node-a 1 GPU V100)",
            id="gpu-free",
        ),
        pytest.param(
            job(role("w").gpus(3)),
            cluster(node("a").gpus(2, "V100"), node("b").gpus(2, "V100")),
            "role w task 0: no node has 3 GPUs; the largest has 2 GPUs in total (a)",
            id="gpus-of-a-task-on-one-node",
        ),
        pytest.param(
            job(role("w").gpus(1, "H100")),
            MIXED,
            "role w task 0: no node has 1 GPU of type H100 (the cluster has no H100 GPUs)",
            id="no-such-gpu-type",
        ),
        pytest.param(
            job(role("w").cpu(4)),
            cluster(node("a").cpu(2), node("b").cpu(1)),
            "role w task 0: needs 4 CPU, the largest node has 2 CPU in total",
            id="cpu-never",
        ),
        pytest.param(
            job(role("w", 2).cpu(3)),
            cluster(node("a").cpu(4), node("b").cpu(2)),
            "role w task 1: needs 3 CPU, most free on any node is 2 (b)",
            id="cpu-now",
        ),
        pytest.param(
            job(role("w").mem(9000)),
            cluster(node("a").mem(8192)),
            "role w task 0: needs 9000 MB memory, the largest node has 8192 MB memory in total",
            id="memory",
        ),
        pytest.param(
            job(role("w", 2).fixed_port("http", 8080)),
            cluster(node("a")),
            "role w task 1: port 8080 (label http) is taken on every node",
            id="fixed-port-once-per-node",
        ),
        pytest.param(
            job(role("w", 3).port("p", 2)),
            cluster(node("a").ports(30000, 30003)),
            "role w task 2: needs 2 free ports from a node's port range, most free on any node is 0 (a)",
            id="dynamic-ports-exhausted",
        ),
        pytest.param(
            job(role("w").fixed_port("a", 8080, 2).fixed_port("b", 8081)),
            cluster(node("a")),
            "role w task 0: its fixed port ranges overlap each other",
            id="overlapping-fixed-ports",
        ),
        pytest.param(
            job(role("w", 2).gpus(1, "V100").fixed_port("ssh", 2222)),
            MIXED,
            "role w task 1: no single node has 1 CPU, 1024 MB memory, 1 GPU of type V100 and 1 port "
            "free at once (v: port 2222 (label ssh) taken; x: GPU type A100)",
            id="no-single-node",
        ),
        pytest.param(
            job(role("w")), ClusterSpec(nodes=[]), "the cluster has no nodes", id="empty-cluster"
        ),
    ],
)
def test_reasons(spec: JobSpec, c: ClusterSpec, expected: str) -> None:
    assert expected in reasons(place_gang(spec, snap(c), job_id="j"))


def test_gang_is_all_or_nothing() -> None:
    c = cluster(node("a").gpus(4), node("b").gpus(4))
    outcome = place_gang(job(role("w", 3).gpus(3)), snap(c), job_id="j")
    text = reasons(outcome)
    assert text.startswith("only 2 of 3 tasks fit at once")
    assert "role w task 2: no node has 3 free GPUs" in text


def test_stays_on_current_node_and_fills_partly_used_first() -> None:
    c = cluster(node("a").gpus(4), node("b").gpus(4), node("c").gpus(4))
    held = occupy(c, "old", job(role("w", 3).gpus(1)))
    assert where(place_gang(job(role("w", 3).gpus(1)), snap(c, held), job_id="j")) == [
        "a",
        "b",
        "b",
    ]


def test_gpu_indices_are_free_ones_and_distinct() -> None:
    c = cluster(node("a").gpus(4, "V100"))
    held = occupy(c, "old", job(role("w").gpus(1)))
    plan = place_gang(job(role("w", 3).gpus(1)), snap(c, held), job_id="j")
    assert isinstance(plan, Plan)
    assert held.tasks[0].gpu_indices == [0]
    assert [t.gpu_indices for t in plan.tasks] == [[1], [2], [3]]


def test_result_is_in_role_order_though_larger_tasks_are_fitted_first() -> None:
    c = cluster(node("a").cpu(4).gpus(2), node("b").cpu(4).gpus(2))
    plan = place_gang(job(role("ps").cpu(3), role("worker", 2).gpus(2)), snap(c), job_id="j")
    assert isinstance(plan, Plan)
    assert [(t.role, t.index, t.node) for t in plan.tasks] == [
        ("ps", 0, "b"), ("worker", 0, "a"), ("worker", 1, "b"),
    ]  # fmt: skip
    assert plan.tasks[1].host_ip == c.nodes[0].host_ip


def test_fixed_ports() -> None:
    c = cluster(node("a"), node("b"))
    spec = job(role("w", 2).fixed_port("http", 8080, count=2))
    plan = place_gang(spec, snap(c), job_id="j")
    assert isinstance(plan, Plan)
    assert [(t.node, t.ports[0].label, t.ports[0].ports) for t in plan.tasks] == [
        ("a", "http", [8080, 8081]), ("b", "http", [8080, 8081]),
    ]  # fmt: skip
    # Held by a placed job: a third task of another job with the same fixed port fits nowhere.
    held = Allocation("j", spec, plan.tasks)
    assert "port" in reasons(
        place_gang(job(role("w").fixed_port("x", 8081)), snap(c, held), job_id="k")
    )


def test_dynamic_ports_in_range_distinct_seeded_and_spread() -> None:
    c = cluster(node("a").ports(30000, 30999))
    spec = job(role("w", 4).port("http", 3).port("ssh"))
    first = place_gang(spec, snap(c), job_id="job-1")
    again = place_gang(spec, snap(c), job_id="job-1")
    other = place_gang(spec, snap(c), job_id="job-2")
    assert isinstance(first, Plan) and isinstance(other, Plan)
    assert first == again
    ports = [p for t in first.tasks for g in t.ports for p in g.ports]
    assert len(ports) == 16 == len(set(ports))
    assert all(30000 <= p <= 30999 for p in ports)
    assert [len(g.ports) for g in first.tasks[0].ports] == [3, 1]
    assert ports != [p for t in other.tasks for g in t.ports for p in g.ports]
    # Spread, not lowest-first: a stale process on 30000 would otherwise collide every time.
    assert sorted(ports) != list(range(30000, 30016))


def test_dynamic_ports_avoid_held_ports_and_the_jobs_fixed_ports() -> None:
    c = cluster(node("a").ports(30000, 30004))
    held = occupy(c, "old", job(role("w").fixed_port("p", 30001, 2)))
    spec = job(role("dyn").port("p", 2), role("fixed").fixed_port("f", 30000))
    plan = place_gang(spec, snap(c, held), job_id="j")
    assert isinstance(plan, Plan)
    # 30000 is the job's own fixed port, 30001-30002 are held: only two are left.
    assert plan.tasks[0].ports[0].ports == [30003, 30004]
    assert plan.tasks[1].ports[0].ports == [30000]


def test_snapshot_is_derived_from_allocations() -> None:
    c = cluster(node("a").cpu(8).mem(8000).gpus(4, "V100"))
    held = occupy(c, "old", job(role("w", 2).cpu(3).mem(1000).gpus(1).port("p")))
    a = snap(c, held).node("a")
    assert (a.cpu, a.memory_mb, a.gpus, len(a.ports_taken)) == (2, 6000, (2, 3), 2)
    state = SchedulerState(c, placed={"old": held})
    assert state.release("old") == held
    assert state.snapshot().node("a") == snap(c).node("a")


# --- the queue cycle ------------------------------------------------------------------------


def queued(job_id: str, spec: JobSpec, seq: int) -> QueuedJob:
    return QueuedJob(job_id, spec, arrival_seq=seq)


def test_schedule_orders_by_priority_then_arrival() -> None:
    c = cluster(node("a").gpus(2))
    decisions = schedule(
        [
            queued("early", job(role("w").gpus(2)), 1),
            queued("urgent", job(role("w").gpus(2), priority=9), 5),
            queued("late", job(role("w").gpus(2)), 3),
        ],
        snap(c),
    )
    assert [type(d).__name__ + ":" + d.job_id for d in decisions] == [
        "Placed:urgent", "Waiting:early", "Waiting:late",
    ]  # fmt: skip
    early, late = decisions[1], decisions[2]
    assert isinstance(early, Waiting) and isinstance(late, Waiting)
    assert early.position == 1 and "no node has 2 free GPUs" in early.reasons[0]
    assert late.position == 2
    assert late.reasons == ("waiting behind job early at the head of the queue",)


def test_schedule_is_strict_fifo_a_small_job_does_not_overtake_the_head() -> None:
    c = cluster(node("a").gpus(2))
    held = occupy(c, "running", job(role("w").gpus(1)))
    decisions = schedule(
        [queued("big", job(role("w").gpus(2)), 1), queued("small", job(role("w").gpus(1)), 2)],
        snap(c, held),
    )
    assert all(isinstance(d, Waiting) for d in decisions)


def test_schedule_counts_capacity_placed_earlier_in_the_same_cycle() -> None:
    c = cluster(node("a").gpus(3))
    decisions = schedule([queued(f"j{i}", job(role("w").gpus(1)), i) for i in range(4)], snap(c))
    placed = [d for d in decisions if isinstance(d, Placed)]
    assert [d.job_id for d in placed] == ["j0", "j1", "j2"]
    gpus = [g for d in placed for t in d.allocation.tasks for g in t.gpu_indices]
    assert sorted(gpus) == [0, 1, 2]
    assert isinstance(decisions[3], Waiting)


def test_release_lets_the_next_cycle_place_the_waiting_job() -> None:
    state = SchedulerState(cluster(node("a").gpus(2)))
    state.enqueue(queued("first", job(role("w").gpus(2)), 1))
    state.enqueue(queued("second", job(role("w").gpus(2)), 2))
    for decision in state.cycle():
        if isinstance(decision, Placed):
            state.commit(decision.allocation)
    assert list(state.placed) == ["first"] and list(state.queued) == ["second"]
    state.release("first")
    (decision,) = state.cycle()
    assert isinstance(decision, Placed) and decision.job_id == "second"


def test_task_placement_roundtrips_for_the_store() -> None:
    t = TaskPlacement(role="w", index=0, node="a", host_ip="1.2.3.4", gpu_indices=[1])
    assert TaskPlacement.model_validate(t.model_dump(mode="json")) == t
