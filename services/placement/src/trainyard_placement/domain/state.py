"""The scheduler's state: queued jobs, the allocations of placed jobs, and the nodes.

Free capacity is never a counter here: :meth:`SchedulerState.snapshot` is what
``Snapshot.of`` would derive from the allocations, so releasing a job is only forgetting
its allocation. What a cycle needs (the snapshot, the target workload, each queue's
usage and borrowers) is kept between cycles and brought up to date for what changed: a
node a job came to or left is derived again from the allocations on it, in the order
they were placed, so it is the same node ``Snapshot.of`` gives (docs/placement.md,
"Speed"). ``reference_cycle`` derives everything afresh, for tests to compare.

What the service layer calls, besides enqueue / commit / release / cycle:

- ``preempting(victim, by)`` once a ``Preempt`` decision's interruption of ``victim`` is
  stored; the victim keeps its allocation until ``release``.
- ``interrupting[job] = None`` while a job's attempt is being ended for another cause
  (paused, scaled, node removed): it is then never chosen as a victim.
- ``add_node`` / ``drain_node`` / ``undrain_node`` / ``remove_node`` for node
  administration; each only changes what later cycles may use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.jobspec import JobSpec

from .capacity import Allocation, NodeFree, Snapshot, empty_node
from .gpu_share import MILLI, Demand
from .plugins import Rules
from .policies import scorer_named
from .queue import CycleMemo, Decision, QueuedJob, Running, RunningIndex, schedule
from .quota import Usage, borrowers, unlimited, usage_of
from .scoring import (
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    ClusterContext,
    Scorer,
    model_scarcity,
    target_workloads,
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
    # What cycles need, kept up to date by the methods below (None: derive it at the next
    # use). queued and placed change only through them.
    _kept: _Kept | None = field(default=None, init=False, repr=False, compare=False)
    # Counts every change but an arrival; the jobs that arrived since the last cycle; and
    # what that cycle started from. A cycle whose only news is arrivals carries the last
    # one on with them (_Cycle.extend) instead of walking the whole queue again.
    _changes: int = field(default=0, init=False, repr=False, compare=False)
    _arrived: list[QueuedJob] = field(default_factory=list, init=False, repr=False,
                                      compare=False)  # fmt: skip
    _last_inputs: tuple[object, ...] | None = field(default=None, init=False, repr=False,
                                                    compare=False)  # fmt: skip
    # How many decisions at the head of the last cycle's are the cycle before's,
    # unchanged (all of them Waiting): 0 after a whole cycle.
    carried: int = field(default=0, init=False, repr=False, compare=False)

    def snapshot(self) -> Snapshot:
        """Free capacity of every node, drained ones included."""
        return self._up_to_date().snapshot()

    def last_reservations(self) -> list[tuple[str, Allocation]]:
        """What the last cycle kept for the heads that still wait: each one's queue, and
        where it goes once what runs there ends (queue.py, conservative backfill)."""
        last = self._kept.memo.last if self._kept is not None else None
        if last is None:
            return []
        return [(queue, kept) for queue, kept in last.reserved if kept.job_id in self.queued]

    def enqueue(self, job: QueuedJob) -> None:
        old = self.queued.get(job.job_id)
        self.queued[job.job_id] = job
        if old is None:
            self._arrived.append(job)
        else:
            self._changes += 1
        if self._kept is not None:
            if old is not None:
                self._kept.shapes(old.spec, -1)
            self._kept.shapes(job.spec, 1)

    def dequeue(self, job_id: str) -> QueuedJob | None:
        job = self.queued.pop(job_id, None)
        self._changes += 1
        if job is not None and self._kept is not None:
            self._kept.shapes(job.spec, -1)
            self._kept.memo.forget(job_id)
        return job

    def commit(self, allocation: Allocation, placed_at: float | None = None) -> None:
        self.dequeue(allocation.job_id)  # counts as a change
        # An elastic job's stored allocation may come with the spec as submitted.
        spec = sized_to(allocation.spec, allocation.tasks)
        if spec is not allocation.spec:
            allocation = Allocation(allocation.job_id, spec, allocation.tasks)
        if placed_at is None:
            placed_at = max(self.placed_at.values(), default=0.0) + 1
        old = self.placed.get(allocation.job_id)
        self.placed[allocation.job_id] = allocation
        self.placed_at[allocation.job_id] = placed_at
        if self._kept is not None:
            if old is not None:
                self._kept.unplace(old)
            self._kept.place(allocation, placed_at)

    def release(self, job_id: str) -> Allocation | None:
        self._changes += 1
        self.placed_at.pop(job_id, None)
        self.interrupting.pop(job_id, None)
        allocation = self.placed.pop(job_id, None)
        if allocation is not None and self._kept is not None:
            self._kept.unplace(allocation, gone=True)
        return allocation

    def preempting(self, victim: str, by: str) -> None:
        """``victim`` is being preempted for queued job ``by``: counted once."""
        self._changes += 1
        if self.interrupting.get(victim) != by:
            self.preemptions[victim] = self.preemptions.get(victim, 0) + 1
        self.interrupting[victim] = by

    def cycle(self, now: float | None = None) -> list[Decision]:
        """One scheduling pass. ``now`` is on the clock of ``placed_at`` (how long the
        placed jobs have run, for choosing victims); by default just after the last
        placement."""
        if now is None:
            now = max(self.placed_at.values(), default=0.0) + 1
        kept = self._up_to_date()
        arrived, self._arrived = self._arrived, []
        inputs = self._inputs(kept)
        last = kept.memo.last
        try:
            if last is not None and self._same_inputs(inputs):
                decisions = last.extend(arrived, now)
                if decisions is not None:
                    self.carried = last.carried
                    return decisions
            decisions = self._whole_cycle(kept, now)
        except BaseException:
            # A cycle cut short is no end to carry on (and the arrivals it took are
            # still queued): the next one is whole.
            kept.memo.last, self._last_inputs, self.carried = None, None, 0
            raise
        self._last_inputs, self.carried = inputs, 0
        return decisions

    def _whole_cycle(self, kept: _Kept, now: float) -> list[Decision]:
        running: Mapping[str, Running] = kept.running
        preempting: dict[str, list[str]] = {}
        interrupted = [job_id for job_id in self.interrupting if job_id in running]
        if interrupted:
            running = dict(running)
            for job_id in interrupted:
                by = self.interrupting[job_id]
                running[job_id] = Running(kept.running[job_id].allocation,
                                          self.placed_at.get(job_id, 0.0), True, by)  # fmt: skip
                if by is not None:
                    preempting.setdefault(by, []).append(job_id)
        index = RunningIndex(
            used=kept.used, borrowed=kept.borrowed(), by_priority=kept.by_priority,
            preempting={by: tuple(sorted(jobs)) for by, jobs in preempting.items()},
            order=kept.seq, on_node=kept.on_node,
        )  # fmt: skip
        return schedule(
            self.queued.values(), kept.snapshot(), self.scorer, kept.context(),
            rules=self.rules, running=running, queues=self.cluster.queue,
            drained=self.drained, preemptions=self.preemptions, now=now, index=index,
            memo=kept.memo,
        )  # fmt: skip

    def _inputs(self, kept: _Kept) -> tuple[object, ...]:
        """What a cycle starts from besides the queue: the changes counted, then what
        may be set from outside (the policy, the rules, drained nodes, preemptions and
        interruptions restored by the service), then the kept snapshot, workload and
        scarcity (the same objects while they stay the same)."""
        context = kept.context()
        return (self._changes, self.scorer, self.rules, frozenset(self.drained),
                dict(self.preemptions), dict(self.interrupting),
                (context.max_cpu_milli, context.max_gpu_milli), kept.snapshot(),
                context.workload, context.workload_by_gpus, context.scarcity)  # fmt: skip

    def _same_inputs(self, inputs: tuple[object, ...]) -> bool:
        last = self._last_inputs
        return (last is not None and last[0] == inputs[0] and last[1] is inputs[1]
                and last[2] is inputs[2] and last[3:7] == inputs[3:7]
                and last[7] is inputs[7] and last[8] is inputs[8]
                and last[9] is inputs[9] and last[10] is inputs[10])  # fmt: skip

    def reference_cycle(
        self, now: float | None = None, *, scorer: Scorer | None = None
    ) -> list[Decision]:
        """``cycle`` with everything derived afresh from the placed and queued jobs, as
        every cycle once did: what ``cycle`` must decide too (a check for tests).
        ``scorer``: another instance of the policy, so that what the state's scorer
        remembers from cycle to cycle is checked as well."""
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
        context = context_of(self.cluster.nodes, Counter(self._demands()))
        return schedule(
            self.queued.values(), Snapshot.of(self.cluster, self.placed.values()),
            scorer or self.scorer, context, rules=self.rules, running=running,
            queues=self.cluster.queue, drained=self.drained, preemptions=self.preemptions,
            now=now,
        )  # fmt: skip

    def snapshot_with(self, changes: Mapping[str, Allocation | None]) -> Snapshot:
        """The snapshot as if each placed job named in ``changes`` held the allocation
        given instead (None: nothing), keeping its place in the placement order."""
        return self._up_to_date().snapshot_with(changes)

    def queue_usage(self) -> dict[str, Usage]:
        """What each queue's placed jobs use (a key for every queue with one)."""
        return dict(self._up_to_date().used)

    def _up_to_date(self) -> _Kept:
        """The kept derivations, made afresh when there are none yet or the cluster is
        another (a node added or removed)."""
        if self._kept is None or self._kept.cluster is not self.cluster:
            self._kept = _Kept(self)
        return self._kept

    # --- nodes --------------------------------------------------------------------

    def is_drained(self, name: str) -> bool:
        return name in self.drained

    def add_node(self, spec: NodeSpec) -> None:
        """A new node, after the others (ValueError if the name is taken)."""
        if any(node.name == spec.name for node in self.cluster.nodes):
            raise ValueError(f"name: node {spec.name} already exists")
        self._changes += 1
        self.cluster = self.cluster.model_copy(update={"nodes": [*self.cluster.nodes, spec]})

    def drain_node(self, name: str) -> None:
        """Nothing new goes to the node; its jobs keep running (KeyError if unknown)."""
        self._node(name)
        self._changes += 1
        self.drained.add(name)

    def undrain_node(self, name: str) -> None:
        self._node(name)
        self._changes += 1
        self.drained.discard(name)

    def remove_node(self, name: str) -> list[str]:
        """The node leaves the cluster; returns the placed jobs with a task on it, which
        the caller interrupts (cause node_removed). Until they are released they keep
        what they hold on their other nodes; capacity on the removed node is gone."""
        self._changes += 1
        self.cluster = self.cluster.model_copy(
            update={"nodes": [n for n in self.cluster.nodes if n.name != name]}
        )
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
        placed and waiting now stand for the target workload. The same object while
        they stay the same (the scorers' memos follow it)."""
        return self._up_to_date().context()

    def _demands(self) -> Iterator[Demand]:
        specs = [a.spec for a in self.placed.values()] + [j.spec for j in self.queued.values()]
        for spec in specs:
            for role in spec.roles:
                demand = Demand.of(role.resources)
                for _ in range(role.replicas):
                    yield demand


def capacity_milli(nodes: Iterable[NodeSpec]) -> tuple[int, int]:
    """The cluster's milli-CPU and milli-GPU."""
    cpu = gpu = 0
    for node in nodes:
        cpu += round(node.cpu * MILLI)
        gpu += node.gpus * MILLI
    return cpu, gpu


def context_of(nodes: Sequence[NodeSpec], counts: Mapping[Demand, int]) -> ClusterContext:
    """The context the policies measure against, derived afresh: the target workloads and
    the GPU models' scarcity of the tasks counted by demand, on these nodes."""
    workload, by_gpus = target_workloads(counts, *capacity_milli(nodes))
    return ClusterContext(
        workload=workload,
        workload_by_gpus=by_gpus,
        scarcity=model_scarcity(counts, gpus_by_model(nodes)),
        max_cpu_milli=max([MAX_SPEC_CPU_MILLI, *(round(n.cpu * MILLI) for n in nodes)]),
        max_gpu_milli=max([MAX_SPEC_GPU_MILLI, *(n.gpus * MILLI for n in nodes)]),
    )


def gpus_by_model(nodes: Iterable[NodeSpec]) -> dict[str, int]:
    """The cluster's GPUs by model (lower case, as tasks name them); nodes whose GPUs
    name no model count under ""."""
    found: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            model = (node.gpu_type or "").lower()
            found[model] = found.get(model, 0) + node.gpus
    return found


class _Kept:
    """What SchedulerState keeps for its cycles, for one cluster: the snapshot (nodes to
    derive again marked ``dirty``), the target workload's task shapes counted, each
    queue's usage, jobs and borrowers, the running jobs as a cycle sees them, and the
    cycles' memo. Built from the state's jobs; then the state tells it each change."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        self.cluster = state.cluster
        nodes = state.cluster.nodes
        self.empty: dict[str, NodeFree] = {n.name: empty_node(n) for n in nodes}
        self.limits = (
            max([MAX_SPEC_CPU_MILLI, *(round(n.cpu * MILLI) for n in nodes)]),
            max([MAX_SPEC_GPU_MILLI, *(n.gpus * MILLI for n in nodes)]),
        )
        self.capacity = capacity_milli(nodes)
        self.gpus_by_model = gpus_by_model(nodes)
        self._snapshot = Snapshot.of(state.cluster, state.placed.values())
        self.dirty: set[str] = set()
        # Placed jobs: their place in the placement order, the jobs on each node.
        self.seq: dict[str, int] = {}
        self.next_seq = 0
        self.on_node: dict[str, dict[str, None]] = {}
        self.used: dict[str, Usage] = {}
        self.usage: dict[str, Usage] = {}
        self.members: dict[str, dict[str, None]] = {}
        self.by_priority: dict[tuple[str, int], dict[str, None]] = {}
        self.borrowers: dict[str, list[str]] = {}
        self.stale_queues: set[str] = set()
        self._borrowed: set[str] | None = set()
        self.running: dict[str, Running] = {}
        self.counts: Counter[Demand] = Counter()
        self._context: ClusterContext | None = None
        self.memo = CycleMemo()
        for allocation in state.placed.values():
            self.place(allocation, state.placed_at.get(allocation.job_id, 0.0))
        self.dirty.clear()  # the snapshot was derived from all of them
        for job in state.queued.values():
            self.shapes(job.spec, 1)

    # --- changes ------------------------------------------------------------------

    def place(self, allocation: Allocation, placed_at: float) -> None:
        job_id, spec = allocation.job_id, allocation.spec
        if job_id not in self.seq:
            self.seq[job_id] = self.next_seq
            self.next_seq += 1
        for task in allocation.tasks:
            self.on_node.setdefault(task.node, {})[job_id] = None
            self.dirty.add(task.node)
        usage = self.usage[job_id] = usage_of(spec)
        self.used[spec.queue] = self.used.get(spec.queue, Usage()) + usage
        self.members.setdefault(spec.queue, {})[job_id] = None
        self.by_priority.setdefault((spec.queue, spec.priority), {})[job_id] = None
        self.stale_queues.add(spec.queue)
        self.running[job_id] = Running(allocation=allocation, placed_at=placed_at)
        self.shapes(spec, 1)

    def unplace(self, allocation: Allocation, *, gone: bool = False) -> None:
        """Take a placed job's allocation out; ``gone``: the job is no longer placed (a
        job placed again keeps its place in the order)."""
        job_id, spec = allocation.job_id, allocation.spec
        for task in allocation.tasks:
            jobs = self.on_node.get(task.node)
            if jobs is not None:
                jobs.pop(job_id, None)
                if not jobs:
                    del self.on_node[task.node]
            self.dirty.add(task.node)
        queue = spec.queue
        self.used[queue] = self.used[queue] - self.usage.pop(job_id)
        members = self.members[queue]
        del members[job_id]
        if not members:
            del self.members[queue], self.used[queue]
        key = (queue, spec.priority)
        del self.by_priority[key][job_id]
        if not self.by_priority[key]:
            del self.by_priority[key]
        self.stale_queues.add(queue)
        del self.running[job_id]
        self.shapes(spec, -1)
        if gone:
            del self.seq[job_id]

    def shapes(self, spec: JobSpec, sign: int) -> None:
        """Count a job's tasks in (1) or out (-1) of the target workload."""
        counts = self.counts
        for role in spec.roles:
            if role.replicas:
                demand = Demand.of(role.resources)
                count = counts[demand] + sign * role.replicas
                if count:
                    counts[demand] = count
                else:
                    del counts[demand]
        self._context = None

    # --- what a cycle reads ---------------------------------------------------------

    def snapshot(self) -> Snapshot:
        if self.dirty:
            self._snapshot = self._snapshot.with_nodes(self._derive(self.dirty, {}))
            self.dirty = set()
        return self._snapshot

    def snapshot_with(self, changes: Mapping[str, Allocation | None]) -> Snapshot:
        placed = self.state.placed
        names: set[str] = set()
        for job_id, allocation in changes.items():
            for held in (placed.get(job_id), allocation):
                if held is not None:
                    names.update(task.node for task in held.tasks)
        return self.snapshot().with_nodes(self._derive(names, changes))

    def _derive(
        self, names: Iterable[str], changes: Mapping[str, Allocation | None]
    ) -> dict[str, NodeFree]:
        """The named nodes from nothing allocated, less the allocations on them in the
        order they were placed (``Snapshot.of``'s sums, so the same floats)."""
        names = [name for name in names if name in self.empty]
        jobs: set[str] = set()
        for name in names:
            jobs.update(self.on_node.get(name, ()))
        jobs.update(changes)
        placed, seq = self.state.placed, self.seq
        allocations = []
        for job_id in sorted(jobs, key=seq.__getitem__):
            allocation = changes[job_id] if job_id in changes else placed[job_id]
            if allocation is not None:
                allocations.append(allocation)
        derived = Snapshot(self.empty[name] for name in names).with_allocations(allocations)
        return dict(derived.by_name())

    def borrowed(self) -> set[str]:
        if self.stale_queues:
            for queue in self.stale_queues:
                self.borrowers.pop(queue, None)
                quota = self.cluster.queue(queue).quota
                if queue not in self.members or unlimited(quota):
                    continue
                placed_at = self.state.placed_at
                jobs = sorted((placed_at.get(j, 0.0), j) for j in self.members[queue])
                found = borrowers(quota, [(j, self.usage[j]) for _, j in jobs])
                if found:
                    self.borrowers[queue] = found
            self.stale_queues.clear()
            self._borrowed = None
        if self._borrowed is None:
            self._borrowed = {j for found in self.borrowers.values() for j in found}
        return self._borrowed

    def context(self) -> ClusterContext:
        if self._context is None:
            workloads = (
                *target_workloads(self.counts, *self.capacity),
                model_scarcity(self.counts, self.gpus_by_model),
            )
            old = self.memo.workload
            if old is not None and old == workloads:
                workloads = old  # the same objects: the scorers' memos need not compare
            self._context = ClusterContext(
                workload=workloads[0],
                workload_by_gpus=workloads[1],
                scarcity=workloads[2],
                max_cpu_milli=self.limits[0],
                max_gpu_milli=self.limits[1],
            )
        return self._context
