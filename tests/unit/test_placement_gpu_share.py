"""Fractional GPUs: share accounting in the gang placer, and its invariants under random
clusters, jobs and policies."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_placement.domain import (
    Allocation,
    Placed,
    Plan,
    QueuedJob,
    SchedulerState,
    Snapshot,
    Unschedulable,
    place_gang,
)
from trainyard_placement.domain.gpu_share import (
    MILLI,
    Demand,
    NodeState,
    fits,
    give_back,
    gpu_request,
    take,
)
from trainyard_placement.domain.policies import POLICIES, scorer_named


def gpu_node(name: str, gpus: int, gpu_type: str = "T4", cpu: float = 16) -> NodeSpec:
    return NodeSpec(name=name, cpu=cpu, memory_mb=65536, gpus=gpus, gpu_type=gpu_type)


def job(gpu: float, replicas: int = 1, name: str = "j", gpu_type: str | None = None) -> JobSpec:
    resources = Resources(cpu=1, memory_mb=1024, gpu=gpu, gpu_type=gpu_type)
    role = RoleSpec(name="w", replicas=replicas, command="true", resources=resources)
    return JobSpec(name=name, roles=[role])


def place(spec: JobSpec, snapshot: Snapshot, job_id: str = "j", policy: str = "first-fit") -> Plan:
    plan = place_gang(spec, snapshot, job_id=job_id, scorer=scorer_named(policy))
    assert isinstance(plan, Plan), plan
    return plan


def commit(snapshot: Snapshot, job_id: str, spec: JobSpec, plan: Plan) -> Snapshot:
    return snapshot.with_allocation(Allocation(job_id, spec, plan.tasks))


ONE_GPU = ClusterSpec(nodes=[gpu_node("a", 1)])
TWO_GPUS = ClusterSpec(nodes=[gpu_node("a", 2)])


# --- the request ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [(0, (0, 0)), (0.5, (1, 500)), (0.001, (1, 1)), (0.9999, (1, MILLI)), (1, (1, MILLI)),
     (1.5, (2, MILLI)), (2, (2, MILLI))],
)  # fmt: skip
def test_a_fraction_is_a_share_of_one_gpu(gpu: float, expected: tuple[int, int]) -> None:
    assert gpu_request(gpu) == expected


# --- share accounting ------------------------------------------------------------------------


def test_two_halves_share_one_gpu() -> None:
    spec = job(0.5, replicas=2)
    plan = place(spec, Snapshot.of(ONE_GPU))
    assert [(t.node, t.gpu_indices, t.gpu_milli) for t in plan.tasks] == [
        ("a", [0], 500), ("a", [0], 500),
    ]  # fmt: skip
    after = commit(Snapshot.of(ONE_GPU), "j", spec, plan)
    assert after.node("a").gpu_free == (0,)


def test_point_six_and_a_half_do_not_share() -> None:
    first = job(0.6)
    snapshot = commit(Snapshot.of(ONE_GPU), "j1", first, place(first, Snapshot.of(ONE_GPU), "j1"))
    outcome = place_gang(job(0.5), snapshot, job_id="j2")
    assert isinstance(outcome, Unschedulable)
    assert outcome.reasons == (
        "role w task 0: needs 500 milli-GPU on one GPU, most free on one GPU is 400 (a)",
    )


def test_a_whole_gpu_task_never_lands_on_a_shared_gpu() -> None:
    half = job(0.5)
    snapshot = Snapshot.of(TWO_GPUS)
    snapshot = commit(snapshot, "half", half, place(half, snapshot, "half"))
    assert snapshot.node("a").gpu_free == (500, MILLI)
    whole = job(1)
    plan = place(whole, snapshot, "whole")
    assert (plan.tasks[0].gpu_indices, plan.tasks[0].gpu_milli) == ([1], None)
    snapshot = commit(snapshot, "whole", whole, plan)
    outcome = place_gang(job(1), snapshot, job_id="again")
    assert isinstance(outcome, Unschedulable)
    assert "no node has 1 free GPU (largest free: a 0 GPUs T4)" in outcome.reasons[0]
    # ...while a share still fits in the half that is left.
    assert place(job(0.5), snapshot, "share").tasks[0].gpu_indices == [0]


def test_a_share_goes_to_the_fullest_gpu_it_fits_on() -> None:
    snapshot = Snapshot.of(ClusterSpec(nodes=[gpu_node("a", 3)]))
    for job_id, gpu in (("x", 1.0), ("y", 0.7), ("z", 0.2)):
        spec = job(gpu)
        snapshot = commit(snapshot, job_id, spec, place(spec, snapshot, job_id))
    assert snapshot.node("a").gpu_free == (0, 100, MILLI)
    assert place(job(0.1), snapshot).tasks[0].gpu_indices == [1]


def test_release_returns_the_milli() -> None:
    state = SchedulerState(ONE_GPU)
    state.enqueue(QueuedJob("a", job(0.3), arrival_seq=1))
    state.enqueue(QueuedJob("b", job(0.7), arrival_seq=2))
    for decision in state.cycle():
        assert isinstance(decision, Placed)
        state.commit(decision.allocation)
    assert state.snapshot().node("a").gpu_free == (0,)
    state.release("b")
    assert state.snapshot().node("a").gpu_free == (700,)
    state.release("a")
    assert state.snapshot().node("a").gpu_free == (MILLI,)
    assert state.snapshot().node("a").gpus == (0,)


def test_a_placement_stored_before_shares_holds_whole_gpus() -> None:
    legacy = TaskPlacement(role="w", index=0, node="a", host_ip="127.0.0.1", gpu_indices=[0])
    snapshot = Snapshot.of(TWO_GPUS, [Allocation("old", job(0.5), (legacy,))])
    assert snapshot.node("a").gpu_free == (0, MILLI)


def test_take_and_give_back_are_inverse_and_refuse_overcommit() -> None:
    node = NodeState("t4", 8000, 4096, (MILLI, 300), 8000, 4096)
    share = Demand(cpu_milli=1000, memory_mib=512, gpu_count=1, gpu_milli=300)
    after = take(node, share, (1,))
    assert after == NodeState("t4", 7000, 3584, (MILLI, 0), 8000, 4096)
    assert give_back(after, share, (1,)) == node
    assert fits(after, Demand(1000, 0, 1, MILLI)) and not fits(after, Demand(1000, 0, 2, MILLI))
    with pytest.raises(ValueError, match="GPU 1"):
        take(after, share, (1,))


# --- invariants ------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSpec:
    count = draw(st.integers(1, 3))
    return ClusterSpec(nodes=[
        NodeSpec(name=f"n{i}", cpu=draw(st.sampled_from([2, 4, 8])), memory_mb=16384,
                 gpus=draw(st.integers(0, 4)), gpu_type=draw(st.sampled_from(["T4", "V100"])))
        for i in range(count)
    ])  # fmt: skip


jobs = st.builds(
    lambda gpu, replicas, gpu_type: job(gpu, replicas, gpu_type=gpu_type),
    gpu=st.sampled_from([0, 0.1, 0.25, 0.3, 0.5, 0.6, 0.75, 0.9, 1, 2]),
    replicas=st.integers(1, 4),
    gpu_type=st.sampled_from([None, None, "T4", "V100"]),
)
steps = st.lists(
    st.one_of(st.tuples(st.just("submit"), jobs), st.tuples(st.just("release"), st.integers(0, 9))),
    min_size=1,
    max_size=16,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), plan=steps, policy=st.sampled_from(sorted(POLICIES)))
def test_no_gpu_over_a_thousand_milli_and_gangs_stay_whole(
    cluster: ClusterSpec, plan: list, policy: str
) -> None:  # type: ignore[type-arg]
    state = SchedulerState(cluster, scorer=scorer_named(policy))
    seq = 0
    for op, arg in plan:
        if op == "submit":
            seq += 1
            state.enqueue(QueuedJob(f"job{seq}", arg, arrival_seq=seq))
        elif state.placed:
            state.release(sorted(state.placed)[arg % len(state.placed)])
        for decision in state.cycle():
            if isinstance(decision, Placed):
                state.commit(decision.allocation)
        held: Counter[tuple[str, int]] = Counter()
        holders: dict[tuple[str, int], list[bool]] = defaultdict(list)
        for allocation in state.placed.values():
            role = allocation.spec.roles[0]
            assert sorted(t.index for t in allocation.tasks) == list(range(role.replicas))
            for task in allocation.tasks:
                count, milli = gpu_request(role.resources.gpu)
                assert len(task.gpu_indices) == count
                assert task.gpu_milli == (milli if count == 1 and milli < MILLI else None)
                for g in task.gpu_indices:
                    held[task.node, g] += milli
                    holders[task.node, g].append(task.gpu_milli is not None)
        assert all(m <= MILLI for m in held.values())
        # A device held whole is held by that task alone.
        assert all(all(shares) or len(shares) == 1 for shares in holders.values())
        snapshot = state.snapshot()
        for n in cluster.nodes:
            free = snapshot.node(n.name).gpu_free
            assert free == tuple(MILLI - held[n.name, g] for g in range(n.gpus))
