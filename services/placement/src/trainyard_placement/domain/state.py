"""The scheduler's state: queued jobs, the allocations of placed jobs, and the nodes.

Free capacity is never stored here; :meth:`SchedulerState.snapshot` derives it from the
allocations each time, so releasing a job is only forgetting its allocation.

What the service layer calls, besides enqueue / commit / release / cycle:

- ``preempting(victim, by)`` once a ``Preempt`` decision's interruption of ``victim`` is
  stored; the victim keeps its allocation until ``release``.
- ``interrupting[job] = None`` while a job's attempt is being ended for another cause
  (paused, scaled, node removed): it is then never chosen as a victim.
- ``add_node`` / ``drain_node`` / ``undrain_node`` / ``remove_node`` for node
  administration; each only changes what later cycles may use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from trainyard_common.cluster import ClusterSpec, NodeSpec

from .capacity import Allocation, Snapshot
from .gpu_share import MILLI, Demand
from .plugins import Rules
from .policies import scorer_named
from .queue import Decision, QueuedJob, Running, schedule
from .scoring import (
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    ClusterContext,
    Scorer,
    typical_workload,
)
from .sizes import sized_to


@dataclass
class SchedulerState:
    cluster: ClusterSpec
    queued: dict[str, QueuedJob] = field(default_factory=dict)
    placed: dict[str, Allocation] = field(default_factory=dict)
    # The placement policy (YARD_PLACEMENT_POLICY, chosen in bootstrap).
    scorer: Scorer = field(default_factory=lambda: scorer_named(None))
    # Queue order, preemption and backfill (YARD_PLACEMENT_*, plugins.py).
    rules: Rules = field(default_factory=Rules)
    # Cordoned nodes: nothing new is placed there, what runs there stays.
    drained: set[str] = field(default_factory=set)
    # When each placed job was placed: wall-clock seconds from the service, or a
    # logical clock (one tick per placement) when the caller gives no time.
    placed_at: dict[str, float] = field(default_factory=dict)
    # Times each job was preempted (kept across its attempts; stored by the service).
    preemptions: dict[str, int] = field(default_factory=dict)
    # Placed jobs whose attempt is being ended: the queued job that preempted each,
    # or None for another cause.
    interrupting: dict[str, str | None] = field(default_factory=dict)

    def snapshot(self) -> Snapshot:
        """Free capacity of every node, drained ones included."""
        return Snapshot.of(self.cluster, self.placed.values())

    def enqueue(self, job: QueuedJob) -> None:
        self.queued[job.job_id] = job

    def dequeue(self, job_id: str) -> QueuedJob | None:
        return self.queued.pop(job_id, None)

    def commit(self, allocation: Allocation, placed_at: float | None = None) -> None:
        self.queued.pop(allocation.job_id, None)
        # An elastic job's stored allocation may come with the spec as submitted.
        spec = sized_to(allocation.spec, allocation.tasks)
        if spec is not allocation.spec:
            allocation = Allocation(allocation.job_id, spec, allocation.tasks)
        self.placed[allocation.job_id] = allocation
        if placed_at is None:
            placed_at = max(self.placed_at.values(), default=0.0) + 1
        self.placed_at[allocation.job_id] = placed_at

    def release(self, job_id: str) -> Allocation | None:
        self.placed_at.pop(job_id, None)
        self.interrupting.pop(job_id, None)
        return self.placed.pop(job_id, None)

    def preempting(self, victim: str, by: str) -> None:
        """``victim`` is being preempted for queued job ``by``: counted once."""
        if self.interrupting.get(victim) != by:
            self.preemptions[victim] = self.preemptions.get(victim, 0) + 1
        self.interrupting[victim] = by

    def cycle(self, now: float | None = None) -> list[Decision]:
        """One scheduling pass. ``now`` is on the clock of ``placed_at`` (how long the
        placed jobs have run, for choosing victims); by default just after the last
        placement."""
        if now is None:
            now = max(self.placed_at.values(), default=0.0) + 1
        running = {
            job_id: Running(
                allocation=allocation,
                placed_at=self.placed_at.get(job_id, 0.0),
                interrupting=job_id in self.interrupting,
                preempted_for=self.interrupting.get(job_id),
            )
            for job_id, allocation in self.placed.items()
        }
        return schedule(
            self.queued.values(), self.snapshot(), self.scorer, self.context(),
            rules=self.rules, running=running, queues=self.cluster.queue,
            drained=self.drained, preemptions=self.preemptions, now=now,
        )  # fmt: skip

    # --- nodes --------------------------------------------------------------------

    def is_drained(self, name: str) -> bool:
        return name in self.drained

    def add_node(self, spec: NodeSpec) -> None:
        """A new node, after the others (ValueError if the name is taken)."""
        if any(node.name == spec.name for node in self.cluster.nodes):
            raise ValueError(f"name: node {spec.name} already exists")
        self.cluster = self.cluster.model_copy(update={"nodes": [*self.cluster.nodes, spec]})

    def drain_node(self, name: str) -> None:
        """Nothing new goes to the node; its jobs keep running (KeyError if unknown)."""
        self._node(name)
        self.drained.add(name)

    def undrain_node(self, name: str) -> None:
        self._node(name)
        self.drained.discard(name)

    def remove_node(self, name: str) -> list[str]:
        """The node leaves the cluster; returns the placed jobs with a task on it, which
        the caller interrupts (cause node_removed). Until they are released they keep
        what they hold on their other nodes; capacity on the removed node is gone."""
        self.cluster = self.cluster.model_copy(
            update={"nodes": [n for n in self.cluster.nodes if n.name != name]})
        self.drained.discard(name)
        return sorted(job_id for job_id, allocation in self.placed.items()
                      if any(task.node == name for task in allocation.tasks))  # fmt: skip

    def _node(self, name: str) -> NodeSpec:
        for node in self.cluster.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    # --- policies -----------------------------------------------------------------

    def context(self) -> ClusterContext:
        """What fragmentation-aware policies measure against: the shapes of the tasks
        placed and waiting now stand for the target workload."""
        nodes = self.cluster.nodes
        return ClusterContext(
            workload=typical_workload(self._demands()),
            max_cpu_milli=max([MAX_SPEC_CPU_MILLI, *(round(n.cpu * MILLI) for n in nodes)]),
            max_gpu_milli=max([MAX_SPEC_GPU_MILLI, *(n.gpus * MILLI for n in nodes)]),
        )

    def _demands(self) -> Iterator[Demand]:
        specs = [a.spec for a in self.placed.values()] + [j.spec for j in self.queued.values()]
        for spec in specs:
            for role in spec.roles:
                demand = Demand.of(role.resources)
                for _ in range(role.replicas):
                    yield demand
