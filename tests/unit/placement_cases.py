"""A small cluster world for the placement-rule tests: nodes, jobs and a scheduler state
that applies each cycle's decisions as the service does (commit a placement, record a
preemption; a victim is released when the test says it ended)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from trainyard_common.cluster import ClusterSpec, NodeSpec, QueueQuota, QueueSpec
from trainyard_common.jobspec import EnvVar, JobSpec, Resources, RoleSpec
from trainyard_placement.domain import (
    Decision,
    Placed,
    Preempt,
    QueuedJob,
    Rules,
    SchedulerState,
    Waiting,
)


def node(
    name: str,
    *,
    gpus: int = 0,
    cpu: float = 16,
    memory_mb: int = 65536,
    labels: dict[str, str] | None = None,
) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu=cpu,
        memory_mb=memory_mb,
        gpus=gpus,
        gpu_type="A100" if gpus else None,
        labels=[EnvVar(name=k, value=v) for k, v in (labels or {}).items()],
    )


def queue(
    name: str,
    *,
    gpus: float | None = None,
    cpu: float | None = None,
    borrowing: bool = True,
    preemption: bool = True,
) -> QueueSpec:
    return QueueSpec(
        name=name, quota=QueueQuota(gpus=gpus, cpu=cpu), borrowing=borrowing, preemption=preemption
    )


def role(
    name: str = "worker",
    *,
    replicas: int = 1,
    gpus: float = 0,
    cpu: float = 1,
    selector: dict[str, str] | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
) -> RoleSpec:
    return RoleSpec(
        name=name, replicas=replicas, command="train", min_replicas=min_replicas,
        max_replicas=max_replicas, resources=Resources(cpu=cpu, memory_mb=1024, gpu=gpus),
        node_selector=[EnvVar(name=k, value=v) for k, v in (selector or {}).items()],
    )  # fmt: skip


def job(*roles: RoleSpec, queue: str = "default", priority: int = 5) -> JobSpec:
    return JobSpec(name="j", queue=queue, priority=priority, roles=list(roles or [role()]))


def gpus(n: float, *, replicas: int = 1, **kw: object) -> JobSpec:
    """A one-role job of ``replicas`` tasks with ``n`` GPUs each."""
    return job(role(gpus=n, replicas=replicas), **kw)  # type: ignore[arg-type]


@dataclass
class World:
    state: SchedulerState
    seq: int = 0
    last: list[Decision] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        *nodes: NodeSpec,
        queues: list[str | QueueSpec] | None = None,
        rules: Rules | None = None,
    ) -> World:
        cluster = ClusterSpec(nodes=list(nodes), queues=queues or ["default"])
        return cls(SchedulerState(cluster, rules=rules or Rules()))

    def submit(self, job_id: str, spec: JobSpec) -> World:
        self.seq += 1
        self.state.enqueue(QueuedJob(job_id, spec, arrival_seq=self.seq))
        return self

    def cycle(self) -> list[Decision]:
        self.last = self.state.cycle()
        for decision in self.last:
            if isinstance(decision, Placed):
                self.state.commit(decision.allocation)
            elif isinstance(decision, Preempt):
                for victim in decision.victims:
                    self.state.preempting(victim, decision.job_id)
        return self.last

    def interrupted(self, job_id: str) -> None:
        """The victim's attempt ended: its capacity is free, it queues again."""
        allocation = self.state.release(job_id)
        assert allocation is not None
        self.seq += 1
        self.state.enqueue(QueuedJob(job_id, allocation.spec, arrival_seq=self.seq, attempt=2))

    def placed(self) -> list[str]:
        return sorted(self.state.placed)

    def waiting(self, job_id: str) -> Waiting:
        return next(d for d in self.last if isinstance(d, Waiting) and d.job_id == job_id)

    def preempts(self) -> list[Preempt]:
        return [d for d in self.last if isinstance(d, Preempt)]

    def nodes_of(self, job_id: str) -> set[str]:
        return {t.node for t in self.state.placed[job_id].tasks}


@st.composite
def queue_specs(draw: st.DrawFn, names: Sequence[str]) -> list[str | QueueSpec]:
    """Each named queue either plain (no quota) or with a drawn quota and rules."""
    result: list[str | QueueSpec] = []
    for name in names:
        if draw(st.booleans()):
            result.append(name)  # no quota
            continue
        result.append(QueueSpec(
            name=name,
            quota=QueueQuota(gpus=draw(st.sampled_from([None, 0, 1, 2, 4])),
                             cpu=draw(st.sampled_from([None, 1, 4, 8]))),
            borrowing=draw(st.booleans()), preemption=draw(st.booleans()),
        ))  # fmt: skip
    return result


def cycle_and_apply(state: SchedulerState) -> list[Decision]:
    """One cycle of ``state``, its decisions applied as the service applies them: a
    placement committed, each victim marked as being preempted (never one twice)."""
    decisions = state.cycle()
    for decision in decisions:
        if isinstance(decision, Placed):
            state.commit(decision.allocation)
        elif isinstance(decision, Preempt):
            for victim in decision.victims:
                assert victim not in state.interrupting, (victim, decisions)
                state.preempting(victim, decision.job_id)
    return decisions
