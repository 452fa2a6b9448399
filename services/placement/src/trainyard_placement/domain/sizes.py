"""Elastic sizes: a role with both ``min_replicas`` and ``max_replicas`` (domain/elastic.py's
definition) runs at any size between them. It is placed at its ``replicas`` (the size
asked for; ScaleJob changes it) when that fits, otherwise at as many as fit down to
``min_replicas``; ``growth`` (growth.py) reports when a placed one could grow, up to
``max_replicas``.

The sizes tried are numbered by a step k: at step k every elastic role runs
``max(min, top - k)`` replicas, ``top`` being its ``replicas`` kept within the bounds, so
step 0 is the size asked for and the last step every role at its minimum. Fixed roles
keep ``replicas`` at every step.

A job that does not ask for gang placement (``gang`` false, OpenPAI's
``gangAllocation: false``) has sizes too: at step k its first n − k tasks, in role
order, so it is placed with as many tasks as fit (at least one); the service places the
others one by one as capacity frees (docs/placement.md, "Without gang placement").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec


def bounds(role: RoleSpec) -> tuple[int, int] | None:
    """(min, max) replicas of an elastic role; None for a fixed one."""
    if role.min_replicas is None or role.max_replicas is None:
        return None
    low = max(role.min_replicas, 0)
    return min(low, role.max_replicas), role.max_replicas


def is_elastic(spec: JobSpec) -> bool:
    return any(bounds(role) is not None for role in spec.roles)


def _top(role: RoleSpec, low: int, high: int) -> int:
    return min(max(role.replicas, low), high)


def is_partial(spec: JobSpec) -> bool:
    """Whether the job may be placed with part of its tasks (gang placement off; an
    elastic job keeps its own sizes)."""
    return not spec.gang and spec.task_count() > 1 and not is_elastic(spec)


def last_step(spec: JobSpec) -> int:
    """The step at which every elastic role is at its minimum (0 for a fixed job); for
    a job without gang placement, the step of its first task alone."""
    if is_partial(spec):
        return spec.task_count() - 1
    spans = [_top(role, *b) - b[0] for role in spec.roles if (b := bounds(role)) is not None]
    return max(spans, default=0)


def at_step(spec: JobSpec, step: int) -> JobSpec:
    if is_partial(spec):
        return _first_tasks(spec, spec.task_count() - step)
    if not is_elastic(spec):
        return spec
    roles = []
    for role in spec.roles:
        b = bounds(role)
        replicas = role.replicas if b is None else max(b[0], _top(role, *b) - step)
        roles.append(
            role if replicas == role.replicas else role.model_copy(update={"replicas": replicas})
        )
    return spec.model_copy(update={"roles": roles})


def sized_to(spec: JobSpec, tasks: Iterable[TaskPlacement]) -> JobSpec:
    """The spec at the size its placed tasks have: an elastic job's allocation may be
    stored with the spec as submitted, and capacity, growth and the launcher read the
    replicas from the spec."""
    if is_partial(spec):
        placed = Counter(task.role for task in tasks)
        if all(placed[role.name] == role.replicas for role in spec.roles):
            return spec
        return spec.model_copy(update={"roles": [
            role.model_copy(update={"replicas": placed[role.name]}) for role in spec.roles]})  # fmt: skip
    if not is_elastic(spec):
        return spec
    count = Counter(task.role for task in tasks)
    roles = [role.model_copy(update={"replicas": count[role.name]})
             if bounds(role) is not None and count[role.name] != role.replicas else role
             for role in spec.roles]  # fmt: skip
    return spec.model_copy(update={"roles": roles})


def _first_tasks(spec: JobSpec, count: int) -> JobSpec:
    """The spec with only its first ``count`` tasks, in role order."""
    roles = []
    for role in spec.roles:
        replicas = min(role.replicas, max(count, 0))
        count -= replicas
        roles.append(
            role if replicas == role.replicas else role.model_copy(update={"replicas": replicas})
        )
    return spec.model_copy(update={"roles": roles})


def remaining_tasks(spec: JobSpec, tasks: Iterable[TaskPlacement]) -> list[tuple[str, int]]:
    """The (role, index) of each task of ``spec`` not among the placed ``tasks``, in
    role order."""
    placed = {(task.role, task.index) for task in tasks}
    return [(role.name, index) for role in spec.roles for index in range(role.replicas)
            if (role.name, index) not in placed]  # fmt: skip
