"""Placement policies on tiny clusters: each picks the node its definition says it should,
the fragmentation measure matches the paper's cases, and the benchmark core runs."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_placement.domain import Plan, SchedulerState, Snapshot, place_gang
from trainyard_placement.domain.gpu_share import MILLI, Demand, NodeState
from trainyard_placement.domain.policies import (
    DEFAULT_POLICY,
    POLICIES,
    Trainyard,
    UnknownPolicy,
    scorer_named,
)
from trainyard_placement.domain.queue import QueuedJob
from trainyard_placement.domain.scoring import (
    TYPICAL_COVERAGE,
    ClusterContext,
    Typical,
    fragmentation,
    fragmentation_measure,
    stranded_measure,
    summed_measure,
    target_workloads,
    typical_of_counts,
    typical_workload,
)

from ..support.bench import load_bench


def state(
    gpu_free: tuple[int, ...] = (),
    cpu: int = 32_000,
    memory: int = 65_536,
    model: str | None = "t4",
    cpu_capacity: int | None = None,
) -> NodeState:
    return NodeState(
        model=model if gpu_free else None, cpu_milli=cpu, memory_mib=memory, gpu_free=gpu_free,
        cpu_capacity=cpu_capacity or cpu, memory_capacity=memory,
    )  # fmt: skip


def share(milli: int, cpu: int = 1000, models: frozenset[str] = frozenset()) -> Demand:
    return Demand(cpu_milli=cpu, memory_mib=1024, gpu_count=1, gpu_milli=milli, gpu_models=models)


def whole(count: int, cpu: int = 1000) -> Demand:
    return Demand(cpu_milli=cpu, memory_mib=1024, gpu_count=count, gpu_milli=MILLI)


def cpu_only(cpu: int) -> Demand:
    return Demand(cpu_milli=cpu, memory_mib=1024)


def pick(policy: str, nodes: dict[str, NodeState], demand: Demand, ctx: ClusterContext) -> str:
    """The placer's rule: the best score, ties to the first node."""
    scorer = scorer_named(policy)
    best, best_score = "", 0.0
    for name, node in nodes.items():
        score = scorer.score(node, demand, ctx)
        if not best or score > best_score:
            best, best_score = name, score
    return best


WHOLE_GPU_WORKLOAD = ClusterContext(workload=(Typical(whole(1), 1.0),))


# --- each policy picks what its definition says ----------------------------------------------


@pytest.mark.parametrize(
    ("policy", "nodes", "demand", "ctx", "expected"),
    [
        pytest.param(
            "first-fit", {"a": state((MILLI,) * 4), "b": state((MILLI,))}, whole(1),
            ClusterContext(), "a", id="first-fit-takes-the-first",
        ),
        pytest.param(
            # Least left after placement: b keeps no GPU, a keeps three.
            "best-fit", {"a": state((MILLI,) * 4), "b": state((MILLI,))}, whole(1),
            ClusterContext(), "b", id="best-fit-least-left",
        ),
        pytest.param(
            # A CPU task: a keeps more CPU but no GPU, b keeps four idle GPUs, which weigh
            # as much as CPU in best-fit.
            "best-fit", {"a": state(cpu=16_000), "b": state((MILLI,) * 4, cpu=4000)},
            cpu_only(1000), ClusterContext(), "a", id="best-fit-counts-gpus-left",
        ),
        pytest.param(
            # Dot product of free and requested: the task asks no GPU, so only CPU counts,
            # and b has less CPU free.
            "dot-product", {"a": state(cpu=16_000), "b": state((MILLI,) * 4, cpu=4000)},
            cpu_only(1000), ClusterContext(), "b", id="dot-product-aligns-with-the-request",
        ),
        pytest.param(
            # The paper's gradient: a 0.3 share on a's 400-milli device turns it into 100
            # unusable milli instead of 400 (fragmentation falls by 300); on b it would
            # strand 700 on a device no whole-GPU task can use. Best-fit would pick b.
            "fgd", {"a": state((400, MILLI)), "b": state((MILLI,))}, share(300),
            WHOLE_GPU_WORKLOAD, "a", id="fgd-fills-the-fragment",
        ),
        pytest.param(
            "best-fit", {"a": state((400, MILLI)), "b": state((MILLI,))}, share(300),
            WHOLE_GPU_WORKLOAD, "b", id="best-fit-does-not",
        ),
        pytest.param(
            "trainyard", {"a": state((400, MILLI)), "b": state((MILLI,))}, share(300),
            WHOLE_GPU_WORKLOAD, "a", id="trainyard-fills-the-fragment",
        ),
        pytest.param(
            # A CPU task on a node whose GPUs then lack the CPU their tasks need strands
            # those GPUs; a node without free GPUs loses nothing.
            "fgd",
            {"a": state((MILLI,) * 2, cpu=3000), "b": state((0, 0), cpu=3000)},
            cpu_only(2500), WHOLE_GPU_WORKLOAD, "b", id="fgd-keeps-cpu-for-gpus",
        ),
        pytest.param(
            "trainyard",
            {"a": state((MILLI,) * 2, cpu=3000), "b": state((0, 0), cpu=3000)},
            cpu_only(2500), WHOLE_GPU_WORKLOAD, "b", id="trainyard-keeps-cpu-for-gpus",
        ),
    ],
)  # fmt: skip
def test_policy_picks(
    policy: str, nodes: dict[str, NodeState], demand: Demand, ctx: ClusterContext, expected: str
) -> None:
    assert pick(policy, nodes, demand, ctx) == expected


def test_fgd_picks_the_device_that_fragments_least() -> None:
    node = state((MILLI, 400, 700))
    assert scorer_named("fgd").devices(node, share(300), WHOLE_GPU_WORKLOAD) == (1,)
    assert scorer_named("trainyard").devices(node, share(300), WHOLE_GPU_WORKLOAD) == (1,)
    assert scorer_named("best-fit").devices(node, share(300), WHOLE_GPU_WORKLOAD) == (1,)
    assert scorer_named("best-fit").devices(node, share(500), WHOLE_GPU_WORKLOAD) == (2,)


def test_trainyard_counts_the_cpu_that_a_node_has_left_for_its_gpus() -> None:
    # Both nodes can take one whole-GPU task of the workload, so FGD sees no fragment on
    # either; but a has CPU for one such task and four GPUs: three of them are stranded.
    workload = ClusterContext(workload=(Typical(whole(1, cpu=8000), 1.0),))
    a = state((MILLI,) * 4, cpu=8000)
    b = state((MILLI,) * 4, cpu=32_000)
    assert fragmentation(a, workload.workload) == fragmentation(b, workload.workload) == 0
    trainyard = scorer_named("trainyard")
    assert trainyard.frag(a, workload) == 3 * MILLI  # type: ignore[attr-defined]
    assert trainyard.frag(b, workload) == 0  # type: ignore[attr-defined]


def test_trainyard_strands_only_shares_where_multi_gpu_tasks_ask_for_most_gpus() -> None:
    from trainyard_placement.domain.policies import (
        MULTI_GPU_SHARE_FOR_SHARES_ONLY,
        multi_gpu_share,
    )
    from trainyard_placement.domain.scoring import stranded

    few = (Typical(whole(1, cpu=8000), 0.8), Typical(share(300), 0.19),
           Typical(whole(8, cpu=8000), 0.01))  # fmt: skip
    many = (Typical(whole(1, cpu=8000), 0.4), Typical(share(300), 0.2),
            Typical(whole(8, cpu=8000), 0.4))  # fmt: skip
    assert multi_gpu_share(few) < MULTI_GPU_SHARE_FOR_SHARES_ONLY < multi_gpu_share(many)
    assert multi_gpu_share(()) == 0.0
    # Four whole GPUs with CPU for one task, a device too full for the share.
    a = state((MILLI,) * 4 + (200,), cpu=8000)
    trainyard = scorer_named("trainyard")

    def measured(workload: tuple[Typical, ...]) -> float:
        return trainyard.frag(a, ClusterContext(workload=workload))  # type: ignore[attr-defined,no-any-return]

    # Few: FGD's measure and the strands of the shapes of fewer than two GPUs.
    own = measured(few)
    assert own == fragmentation(a, few) + stranded(a, few[:2])
    # Many: FGD's measure and the shares' strands only (the CPU-stranded whole GPUs
    # are left to FGD's measure), and back when the workload changes again.
    assert measured(many) == fragmentation(a, many) + stranded(a, many[1:2])
    assert stranded(a, many[:1]) > 0 and stranded(a, many[1:2]) > 0
    assert measured(few) == own


def test_trainyard_strands_only_shares_where_sharing_tasks_ask_for_two_fifths_of_the_gpus() -> None:
    from trainyard_placement.domain.policies import SHARING_SHARE_FOR_SHARES_ONLY, sharing_share
    from trainyard_placement.domain.scoring import stranded

    # Shares ask for a third of the GPUs, then for a half; no multi-GPU tasks.
    some = (Typical(whole(1, cpu=8000), 0.4), Typical(share(500), 0.4),
            Typical(whole(0, cpu=4000), 0.2))  # fmt: skip
    many = (Typical(whole(1, cpu=8000), 0.3), Typical(share(500), 0.6),
            Typical(whole(0, cpu=4000), 0.1))  # fmt: skip
    assert sharing_share(some) < SHARING_SHARE_FOR_SHARES_ONLY < sharing_share(many)
    # Four whole GPUs with CPU for one task, a device too full for the share: the
    # one-GPU shape strands three GPUs and the 200 milli.
    a = state((MILLI,) * 4 + (200,), cpu=8000)
    trainyard = scorer_named("trainyard")

    def measured(workload: tuple[Typical, ...]) -> float:
        return trainyard.frag(a, ClusterContext(workload=workload))  # type: ignore[attr-defined,no-any-return]

    assert measured(some) == fragmentation(a, some) + stranded(a, some)
    assert measured(many) == fragmentation(a, many) + stranded(a, many[1:2])
    assert stranded(a, many[:1]) > 0 and stranded(a, many[1:2]) > 0


def test_trainyard_sums_both_measures_unless_gpu_model_constrained_tasks_ask_for_a_tenth() -> None:
    from trainyard_placement.domain.policies import (
        CONSTRAINED_SHARE_FOR_ONE_MEASURE,
        SHARING_SHARE_FOR_STRANDED,
        constrained_share,
        sharing_share,
    )
    from trainyard_placement.domain.scoring import stranded

    t4 = Demand(cpu_milli=4000, memory_mib=0, gpu_count=1, gpu_milli=MILLI,
                gpu_models=frozenset({"t4"}))  # fmt: skip
    free = (Typical(whole(1, cpu=8000), 0.6), Typical(share(300), 0.35), Typical(t4, 0.05))
    constrained = (Typical(whole(1, cpu=8000), 0.6), Typical(t4, 0.4))
    # Shares ask for a third of the GPUs, constrained tasks for two fifths.
    shared = (Typical(whole(1, cpu=8000), 0.2), Typical(share(500), 0.5), Typical(t4, 0.3))
    assert constrained_share(free) < CONSTRAINED_SHARE_FOR_ONE_MEASURE
    assert constrained_share(constrained) > CONSTRAINED_SHARE_FOR_ONE_MEASURE
    assert constrained_share(shared) > CONSTRAINED_SHARE_FOR_ONE_MEASURE
    assert constrained_share(()) == 0.0 == sharing_share(())
    assert sharing_share(constrained) == 0.0
    assert sharing_share(shared) > SHARING_SHARE_FOR_STRANDED
    assert sharing_share(shared) == pytest.approx(250 / 750)
    # Three GPUs with room for one task by CPU, one device too full for the share.
    node = state((MILLI, MILLI, 200, MILLI), cpu=8000)
    # Shares asking a nineteenth of the GPUs (FGD's measure), then a ninth (stranded).
    few = (Typical(whole(1, cpu=8000), 0.55), Typical(share(500), 0.1), Typical(t4, 0.35))
    some = (Typical(whole(1, cpu=8000), 0.45), Typical(share(500), 0.2), Typical(t4, 0.35))
    assert sharing_share(few) < SHARING_SHARE_FOR_STRANDED < sharing_share(some)
    cases = (
        (free, fragmentation(node, free) + stranded(node, free), 1.0),
        (constrained, fragmentation(node, constrained), 2.0),
        (shared, stranded(node, shared), 2.0),
        (few, fragmentation(node, few), 2.0),
        (some, stranded(node, some), 2.0),
    )
    for workload, want, step in cases:
        trainyard = scorer_named("trainyard")
        got = trainyard.frag(node, ClusterContext(workload=workload))  # type: ignore[attr-defined]
        assert got == pytest.approx(want)
        assert trainyard.step == step  # type: ignore[attr-defined]
    # The measures differ on this node: the CPU leaves two of its GPUs to no task.
    assert stranded(node, free) > 0
    assert stranded(node, constrained) != fragmentation(node, constrained)
    assert stranded(node, shared) != fragmentation(node, shared)


def test_the_summed_measure_is_both_measures_added_to_the_bit_without_multi_gpu_strands() -> None:
    import random

    from trainyard_placement.domain.scoring import stranded, summed_measure

    rng = random.Random(7)
    for _ in range(300):
        workload = tuple(
            Typical(
                Demand(
                    cpu_milli=rng.choice((0, 2000, 8000, 40_000)),
                    memory_mib=rng.choice((0, 4096, 65536)),
                    gpu_count=(count := rng.choice((0, 1, 1, 2, 4))),
                    gpu_milli=rng.choice((250, 500, MILLI)) if count == 1 else MILLI * bool(count),
                    gpu_models=rng.choice((frozenset(), frozenset({"t4"})))
                    if count
                    else frozenset(),
                ),
                rng.random(),
            )
            for _ in range(rng.randint(1, 6))
        )
        node = NodeState(
            rng.choice(("t4", "v100")), rng.randint(0, 64_000), rng.randint(0, 200_000),
            tuple(rng.choice((0, 100, 500, 800, MILLI)) for _ in range(rng.choice((1, 2, 4, 8)))),
            64_000, 200_000,
        )  # fmt: skip
        single = tuple(t for t in workload if t.demand.gpu_count < 2)
        want = fragmentation(node, workload) + stranded(node, single)
        assert summed_measure(workload)(node) == want
        shares = tuple(t for t in workload if t.demand.is_share)
        want = fragmentation(node, workload) + stranded(node, shares)
        assert summed_measure(workload, shares_only=True)(node) == want


def test_random_is_seeded_and_reaches_every_feasible_node() -> None:
    c = ClusterSpec(nodes=[NodeSpec(name=n, cpu=4, memory_mb=4096) for n in "abcd"])
    spec = JobSpec(name="j", roles=[RoleSpec(name="w", command="true")])
    chosen = set()
    for i in range(60):
        plan = place_gang(spec, Snapshot.of(c), job_id=f"job{i}", scorer=scorer_named("random"))
        again = place_gang(spec, Snapshot.of(c), job_id=f"job{i}", scorer=scorer_named("random"))
        assert isinstance(plan, Plan) and plan == again
        chosen.add(plan.tasks[0].node)
    assert chosen == set("abcd")


def test_the_gang_placer_uses_the_scorer_and_keeps_a_job_together() -> None:
    c = ClusterSpec(nodes=[
        NodeSpec(name="big", cpu=32, memory_mb=65536, gpus=8, gpu_type="T4"),
        NodeSpec(name="small", cpu=32, memory_mb=65536, gpus=2, gpu_type="T4"),
    ])  # fmt: skip
    resources = Resources(cpu=1, memory_mb=1024, gpu=1)
    role = RoleSpec(name="w", replicas=3, command="true", resources=resources)
    spec = JobSpec(name="j", roles=[role])
    first = place_gang(spec, Snapshot.of(c), job_id="j", scorer=scorer_named("first-fit"))
    best = place_gang(spec, Snapshot.of(c), job_id="j", scorer=scorer_named("best-fit"))
    assert isinstance(first, Plan) and isinstance(best, Plan)
    assert [t.node for t in first.tasks] == ["big"] * 3
    # Best-fit opens the small node, then the job stays on it while it fits.
    assert [t.node for t in best.tasks] == ["small", "small", "big"]


# --- fragmentation and the target workload ---------------------------------------------------


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        pytest.param(state((MILLI, MILLI)), 0.0, id="all-usable"),
        pytest.param(state((MILLI, 400)), 400.0, id="a-device-too-small"),
        pytest.param(state((400, 300)), 700.0, id="nothing-fits"),
        pytest.param(state((MILLI, MILLI), cpu=500), 2000.0, id="cpu-lacking"),
        pytest.param(state((MILLI,), model="v100"), 1000.0, id="wrong-model"),
        pytest.param(state(()), 0.0, id="no-gpus"),
    ],
)
def test_fragmentation_for_one_task_shape(node: NodeState, expected: float) -> None:
    workload = (Typical(share(500, models=frozenset({"t4"})), 1.0),)
    assert fragmentation(node, workload) == expected


def test_fragmentation_is_an_expectation_over_the_workload() -> None:
    workload = (Typical(share(500), 0.5), Typical(cpu_only(1000), 0.25), Typical(whole(2), 0.25))
    # share: 300 stranded; CPU task: all 1300 idle; two whole GPUs: not there, all 1300.
    assert fragmentation(state((MILLI, 300)), workload) == pytest.approx(
        0.5 * 300 + 0.25 * 1300 + 0.25 * 1300
    )


def test_typical_workload_takes_the_common_shapes_and_renormalises() -> None:
    demands = [share(500)] * 60 + [whole(1)] * 36 + [whole(8)] * 3 + [cpu_only(4000)]
    workload = typical_workload(demands, coverage=0.95)
    shapes = [(t.demand.gpu_count, t.demand.gpu_milli) for t in workload]
    assert shapes == [(1, 500), (1, MILLI)]
    assert [t.freq for t in workload] == pytest.approx([60 / 96, 36 / 96])


def test_by_gpus_the_multi_gpu_shapes_the_gpu_demand_needs_join_most_demand_first() -> None:
    # GPU demand: shares 40,000, one-GPU 36,000, 8-GPU 24,000, 2-GPU 4,000 milli: the
    # count's shapes (116 of 122 tasks) hold 76,000 of 104,000 (73 %); with the 8-GPU
    # shape, 96 %.
    demands = (
        [share(500)] * 80 + [whole(1)] * 36 + [whole(2)] * 2 + [whole(8)] * 3 + [cpu_only(4000)]
    )
    paper = typical_workload(demands, coverage=0.95)
    assert [(t.demand.gpu_count, t.demand.gpu_milli) for t in paper] == [(1, 500), (1, MILLI)]
    wide = typical_workload(demands, coverage=0.95, gpu_coverage=0.95)
    assert [(t.demand.gpu_count, t.demand.gpu_milli) for t in wide] == [
        (1, 500), (1, MILLI), (8, MILLI),
    ]  # fmt: skip
    assert [t.freq for t in wide] == pytest.approx([80 / 119, 36 / 119, 3 / 119])
    # Every shape where the coverage asks for all of the GPU demand; nothing added where
    # the count's shapes hold enough of it already.
    everything = typical_workload(demands, coverage=0.95, gpu_coverage=1.0)
    assert [t.demand.gpu_count for t in everything] == [1, 1, 8, 2]
    assert typical_workload(demands, coverage=0.95, gpu_coverage=0.7) == paper


def test_the_shapes_by_gpus_only_where_the_gpus_run_out_before_the_cpu() -> None:
    counts = Counter({whole(1, cpu=8000): 96, whole(8, cpu=64_000): 4})
    # 1,024 cores for 128 GPUs asked: 8 cores a GPU.
    wide = target_workloads(counts, cpu_milli=12_000 * 800, gpu_milli=MILLI * 800)[1]
    assert wide is not None and [t.demand.gpu_count for t in wide] == [1, 8]
    assert wide == typical_of_counts(counts, gpu_coverage=TYPICAL_COVERAGE)
    assert target_workloads(counts, cpu_milli=8_000 * 800, gpu_milli=MILLI * 800)[1] is not None
    assert target_workloads(counts, cpu_milli=7_900 * 800, gpu_milli=MILLI * 800)[1] is None
    assert target_workloads(Counter({cpu_only(4000): 3}), 10**6, 10**6)[1] is None


def test_trainyard_keeps_a_whole_node_for_the_multi_gpu_shapes_counted_by_gpus() -> None:
    # One-GPU tasks alone in the paper's workload: an empty 8-GPU node and a half-used
    # one look alike to both measures, and the tie goes to the first (the empty one).
    # With the 8-GPU shape in view, the half-used node is the one to fill.
    nodes = {
        "empty": state((MILLI,) * 8, cpu=96_000, memory=393_216),
        "half": state((0,) * 4 + (MILLI,) * 4, cpu=48_000, memory=196_608),
    }
    paper = (Typical(whole(1), 1.0),)
    wide = (Typical(whole(1), 0.9), Typical(whole(8), 0.1))
    task = whole(1)
    assert pick("trainyard", nodes, task, ClusterContext(workload=paper)) == "empty"
    by_gpus = ClusterContext(workload=paper, workload_by_gpus=wide)
    assert pick("trainyard", nodes, task, by_gpus) == "half"
    assert pick("fgd", nodes, task, by_gpus) == "empty"  # the paper's FGD: its workload


def test_one_trainyard_scorer_follows_a_change_of_the_workload_by_gpus_alone() -> None:
    # The placer keeps one scorer across cycles: its memos must follow the second
    # workload too, also when the paper's one is the same object.
    nodes = {
        "empty": state((MILLI,) * 8, cpu=96_000, memory=393_216),
        "half": state((0,) * 4 + (MILLI,) * 4, cpu=48_000, memory=196_608),
    }
    paper = (Typical(whole(1), 1.0),)
    by_gpus = ClusterContext(
        workload=paper, workload_by_gpus=(Typical(whole(1), 0.9), Typical(whole(8), 0.1))
    )
    scorer = scorer_named("trainyard")

    def choice(ctx: ClusterContext) -> str:
        scores = {name: scorer.score(node, whole(1), ctx) for name, node in nodes.items()}
        return max(scores, key=lambda name: (scores[name], name == "empty"))

    assert choice(ClusterContext(workload=paper)) == "empty"
    assert choice(by_gpus) == "half"
    assert choice(replace(by_gpus, max_cpu_milli=1)) == "half"  # a copy, as gang.py makes
    assert choice(ClusterContext(workload=paper)) == "empty"


def nodes_to_measure() -> list[NodeState]:
    return [
        state((MILLI,) * 8, cpu=48_000, memory=196_608),
        state((0,) * 4 + (MILLI,) * 4, cpu=48_000, memory=196_608),
        state((500,) + (MILLI,) * 3, cpu=48_000, memory=196_608),
        state((0,) * 7 + (MILLI,), cpu=48_000, memory=196_608),
        state((MILLI,) * 4, cpu=2000, memory=196_608),  # CPU for two one-GPU tasks
        state((MILLI,) * 4, cpu=48_000, memory=196_608, model="v100"),
    ]


def test_a_measure_alone_keeps_the_papers_workload() -> None:
    # Constrained tasks ask for half the GPUs: one measure alone, at twice the step, and
    # without the added multi-GPU shapes (the stranded measure would count their
    # leftover whole GPUs lost; among constrained tasks they cost FGD's). FGD's without
    # sharing tasks, the stranded one with shares asking for half of the GPUs.
    t4 = Demand(cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=MILLI,
                gpu_models=frozenset({"t4"}))  # fmt: skip
    eight = Typical(whole(8, cpu=8000), 0.1)
    for paper, measure_of in (
        ((Typical(whole(1), 0.5), Typical(t4, 0.5)), fragmentation_measure),
        ((Typical(share(400), 0.5), Typical(t4, 0.5)), stranded_measure),
    ):
        wide = (*(Typical(t.demand, 0.45) for t in paper), eight)
        scorer = Trainyard()
        measure = scorer.measure_for(ClusterContext(workload=paper, workload_by_gpus=wide))
        assert scorer.step == 2
        got = [measure(n) for n in nodes_to_measure()]
        assert got == [measure_of(paper)(n) for n in nodes_to_measure()]
        assert got != [measure_of(wide)(n) for n in nodes_to_measure()]
        other = stranded_measure if measure_of is fragmentation_measure else fragmentation_measure
        assert got != [other(paper)(n) for n in nodes_to_measure()]


def test_the_rules_read_the_papers_workload_and_the_sum_the_wider_one() -> None:
    # Multi-GPU tasks ask for two thirds of the GPUs in the wider workload and none in
    # the paper's: the full sum (not the shares-only one), over the wider workload.
    paper = (Typical(whole(1), 1.0),)
    wide = (Typical(whole(1), 0.8), Typical(whole(8, cpu=8000), 0.2))
    scorer = Trainyard()
    measure = scorer.measure_for(ClusterContext(workload=paper, workload_by_gpus=wide))
    got = [measure(n) for n in nodes_to_measure()]
    assert scorer.step == 1
    assert got == [summed_measure(wide)(n) for n in nodes_to_measure()]
    assert got != [summed_measure(wide, shares_only=True)(n) for n in nodes_to_measure()]
    assert got != [summed_measure(paper)(n) for n in nodes_to_measure()]


def test_the_shares_only_sum_takes_the_wider_workload_too() -> None:
    paper = (Typical(whole(1), 0.5), Typical(whole(4), 0.5))  # 4-GPU tasks: 80 % of GPUs
    wide = (Typical(whole(1), 0.45), Typical(whole(4), 0.45), Typical(whole(8), 0.1))
    measure = Trainyard().measure_for(ClusterContext(workload=paper, workload_by_gpus=wide))
    got = [measure(n) for n in nodes_to_measure()]
    assert got == [summed_measure(wide, shares_only=True)(n) for n in nodes_to_measure()]
    assert got != [summed_measure(paper, shares_only=True)(n) for n in nodes_to_measure()]


def test_only_multi_gpu_shapes_join_by_gpus() -> None:
    large_one_gpu = whole(1, cpu=4000)
    demands = [whole(1)] * 100 + [share(300)] * 2 + [large_one_gpu] * 2 + [whole(8)]
    assert [t.demand for t in typical_workload(demands)] == [whole(1)]
    wide = typical_workload(demands, gpu_coverage=1.0)
    assert [t.demand for t in wide] == [whole(1), whole(8)]


# --- scarce GPU models ------------------------------------------------------------------------


def test_a_models_scarcity_is_its_share_of_the_demand_over_its_share_of_the_gpus() -> None:
    from trainyard_placement.domain.scoring import model_scarcity

    t4 = Demand(1000, 1024, 1, MILLI, frozenset({"t4"}))
    either = Demand(1000, 1024, 2, MILLI, frozenset({"t4", "p100", "h100"}))  # no h100 here
    counts = {whole(1): 50, t4: 10, either: 10, share(500): 40, cpu_only(4000): 99}
    # 100 GPUs asked: t4 10 + 10 of the 20 either asks, p100 the other 10.
    gpus = {"g2": 60, "t4": 10, "p100": 30}
    assert model_scarcity(counts, gpus) == (("p100", pytest.approx(0.1 / 0.3)), ("t4", 1.0))
    assert dict(model_scarcity({t4: 1, whole(1): 99}, gpus))["t4"] == pytest.approx(0.1)
    assert model_scarcity({whole(1): 5}, gpus) == ()  # no task names a model
    assert model_scarcity({t4: 0, whole(1): 5}, gpus) == ()
    assert model_scarcity({t4: 3}, {}) == ()
    assert model_scarcity({cpu_only(1000): 3}, gpus) == ()


def test_the_scarce_measure_counts_a_scarce_models_gpus_taken() -> None:
    from trainyard_placement.domain.scoring import scarce_measure

    def base(node: NodeState) -> float:
        return 7.0

    assert scarce_measure(base, ()) is base
    assert scarce_measure(base, (("t4", 0.5),), 0.0) is base
    measure = scarce_measure(base, (("t4", 0.5), ("p100", 1.0)), 2.0)
    assert measure(state((MILLI, 300, 0), model="t4")) == 7.0 + 2.0 * 0.5 * 1700
    assert measure(state((MILLI, MILLI), model="p100")) == 7.0  # nothing taken yet
    assert measure(state((0, MILLI), model="g2")) == 7.0  # not a scarce model
    assert measure(state((0, MILLI), model=None)) == 7.0


def test_trainyard_keeps_a_scarce_models_gpus_for_the_tasks_that_need_them() -> None:
    # Two nodes alike but for their model; the T4 node comes first, so a tie goes to it.
    nodes = {
        "t4": state((MILLI,) * 4, cpu=48_000, memory=196_608, model="t4"),
        "g2": state((MILLI,) * 4, cpu=48_000, memory=196_608, model="g2"),
    }
    paper = (Typical(whole(1), 1.0),)
    scorer = scorer_named("trainyard")

    def choice(ctx: ClusterContext, demand: Demand) -> str:
        fits = [name for name, node in nodes.items()
                if not demand.gpu_models or node.model in demand.gpu_models]  # fmt: skip
        scores = {name: scorer.score(nodes[name], demand, ctx) for name in fits}
        return max(fits, key=lambda name: (scores[name], name == "t4"))

    scarce = ClusterContext(workload=paper, scarcity=(("t4", 1.0),))
    assert choice(ClusterContext(workload=paper), whole(1)) == "t4"
    assert choice(scarce, whole(1)) == "g2"  # the same scorer follows the new scarcity
    assert choice(replace(scarce, scarcity=(("t4", 1.0),)), whole(1)) == "g2"  # an equal copy
    t4 = Demand(1000, 1024, 1, MILLI, frozenset({"t4"}))
    assert choice(scarce, t4) == "t4"  # the tasks naming it still go there
    assert choice(ClusterContext(workload=paper), whole(1)) == "t4"
    assert scorer_named("fgd").score(nodes["t4"], whole(1), scarce) == scorer_named("fgd").score(
        nodes["g2"], whole(1), scarce
    )  # FGD as the paper defines it ignores it


def test_the_scheduler_state_measures_scarcity_over_placed_and_waiting_tasks() -> None:
    from trainyard_placement.domain.state import gpus_by_model

    nodes = [
        NodeSpec(name="a", cpu=32, memory_mb=65_536, gpus=8, gpu_type="T4"),
        NodeSpec(name="b", cpu=32, memory_mb=65_536, gpus=4, gpu_type="G2"),
        NodeSpec(name="c", cpu=32, memory_mb=65_536),
    ]
    assert gpus_by_model(nodes) == {"t4": 8, "g2": 4}
    sched = SchedulerState(ClusterSpec(nodes=nodes))
    assert sched.context().scarcity == ()

    def job(name: str, gpu_type: str | None) -> JobSpec:
        resources = Resources(cpu=1, memory_mb=1024, gpu=1, gpu_type=gpu_type)
        role = RoleSpec(name="w", replicas=2, command="true", resources=resources)
        return JobSpec(name=name, roles=[role])

    spec, other = job("t4-job", "t4"), job("any-job", None)
    sched.enqueue(QueuedJob("j1", spec, arrival_seq=1))
    sched.enqueue(QueuedJob("j2", other, arrival_seq=2))
    # Half the GPUs asked must go to T4, which has two thirds of the GPUs.
    assert sched.context().scarcity == (("t4", pytest.approx(0.75)),)
    reference = sched.reference_cycle(now=1.0)
    decisions = sched.cycle(now=1.0)
    assert decisions == reference
    placed = {d.job_id: {t.node for t in d.allocation.tasks} for d in decisions}  # type: ignore[union-attr]
    assert placed == {"j1": {"a"}, "j2": {"b"}}
    # The state's policy counts the T4s taken at the scarcity times the weight.
    from trainyard_placement.domain.policies import SCARCITY_WEIGHT

    scorer = sched.scorer
    assert isinstance(scorer, Trainyard)
    context = sched.context()
    t4_node = state((0, 0) + (MILLI,) * 6, cpu=30_000, memory=63_488, model="t4")
    extra = scorer.measure_for(context)(t4_node) - scorer._chosen_measure(context)(t4_node)
    assert SCARCITY_WEIGHT > 0 and extra == pytest.approx(SCARCITY_WEIGHT * 0.75 * 2 * MILLI)


# --- the registry ----------------------------------------------------------------------------


def test_registry() -> None:
    assert scorer_named(None).name == DEFAULT_POLICY == "trainyard"
    assert scorer_named(" Best-Fit ").name == "best-fit"
    assert {scorer_named(name).name for name in POLICIES} == set(POLICIES)
    with pytest.raises(UnknownPolicy, match="unknown placement policy 'tetris'"):
        scorer_named("tetris")
    assert SchedulerState(ClusterSpec(nodes=[])).scorer.name == DEFAULT_POLICY


# --- the benchmark core on a tiny synthetic trace --------------------------------------------


def test_benchmark_runs_on_a_tiny_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n0,32000,65536,4,T4\nn1,32000,65536,2,V100\nn2,16000,32768,0,\n"
    )
    pods = tmp_path / "pods.csv"
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    shapes = ["4000,8192,1,500,", "8000,8192,1,1000,", "2000,4096,0,0,", "4000,8192,2,1000,V100",
              "3000,4096,1,250,T4|V100"]  # fmt: skip
    rows += [f"p{i:03},{shapes[i % len(shapes)]}" for i in range(20)]
    pods.write_text("\n".join(rows) + "\n")
    bench = load_bench("placement_quality")

    assert bench.main(["--nodes", str(nodes), "--pods", str(pods), "--quick"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cluster"] == {"nodes": 2, "gpus": 6}
    assert report["seeds"] == [42, 43]
    assert list(report["policies"]) == ["trainyard", "random", "best-fit", "dot-product", "fgd"]
    for result in report["policies"].values():
        assert 0 < result["alloc_rate_at_100"]["mean"] <= 100
        assert set(result["alloc_rate_at_100"]["per_seed"]) == {"42", "43"}
        assert result["decisions_per_s"] > 0
        assert result["fragmentation_at_100"]["idle_gpus"] >= 0
    assert "published" not in report


def test_benchmark_inflates_to_the_target_and_keeps_every_pod(tmp_path: Path) -> None:
    bench = load_bench("placement_quality")
    pods = [bench.Pod(f"p{i}", whole(1)) for i in range(10)] + [bench.Pod("c", cpu_only(1000))]
    stream = bench.arrival_order(pods, capacity_milli=20 * MILLI, seed=42, inflate=1.3)
    assert sum(d.total_gpu_milli for d in stream) == 26 * MILLI
    assert stream[:11] != [p.demand for p in pods]  # shuffled
    assert sorted(stream[:11], key=lambda d: d.gpu_count) == sorted(
        (p.demand for p in pods), key=lambda d: d.gpu_count
    )


def test_benchmark_breaks_ties_by_a_node_order_shuffled_with_each_seed() -> None:
    # The paper's simulator names its nodes after a random permutation and its scheduler
    # takes the smallest name among equal scores: ties go by a random order per run.
    bench = load_bench("placement_quality")
    nodes = [NodeState("g2", 8000 + i, 65536, (MILLI,) * 8, 8000 + i, 65536) for i in range(12)]
    order = bench.node_order(nodes, 42)
    assert order == bench.node_order(nodes, 42)  # the same run, the same order
    assert sorted(order, key=lambda n: n.cpu_milli) == nodes  # every node once
    assert order != nodes and order != bench.node_order(nodes, 43)
