"""Placement invariants over random clusters and random place/release sequences."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.jobspec import JobSpec, PortSpec, Resources, RoleSpec
from trainyard_placement.domain import (
    Placed,
    QueuedJob,
    SchedulerState,
    Waiting,
    gpu_count,
)

GPU_TYPES = [None, "V100", "A100"]
PORT_BASE = 30000


@st.composite
def nodes(draw: st.DrawFn) -> list[NodeSpec]:
    count = draw(st.integers(1, 4))
    result = []
    for i in range(count):
        gpus = draw(st.integers(0, 4))
        width = draw(st.integers(0, 12))  # small ranges, so ports are contended
        result.append(NodeSpec(
            name=f"n{i}", cpu=draw(st.sampled_from([1, 2, 4, 8])),
            memory_mb=draw(st.sampled_from([1024, 4096, 16384])), gpus=gpus,
            gpu_type=draw(st.sampled_from(GPU_TYPES)) if gpus else None,
            port_range=(PORT_BASE, PORT_BASE + width),
        ))  # fmt: skip
    return result


ports = st.lists(
    st.builds(
        PortSpec,
        label=st.sampled_from(["http", "ssh", "nccl"]),
        begin_at=st.one_of(st.just(0), st.integers(PORT_BASE - 2, PORT_BASE + 14)),
        count=st.integers(1, 3),
    ),
    max_size=2,
)

roles = st.builds(
    RoleSpec,
    name=st.sampled_from(["worker", "ps", "chief"]),
    replicas=st.integers(0, 3),
    command=st.just("true"),
    resources=st.builds(
        Resources,
        cpu=st.sampled_from([0.5, 1, 2, 3]),
        memory_mb=st.sampled_from([256, 1024, 4096]),
        gpu=st.sampled_from([0, 0, 0.5, 1, 2]),
        gpu_type=st.sampled_from(GPU_TYPES),
    ),
    ports=ports,
)


def unique_roles(rs: list[RoleSpec]) -> list[RoleSpec]:
    seen: dict[str, RoleSpec] = {}
    for r in rs:
        seen.setdefault(r.name, r)
    return list(seen.values())


jobs = st.builds(
    JobSpec,
    name=st.just("j"),
    priority=st.integers(0, 3),
    roles=st.lists(roles, min_size=1, max_size=3).map(unique_roles),
)

# Each step: submit a job, or release the placed job at a drawn position.
steps = st.lists(
    st.one_of(st.tuples(st.just("submit"), jobs), st.tuples(st.just("release"), st.integers(0, 9))),
    min_size=1,
    max_size=14,
)


def check(state: SchedulerState) -> None:
    spec_of = {n.name: n for n in state.cluster.nodes}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    gpus: dict[str, list[int]] = defaultdict(list)
    milli: Counter[tuple[str, int]] = Counter()  # milli-GPU held per (node, device)
    used_ports: dict[str, list[int]] = defaultdict(list)
    for job_id, allocation in state.placed.items():
        assert job_id not in state.queued
        expected = {(r.name, i) for r in allocation.spec.roles for i in range(r.replicas)}
        assert {(t.role, t.index) for t in allocation.tasks} == expected  # the gang is whole
        assert len(allocation.tasks) == allocation.spec.task_count()
        for task in allocation.tasks:
            role = allocation.spec.role(task.role)
            node = spec_of[task.node]
            assert task.host_ip == node.host_ip
            cpu[task.node] += role.resources.cpu
            mem[task.node] += role.resources.memory_mb
            assert len(task.gpu_indices) == gpu_count(role.resources)
            if task.gpu_indices and role.resources.gpu_type:
                assert node.gpu_type == role.resources.gpu_type
            gpus[task.node] += task.gpu_indices
            for g in task.gpu_indices:
                milli[task.node, g] += task.gpu_milli or 1000
            assert [g.label for g in task.ports] == [p.label for p in role.ports]
            for group, want in zip(task.ports, role.ports, strict=True):
                assert len(group.ports) == want.count
                if want.begin_at:
                    assert group.ports == list(range(want.begin_at, want.begin_at + want.count))
                else:
                    assert all(node.port_range[0] <= p <= node.port_range[1] for p in group.ports)
                used_ports[task.node] += group.ports
    for name, node in spec_of.items():
        assert cpu[name] <= node.cpu + 1e-6
        assert mem[name] <= node.memory_mb
        # No GPU is given twice, except as shares that fit in it together.
        assert all(milli[name, g] <= 1000 for g in set(gpus[name]))
        assert all(0 <= g < node.gpus for g in gpus[name])
        assert len(used_ports[name]) == len(set(used_ports[name]))  # no port given twice
        free = state.snapshot().node(name)
        assert sorted(free.gpus) == sorted(set(range(node.gpus)) - set(gpus[name]))
        assert abs(free.cpu - (node.cpu - cpu[name])) < 1e-6


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_nodes=nodes(), plan=steps)
def test_random_place_and_release_never_overcommits(
    cluster_nodes: list[NodeSpec], plan: list
) -> None:  # type: ignore[type-arg]
    state = SchedulerState(ClusterSpec(nodes=cluster_nodes))
    seq = 0
    for op, arg in plan:
        if op == "submit":
            seq += 1
            state.enqueue(QueuedJob(f"job{seq}", arg, arrival_seq=seq))
        elif state.placed:
            state.release(sorted(state.placed)[arg % len(state.placed)])
        decisions = state.cycle()
        for decision in decisions:
            if isinstance(decision, Placed):
                state.commit(decision.allocation)
        check(state)
        waiting = [d for d in decisions if isinstance(d, Waiting)]
        assert [w.position for w in waiting] == list(range(1, len(waiting) + 1))
        assert all(w.reasons for w in waiting)
        assert {w.job_id for w in waiting} == set(state.queued)
