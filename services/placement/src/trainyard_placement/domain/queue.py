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

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from heapq import merge

from trainyard_common.cluster import QueueSpec
from trainyard_common.jobspec import JobSpec, RoleSpec

from .capacity import CPU_EPSILON, Allocation, GroupKey, NodeFree, Snapshot
from .eligible import place_job, selector_matches
from .gang import Plan, Unschedulable
from .gpu_share import MILLI, Demand
from .plugins import Candidate, Rules
from .quota import Usage, borrowers, over_quota_text, usage_of, within
from .scoring import ClusterContext, Scarcity, Scorer, Typical
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


@dataclass(frozen=True)
class RunningIndex:
    """What a cycle reads of the running jobs as a whole: each queue's usage (a key for
    every queue with a running job), the borrowers, the jobs by (queue, priority) (where
    preemption candidates are found), the jobs being preempted for each queued job
    (sorted), each job's place in ``running``'s order and the jobs with a task on each
    node. ``of`` derives it from ``running``; SchedulerState keeps an equal one up to
    date between cycles instead of deriving it every cycle."""

    used: Mapping[str, Usage]
    borrowed: AbstractSet[str]
    by_priority: Mapping[tuple[str, int], Collection[str]]
    preempting: Mapping[str, tuple[str, ...]]
    order: Mapping[str, int]
    on_node: Mapping[str, Collection[str]]

    @classmethod
    def of(cls, running: Mapping[str, Running], queues: Callable[[str], QueueSpec]) -> RunningIndex:
        used: dict[str, Usage] = {}
        by_priority: dict[tuple[str, int], list[str]] = {}
        preempting: dict[str, list[str]] = {}
        on_node: dict[str, dict[str, None]] = {}
        for job_id, r in running.items():
            spec = r.allocation.spec
            used[spec.queue] = used.get(spec.queue, Usage()) + usage_of(spec)
            by_priority.setdefault((spec.queue, spec.priority), []).append(job_id)
            if r.interrupting and r.preempted_for is not None:
                preempting.setdefault(r.preempted_for, []).append(job_id)
            for task in r.allocation.tasks:
                on_node.setdefault(task.node, {})[job_id] = None
        return cls(
            used=used, borrowed=borrowers_of(running, queues), by_priority=by_priority,
            preempting={job_id: tuple(sorted(v)) for job_id, v in preempting.items()},
            order={job_id: i for i, job_id in enumerate(running)}, on_node=on_node,
        )  # fmt: skip


def borrowers_of(running: Mapping[str, Running], queues: Callable[[str], QueueSpec]) -> set[str]:
    """Every queue's borrowers (quota.borrowers), its jobs in the order they were placed."""
    by_queue: dict[str, list[tuple[float, str, Usage]]] = {}
    for job_id, r in running.items():
        spec = r.allocation.spec
        by_queue.setdefault(spec.queue, []).append((r.placed_at, job_id, usage_of(spec)))
    found: set[str] = set()
    for queue, jobs in by_queue.items():
        jobs.sort()
        found.update(borrowers(queues(queue).quota, [(j, u) for _, j, u in jobs]))
    return found


@dataclass
class _Size:
    """A queued job at one step of its sizes (sizes.py), with what the cycle derives
    from it: its usage, and its shape (what place_job reads of its roles)."""

    spec: JobSpec
    ask: Usage
    shape: tuple[str, ...]
    ports: bool
    # Each role with tasks and its demand, for the fit-only check.
    demands: list[tuple[RoleSpec, Demand]]
    single: bool  # one task


@dataclass
class _JobFacts:
    job: QueuedJob
    last: int
    sizes: dict[int, _Size] = field(default_factory=dict)


@dataclass
class CycleMemo:
    """What cycles keep for the next ones (SchedulerState holds one per cluster): the
    cluster with nothing allocated, the sizes of each queued job, and what a cycle found
    on its starting snapshot — views less the heads' reservations, the shapes that fit
    nowhere there, the heads' reservations — for as long as the next cycle starts on the
    same snapshot with the same scorer and drained nodes (then they are what it would
    find again). Only deterministic scorers' misfits are kept, and only for shapes
    without ports: those are the same whichever job asked. A gang's misfit depends on
    where the scorer puts its first tasks, so on the target workloads too (the paper's
    and the one by GPUs) and the GPU models' scarcity: those are dropped when any of
    them changes (every arrival may change them); a single task fits nowhere whatever
    the scores, and reservations are first fit."""

    empty: Snapshot | None = None
    empty_state: dict[str, GroupKey] | None = None
    facts: dict[str, _JobFacts] = field(default_factory=dict)
    base: Snapshot | None = None
    scorer: Scorer | None = None
    # The context's target workloads and scarcity (ClusterContext.workload,
    # .workload_by_gpus, .scarcity).
    workload: tuple[tuple[Typical, ...], tuple[Typical, ...] | None, Scarcity] | None = None
    limits: tuple[int, int] | None = None
    drained: frozenset[str] = frozenset()
    views: list[tuple[str | None, list[Allocation], Snapshot]] = field(default_factory=list)
    misfits: dict[tuple[Snapshot, tuple[str, ...]], Unschedulable] = field(default_factory=dict)
    gang_misfits: dict[tuple[Snapshot, tuple[str, ...]], Unschedulable] = field(
        default_factory=dict
    )
    reservations: dict[str, tuple[QueuedJob, Allocation | None]] = field(default_factory=dict)
    # The last cycle run with this memo, which SchedulerState may carry on with the
    # jobs that arrived since (_Cycle.extend).
    last: _Cycle | None = None

    def start(
        self,
        snapshot: Snapshot,
        scorer: Scorer | None,
        context: ClusterContext | None,
        drained: AbstractSet[str],
    ) -> None:
        """Keep what the last cycle found if this one starts where it did."""
        workload = (
            (context.workload, context.workload_by_gpus, context.scarcity)
            if context is not None
            else None
        )
        limits = (context.max_cpu_milli, context.max_gpu_milli) if context is not None else None
        if not (snapshot is self.base and scorer is self.scorer and drained == self.drained):
            self.base, self.scorer, self.drained = snapshot, scorer, frozenset(drained)
            self.views, self.misfits, self.reservations = [], {}, {}
            self.gang_misfits = {}
        if workload != self.workload or limits != self.limits:
            self.workload, self.limits = workload, limits
            self.gang_misfits = {}

    def forget(self, job_id: str) -> None:
        self.facts.pop(job_id, None)
        self.reservations.pop(job_id, None)


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
    index: RunningIndex | None = None,
    memo: CycleMemo | None = None,
) -> list[Decision]:
    """One cycle. ``snapshot`` is the free capacity now (of every node, drained ones
    too), ``running`` the placed jobs it was derived from (without them nothing can be
    preempted), ``preemptions`` how often each job was preempted. ``index`` (by default
    derived from ``running``) and ``memo`` are what SchedulerState keeps between cycles
    so that a cycle derives only what changed; with a memo a cycle also finds whether a
    job behind its queue's head fits without explaining why not (nobody reads it). The
    decisions are the same without them."""
    running = running or {}
    if index is None:
        index = RunningIndex.of(running, queues)
    fit_only = memo is not None
    if memo is None:
        memo = CycleMemo()
    memo.start(snapshot, scorer, context, drained)
    cycle = _Cycle(
        snapshot=snapshot, running=running, queues=queues, drained=drained,
        preemptions=preemptions or {}, now=now, rules=rules or Rules(), scorer=scorer,
        context=context, index=index, memo=memo, fit_only=fit_only,
    )  # fmt: skip
    memo.last = cycle
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
    index: RunningIndex
    memo: CycleMemo
    fit_only: bool = False
    decisions: list[Decision] = field(default_factory=list)
    # Jobs placed by this cycle, on top of ``running``.
    extra: list[Allocation] = field(default_factory=list)
    used: dict[str, Usage] = field(default_factory=dict)
    # The head of each queue that has one, its reservation and the quota kept for it.
    heads: dict[str, str] = field(default_factory=dict)
    # Whose job each head is: a reason names another job only to that job's own user
    # (ids of other users' jobs are not to be learnt, docs/security.md).
    head_users: dict[str, str] = field(default_factory=dict)
    reserved: list[tuple[str, Allocation]] = field(default_factory=list)
    held: dict[str, Usage] = field(default_factory=dict)
    # Jobs this cycle already chose to preempt: another queue's head may not choose them
    # too (their capacity is reserved for the head that preempts them).
    chosen_victims: set[str] = field(default_factory=set)
    position: int = 0
    # What extend needs: whether a decision changed what later jobs see (a placement,
    # a preemption), the last job considered and the queues seen.
    changed: bool = False
    last_job: QueuedJob | None = None
    queue_names: set[str] = field(default_factory=set)
    # How many decisions the last extend found already made (all of them Waiting).
    carried: int = 0

    def __post_init__(self) -> None:
        self.current = self.snapshot
        self._views: dict[tuple[int, str | None, int], Snapshot] = {}
        self._views_of: Snapshot | None = None
        # Keyed by the view itself (kept alive, so no other view takes its id).
        self._misfits: dict[tuple[Snapshot, tuple[str, ...]], Unschedulable] = {}
        # Jobs behind a head that found no room, by what decided it (_behind_key): a
        # long queue of one shape asks the same question once per job. Cleared with
        # _misfits, whenever the cycle places a job.
        self._behind_misfits: set[tuple[object, ...]] = set()
        self._behind_text: dict[tuple[str, bool], tuple[str]] = {}
        self._qspecs: dict[str, QueueSpec] = {}
        self.used.update(self.index.used)
        self.multi_queue = len(self.index.used) > 1
        self.borrowed = self.index.borrowed
        # Misfits on the starting snapshot are the memo's, which the next cycle may keep.
        self._kept = self.scorer is None or self.scorer.deterministic

    def run(self, queue: Iterable[QueuedJob]) -> list[Decision]:
        jobs = self.rules.order.order(queue)
        self.queue_names = {j.spec.queue for j in jobs}
        self.multi_queue = self.multi_queue or len(self.queue_names) > 1
        for job in jobs:
            self._consider(job)
        if jobs:
            self.last_job = jobs[-1]
        return list(self.decisions)  # extend goes on appending to its own

    def extend(self, arrived: Iterable[QueuedJob], now: float) -> list[Decision] | None:
        """This cycle's decisions as if ``arrived`` had been in its queue, where that is
        this cycle carried on: it placed and preempted nothing (so its end is the state
        every later job of a cycle on the same inputs meets, and ``now``, which only
        ranks victims, entered none of its decisions), every arrival comes after its
        last job in the queue's order, and they bring no second queue (which rewords
        every "waiting behind"). The caller vouches that nothing else changed. None:
        run a whole cycle instead."""
        if self.changed:
            return None
        jobs = self.rules.order.order(arrived)
        if jobs and self.last_job is not None:
            first = jobs[0]
            if self.rules.order.order([first, self.last_job])[0] is first:
                return None
        queues = self.queue_names | {j.spec.queue for j in jobs}
        if (self.multi_queue or len(queues) > 1) != self.multi_queue:
            return None
        self.queue_names, self.now = queues, now
        self.carried = len(self.decisions)
        for job in jobs:
            self._consider(job)
        if jobs:
            self.last_job = jobs[-1]
        return list(self.decisions)

    # --- one job ------------------------------------------------------------------

    def _consider(self, job: QueuedJob) -> None:
        queue = job.spec.queue
        head = self.heads.get(queue)
        if head is not None and not self.rules.backfill:
            self._wait(job, self._behind(head, job))
            return
        key = self._behind_key(job) if head is not None else None
        if head is not None and key is not None and key in self._behind_misfits:
            self._wait(job, self._behind(head, job))
            return
        outcome = self._fit(job, self.current, reasons=head is None)
        if isinstance(outcome, _Fit):
            allocation = Allocation(job.job_id, outcome.spec, outcome.plan.tasks)
            self.extra.append(allocation)
            self.current = self.current.with_allocation(allocation)
            self._misfits = {}  # keyed by views of the snapshot just replaced
            self._behind_misfits = set()
            self.used[queue] = self.used.get(queue, Usage()) + outcome.ask
            self.decisions.append(Placed(job.job_id, allocation, job.attempt))
            self.changed = True
            return
        if head is not None:
            if key is not None:
                self._behind_misfits.add(key)
            self._wait(job, self._behind(head, job))
            return
        self.heads[queue] = job.job_id
        self.head_users[queue] = job.spec.user
        self._head(job, outcome)

    def _behind_key(self, job: QueuedJob) -> tuple[object, ...] | None:
        """What decides whether a job behind its queue's head fits on the current
        snapshot, where one alike job's answer is every such job's (with a memo, a
        deterministic scorer, no ports: CycleMemo's misfits): its smallest size's
        shape, its queue, whether it may borrow, the reservations made so far (they
        only grow within a cycle). The queue stands for its usage and the quota kept
        for its head: while the answers are kept neither changes (usage only with a
        placement, which clears them; the quota once, when the queue's head is found,
        before any job behind it is asked). None: the job must be tried itself."""
        if not (self.fit_only and self._kept):
            return None
        facts = self._facts(job)
        size = self._size(facts, facts.last)  # _fit tries it first: no fit, no job
        if size.ports:
            return None
        queue = job.spec.queue
        return (queue, size.shape, self._may_borrow(job, self._qspec(queue)),
                len(self.reserved))  # fmt: skip

    def _head(self, job: QueuedJob, misfit: _Misfit) -> None:
        queue = job.spec.queue
        facts = self._facts(job)
        size = self._size(facts, facts.last)
        smallest, ask = size.spec, size.ask
        self.held[queue] = ask
        pending = self.index.preempting.get(job.job_id, ())
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
                self.chosen_victims.update(victims)
                self.changed = True
                self.decisions.append(Preempt(
                    job.job_id, victims, self._preempt_reason(job, victims), job.attempt))  # fmt: skip
            self.reserved.append((queue, Allocation(job.job_id, smallest, plan.tasks)))
            ending = pending + victims
            mine = [v for v in ending if self._user_of(v) == job.spec.user]
            others = len(ending) - len(mine)
            named = [f"job{'s' if len(mine) > 1 else ''} {', '.join(mine)}"] if mine else []
            if others:
                named.append(f"{others} job{'s' if others > 1 else ''} of other users")
            self._wait(job, (
                f"waiting for preempted {' and '.join(named)} to end: "
                f"{'they hold' if len(ending) > 1 else 'it holds'} capacity this job needs",
            ))  # fmt: skip
            return
        if not misfit.quota_blocked:
            reservation = self._reservation(job, smallest)
            if reservation is not None:
                self.reserved.append((queue, reservation))
        self._wait(job, misfit.reasons)

    def _fit(self, job: QueuedJob, base: Snapshot, *, reasons: bool) -> _Fit | _Misfit:
        """The largest size of the job that fits on ``base``: the smallest size first
        (if that fails, nothing does), then a binary search over the steps between.
        ``reasons``: why it does not fit is needed (it becomes its queue's head), else
        only whether it does."""
        facts = self._facts(job)
        last = facts.last
        found = self._try(job, self._size(facts, last), base, reasons=reasons)
        if not isinstance(found, _Fit):
            return found
        low, high = 0, last
        while low < high:
            middle = (low + high) // 2
            attempt = self._try(job, self._size(facts, middle), base, reasons=False)
            if isinstance(attempt, _Fit):
                found, high = attempt, middle
            else:
                low = middle + 1
        return found

    def _facts(self, job: QueuedJob) -> _JobFacts:
        facts = self.memo.facts.get(job.job_id)
        if facts is None or facts.job is not job:
            facts = self.memo.facts[job.job_id] = _JobFacts(job, last_step(job.spec))
        return facts

    def _size(self, facts: _JobFacts, step: int) -> _Size:
        size = facts.sizes.get(step)
        if size is None:
            spec = at_step(facts.job.spec, step)
            size = facts.sizes[step] = _Size(
                spec, usage_of(spec),
                tuple(role.model_dump_json(exclude={"command", "env", "image"})
                      for role in spec.roles),
                any(role.ports for role in spec.roles),
                [(role, Demand.of(role.resources)) for role in spec.roles if role.replicas],
                spec.task_count() == 1,
            )  # fmt: skip
        return size

    def _qspec(self, queue: str) -> QueueSpec:
        qspec = self._qspecs.get(queue)
        if qspec is None:
            qspec = self._qspecs[queue] = self.queues(queue)
        return qspec

    def _try(self, job: QueuedJob, size: _Size, base: Snapshot, *, reasons: bool) -> _Fit | _Misfit:
        queue = job.spec.queue
        qspec = self._qspec(queue)
        spec, ask = size.spec, size.ask
        used = self.used.get(queue, Usage())
        held = self.held.get(queue, Usage()) if self.heads.get(queue) != job.job_id else Usage()
        guaranteed = within(qspec.quota, used + held + ask)
        quota_lines: list[str] = []
        if not guaranteed:
            quota_lines = over_quota_text(queue, qspec.quota, used, held, ask)
            if not self._may_borrow(job, qspec):
                times = self.preemptions.get(job.job_id, 0)
                why = "its queue does not borrow" if not qspec.borrowing else (
                    f"it was preempted {times} time{'s' if times != 1 else ''}, so it no "
                    "longer borrows")  # fmt: skip
                return _Misfit((*quota_lines[:-1], f"{quota_lines[-1]} ({why})"), True)
        view = self._view(queue, borrowing=not guaranteed, base=base)
        # A long queue holds many jobs of one shape: one that did not fit on this view
        # says the others do not either (cleared whenever the snapshot changes; on the
        # cycle's starting snapshot kept for the next cycle, CycleMemo).
        shape = (view, size.shape)
        # Without ports a deterministic scorer places a shape alike for every job.
        alike = self._kept and not size.ports
        misfits = self._misfits
        if alike and base is self.snapshot:
            misfits = self.memo.misfits if size.single else self.memo.gang_misfits
        outcome: Plan | Unschedulable | None = misfits.get(shape)
        if outcome is _NO_FIT and reasons:
            outcome = None
        if (outcome is None and alike and self.fit_only and not reasons
                and not self._fits_somewhere(size, view)):  # fmt: skip
            outcome = misfits[shape] = _NO_FIT
        if outcome is None:
            outcome = place_job(spec, view, drained=self.drained, job_id=job.job_id,
                                scorer=self.scorer, context=self.context)  # fmt: skip
            if isinstance(outcome, Unschedulable):
                misfits[shape] = outcome
        if outcome is _NO_FIT:
            return _Misfit((), False)  # its reasons are not asked for
        if isinstance(outcome, Unschedulable):
            if quota_lines:
                quota_lines[-1] += "; beyond the quota it may only borrow idle capacity"
            return _Misfit((*quota_lines, *outcome.reasons), False)
        return _Fit(spec, outcome, ask)

    def _fits_somewhere(self, size: _Size, view: Snapshot) -> bool:
        """Whether the job (at ``size``; no ports, a deterministic scorer) fits on
        ``view``, as place_job would find, without explaining a misfit over the whole
        cluster. A single task fits where a node it may use has room for it. A gang: the
        placer puts k tasks on the first node (in cluster order) of a group of alike
        nodes that its earlier tasks left alone, so it only ever meets the first k nodes
        of each group that a role may use; placed on those alone, it gets the same
        placement (or misfit), at the cost of that few nodes. Groups where no task of
        the job fits are left out: no task goes there."""
        tasks = size.spec.task_count()
        if not tasks:
            return True
        hosts: set[GroupKey] = set()
        for role, demand in size.demands:
            found = _hosts(view, role, demand)
            if not found:
                return False  # one of its tasks fits on no node
            hosts.update(found)
        drained, groups, nodes = self.drained, view.groups(), view.by_name()
        selectors = {tuple((s.name, s.value) for s in role.node_selector): role.node_selector
                     for role, _ in size.demands}  # fmt: skip
        if tasks == 1:
            (selector,) = selectors.values()
            return any(name not in drained and selector_matches(selector, nodes[name].spec)
                       for key in hosts for name in groups[key])  # fmt: skip
        picked: set[str] = set()
        for key in hosts:
            for selector in selectors.values():
                taken = 0
                for name in groups[key]:
                    if name in drained or not selector_matches(selector, nodes[name].spec):
                        continue
                    picked.add(name)
                    taken += 1
                    if taken == tasks:
                        break
        position = view.positions()
        few = Snapshot(nodes[name] for name in sorted(picked, key=position.__getitem__))
        return isinstance(place_job(size.spec, few, drained=drained, scorer=self.scorer,
                                    context=self.context), Plan)  # fmt: skip

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
            view = self._kept_view(base, None if borrowing else queue, kept)
            self._views[key] = view
        return view

    def _kept_view(self, base: Snapshot, queue: str | None, kept: list[Allocation]) -> Snapshot:
        """``base`` less ``kept``: on the starting snapshot, the view an earlier cycle
        derived for equal reservations (so its misfits apply), or a new one it keeps."""
        if base is not self.snapshot:
            return base.with_allocations(kept)
        for q, allocations, view in self.memo.views:
            if q == queue and allocations == kept:
                return view
        view = base.with_allocations(kept)
        self.memo.views.append((queue, kept, view))
        return view

    def _empty(self) -> Snapshot:
        if self.memo.empty is None:
            self.memo.empty = _empty(self.snapshot)
        return self.memo.empty

    def _released(self, gone: AbstractSet[str]) -> Snapshot:
        """The cluster as if the ``gone`` jobs had ended."""
        if not self.fit_only:
            allocations = [r.allocation for job_id, r in self.running.items()
                           if job_id not in gone]  # fmt: skip
            return self._empty().with_allocations([*allocations, *self.extra])
        # Only the nodes the gone jobs and this cycle's placements are on differ from the
        # starting snapshot: those derived again, from all that stays on them in order.
        nodes = self.snapshot.by_name()
        names = {task.node for job_id in gone for task in self.running[job_id].allocation.tasks}
        names.update(task.node for allocation in self.extra for task in allocation.tasks)
        names &= nodes.keys()
        jobs = {job_id for name in names for job_id in self.index.on_node.get(name, ())}
        staying = [self.running[job_id].allocation
                   for job_id in sorted(jobs - gone, key=self.index.order.__getitem__)]  # fmt: skip
        empty = self._empty().by_name()
        derived = Snapshot(empty[name] for name in names).with_allocations([*staying, *self.extra])
        return self.current.with_nodes(derived.by_name())

    def _with_released(self, job: QueuedJob, spec: JobSpec, gone: tuple[str, ...]) -> Plan | None:
        """Where the job (at ``spec``) would go once ``gone`` ended, if it fits then —
        quota counted without the gone jobs of its queue too."""
        queue = job.spec.queue
        freed = [self.running[j].allocation.spec for j in gone]
        used = self.used.get(queue, Usage())
        for spec_gone in freed:
            if spec_gone.queue == queue:
                used = used - usage_of(spec_gone)
        qspec = self._qspec(queue)
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
        when it fits nowhere even then (nothing to keep for it). On the starting snapshot
        an earlier cycle's reservation for the same job is this one."""
        kept = self.current is self.snapshot
        if kept:
            found = self.memo.reservations.get(job.job_id)
            if found is not None and found[0] is job:
                return found[1]
        if self.fit_only and not any(role.ports for role in spec.roles):
            nodes = self._freest(spec)
        else:
            free_now = self.current.by_name()
            nodes = sorted(self._empty().nodes, key=lambda n: _freeness(free_now[n.name]))
        outcome = place_job(spec, Snapshot(nodes), drained=self.drained, job_id=job.job_id)
        reservation = (Allocation(job.job_id, spec, outcome.tasks)
                       if isinstance(outcome, Plan) else None)  # fmt: skip
        if kept:
            self.memo.reservations[job.job_id] = (job, reservation)
        return reservation

    def _freest(self, spec: JobSpec) -> list[NodeFree]:
        """The empty nodes that first fit over the freest nodes can reach, in that order,
        for a job without ports: nodes of one state take the tasks of a job on the first
        of them its earlier tasks left alone (``_fits_somewhere``), so of each state of an
        empty node the first k a role may use will do, for k tasks. Nodes with equal
        groups now are equally free; they come in cluster order."""
        tasks = spec.task_count()
        empty = self._empty()
        state_of = self.memo.empty_state
        if state_of is None:
            state_of = self.memo.empty_state = {
                name: key for key, names in empty.groups().items() for name in names
            }
        drained, position = self.drained, self.current.positions()
        selectors = list({tuple((s.name, s.value) for s in role.node_selector): role.node_selector
                          for role in spec.roles}.values())  # fmt: skip
        by_freeness: dict[tuple[int, float, int], list[Sequence[str]]] = {}
        for (state, cpu, _, _), names in self.current.groups().items():
            by_freeness.setdefault((-sum(state.gpu_free), -cpu, -state.memory_mib),
                                   []).append(names)  # fmt: skip
        taken: dict[tuple[GroupKey, int], int] = {}
        missing = len(empty.groups()) * len(selectors)
        nodes = empty.by_name()
        found: list[NodeFree] = []
        for freeness in sorted(by_freeness):
            lists = by_freeness[freeness]
            ordered = lists[0] if len(lists) == 1 else merge(*lists, key=position.__getitem__)
            for name in ordered:
                if name in drained:
                    continue
                node, used = nodes[name], False
                for i, selector in enumerate(selectors):
                    pair = (state_of[name], i)
                    count = taken.get(pair, 0)
                    if count < tasks and selector_matches(selector, node.spec):
                        taken[pair] = count + 1
                        used = True
                        missing -= count + 1 == tasks
                if used:
                    found.append(node)
                    if not missing:
                        return found
        return found

    # --- preemption -------------------------------------------------------------

    def _candidates(self, job: QueuedJob, ask: Usage) -> list[Candidate]:
        """Lower-priority jobs of the head's queue (if it preempts) and other queues'
        borrowers (if the head is within its quota), in running order."""
        queue = job.spec.queue
        qspec = self._qspec(queue)
        reclaim = within(qspec.quota, self.used.get(queue, Usage()) + ask)
        ids: list[str] = []
        if qspec.preemption:
            for (q, priority), jobs in self.index.by_priority.items():
                if q == queue and priority < job.spec.priority:
                    ids.extend(jobs)
        if reclaim:
            ids.extend(j for j in self.borrowed
                       if self.running[j].allocation.spec.queue != queue)  # fmt: skip
        ids.sort(key=self.index.order.__getitem__)
        found = []
        for job_id in ids:
            r = self.running[job_id]
            spec = r.allocation.spec
            if r.interrupting or job_id in self.chosen_victims:
                continue
            if spec.queue == queue:
                if self.preemptions.get(job_id, 0) >= self.rules.max_preemptions:
                    continue
                borrowed = False
            else:
                borrowed = True
            tasks = len(r.allocation.tasks)
            found.append(Candidate(
                job_id=job_id, queue=spec.queue, priority=spec.priority, tasks=tasks,
                work=tasks * max(self.now - r.placed_at, 0.0), placed_at=r.placed_at,
                borrowed=borrowed,
            ))  # fmt: skip
        return found

    def _may_borrow(self, job: QueuedJob, qspec: QueueSpec) -> bool:
        # Reclaimed this often, a job stops borrowing: it could otherwise be lent idle
        # capacity and reclaimed again forever.
        return qspec.borrowing and (
            self.preemptions.get(job.job_id, 0) < self.rules.max_preemptions
        )

    def _user_of(self, job_id: str) -> str | None:
        running = self.running.get(job_id)
        return running.allocation.spec.user if running is not None else None

    def _preempt_reason(self, job: QueuedJob, victims: tuple[str, ...]) -> str:
        # Told to every victim: the preemptor is named when they are all its user's.
        own = all(self._user_of(v) == job.spec.user for v in victims)
        who = f"job {job.job_id}" if own else "another user's job"
        reason = f"preempted by {who} (priority {job.spec.priority})"
        queue = job.spec.queue
        if any(
            v in self.borrowed and self.running[v].allocation.spec.queue != queue for v in victims
        ):
            reason += f" to reclaim queue {queue}'s quota"
        return reason

    # --- waiting ----------------------------------------------------------------

    def _wait(self, job: QueuedJob, reasons: tuple[str, ...]) -> None:
        self.position += 1
        self.decisions.append(Waiting(job.job_id, self.position, reasons, job.attempt))

    def _behind(self, head: str, job: QueuedJob) -> tuple[str]:
        queue = job.spec.queue
        own = self.head_users.get(queue) == job.spec.user
        reasons = self._behind_text.get((head, own))
        if reasons is None:  # every job behind one head is told the same, by whose it is
            where = f"the queue {queue}" if self.multi_queue else "the queue"
            who = f"job {head}" if own else "another user's job"
            reasons = self._behind_text[(head, own)] = (
                f"waiting behind {who} at the head of {where}",
            )
        return reasons


def _hosts(view: Snapshot, role: RoleSpec, demand: Demand) -> list[GroupKey]:
    """The groups of ``view`` whose nodes have room for one task of the role (the
    placer's check on a group's key: CPU with its slack, memory, ``gpus_fit``)."""
    cpu, memory = role.resources.cpu, role.resources.memory_mb
    count = demand.gpu_count
    if not count:
        keys: Iterable[GroupKey] = view.groups()
    else:
        index = view.by_gpus()
        by_model, need = ((index.share, demand.gpu_milli) if demand.is_share
                          else (index.whole, count))  # fmt: skip
        models = demand.gpu_models
        keys = [key for model, levels in by_model.items() if not models or model in models
                for level, at in levels.items() if level >= need for key in at]  # fmt: skip
    return [key for key in keys
            if key[1] + CPU_EPSILON >= cpu and key[0].memory_mib >= memory]  # fmt: skip


# A shape that fits nowhere, found without explaining why (CycleMemo's misfits).
_NO_FIT = Unschedulable(())


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
