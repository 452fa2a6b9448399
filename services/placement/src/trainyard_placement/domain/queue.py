"""One scheduling pass over the queue.

The cycle, in order (docs/placement.md has the rules with examples):

1. Order the queue (``Rules.order``: priority, then arrival).
2. Try each job as a gang at the largest size that fits (elastic roles, sizes.py), on
   the nodes its roles may use (eligible.py), within its queue's quota, or beyond it on
   idle capacity when the queue borrows (quota.py). A fitting plan is committed to the
   snapshot the next job sees.
3. The first job of a queue that does not fit is that queue's head. If lower-priority
   jobs of its queue, or jobs borrowing beyond another queue's quota, would make it fit
   once gone, it preempts the cheapest such set (``Preempt``) and waits for them to end;
   their capacity stays theirs until they do.
4. The head keeps a reservation: where it will go once its victims (or, without any,
   every running job) are gone, and the quota it needs. A job behind the head is placed
   only on capacity that reservation does not touch (conservative backfill), so it can
   never delay the head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from trainyard_common.cluster import QueueSpec
from trainyard_common.jobspec import JobSpec

from .capacity import Allocation, NodeFree, Snapshot
from .eligible import place_job
from .gang import Plan, Unschedulable
from .gpu_share import MILLI
from .plugins import Candidate, Rules
from .quota import Usage, borrowers, over_quota_text, usage_of, within
from .scoring import ClusterContext, Scorer
from .sizes import at_step, last_step


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    spec: JobSpec
    arrival_seq: int
    attempt: int = 1


@dataclass(frozen=True)
class Placed:
    job_id: str
    allocation: Allocation
    attempt: int = 1


@dataclass(frozen=True)
class Waiting:
    """A job left in the queue; ``position`` counts from 1 at the head."""

    job_id: str
    position: int
    reasons: tuple[str, ...]
    attempt: int = 1


@dataclass(frozen=True)
class Preempt:
    """End the ``victims``' attempts so job ``job_id`` fits (``reason`` is for the
    victims: who preempted them and why). The victims keep their capacity until their
    end is known (``SchedulerState.release``); the job waits for it, and the same
    cycle also reports it as ``Waiting``."""

    job_id: str
    victims: tuple[str, ...]
    reason: str
    attempt: int = 1


Decision = Placed | Waiting | Preempt


@dataclass(frozen=True)
class Running:
    """A placed job as the cycle sees it. ``placed_at`` orders placements (and, with
    the cycle's ``now``, says how long its tasks have run); ``interrupting`` is set while
    its attempt is being ended for any cause, ``preempted_for`` when a queued job
    preempted it."""

    allocation: Allocation
    placed_at: float = 0.0
    interrupting: bool = False
    preempted_for: str | None = None


def queue_order(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
    """Higher priority first, then by arrival."""
    return sorted(queue, key=lambda job: (-job.spec.priority, job.arrival_seq, job.job_id))


def schedule(
    queue: Iterable[QueuedJob],
    snapshot: Snapshot,
    scorer: Scorer | None = None,
    context: ClusterContext | None = None,
    *,
    rules: Rules | None = None,
    running: Mapping[str, Running] | None = None,
    queues: Callable[[str], QueueSpec] = lambda name: QueueSpec(name=name),
    drained: AbstractSet[str] = frozenset(),
    preemptions: Mapping[str, int] | None = None,
    now: float = 0.0,
) -> list[Decision]:
    """One cycle. ``snapshot`` is the free capacity now (of every node, drained ones
    too), ``running`` the placed jobs it was derived from (without them nothing can be
    preempted), ``preemptions`` how often each job was preempted."""
    cycle = _Cycle(
        snapshot=snapshot, running=running or {}, queues=queues, drained=drained,
        preemptions=preemptions or {}, now=now, rules=rules or Rules(), scorer=scorer,
        context=context,
    )  # fmt: skip
    return cycle.run(queue)


@dataclass
class _Fit:
    spec: JobSpec
    plan: Plan
    ask: Usage


@dataclass
class _Misfit:
    reasons: tuple[str, ...]
    # Beyond the quota without borrowing: no capacity would help.
    quota_blocked: bool


@dataclass
class _Cycle:
    snapshot: Snapshot
    running: Mapping[str, Running]
    queues: Callable[[str], QueueSpec]
    drained: AbstractSet[str]
    preemptions: Mapping[str, int]
    now: float
    rules: Rules
    scorer: Scorer | None
    context: ClusterContext | None
    decisions: list[Decision] = field(default_factory=list)
    # Jobs placed by this cycle, on top of ``running``.
    extra: list[Allocation] = field(default_factory=list)
    used: dict[str, Usage] = field(default_factory=dict)
    # The head of each queue that has one, its reservation and the quota kept for it.
    heads: dict[str, str] = field(default_factory=dict)
    reserved: list[tuple[str, Allocation]] = field(default_factory=list)
    held: dict[str, Usage] = field(default_factory=dict)
    position: int = 0

    def __post_init__(self) -> None:
        self.current = self.snapshot
        self._views: dict[tuple[int, str | None, int], Snapshot] = {}
        self._views_of: Snapshot | None = None
        self._misfits: dict[tuple[int, tuple[str, ...]], Unschedulable] = {}
        for running in self.running.values():
            spec = running.allocation.spec
            self.used[spec.queue] = self.used.get(spec.queue, Usage()) + usage_of(spec)
        self.multi_queue = len({r.allocation.spec.queue for r in self.running.values()}) > 1
        self.borrowed = self._borrowers()

    def run(self, queue: Iterable[QueuedJob]) -> list[Decision]:
        jobs = self.rules.order.order(queue)
        self.multi_queue = self.multi_queue or len({j.spec.queue for j in jobs}) > 1
        for job in jobs:
            self._consider(job)
        return self.decisions

    # --- one job ------------------------------------------------------------------

    def _consider(self, job: QueuedJob) -> None:
        queue = job.spec.queue
        head = self.heads.get(queue)
        if head is not None and not self.rules.backfill:
            self._wait(job, (self._behind(head, queue),))
            return
        outcome = self._fit(job, self.current)
        if isinstance(outcome, _Fit):
            allocation = Allocation(job.job_id, outcome.spec, outcome.plan.tasks)
            self.extra.append(allocation)
            self.current = self.current.with_allocation(allocation)
            self._misfits.clear()  # keyed by views of the snapshot just replaced
            self.used[queue] = self.used.get(queue, Usage()) + outcome.ask
            self.decisions.append(Placed(job.job_id, allocation, job.attempt))
            return
        if head is not None:
            self._wait(job, (self._behind(head, queue),))
            return
        self.heads[queue] = job.job_id
        self._head(job, outcome)

    def _head(self, job: QueuedJob, misfit: _Misfit) -> None:
        queue = job.spec.queue
        smallest = at_step(job.spec, last_step(job.spec))
        ask = usage_of(smallest)
        self.held[queue] = ask
        pending = tuple(sorted(
            job_id for job_id, r in self.running.items()
            if r.interrupting and r.preempted_for == job.job_id
        ))  # fmt: skip
        plan: Plan | None = None
        victims: tuple[str, ...] = ()
        if pending:
            plan = self._with_released(job, smallest, pending)
        if plan is None and self.rules.victims is not None:
            candidates = self._candidates(job, ask)
            if candidates:
                chosen = self.rules.victims.choose(
                    candidates,
                    lambda ids: self._with_released(job, smallest, pending + ids) is not None,
                )
                if chosen:
                    victims = chosen
                    plan = self._with_released(job, smallest, pending + victims)
        if plan is not None:
            if victims:
                self.decisions.append(Preempt(
                    job.job_id, victims, self._preempt_reason(job, victims), job.attempt))  # fmt: skip
            self.reserved.append((queue, Allocation(job.job_id, smallest, plan.tasks)))
            names = ", ".join(pending + victims)
            self._wait(job, (
                f"waiting for preempted job{'s' if len(pending + victims) > 1 else ''} "
                f"{names} to end: {'they hold' if len(pending + victims) > 1 else 'it holds'} "
                "capacity this job needs",
            ))  # fmt: skip
            return
        if not misfit.quota_blocked:
            reservation = self._reservation(job, smallest)
            if reservation is not None:
                self.reserved.append((queue, reservation))
        self._wait(job, misfit.reasons)

    def _fit(self, job: QueuedJob, base: Snapshot) -> _Fit | _Misfit:
        """The largest size of the job that fits on ``base``: the smallest size first
        (if that fails, nothing does), then a binary search over the steps between."""
        last = last_step(job.spec)
        found = self._try(job, at_step(job.spec, last), base)
        if not isinstance(found, _Fit):
            return found
        low, high = 0, last
        while low < high:
            middle = (low + high) // 2
            attempt = self._try(job, at_step(job.spec, middle), base)
            if isinstance(attempt, _Fit):
                found, high = attempt, middle
            else:
                low = middle + 1
        return found

    def _try(self, job: QueuedJob, spec: JobSpec, base: Snapshot) -> _Fit | _Misfit:
        queue = job.spec.queue
        qspec = self.queues(queue)
        ask = usage_of(spec)
        used = self.used.get(queue, Usage())
        held = self.held.get(queue, Usage()) if self.heads.get(queue) != job.job_id else Usage()
        guaranteed = within(qspec.quota, used + held + ask)
        quota_lines: list[str] = []
        if not guaranteed:
            quota_lines = over_quota_text(queue, qspec.quota, used, held, ask,
                                          self.heads.get(queue))  # fmt: skip
            if not self._may_borrow(job, qspec):
                times = self.preemptions.get(job.job_id, 0)
                why = "its queue does not borrow" if not qspec.borrowing else (
                    f"it was preempted {times} time{'s' if times != 1 else ''}, so it no "
                    "longer borrows")  # fmt: skip
                return _Misfit((*quota_lines[:-1], f"{quota_lines[-1]} ({why})"), True)
        view = self._view(queue, borrowing=not guaranteed, base=base)
        # A long queue holds many jobs of one shape: one that did not fit on this view
        # says the others do not either (cleared whenever the snapshot changes).
        shape = (id(view), tuple(role.model_dump_json(exclude={"command", "env", "image"})
                                 for role in spec.roles))  # fmt: skip
        outcome = self._misfits.get(shape)
        if outcome is None:
            outcome = place_job(spec, view, drained=self.drained, job_id=job.job_id,
                                scorer=self.scorer, context=self.context)  # fmt: skip
            if isinstance(outcome, Unschedulable):
                self._misfits[shape] = outcome
        if isinstance(outcome, Unschedulable):
            if quota_lines:
                quota_lines[-1] += "; beyond the quota it may only borrow idle capacity"
            return _Misfit((*quota_lines, *outcome.reasons), False)
        return _Fit(spec, outcome, ask)

    # --- views of the cluster ---------------------------------------------------

    def _view(self, queue: str, *, borrowing: bool, base: Snapshot) -> Snapshot:
        """``base`` less the heads' reservations this job must respect: its own queue's
        head always, every head when it would borrow (reserved capacity is not idle)."""
        kept = [a for q, a in self.reserved if borrowing or q == queue]
        if not kept:
            return base
        # The jobs waiting behind heads all look at the same few views: derived once
        # per change of the snapshot or of the reservations.
        key = (id(base), None if borrowing else queue, len(self.reserved))
        view = self._views.get(key)
        if view is None:
            if base is not self._views_of:
                self._views.clear()
                self._views_of = base
            view = self._views[key] = base.with_allocations(kept)
        return view

    def _released(self, gone: AbstractSet[str]) -> Snapshot:
        """The cluster as if the ``gone`` jobs had ended."""
        allocations = [r.allocation for job_id, r in self.running.items() if job_id not in gone]
        return _empty(self.snapshot).with_allocations([*allocations, *self.extra])

    def _with_released(
        self, job: QueuedJob, spec: JobSpec, gone: tuple[str, ...]
    ) -> Plan | None:
        """Where the job (at ``spec``) would go once ``gone`` ended, if it fits then —
        quota counted without the gone jobs of its queue too."""
        queue = job.spec.queue
        freed = [self.running[j].allocation.spec for j in gone]
        used = self.used.get(queue, Usage())
        for spec_gone in freed:
            if spec_gone.queue == queue:
                used = used - usage_of(spec_gone)
        qspec = self.queues(queue)
        guaranteed = within(qspec.quota, used + usage_of(spec))
        if not guaranteed and not self._may_borrow(job, qspec):
            return None
        view = self._view(queue, borrowing=not guaranteed, base=self._released(set(gone)))
        outcome = place_job(spec, view, drained=self.drained, job_id=job.job_id,
                            scorer=self.scorer, context=self.context)  # fmt: skip
        return outcome if isinstance(outcome, Plan) else None

    def _reservation(self, job: QueuedJob, spec: JobSpec) -> Allocation | None:
        """Where the head goes once every running job has ended, on the nodes that are
        freest now (first fit over them): the capacity later jobs must leave alone. None
        when it fits nowhere even then (nothing to keep for it)."""
        free_now = {node.name: node for node in self.current.nodes}
        nodes = sorted(_empty(self.snapshot).nodes, key=lambda n: _freeness(free_now[n.name]))
        outcome = place_job(spec, Snapshot(nodes), drained=self.drained, job_id=job.job_id)
        return Allocation(job.job_id, spec, outcome.tasks) if isinstance(outcome, Plan) else None

    # --- preemption -------------------------------------------------------------

    def _candidates(self, job: QueuedJob, ask: Usage) -> list[Candidate]:
        queue = job.spec.queue
        qspec = self.queues(queue)
        same = qspec.preemption
        reclaim = within(qspec.quota, self.used.get(queue, Usage()) + ask)
        found = []
        for job_id, r in self.running.items():
            spec = r.allocation.spec
            if r.interrupting:
                continue
            if spec.queue == queue:
                if not (same and spec.priority < job.spec.priority
                        and self.preemptions.get(job_id, 0) < self.rules.max_preemptions):
                    continue
                borrowed = False
            elif not (reclaim and job_id in self.borrowed):
                continue
            else:
                borrowed = True
            tasks = len(r.allocation.tasks)
            found.append(Candidate(
                job_id=job_id, queue=spec.queue, priority=spec.priority, tasks=tasks,
                work=tasks * max(self.now - r.placed_at, 0.0), placed_at=r.placed_at,
                borrowed=borrowed,
            ))  # fmt: skip
        return found

    def _borrowers(self) -> set[str]:
        by_queue: dict[str, list[tuple[float, str, Usage]]] = {}
        for job_id, r in self.running.items():
            spec = r.allocation.spec
            by_queue.setdefault(spec.queue, []).append((r.placed_at, job_id, usage_of(spec)))
        found: set[str] = set()
        for queue, jobs in by_queue.items():
            jobs.sort()
            found.update(borrowers(self.queues(queue).quota, [(j, u) for _, j, u in jobs]))
        return found

    def _may_borrow(self, job: QueuedJob, qspec: QueueSpec) -> bool:
        # Reclaimed this often, a job stops borrowing: it could otherwise be lent idle
        # capacity and reclaimed again forever.
        return qspec.borrowing and (
            self.preemptions.get(job.job_id, 0) < self.rules.max_preemptions)

    def _preempt_reason(self, job: QueuedJob, victims: tuple[str, ...]) -> str:
        reason = f"preempted by job {job.job_id} (priority {job.spec.priority})"
        queue = job.spec.queue
        if any(v in self.borrowed and self.running[v].allocation.spec.queue != queue
               for v in victims):
            reason += f" to reclaim queue {queue}'s quota"
        return reason

    # --- waiting ----------------------------------------------------------------

    def _wait(self, job: QueuedJob, reasons: tuple[str, ...]) -> None:
        self.position += 1
        self.decisions.append(Waiting(job.job_id, self.position, reasons, job.attempt))

    def _behind(self, head: str, queue: str) -> str:
        where = f"the queue {queue}" if self.multi_queue else "the queue"
        return f"waiting behind job {head} at the head of {where}"


def _empty(snapshot: Snapshot) -> Snapshot:
    """The same nodes with nothing allocated."""
    return Snapshot(
        NodeFree(spec=n.spec, cpu=n.spec.cpu, memory_mb=n.spec.memory_mb,
                 gpu_free=(MILLI,) * n.spec.gpus)
        for n in snapshot.nodes
    )  # fmt: skip


def _freeness(node: NodeFree) -> tuple[int, float, int]:
    # Sorted ascending: the most free GPU milli, then CPU, then memory first.
    return (-sum(node.gpu_free), -node.cpu, -node.memory_mb)
