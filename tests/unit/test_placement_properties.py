"""Placement invariants over random clusters and random sequences of events: place and
release; and queues with quotas, preemption, backfill, node changes and elastic roles."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.cluster import ClusterSpec, NodeSpec, QueueSpec
from trainyard_common.jobspec import EnvVar, JobSpec, PortSpec, Resources, RoleSpec
from trainyard_placement.domain import (
    Decision,
    Placed,
    Preempt,
    QueuedJob,
    Rules,
    SchedulerState,
    Waiting,
    gpu_count,
)
from trainyard_placement.domain.gpu_share import gpu_request

from .placement_cases import cycle_and_apply, queue_specs

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
        gpu_types=st.lists(st.sampled_from(["V100", "a100", "H100"]), max_size=2),
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
            if task.gpu_indices and (allowed := role.resources.allowed_gpu_types()):
                assert node.gpu_type and node.gpu_type.lower() in {m.lower() for m in allowed}
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


# --- queues, preemption, backfill, node states and elastic roles ------------------------

QUEUE_NAMES = ["qa", "qb", "qc"]


@st.composite
def labelled_nodes(draw: st.DrawFn) -> list[NodeSpec]:
    return [
        n.model_copy(update={"labels": [EnvVar(name="zone", value=draw(st.sampled_from("ab")))]})
        for n in draw(nodes())
    ]


@st.composite
def world_jobs(draw: st.DrawFn) -> JobSpec:
    rs = []
    for name in draw(
        st.lists(st.sampled_from(["worker", "ps"]), min_size=1, max_size=2, unique=True)
    ):
        replicas = draw(st.integers(1, 3))
        elastic = draw(st.booleans())
        rs.append(RoleSpec(
            name=name, replicas=replicas, command="true",
            min_replicas=draw(st.integers(1, replicas)) if elastic else None,
            max_replicas=replicas + draw(st.integers(0, 2)) if elastic else None,
            resources=Resources(cpu=draw(st.sampled_from([0.5, 1, 2])),
                                memory_mb=draw(st.sampled_from([256, 1024])),
                                gpu=draw(st.sampled_from([0, 0.5, 1, 2]))),
            node_selector=draw(st.sampled_from([[], [EnvVar(name="zone", value="a")]])),
            ports=draw(st.one_of(st.just([]), st.just([]), ports)),
        ))  # fmt: skip
    return JobSpec(
        name="j",
        queue=draw(st.sampled_from(QUEUE_NAMES)),
        priority=draw(st.integers(1, 9)),
        roles=rs,
    )


world_steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), world_jobs()),
        st.tuples(
            st.sampled_from(["end", "interrupted", "drain", "undrain", "remove", "add"]),
            st.integers(0, 9),
        ),
    ),
    min_size=1,
    max_size=16,
)


def check_world(state: SchedulerState, decisions: list[Decision]) -> None:
    nodes_now = {n.name: n for n in state.cluster.nodes}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    milli: Counter[tuple[str, int]] = Counter()
    used_ports: dict[str, list[int]] = defaultdict(list)
    for job_id, allocation in state.placed.items():
        assert job_id not in state.queued  # never both waiting and holding capacity
        spec = allocation.spec
        # The gang is whole at the size it was placed, within its elastic bounds.
        expected = {(r.name, i) for r in spec.roles for i in range(r.replicas)}
        assert sorted((t.role, t.index) for t in allocation.tasks) == sorted(expected)
        for r in spec.roles:
            if r.min_replicas is not None and r.max_replicas is not None:
                assert min(r.min_replicas, r.max_replicas) <= r.replicas <= r.max_replicas
        for task in allocation.tasks:
            if task.node not in nodes_now:
                continue  # a removed node: its capacity is gone, the job is on its way out
            role = spec.role(task.role)
            cpu[task.node] += role.resources.cpu
            mem[task.node] += role.resources.memory_mb
            for g in task.gpu_indices:
                milli[task.node, g] += task.gpu_milli or 1000
            used_ports[task.node] += [p for group in task.ports for p in group.ports]
    for name, n in nodes_now.items():
        assert cpu[name] <= n.cpu + 1e-6
        assert mem[name] <= n.memory_mb
        assert all(m <= 1000 and 0 <= g < n.gpus for (nn, g), m in milli.items() if nn == name)
        assert len(used_ports[name]) == len(set(used_ports[name]))
    # Quota is never exceeded in a queue that does not borrow.
    for q in state.cluster.queues:
        if isinstance(q, str) or q.borrowing:
            continue
        held = [a.spec for a in state.placed.values() if a.spec.queue == q.name]
        gpus = sum(r.replicas * gpu_milli_of(r.resources.gpu) for s in held for r in s.roles)
        cpus = sum(r.replicas * r.resources.cpu for s in held for r in s.roles)
        if q.quota.gpus is not None:
            assert gpus <= q.quota.gpus * 1000
        if q.quota.cpu is not None:
            assert cpus <= q.quota.cpu + 1e-6
    # New placements avoid drained nodes and honour node selectors.
    for d in decisions:
        if isinstance(d, Placed):
            for task in d.allocation.tasks:
                assert task.node not in state.drained
                selector = d.allocation.spec.role(task.role).node_selector
                assert all(label in nodes_now[task.node].labels for label in selector)
        if isinstance(d, Preempt):
            assert d.victims and all(v in state.placed for v in d.victims)
    waiting = [d for d in decisions if isinstance(d, Waiting)]
    assert [w.position for w in waiting] == list(range(1, len(waiting) + 1))
    assert {w.job_id for w in waiting} == set(state.queued)


def gpu_milli_of(gpu: float) -> int:
    count, milli = gpu_request(gpu)
    return count * milli


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_nodes=labelled_nodes(),
    queues=queue_specs(QUEUE_NAMES),
    plan=world_steps,
    max_preemptions=st.integers(0, 2),
)
def test_any_interleaving_keeps_the_invariants(
    cluster_nodes: list[NodeSpec],
    queues: list[str | QueueSpec],
    plan: list,  # type: ignore[type-arg]
    max_preemptions: int,
) -> None:
    state = SchedulerState(
        ClusterSpec(nodes=cluster_nodes, queues=queues),
        rules=Rules(max_preemptions=max_preemptions),
    )
    spare = [n.model_copy(update={"name": f"extra{i}"}) for i, n in enumerate(cluster_nodes)]
    seq = 0
    for op, arg in plan:
        names = [n.name for n in state.cluster.nodes]
        if op == "submit":
            seq += 1
            state.enqueue(QueuedJob(f"job{seq}", arg, arrival_seq=seq))
        elif op == "end" and state.placed:
            state.release(sorted(state.placed)[arg % len(state.placed)])
        elif op == "interrupted" and state.interrupting:
            victim = sorted(state.interrupting)[arg % len(state.interrupting)]
            allocation = state.release(victim)
            assert allocation is not None
            seq += 1
            state.enqueue(QueuedJob(victim, allocation.spec, arrival_seq=seq, attempt=2))
        elif op in ("drain", "undrain", "remove") and names:
            name = names[arg % len(names)]
            if op == "drain":
                state.drain_node(name)
            elif op == "undrain":
                state.undrain_node(name)
            else:
                for job_id in state.remove_node(name):
                    state.interrupting.setdefault(job_id, None)
        elif op == "add" and spare:
            state.add_node(spare.pop())
        decisions = cycle_and_apply(state)  # never interrupts a job twice
        check_world(state, decisions)
