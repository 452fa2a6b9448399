"""Whether a job can ever fit the cluster as configured: its queue exists, its GPU model
exists, each task fits some node, and the whole gang (a job placed as one) fits the
whole cluster. Pure: used
by validation (every job, against the cluster it knows) and by intake (to answer a
submission that can never run at once, where the cluster is configured by file)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .cluster import ClusterSpec, NodeSpec
from .dialects import dedupe
from .events import FieldIssue
from .jobspec import JobSpec, RoleSpec

# Where a canonical field is written in the user's payload: (role name or None, field).
Locate = Callable[[str | None, str], str]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _gpus_needed(gpu: float) -> int:
    # A fraction below 1 shares one GPU; 1.5 needs two.
    return math.ceil(gpu) if gpu > 0 else 0


def _selected(node: NodeSpec, role: RoleSpec) -> bool:
    """The node carries every label of the role's node selector (placement's rule)."""
    labels = {(label.name, label.value) for label in node.labels}
    return all((s.name, s.value) in labels for s in role.node_selector)


def _model_allowed(node: NodeSpec, models: list[str]) -> bool:
    # Without regard to case, as placement matches them.
    if not models:
        return True
    return node.gpu_type is not None and node.gpu_type.lower() in {m.lower() for m in models}


def _node_fits(node: NodeSpec, role: RoleSpec) -> bool:
    r = role.resources
    if node.cpu < r.cpu or node.memory_mb < r.memory_mb or not _selected(node, role):
        return False
    need = _gpus_needed(r.gpu)
    if need == 0:
        return True
    return node.gpus >= need and _model_allowed(node, r.allowed_gpu_types())


def _models_text(models: list[str]) -> str:
    return " or ".join(models)


def _ask(role: RoleSpec) -> str:
    r = role.resources
    models = r.allowed_gpu_types()
    gpu = f"{_num(r.gpu)} GPU" + (f" ({_models_text(models)})" if models and r.gpu > 0 else "")
    return f"{_num(r.cpu)} CPU, {r.memory_mb} MB, {gpu}"


def _gpu_type_field(role: RoleSpec) -> str:
    """The canonical field the role's GPU models came from (a list wins: it names more)."""
    return "gpu_types" if role.resources.gpu_types else "gpu_type"


def _selector_text(role: RoleSpec) -> str:
    return ", ".join(f"{s.name}={s.value}" for s in role.node_selector)


def _misfit(role: RoleSpec, cluster: ClusterSpec, locate: Locate) -> FieldIssue:
    r = role.resources
    need = _gpus_needed(r.gpu)
    if not cluster.nodes:
        return FieldIssue(
            path=locate(role.name, "role"),
            code="no_fit",
            message=f"role {role.name!r} cannot run: the cluster has no nodes",
        )
    # Only the nodes the role may use: its node selector has matched some (checked first).
    nodes = [n for n in cluster.nodes if _selected(n, role)]
    models = r.allowed_gpu_types()
    typed = [n for n in nodes if _model_allowed(n, models)]
    max_cpu = max(n.cpu for n in nodes)
    max_mem = max(n.memory_mb for n in nodes)
    max_gpu = max((n.gpus for n in typed), default=0)
    gpu_note = f" ({_models_text(models)})" if models and need else ""
    among = (
        f" among the nodes its node selector {_selector_text(role)} matches"
        if role.node_selector
        else ""
    )
    # Point at the one field that is too large, if there is one; otherwise the
    # combination is what no node has, and the role itself is the culprit.
    if r.cpu > max_cpu:
        path = locate(role.name, "cpu")
    elif r.memory_mb > max_mem:
        path = locate(role.name, "memory_mb")
    elif need > max_gpu:
        # A selected set of nodes without the model at all: the model is what is wrong
        # there (the cluster has it elsewhere, or the type check would have said so).
        path = locate(role.name, _gpu_type_field(role) if models and not typed else "gpu")
    else:
        path = locate(role.name, "role")
    return FieldIssue(
        path=path,
        code="no_fit",
        message=(
            f"role {role.name!r} asks for {_ask(role)} per task; no node{among} has "
            f"that much: the largest node offers {_num(max_cpu)} CPU, the most memory is "
            f"{max_mem} MB, the most GPUs{gpu_note} on one node is {max_gpu}"
        ),
    )


def _unknown_models(role: RoleSpec, known: set[str], locate: Locate) -> FieldIssue:
    models = role.resources.allowed_gpu_types()
    listed = ", ".join(sorted(known)) or "none"
    if len(models) == 1:
        message = f"GPU type {models[0]!r} is on no node; known types: {listed}"
    else:
        message = (
            f"none of the GPU types {', '.join(map(repr, models))} is on any node; "
            f"known types: {listed}"
        )
    return FieldIssue(
        path=locate(role.name, _gpu_type_field(role)), code="unknown_gpu_type", message=message
    )


def _no_selected_node(role: RoleSpec, cluster: ClusterSpec, locate: Locate) -> FieldIssue:
    labels = sorted({f"{label.name}={label.value}" for n in cluster.nodes for label in n.labels})
    shown = ", ".join(labels[:10]) + (f" and {len(labels) - 10} more" if len(labels) > 10 else "")
    return FieldIssue(
        path=locate(role.name, "node_selector"),
        code="no_matching_node",
        message=(
            f"role {role.name!r}: no node carries every label of its node selector "
            f"{_selector_text(role)}; the nodes' labels: {shown or 'none'}"
        ),
    )


def check_against_cluster(spec: JobSpec, cluster: ClusterSpec, locate: Locate) -> list[FieldIssue]:
    issues: list[FieldIssue] = []
    queues = cluster.queue_names()
    if cluster.resolve_queue(spec.queue) is None:
        issues.append(
            FieldIssue(
                path=locate(None, "queue"),
                code="unknown_queue",
                message=f"queue {spec.queue!r} does not exist (nor is it another name of "
                f"one: an administrator maps quota ids to queues with the cluster file's "
                f"aliases); queues: {', '.join(queues) or 'none'}",
            )
        )
    known_types = cluster.gpu_types()
    known_lower = {t.lower() for t in known_types}
    for role in spec.roles:
        r = role.resources
        models = r.allowed_gpu_types()
        if r.gpu > 0 and models and not any(m.lower() in known_lower for m in models):
            issues.append(_unknown_models(role, known_types, locate))
            continue  # nothing fits an unknown type; one message is enough
        if role.node_selector and not any(_selected(n, role) for n in cluster.nodes):
            issues.append(_no_selected_node(role, cluster, locate))
            continue  # as above: no node to measure the rest against
        if not any(_node_fits(node, role) for node in cluster.nodes):
            issues.append(_misfit(role, cluster, locate))
    if not issues and spec.gang:
        # Without gang placement the tasks need not fit at once: each fitting is enough.
        issues += _gang_misfit(spec, cluster, locate)
    return dedupe(issues)


def _gang_misfit(spec: JobSpec, cluster: ClusterSpec, locate: Locate) -> list[FieldIssue]:
    """A gang that asks, in all, for more of a resource than the whole cluster has can
    never start, whatever else runs: refused now rather than left at the head of its
    queue (an elastic role counted at its smallest size). One issue names every resource
    it exceeds, at the role that asks for most of the first."""

    def gpus(role: RoleSpec) -> float:
        gpu = role.resources.gpu
        return _gpus_needed(gpu) if gpu >= 1 else gpu

    per_task = {
        "CPU": (sum(n.cpu for n in cluster.nodes), lambda r: r.resources.cpu),
        "MB of memory": (sum(n.memory_mb for n in cluster.nodes), lambda r: r.resources.memory_mb),
        "GPUs": (sum(n.gpus for n in cluster.nodes), gpus),
    }
    tasks = {role.name: role.min_replicas or role.replicas for role in spec.roles}
    over: list[str] = []
    culprit: RoleSpec | None = None
    for unit, (have, ask) in per_task.items():
        need = sum(tasks[role.name] * ask(role) for role in spec.roles)
        if need > have:
            over.append(f"{_num(need)} {unit} (the cluster has {_num(have)})")
            if culprit is None:
                culprit = max(spec.roles, key=lambda role: tasks[role.name] * ask(role))
    if culprit is None:
        return []
    sizes = ", ".join(f"{role.name}: {tasks[role.name]} task(s)" for role in spec.roles)
    return [
        FieldIssue(
            path=locate(culprit.name, "replicas"),
            code="never_fits",
            message=f"the job asks in all for {'; '.join(over)} ({sizes}): the whole "
            "cluster could never hold it; ask for fewer tasks or less per task",
        )
    ]
