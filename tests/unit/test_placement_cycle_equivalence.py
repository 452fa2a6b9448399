"""The kept state decides as the state derived afresh does.

SchedulerState keeps what its cycles need (the snapshot, the target workload, each
queue's usage and borrowers, the running jobs, a memo of what the last cycle found) and
updates it for each change instead of deriving it from every job each cycle. Hypothesis
drives random event sequences (arrivals, ends, stops, retries of the same job, scale
changes, preemptions carried out or not, interruptions, drained, added and removed
nodes, cycles with nothing new) through one state, and after every event compares its
``cycle`` with ``reference_cycle``, which derives everything from the placed and queued
jobs as every cycle once did: the same decisions, reasons included. Between events the
kept snapshot, workload, usage and borrowers equal their fresh derivations, and the
growth of elastic jobs equals what growth computed from fresh snapshots.
"""

from __future__ import annotations

from collections import Counter

import pytest
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
    Snapshot,
    Waiting,
    scorer_named,
)
from trainyard_placement.domain.eligible import place_job
from trainyard_placement.domain.gang import Plan, Unschedulable
from trainyard_placement.domain.gpu_share import Demand
from trainyard_placement.domain.growth import _grown, _room, growth
from trainyard_placement.domain.plugins import Fifo, LeastWork, LowestPriority
from trainyard_placement.domain.queue import CycleMemo, RunningIndex, _Cycle
from trainyard_placement.domain.quota import Usage, usage_of, within
from trainyard_placement.domain.scoring import (
    ClusterContext,
    Typical,
    target_workloads,
    typical_of_counts,
    typical_workload,
)
from trainyard_placement.domain.sizes import at_step, is_elastic, last_step
from trainyard_placement.domain.state import capacity_milli

from .placement_cases import queue_specs

QUEUES = ["qa", "qb"]
PORT_BASE = 30000


@st.composite
def cluster_nodes(draw: st.DrawFn) -> list[NodeSpec]:
    """A few kinds of node, several nodes of each: alike nodes are where the placer
    takes shortcuts."""
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(0, 4))
        kinds.append(dict(
            cpu=draw(st.sampled_from([1, 2, 4, 8])),
            memory_mb=draw(st.sampled_from([1024, 4096, 16384])), gpus=gpus,
            gpu_type=draw(st.sampled_from([None, "V100", "A100"])) if gpus else None,
        ))  # fmt: skip
    return [
        NodeSpec(name=f"n{i}", **draw(st.sampled_from(kinds)),
                 port_range=(PORT_BASE, PORT_BASE + draw(st.integers(0, 8))),
                 labels=[EnvVar(name="zone", value=draw(st.sampled_from("ab")))])
        for i in range(draw(st.integers(1, 6)))
    ]  # fmt: skip


@st.composite
def job_specs(draw: st.DrawFn) -> JobSpec:
    roles = []
    for name in draw(st.lists(st.sampled_from(["worker", "ps"]), min_size=1, max_size=2,
                              unique=True)):  # fmt: skip
        replicas = draw(st.integers(1, 3))
        elastic = draw(st.booleans())
        roles.append(RoleSpec(
            name=name, replicas=replicas, command="true",
            min_replicas=draw(st.integers(1, replicas)) if elastic else None,
            max_replicas=replicas + draw(st.integers(0, 2)) if elastic else None,
            resources=Resources(
                # 0.1 and 0.2: float sums, so the order capacity is summed in shows.
                cpu=draw(st.sampled_from([0.1, 0.2, 0.5, 1, 2])),
                memory_mb=draw(st.sampled_from([256, 1024])),
                gpu=draw(st.sampled_from([0, 0.3, 0.5, 1, 2])),
                gpu_type=draw(st.sampled_from([None, None, "V100"])),
            ),
            node_selector=draw(st.sampled_from([[], [], [EnvVar(name="zone", value="a")]])),
            ports=draw(st.one_of(st.just([]), st.just([]), st.lists(st.builds(
                PortSpec, label=st.sampled_from(["http", "ssh"]),
                begin_at=st.one_of(st.just(0), st.integers(PORT_BASE, PORT_BASE + 8)),
                count=st.integers(1, 2)), max_size=1))),
        ))  # fmt: skip
    return JobSpec(name="j", queue=draw(st.sampled_from(QUEUES)),
                   priority=draw(st.integers(1, 4)), roles=roles)  # fmt: skip


OPS = ["end", "stop", "retry", "scale", "interrupted", "preempt-later", "drain", "undrain",
       "remove", "add", "cycle"]  # fmt: skip
events = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), job_specs()),
        st.tuples(st.just("submit"), job_specs()),
        st.tuples(st.sampled_from(OPS), st.integers(0, 9)),
    ),
    min_size=1,
    max_size=24,
)
rules = st.sampled_from([
    Rules(),
    Rules(max_preemptions=1),
    Rules(order=Fifo(), victims=LowestPriority()),
    Rules(victims=None, backfill=False),
])  # fmt: skip
policies = st.sampled_from(["trainyard", "fgd", "first-fit", "best-fit", "random"])


def plain_event(state: SchedulerState, op: str, arg: int) -> bool:
    """A job ended or stopped, a node drained or undrained (``arg`` picks which): False
    when ``op`` is none of those, or there is nothing to pick."""
    placed, queued = sorted(state.placed), sorted(state.queued)
    names = [n.name for n in state.cluster.nodes]
    if op == "end" and placed:
        state.release(placed[arg % len(placed)])
    elif op == "stop" and queued:
        state.dequeue(queued[arg % len(queued)])
    elif op == "drain" and names:
        state.drain_node(names[arg % len(names)])
    elif op == "undrain" and names:
        state.undrain_node(names[arg % len(names)])
    else:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=cluster_nodes(), queues=queue_specs(QUEUES), plan=events, rule=rules, policy=policies)
def test_every_cycle_decides_as_one_derived_afresh(
    nodes: list[NodeSpec],
    queues: list[str | QueueSpec],
    plan: list,  # type: ignore[type-arg]
    rule: Rules,
    policy: str,
) -> None:
    state = SchedulerState(ClusterSpec(nodes=nodes, queues=queues), scorer=scorer_named(policy),
                           rules=rule)  # fmt: skip
    spare = [n.model_copy(update={"name": f"extra{i}"}) for i, n in enumerate(nodes)]
    seq = 0
    now = 0.0
    deferred_victims: list[tuple[str, str]] = []
    for op, arg in plan:
        now += 1.0
        names = [n.name for n in state.cluster.nodes]
        placed, queued = sorted(state.placed), sorted(state.queued)
        if op == "submit":
            seq += 1
            state.enqueue(QueuedJob(f"job{seq}", arg, arrival_seq=seq))
        elif plain_event(state, op, arg):
            pass
        elif op == "retry" and placed:
            job_id = placed[arg % len(placed)]
            allocation = state.release(job_id)
            assert allocation is not None
            seq += 1
            state.enqueue(QueuedJob(job_id, allocation.spec, arrival_seq=seq, attempt=2))
        elif op == "scale" and queued:
            # The same job queued again with another size (ScaleJob while it waits).
            job = state.queued[queued[arg % len(queued)]]
            role = job.spec.roles[0]
            bigger = role.model_copy(update={"replicas": role.replicas + 1, "min_replicas": None,
                                             "max_replicas": None})  # fmt: skip
            spec = job.spec.model_copy(update={"roles": [bigger, *job.spec.roles[1:]]})
            state.enqueue(QueuedJob(job.job_id, spec, job.arrival_seq, job.attempt))
        elif op == "interrupted" and state.interrupting:
            victim = sorted(state.interrupting)[arg % len(state.interrupting)]
            allocation = state.release(victim)
            if allocation is not None:
                seq += 1
                state.enqueue(QueuedJob(victim, allocation.spec, arrival_seq=seq, attempt=2))
        elif op == "preempt-later" and deferred_victims:
            victim, by = deferred_victims.pop(arg % len(deferred_victims))
            if victim in state.placed:
                state.preempting(victim, by)
        elif op == "remove" and names:
            for job_id in state.remove_node(names[arg % len(names)]):
                state.interrupting.setdefault(job_id, None)
        elif op == "add" and spare:
            state.add_node(spare.pop())

        assert_kept_equals_fresh(state)
        assert_shortcuts_reserve_alike(state, now)
        expected = state.reference_cycle(now, scorer=scorer_named(state.scorer.name))
        decisions = state.cycle(now)
        assert decisions == expected
        assert growth(state) == growth_afresh(state)
        for decision in decisions:
            if isinstance(decision, Placed):
                state.commit(decision.allocation, placed_at=now)
            elif isinstance(decision, Preempt):
                for victim in decision.victims:
                    # Some preemptions are stored at once, some a few events later, as
                    # the service may (the victims keep their capacity meanwhile).
                    if len(deferred_victims) % 2 or seq % 3:
                        state.preempting(victim, decision.job_id)
                    else:
                        deferred_victims.append((victim, decision.job_id))
        # A cycle right after, on what it just decided: the memo's case.
        assert state.cycle(now) == state.reference_cycle(now)


def assert_kept_equals_fresh(state: SchedulerState) -> None:
    fresh = Snapshot.of(state.cluster, state.placed.values())
    assert state.snapshot().nodes == fresh.nodes
    groups = {key: list(names) for key, names in state.snapshot().groups().items()}
    assert groups == {key: list(names) for key, names in fresh.groups().items()}
    assert state.context().workload == typical_workload(state._demands())
    assert (
        state.context().workload_by_gpus
        == target_workloads(Counter(state._demands()), *capacity_milli(state.cluster.nodes))[1]
    )
    running = state._up_to_date().running
    assert set(running) == set(state.placed)
    fresh_index = RunningIndex.of(running, state.cluster.queue)
    assert state.queue_usage() == fresh_index.used
    assert state._up_to_date().borrowed() == fresh_index.borrowed


def assert_shortcuts_reserve_alike(state: SchedulerState, now: float) -> None:
    """The heads' reservations (which decide what may be backfilled) and the cluster
    without some running jobs (what preemption simulates) are the same when the cycle
    looks only at the nodes a placement can reach or a release changes (``fit_only``)."""
    found = []
    for fit_only in (True, False):
        running = dict(state._up_to_date().running)
        for job_id, by in state.interrupting.items():
            if job_id in running:
                running[job_id] = type(running[job_id])(
                    running[job_id].allocation, state.placed_at.get(job_id, 0.0), True, by
                )
        memo = CycleMemo()
        snapshot, context = Snapshot.of(state.cluster, state.placed.values()), state.context()
        memo.start(snapshot, state.scorer, context, state.drained)
        cycle = _Cycle(
            snapshot=snapshot, running=running, queues=state.cluster.queue,
            drained=state.drained, preemptions=state.preemptions, now=now, rules=state.rules,
            scorer=state.scorer, context=context,
            index=RunningIndex.of(running, state.cluster.queue), memo=memo, fit_only=fit_only,
        )  # fmt: skip
        cycle.run(state.queued.values())
        placed = sorted(state.placed)
        gone_sets = [set(), set(placed), *({job_id} for job_id in placed),
                     set(placed[::2])]  # fmt: skip
        released = [cycle._released(gone).nodes for gone in gone_sets]
        found.append((cycle.reserved, cycle.decisions, released))
    assert found[0] == found[1]


def growth_afresh(state: SchedulerState) -> list[tuple[str, str, int]]:
    """growth.py as it was, every snapshot derived from all the allocations."""
    quota_waits: set[str] = set()
    used: dict[str, Usage] = {}
    for allocation in state.placed.values():
        queue = allocation.spec.queue
        used[queue] = used.get(queue, Usage()) + usage_of(allocation.spec)
    for job in state.queued.values():
        queue = job.spec.queue
        qspec = state.cluster.queue(queue)
        smallest = usage_of(at_step(job.spec, last_step(job.spec)))
        if within(qspec.quota, used.get(queue, Usage()) + smallest) or (
            qspec.borrowing and state.preemptions.get(job.job_id, 0) < state.rules.max_preemptions
        ):
            return []
        quota_waits.add(queue)
    grown: list[tuple[str, str, int]] = []
    allocations = dict(state.placed)
    for job_id in sorted(state.placed, key=lambda j: (state.placed_at.get(j, 0.0), j)):
        spec = allocations[job_id].spec
        if job_id in state.interrupting or not is_elastic(spec) or spec.queue in quota_waits:
            continue
        others = Snapshot.of(state.cluster, [a for j, a in allocations.items() if j != job_id])
        qspec = state.cluster.queue(spec.queue)
        base = used.get(spec.queue, Usage()) - usage_of(spec)
        may_borrow = qspec.borrowing and (
            state.preemptions.get(job_id, 0) < state.rules.max_preemptions
        )
        for step in range(_room(spec)):
            size = _grown(spec, step)
            if not (within(qspec.quota, base + usage_of(size)) or may_borrow):
                continue
            outcome = place_job(size, others, drained=state.drained, job_id=job_id,
                                scorer=state.scorer, context=state.context())  # fmt: skip
            if isinstance(outcome, Plan):
                allocations[job_id] = type(allocations[job_id])(job_id, size, outcome.tasks)
                used[spec.queue] = base + usage_of(size)
                grown += [(job_id, new.name, new.replicas)
                          for old, new in zip(spec.roles, size.roles, strict=True)
                          if new.replicas > old.replicas]  # fmt: skip
                break
    return grown


demands = st.builds(
    Demand,
    cpu_milli=st.sampled_from([0, 500, 1000, 4000]),
    memory_mib=st.integers(0, 5000),
    gpu_count=st.integers(0, 2),
    gpu_milli=st.sampled_from([0, 300, 500, 1000]),
    gpu_models=st.sampled_from([frozenset(), frozenset({"v100"}), frozenset({"v100", "a100"})]),
)


@given(st.lists(demands, max_size=40))
def test_the_workload_from_counts_is_the_workload_from_every_task(tasks: list[Demand]) -> None:
    assert typical_of_counts(Counter(tasks)) == typical_workload(tasks)


def _gpu_job(gpus: int) -> JobSpec:
    resources = Resources(cpu=1, memory_mb=512, gpu=gpus)
    return JobSpec(name="j", roles=[RoleSpec(name="w", command="true", resources=resources)])


def test_a_rare_multi_gpu_job_changes_the_workload_by_gpus_alone() -> None:
    # One 8-GPU job among 21 one-GPU ones: not in the paper's workload (95 % of the
    # tasks), in the one by GPUs. The kept context must follow, not keep the old pair.
    nodes = [NodeSpec(name=f"n{i}", cpu=96, memory_mb=393_216, gpus=8) for i in range(4)]
    state = SchedulerState(ClusterSpec(nodes=nodes), scorer=scorer_named("trainyard"))
    for seq in range(20):
        state.enqueue(QueuedJob(f"a{seq}", _gpu_job(1), arrival_seq=seq))
    for decision in state.cycle(1.0):
        if isinstance(decision, Placed):
            state.commit(decision.allocation, placed_at=1.0)
    before = state.context()
    state.enqueue(QueuedJob("big", _gpu_job(8), arrival_seq=100))
    state.enqueue(QueuedJob("one", _gpu_job(1), arrival_seq=101))
    after = state.context()
    assert after.workload == before.workload
    assert after.workload_by_gpus != before.workload_by_gpus
    assert (
        after.workload_by_gpus
        == target_workloads(Counter(state._demands()), *capacity_milli(nodes))[1]
    )
    assert state.cycle(2.0) == state.reference_cycle(2.0)


def test_gang_misfits_go_when_the_workload_by_gpus_alone_changes() -> None:
    one = Demand(cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000)
    eight = Demand(cpu_milli=1000, memory_mib=1024, gpu_count=8, gpu_milli=1000)
    paper = (Typical(one, 1.0),)
    memo = CycleMemo()
    snapshot = Snapshot.of(ClusterSpec(nodes=[]), [])
    scorer = scorer_named("trainyard")
    misfit = Unschedulable(("no room",))
    memo.start(snapshot, scorer, ClusterContext(workload=paper), frozenset())
    memo.gang_misfits[(snapshot, ("x",))] = misfit
    memo.start(snapshot, scorer, ClusterContext(workload=paper), frozenset())
    assert memo.gang_misfits  # an equal context keeps them
    wide = (Typical(one, 0.9), Typical(eight, 0.1))
    memo.start(snapshot, scorer, ClusterContext(workload=paper, workload_by_gpus=wide), frozenset())
    assert not memo.gang_misfits


def test_an_unchanged_state_keeps_its_snapshot_and_workload() -> None:
    cluster = ClusterSpec(nodes=[NodeSpec(name="a", cpu=4, memory_mb=4096, gpus=1)])
    state = SchedulerState(cluster)
    spec = JobSpec(
        name="j",
        roles=[
            RoleSpec(
                name="w",
                replicas=1,
                command="true",
                resources=Resources(cpu=1, memory_mb=512, gpu=1),
            )
        ],
    )
    state.enqueue(QueuedJob("a", spec, 1))
    state.enqueue(QueuedJob("b", spec.model_copy(update={"priority": 1}), 2))
    (first,) = [d for d in state.cycle(1.0) if isinstance(d, Placed)]
    state.commit(first.allocation, placed_at=1.0)
    snapshot, context = state.snapshot(), state.context()
    state.cycle(2.0)
    assert state.snapshot() is snapshot and state.context() is context
    state.release("a")
    assert state.snapshot() is not snapshot
    assert state.snapshot().node("a").gpu_free == (1000,)


# --- arrivals carry the last cycle on ---------------------------------------------------

one_shape_events = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 4)),
        st.tuples(st.just("submit"), st.integers(1, 4)),
        st.tuples(st.just("submit"), st.integers(1, 4)),
        st.tuples(
            st.sampled_from(["end", "stop", "cycle", "drain", "undrain"]), st.integers(0, 9)
        ),  # fmt: skip
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=cluster_nodes(), queues=queue_specs(QUEUES), shape=job_specs(),
       plan=one_shape_events, rule=rules, policy=policies,
       priorities=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       spread=st.booleans())  # fmt: skip
def test_arrivals_alone_carry_the_last_cycle_on_as_a_whole_cycle_decides(
    nodes: list[NodeSpec],
    queues: list[str | QueueSpec],
    shape: JobSpec,
    plan: list,  # type: ignore[type-arg]
    rule: Rules,
    policy: str,
    priorities: list[int],
    spread: bool,
) -> None:
    """Jobs of one shape (so the target workload stays the same object and a cycle whose
    only news is arrivals carries the last one on) with their queue and priority drawn:
    every cycle, carried on or not, decides as one derived afresh."""
    state = SchedulerState(ClusterSpec(nodes=nodes, queues=queues), scorer=scorer_named(policy),
                           rules=rule)  # fmt: skip
    seq, now = 0, 0.0
    previous: list[Decision] = []
    for op, arg in plan:
        now += 1.0
        if op == "submit":
            for _ in range(arg):
                seq += 1
                spec = shape.model_copy(update={
                    "priority": priorities[seq % len(priorities)],
                    "queue": QUEUES[seq % 2] if spread else shape.queue,
                })  # fmt: skip
                state.enqueue(QueuedJob(f"job{seq}", spec, arrival_seq=seq))
        else:
            plain_event(state, op, arg)
        expected = state.reference_cycle(now, scorer=scorer_named(state.scorer.name))
        decisions = state.cycle(now)
        assert decisions == expected
        if state.carried:  # what it repeats is what the last cycle decided
            assert decisions[: state.carried] == previous[: state.carried]
        previous = decisions
        for decision in decisions:
            if isinstance(decision, Placed):
                state.commit(decision.allocation, placed_at=now)
            elif isinstance(decision, Preempt):
                for victim in decision.victims:
                    state.preempting(victim, decision.job_id)


def test_a_cycle_whose_only_news_is_arrivals_walks_only_them() -> None:
    """One node full, a queue behind it: arrivals after the queue's last job carry the
    last cycle on (``carried`` counts the decisions it repeats); an arrival that goes
    ahead of waiting jobs, or anything else that changed, makes a whole cycle."""
    one_cpu = RoleSpec(name="w", replicas=1, command="true", resources=Resources(cpu=1))

    def job(seq: int, priority: int = 3) -> QueuedJob:
        return QueuedJob(f"j{seq}", JobSpec(name="j", priority=priority, roles=[one_cpu]), seq)

    state = SchedulerState(ClusterSpec(nodes=[NodeSpec(name="n", cpu=2, memory_mb=4096)]),
                           rules=Rules(victims=None))  # fmt: skip

    def cycle() -> list[Decision]:
        decisions = state.cycle()
        assert decisions == state.reference_cycle()
        for decision in decisions:
            if isinstance(decision, Placed):
                state.commit(decision.allocation)
        return decisions

    for seq in range(1, 6):
        state.enqueue(job(seq))
    assert len([d for d in cycle() if isinstance(d, Placed)]) == 2
    assert state.carried == 0
    cycle()  # the placements were news: a whole cycle, three waiting
    assert state.carried == 0 and len(state.queued) == 3
    for seq in range(6, 9):
        state.enqueue(job(seq))
    decisions = cycle()
    assert state.carried == 3
    new = [(d.job_id, d.position) for d in decisions[3:] if isinstance(d, Waiting)]
    assert new == [("j6", 4), ("j7", 5), ("j8", 6)]
    cycle()  # nothing new: the same decisions, all carried
    assert state.carried == 6
    state.enqueue(job(9, priority=5))  # ahead of every waiting job (no preemption here)
    decisions = cycle()
    assert state.carried == 0 and decisions[0].job_id == "j9"
    state.enqueue(job(10))
    cycle()
    assert state.carried == 7
    state.release(next(iter(state.placed)))  # capacity freed: the head is placed
    decisions = state.cycle()
    assert state.carried == 0 and isinstance(decisions[0], Placed)
    # Not committed (the service could not store it): a cycle after an arrival must not
    # carry on from one that counted that placement.
    state.enqueue(job(11))
    assert state.cycle() == state.reference_cycle()
    assert state.carried == 0


def _one_cpu(priority: int = 3, replicas: int = 1, cpu: float = 1) -> JobSpec:
    role = RoleSpec(name="w", replicas=replicas, command="true", resources=Resources(cpu=cpu))
    return JobSpec(name="j", priority=priority, roles=[role])


def _apply(state: SchedulerState, now: float | None = None) -> list[Decision]:
    decisions = state.cycle(now)
    for decision in decisions:
        if isinstance(decision, Placed):
            state.commit(decision.allocation, placed_at=now)
    return decisions


def _full_node(jobs: int) -> SchedulerState:
    """One one-CPU node, ``jobs`` jobs: one placed, the rest waiting after a whole cycle."""
    state = SchedulerState(ClusterSpec(nodes=[NodeSpec(name="n", cpu=1, memory_mb=4096)]),
                           rules=Rules(victims=None))  # fmt: skip
    for seq in range(1, jobs + 1):
        state.enqueue(QueuedJob(f"j{seq}", _one_cpu(), seq))
    _apply(state)
    _apply(state)
    return state


@pytest.mark.parametrize("stop_first", [True, False])
def test_a_cycle_cut_short_is_not_carried_on(
    monkeypatch: pytest.MonkeyPatch, stop_first: bool
) -> None:
    """A cycle that raised (a whole one, or one carried on with arrivals) leaves no end to
    carry on: the next cycle, with nothing else changed, decides as a whole one and
    loses none of the arrivals."""
    state = _full_node(5)
    real = _Cycle._consider
    raised: list[str] = []

    def once(self: _Cycle, job: QueuedJob) -> None:
        if job.job_id in ("j3", "j6") and not raised:
            raised.append(job.job_id)
            raise MemoryError("transient")
        real(self, job)

    monkeypatch.setattr(_Cycle, "_consider", once)
    if stop_first:
        state.dequeue("j5")  # news: the cycle is whole, and it raises at j3
    else:
        state.enqueue(QueuedJob("j6", _one_cpu(), 6))  # carried on, and it raises at j6
        state.enqueue(QueuedJob("j7", _one_cpu(), 7))
    with pytest.raises(MemoryError):
        state.cycle(10.0)
    assert raised == ["j3" if stop_first else "j6"]
    assert state.cycle(11.0) == state.reference_cycle(11.0)
    assert state.carried == 0


def test_what_a_cycle_returned_does_not_grow_when_the_next_carries_it_on() -> None:
    state = _full_node(4)
    state.dequeue("j4")  # news: a whole cycle
    first = state.cycle()
    kept = list(first)
    assert state.carried == 0
    state.enqueue(QueuedJob("j4", _one_cpu(), 4))
    assert len(state.cycle()) == len(kept) + 1 and state.carried == len(kept)
    assert first == kept


def test_news_that_is_no_arrival_makes_a_whole_cycle() -> None:
    """A job queued again under its id (its priority raised), another policy, other
    rules: each is news, though the workload and snapshot stay the same objects."""
    state = _full_node(3)
    state.enqueue(QueuedJob("j3", _one_cpu(priority=5), 3))
    assert state.cycle() == state.reference_cycle() and state.carried == 0

    nodes = [NodeSpec(name="n1", cpu=4, memory_mb=4096), NodeSpec(name="n2", cpu=2, memory_mb=4096)]
    state = SchedulerState(ClusterSpec(nodes=nodes), scorer=scorer_named("first-fit"),
                           rules=Rules(victims=None))  # fmt: skip
    state.enqueue(QueuedJob("y", _one_cpu(), 0))
    _apply(state)
    _apply(state)
    state.scorer = scorer_named("best-fit")
    state.enqueue(QueuedJob("x", _one_cpu(), 1))
    decisions = state.cycle()
    assert decisions == state.reference_cycle() and state.carried == 0

    state = SchedulerState(ClusterSpec(nodes=[NodeSpec(name="n", cpu=1, memory_mb=4096)]),
                           rules=Rules(victims=None))  # fmt: skip
    state.enqueue(QueuedJob("low", _one_cpu(priority=1, cpu=2), 1))
    state.enqueue(QueuedJob("high", _one_cpu(priority=5, cpu=2), 2))
    _apply(state)
    _apply(state)
    state.rules = Rules(victims=None, order=Fifo())
    assert state.cycle() == state.reference_cycle() and state.carried == 0


def _preempting_state() -> SchedulerState:
    """Two low-priority jobs running on a 3-CPU node (a: one task from t=0, b: two from
    t=8) and an empty queue after a whole cycle at t=10. Least work at t=10 is b (4 < 10),
    at t=100 a (100 < 184)."""
    cluster = ClusterSpec(nodes=[NodeSpec(name="n", cpu=3, memory_mb=4096)],
                          queues=[QueueSpec(name="default", preemption=True)])  # fmt: skip
    state = SchedulerState(cluster, rules=Rules(victims=LeastWork()))
    state.enqueue(QueuedJob("a", _one_cpu(priority=1), 1))
    _apply(state, 0.0)
    state.enqueue(QueuedJob("b", _one_cpu(priority=1, replicas=2), 2))
    _apply(state, 8.0)
    _apply(state, 10.0)
    state.enqueue(QueuedJob("h", _one_cpu(priority=5), 3))
    return state


def test_an_arrival_that_preempts_ranks_its_victims_at_the_cycles_time() -> None:
    state = _preempting_state()
    expected = state.reference_cycle(100.0)
    assert state.cycle(100.0) == expected
    assert [d.victims for d in expected if isinstance(d, Preempt)] == [("a",)]


def test_a_preemption_not_stored_is_decided_again_at_the_new_time() -> None:
    state = _preempting_state()
    first = state.cycle(10.0)
    assert [d.victims for d in first if isinstance(d, Preempt)] == [("b",)]
    # The service could not store it (no preempting() follows): decided again at t=100.
    assert state.cycle(100.0) == state.reference_cycle(100.0)
    assert state.carried == 0
