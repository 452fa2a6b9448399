"""GPU model constraints: a task goes only to a node of one of its allowed models
(``Resources.gpu_type`` and ``gpu_types`` together), per task, and the placer's grouping of
alike nodes picks what a node-by-node scan would."""

from __future__ import annotations

import random

import pytest

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.jobspec import EnvVar, JobSpec, Resources, RoleSpec
from trainyard_placement.domain.capacity import Allocation, Snapshot
from trainyard_placement.domain.eligible import place_job
from trainyard_placement.domain.gang import Plan, Unschedulable, place_gang
from trainyard_placement.domain.gpu_share import Demand, fits
from trainyard_placement.domain.policies import POLICIES, scorer_named
from trainyard_placement.domain.scoring import ClusterContext, typical_workload

from .placement_cases import World


def typed(
    name: str,
    model: str | None,
    *,
    gpus: int = 4,
    cpu: float = 16,
    labels: dict[str, str] | None = None,
) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu=cpu,
        memory_mb=65536,
        gpus=gpus if model else 0,
        gpu_type=model,
        labels=[EnvVar(name=k, value=v) for k, v in (labels or {}).items()],
    )


def task(
    gpu: float = 1,
    *,
    gpu_type: str | None = None,
    gpu_types: tuple[str, ...] = (),
    name: str = "worker",
    replicas: int = 1,
    selector: dict[str, str] | None = None,
) -> RoleSpec:
    return RoleSpec(
        name=name, replicas=replicas, command="train",
        resources=Resources(cpu=1, memory_mb=1024, gpu=gpu, gpu_type=gpu_type,
                            gpu_types=list(gpu_types)),
        node_selector=[EnvVar(name=k, value=v) for k, v in (selector or {}).items()],
    )  # fmt: skip


def one(*roles: RoleSpec) -> JobSpec:
    return JobSpec(name="j", roles=list(roles))


CLUSTER = ClusterSpec(
    nodes=[typed("a100", "A100"), typed("v100", "V100"), typed("t4", "T4"), typed("cpu", None)]
)


@pytest.mark.parametrize(
    ("resources", "allowed"),
    [
        ({}, []),
        ({"gpu_type": "A100"}, ["A100"]),
        ({"gpu_types": ["V100", "T4"]}, ["V100", "T4"]),
        ({"gpu_type": "A100", "gpu_types": ["V100"]}, ["A100", "V100"]),
        ({"gpu_type": "A100", "gpu_types": ["a100", "T4", "t4"]}, ["A100", "T4"]),
    ],
)
def test_allowed_models_are_gpu_type_and_gpu_types_together(
    resources: dict[str, object], allowed: list[str]
) -> None:
    assert Resources.model_validate(resources).allowed_gpu_types() == allowed


@pytest.mark.parametrize(
    ("role", "nodes"),
    [
        # any model: the first node with GPUs (first-fit in cluster order)
        (task(), {"a100"}),
        (task(gpu_type="V100"), {"v100"}),
        (task(gpu_types=("T4",)), {"t4"}),
        (task(gpu_types=("T4", "V100")), {"v100"}),  # the earlier node of an allowed model
        (task(gpu_types=("t4", "h100")), {"t4"}),  # case does not matter; unknown ones skip
        (task(gpu_type="T4", gpu_types=("V100",)), {"v100"}),  # both fields allow
        (task(0.5, gpu_types=("T4",)), {"t4"}),  # a share of a GPU of the model
        (task(4, gpu_types=("T4", "V100"), replicas=2), {"v100", "t4"}),  # per task
        (task(0, gpu_types=("T4",)), {"a100"}),  # no GPUs: no model to match
    ],
)
def test_task_goes_only_to_an_allowed_model(role: RoleSpec, nodes: set[str]) -> None:
    plan = place_gang(one(role), Snapshot.of(CLUSTER))
    assert isinstance(plan, Plan), plan
    assert {t.node for t in plan.tasks} == nodes


def test_roles_of_one_job_may_use_different_models() -> None:
    plan = place_gang(
        one(task(gpu_types=("T4",), name="small"), task(gpu_types=("A100",), name="big")),
        Snapshot.of(CLUSTER),
    )
    assert isinstance(plan, Plan), plan
    assert {(t.role, t.node) for t in plan.tasks} == {("small", "t4"), ("big", "a100")}


@pytest.mark.parametrize(
    ("role", "reason"),
    [
        (
            task(gpu_types=("H100", "B200")),
            "no node has 1 GPU of types H100, B200 (the cluster has no H100 or B200 GPUs)",
        ),
        (
            task(0.5, gpu_types=("H100", "B200")),
            "no node has a GPU of types H100, B200 (the cluster has no H100 or B200 GPUs)",
        ),
        (
            task(8, gpu_types=("T4", "V100")),
            "no node has 8 GPUs of types T4, V100; the largest has 4 GPUs in total (v100)",
        ),
        (task(gpu_type="H100"), "no node has 1 GPU of type H100 (the cluster has no H100 GPUs)"),
    ],
)
def test_no_node_of_an_allowed_model_is_explained(role: RoleSpec, reason: str) -> None:
    outcome = place_gang(one(role), Snapshot.of(CLUSTER))
    assert isinstance(outcome, Unschedulable)
    assert outcome.reasons == (f"role worker task 0: {reason}",)


def test_allowed_models_full_is_explained_with_their_free_gpus() -> None:
    snapshot = Snapshot.of(CLUSTER)
    full = place_gang(one(task(4, gpu_types=("T4", "V100"), replicas=2)), snapshot)
    assert isinstance(full, Plan)
    snapshot = snapshot.with_allocation(Allocation("full", one(task(4, replicas=2)), full.tasks))
    outcome = place_gang(one(task(gpu_types=("T4", "V100"))), snapshot)
    assert isinstance(outcome, Unschedulable)
    assert outcome.reasons == (
        "role worker task 0: no node has 1 free GPU of types T4, V100 "
        "(largest free: v100 0 GPUs V100)",
    )


def test_models_and_node_selector_together_through_the_cycle() -> None:
    w = World.of(
        typed("v100-a", "V100", labels={"zone": "a"}),
        typed("t4-b", "T4", labels={"zone": "b"}),
        typed("v100-b", "V100", labels={"zone": "b"}),
    )
    w.submit("j", one(task(gpu_types=("V100", "H100"), replicas=2, selector={"zone": "b"})))
    w.cycle()
    assert w.nodes_of("j") == {"v100-b"}
    # zone b has no A100: the job waits, and says why
    w.submit("k", one(task(gpu_types=("A100",), selector={"zone": "b"})))
    w.cycle()
    assert "k" not in w.placed()
    assert any("the cluster has no A100 GPUs" in r for r in w.waiting("k").reasons)


def test_node_selector_alone_through_the_cycle() -> None:
    w = World.of(
        typed("a", "A100", labels={"zone": "a"}),
        typed("b", "A100", labels={"zone": "b", "disk": "ssd"}),
    )
    w.submit("j", one(task(replicas=2, selector={"zone": "b", "disk": "ssd"})))
    w.submit("k", one(task(selector={"zone": "c"})))
    w.cycle()
    assert w.placed() == ["j"]
    assert w.nodes_of("j") == {"b"}
    assert w.waiting("k").reasons == ("role worker: no node matches its node selector zone=c",)


# --- the grouping of alike nodes picks what a scan node by node picks ----------------------

MODELS = ("A100", "V100", "T4")


def _scan(snapshot: Snapshot, demand: Demand, policy: str, ctx: ClusterContext) -> str | None:
    """The best node by a plain scan in cluster order (earliest on ties)."""
    scorer = scorer_named(policy)
    best, best_score = None, 0.0
    for node in snapshot.nodes:
        if node.cpu + 1e-9 < demand.cpu_milli / 1000 or not fits(node.state(), demand):
            continue
        value = scorer.score(node.state(), demand, ctx)
        if best is None or value > best_score:
            best, best_score = node.name, value
    return best


@pytest.mark.parametrize("policy", sorted(p for p in POLICIES if p != "random"))
def test_grouped_choice_equals_a_scan_for_any_allowed_models(policy: str) -> None:
    rng = random.Random(f"gpu-types:{policy}")
    # Many alike nodes of each model, so groups hold several models' worth of equal states.
    cluster = ClusterSpec(
        nodes=[typed(f"n{i:02}", MODELS[i % 3], gpus=4, cpu=8) for i in range(24)]
    )
    shapes = [
        (rng.choice([0.5, 1, 2, 4]), tuple(rng.sample(MODELS, rng.randint(0, 3))))
        for _ in range(60)
    ]
    ctx = ClusterContext(
        workload=typical_workload(
            Demand.of(Resources(cpu=1, memory_mb=1024, gpu=g, gpu_types=list(m))) for g, m in shapes
        )
    )
    snapshot = Snapshot.of(cluster)
    snapshot.groups()  # the grouping is carried to the derived snapshots from here on
    for i, (gpu, models) in enumerate(shapes):
        spec = one(task(gpu, gpu_types=models))
        demand = Demand.of(spec.roles[0].resources)
        expected = _scan(snapshot, demand, policy, ctx)
        outcome = place_gang(
            spec, snapshot, job_id=f"j{i}", scorer=scorer_named(policy), context=ctx
        )
        if expected is None:
            assert isinstance(outcome, Unschedulable), (i, outcome)
            continue
        assert isinstance(outcome, Plan), (i, outcome)
        assert outcome.tasks[0].node == expected, (i, gpu, models)
        node = cluster.nodes[int(expected[1:])]
        assert not models or node.gpu_type in models
        snapshot = snapshot.with_allocation(Allocation(f"j{i}", spec, outcome.tasks))


def test_place_job_with_selector_and_models_keeps_the_gang_whole() -> None:
    snapshot = Snapshot.of(
        ClusterSpec(
            nodes=[
                typed("cpu", None, labels={"kind": "cpu"}),
                typed("t4", "T4", gpus=1, labels={"kind": "gpu"}),
                typed("v100", "V100", gpus=4, labels={"kind": "gpu"}),
            ]
        )
    )
    spec = one(
        task(0, name="ps", selector={"kind": "cpu"}),
        task(1, gpu_types=("T4",), replicas=2, selector={"kind": "gpu"}),
    )
    outcome = place_job(spec, snapshot)
    # Only one T4 in the selected nodes: V100s are not allowed, so nothing is placed.
    assert isinstance(outcome, Unschedulable)
    assert any("T4" in r for r in outcome.reasons), outcome.reasons
    spec = one(
        task(0, name="ps", selector={"kind": "cpu"}),
        task(1, gpu_types=("T4", "V100"), replicas=2, selector={"kind": "gpu"}),
    )
    outcome = place_job(spec, snapshot)
    assert isinstance(outcome, Plan), outcome
    # Per task: the first worker takes the T4, the second a V100.
    assert [(t.role, t.node) for t in outcome.tasks] == [
        ("ps", "cpu"),
        ("worker", "t4"),
        ("worker", "v100"),
    ]
