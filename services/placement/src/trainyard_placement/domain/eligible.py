"""Which nodes may host a role: node selectors and drained nodes.

The gang placer knows nothing of either: it is handed a snapshot restricted to the nodes
a role may use (``Snapshot.where``). Roles of one job that select different nodes are
placed one group at a time (roles with the same selector together), each group on its
own restricted view of what the earlier groups left; the job is placed only when every
group fits, so it is still all or nothing.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from trainyard_common.cluster import NodeSpec
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import EnvVar, JobSpec, RoleSpec

from .capacity import Allocation, NodeFree, Snapshot
from .gang import Plan, Unschedulable, place_gang
from .scoring import ClusterContext, Scorer


def selector_matches(selector: list[EnvVar], node: NodeSpec) -> bool:
    """Every label of the selector is on the node with the same value."""
    if not selector:
        return True
    labels = {(label.name, label.value) for label in node.labels}
    return all((s.name, s.value) in labels for s in selector)


def selector_text(selector: list[EnvVar]) -> str:
    return ", ".join(f"{s.name}={s.value}" for s in selector)


def _key(role: RoleSpec) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((s.name, s.value) for s in role.node_selector))


def eligible_view(snapshot: Snapshot, role: RoleSpec, drained: AbstractSet[str]) -> Snapshot:
    def keep(node: NodeFree) -> bool:
        return node.name not in drained and selector_matches(role.node_selector, node.spec)

    return snapshot.where(keep)


def place_job(
    spec: JobSpec,
    snapshot: Snapshot,
    *,
    drained: AbstractSet[str] = frozenset(),
    job_id: str = "",
    scorer: Scorer | None = None,
    context: ClusterContext | None = None,
) -> Plan | Unschedulable:
    """``place_gang`` on the nodes each role may use."""
    groups: dict[tuple[tuple[str, str], ...], list[RoleSpec]] = {}
    for role in spec.roles:
        groups.setdefault(_key(role), []).append(role)
    if len(groups) == 1 and not drained and not spec.roles[0].node_selector:
        return place_gang(spec, snapshot, job_id=job_id, scorer=scorer, context=context)
    tasks: list[TaskPlacement] = []
    for roles in groups.values():
        view = eligible_view(snapshot, roles[0], drained)
        if not view.nodes:
            return Unschedulable(tuple(_no_node(role, drained) for role in roles))
        part = spec if len(groups) == 1 else spec.model_copy(update={"roles": roles})
        outcome = place_gang(part, view, job_id=job_id, scorer=scorer, context=context)
        if isinstance(outcome, Unschedulable):
            return outcome
        tasks.extend(outcome.tasks)
        snapshot = snapshot.with_allocation(Allocation(job_id, part, outcome.tasks))
    order = {role.name: i for i, role in enumerate(spec.roles)}
    tasks.sort(key=lambda t: (order[t.role], t.index))
    return Plan(tuple(tasks))


def _no_node(role: RoleSpec, drained: AbstractSet[str]) -> str:
    where = "no node"
    if role.node_selector:
        where += f" matches its node selector {selector_text(role.node_selector)}"
        if drained:
            where += " and is not drained"
    else:
        where += " is left that is not drained"
    return f"role {role.name}: {where}"
