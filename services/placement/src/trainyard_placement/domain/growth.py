"""Growing elastic jobs when capacity frees.

``growth(state)`` names the placed elastic jobs that would fit at a larger size on the
capacity they hold plus what is free, with the size; the service restarts each at that
size (InterruptJob cause scaled), and the next cycle places it at the largest size that
fits. Waiting jobs come first: nothing grows while a job waits for capacity (one that
waits only because its queue is at its quota and may not borrow does not count, except
for jobs of its own queue, whose growth would use that quota).
"""

from __future__ import annotations

from trainyard_common.jobspec import JobSpec

from .capacity import Allocation
from .eligible import place_job
from .gang import Plan
from .quota import Usage, usage_of, within
from .sizes import at_step, bounds, is_elastic, last_step
from .state import SchedulerState


def growth(state: SchedulerState) -> list[tuple[str, str, int]]:
    """(job id, role, replicas) for each elastic role of a placed job that may grow."""
    quota_waits: set[str] = set()
    used = state.queue_usage()
    for job in state.queued.values():
        queue = job.spec.queue
        qspec = state.cluster.queue(queue)
        smallest = usage_of(at_step(job.spec, last_step(job.spec)))
        if within(qspec.quota, used.get(queue, Usage()) + smallest) or (
            qspec.borrowing and state.preemptions.get(job.job_id, 0) < state.rules.max_preemptions
        ):
            return []  # it waits for capacity: freed capacity is its first
        quota_waits.add(queue)

    grown: list[tuple[str, str, int]] = []
    # The allocations of the jobs grown so far, in place of what they hold.
    changed: dict[str, Allocation | None] = {}
    elastic = [job_id for job_id, allocation in state.placed.items()
               if is_elastic(allocation.spec) and job_id not in state.interrupting]  # fmt: skip
    for job_id in sorted(elastic, key=lambda j: (state.placed_at.get(j, 0.0), j)):
        spec = state.placed[job_id].spec
        if spec.queue in quota_waits:
            continue
        bigger = _bigger(state, job_id, spec, changed, used)
        if bigger is None:
            continue
        size, plan = bigger
        changed[job_id] = Allocation(job_id, size, plan.tasks)
        used[spec.queue] = used.get(spec.queue, Usage()) - usage_of(spec) + usage_of(size)
        grown += [(job_id, new.name, new.replicas)
                  for old, new in zip(spec.roles, size.roles, strict=True)
                  if new.replicas > old.replicas]  # fmt: skip
    return grown


def _bigger(
    state: SchedulerState,
    job_id: str,
    spec: JobSpec,
    changed: dict[str, Allocation | None],
    used: dict[str, Usage],
) -> tuple[JobSpec, Plan] | None:
    """The largest size above the current one that fits once the job gives back what
    it holds, within its queue's quota or (if the queue borrows) beyond it. ``changed``:
    the jobs grown before it, at their new sizes."""
    others = state.snapshot_with({**changed, job_id: None})
    qspec = state.cluster.queue(spec.queue)
    base = used.get(spec.queue, Usage()) - usage_of(spec)
    may_borrow = qspec.borrowing and (
        state.preemptions.get(job_id, 0) < state.rules.max_preemptions
    )
    context = state.context()
    for step in range(_room(spec)):
        size = _grown(spec, step)
        if not (within(qspec.quota, base + usage_of(size)) or may_borrow):
            continue
        outcome = place_job(size, others, drained=state.drained, job_id=job_id,
                            scorer=state.scorer, context=context)  # fmt: skip
        if isinstance(outcome, Plan):
            return size, outcome
    return None


def _room(spec: JobSpec) -> int:
    """How many sizes lie above the current one: the most any role may still grow."""
    return max((b[1] - role.replicas for role in spec.roles
                if (b := bounds(role)) is not None), default=0)  # fmt: skip


def _grown(spec: JobSpec, step: int) -> JobSpec:
    """Every elastic role at ``max - step``, never below its current size."""
    roles = []
    for role in spec.roles:
        b = bounds(role)
        replicas = role.replicas if b is None else max(role.replicas, b[1] - step)
        roles.append(role.model_copy(update={"replicas": replicas}))
    return spec.model_copy(update={"roles": roles})
