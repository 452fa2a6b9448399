"""Jobs placed without gang placement get their other tasks one by one.

A job whose spec has ``gang`` false (OpenPAI's ``extras.gangAllocation: false``) is
placed by the cycle with as many of its tasks as fit (sizes.py: its sizes are its first
n − k tasks) and starts with those. ``more_tasks`` finds, for such a job, which of the
tasks still waiting fit now: each on its own, in role order, on what the ones before it
left, within its queue's quota (or beyond it where the queue borrows and the job may
still borrow). The service asks before every cycle, in the order the jobs were placed: a
job that has started is ahead of the jobs that have not, as a pending pod of a started
job is ahead of later jobs' — but not of a head of its queue of a higher priority, and
beyond its quota not of any head: the capacity the last cycle reserved for those is
left to them (reserved capacity is not idle).
Once one task of a role does not fit, the role's later tasks (the same shape) are not
tried. A task that ended gives its capacity back at once (``released``): the job's
other tasks, or anyone's, may use it while the job goes on.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec

from .capacity import Allocation
from .eligible import place_job
from .gang import Plan
from .quota import Usage, usage_of, within
from .sizes import remaining_tasks
from .state import SchedulerState


def more_tasks(
    state: SchedulerState,
    job_id: str,
    spec: JobSpec,
    tasks: Sequence[TaskPlacement],
    released: Collection[tuple[str, int]] = (),
) -> list[TaskPlacement]:
    """The placements of the job's waiting tasks that fit now (none when it is being
    interrupted). ``spec`` is the job as submitted, ``tasks`` what it holds, ``released``
    its tasks that ended and gave their capacity back."""
    if job_id in state.interrupting:
        return []
    qspec = state.cluster.queue(spec.queue)
    used = state.queue_usage().get(spec.queue, Usage())
    snapshot = state.snapshot()
    context = state.context()
    may_borrow = qspec.borrowing and (
        state.preemptions.get(job_id, 0) < state.rules.max_preemptions
    )
    heads = state.last_reservations()
    # Within the quota: the reservations of its queue's heads of a higher priority;
    # beyond it: every head's.
    above = [kept for queue, kept in heads if queue == spec.queue
             and state.queued[kept.job_id].spec.priority > spec.priority]  # fmt: skip
    every = [kept for _, kept in heads]
    added: list[TaskPlacement] = []
    full: set[str] = set()
    for role_name, index in remaining_tasks(spec, tasks):
        if role_name in full or (role_name, index) in released:
            continue
        role = spec.role(role_name)
        one = spec.model_copy(update={"roles": [role.model_copy(update={"replicas": 1})]})
        ask = usage_of(one)
        borrows = not within(qspec.quota, used + ask)
        plan = None
        if may_borrow or not borrows:
            kept = every if borrows else above
            view = snapshot.with_allocations(kept) if kept else snapshot
            plan = place_job(one, view, drained=state.drained, job_id=job_id,
                             scorer=state.scorer, context=context)  # fmt: skip
        if not isinstance(plan, Plan):
            full.add(role_name)
            continue
        task = plan.tasks[0].model_copy(update={"index": index})
        snapshot = snapshot.with_allocation(Allocation(job_id, one, (task,)))
        used = used + ask
        added.append(task)
    return added
