"""Gang placement: every task of a job on the cluster at once, or none of them.

A tentative plan is built task by task on a private copy of the snapshot and returned
only when every task fits; otherwise the answer says, with numbers, why the first task
that did not fit found no node.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainyard_common.events import PortAssignment, TaskPlacement
from trainyard_common.jobspec import JobSpec, PortSpec, RoleSpec

from .capacity import CPU_EPSILON, NodeFree, Snapshot, gpu_count, gpu_milli, gpu_type_matches
from .gpu_share import Demand, gpus_fit
from .policies import FirstFit
from .ports import pick_ports
from .scoring import ClusterContext, Scorer

# A reason listing every node of a large cluster would be unreadable.
MAX_NODES_EXPLAINED = 5


@dataclass(frozen=True)
class Plan:
    """Where every task goes, in role order then index order."""

    tasks: tuple[TaskPlacement, ...]


@dataclass(frozen=True)
class Unschedulable:
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class _Task:
    role: RoleSpec
    index: int
    role_order: int


def place_gang(
    spec: JobSpec,
    snapshot: Snapshot,
    *,
    job_id: str = "",
    scorer: Scorer | None = None,
    context: ClusterContext | None = None,
) -> Plan | Unschedulable:
    """Each task, largest first, on the node ``scorer`` rates best among those it fits
    (first-fit in cluster order without one), ties going to the earlier node; a task
    stays on the node the previous task of its job went to while it fits there, so a
    job's tasks share as few nodes as possible."""
    scorer = scorer or FirstFit()
    # The random policy draws from a source seeded by the job, so a placement replays.
    ctx = replace(context or ClusterContext(), rng=random.Random(f"policy:{job_id or spec.name}"))
    rng = random.Random(f"ports:{job_id or spec.name}")
    # A dynamic port of one task must not take a fixed port a later task of the same
    # job needs on the same node.
    job_fixed = frozenset(p for role in spec.roles for p in _fixed_ports(role))
    nodes = _Tentative(snapshot)
    tasks = _fit_order(spec)
    placed: list[tuple[_Task, TaskPlacement]] = []
    current: str | None = None
    for task in tasks:
        demand = Demand.of(task.role.resources)
        name = current
        if name is None or not _fits(task, demand, nodes[name], job_fixed):
            name = _best_node(task, demand, nodes, scorer, ctx, job_fixed)
        if name is None:
            return Unschedulable(_explain(task, nodes.all(), job_fixed, len(placed), len(tasks)))
        node = nodes[name]
        devices = scorer.devices(node.state(), demand, ctx) if demand.gpu_count else ()
        placement = _placement(task, demand, node, devices, rng, job_fixed)
        nodes[name] = node.take(
            task.role.resources.cpu,
            task.role.resources.memory_mb,
            [(i, demand.gpu_milli) for i in devices],
            [port for group in placement.ports for port in group.ports],
        )
        placed.append((task, placement))
        current = name
    placed.sort(key=lambda item: (item[0].role_order, item[0].index))
    return Plan(tuple(placement for _, placement in placed))


class _Tentative:
    """The snapshot's nodes with this job's tasks placed so far taken off: only the nodes
    those tasks changed are copies, so a gang costs its own nodes, not the cluster."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.changed: dict[str, NodeFree] = {}

    def __getitem__(self, name: str) -> NodeFree:
        node = self.changed.get(name)
        return node if node is not None else self.snapshot.node(name)

    def __setitem__(self, name: str, node: NodeFree) -> None:
        self.changed[name] = node

    def all(self) -> list[NodeFree]:
        """Every node, in cluster order."""
        changed = self.changed
        return [changed.get(node.name, node) for node in self.snapshot.nodes]


def _best_node(
    task: _Task,
    demand: Demand,
    nodes: _Tentative,
    scorer: Scorer,
    ctx: ClusterContext,
    job_fixed: frozenset[int],
) -> str | None:
    """The feasible node with the highest score, the earliest in cluster order on ties."""
    if not scorer.deterministic:
        # A random policy draws once per feasible node in cluster order; keep the draws.
        drawn: str | None = None
        drawn_score = 0.0
        for node in nodes.all():
            if not _fits(task, demand, node, job_fixed):
                continue
            value = scorer.score(node.state(), demand, ctx)
            if drawn is None or value > drawn_score:
                drawn, drawn_score = node.name, value
        return drawn
    # A deterministic score is a function of the node's state: score each group of alike
    # nodes once, at its first node (in cluster order) that fits, which is the one a scan
    # in cluster order would have met first. Nodes this job already changed are off their
    # groups and scored on their own.
    snapshot, changed = nodes.snapshot, nodes.changed
    by_name, position = snapshot.by_name(), snapshot.positions()
    score = scorer.score
    best: str | None = None
    best_score, best_at = 0.0, 0
    # _resources_fit on a group's key, inlined: this loop runs over every distinct node
    # state of the cluster for every task.
    cpu, memory = task.role.resources.cpu, task.role.resources.memory_mb
    count, models, share = demand.gpu_count, demand.gpu_models, demand.is_share
    need = demand.gpu_milli if share else count
    particular = _node_particular(task)
    for (state, free_cpu, whole, best_share), names in snapshot.groups().items():
        if free_cpu + CPU_EPSILON < cpu or state.memory_mib < memory:
            continue
        if count and (
            (models and state.model not in models) or (best_share if share else whole) < need
        ):
            continue
        for name in names:
            if name not in changed and (
                not particular or _node_fits(task, by_name[name], job_fixed)
            ):
                break
        else:
            continue
        value = score(state, demand, ctx)
        at = position[name]
        if best is None or value > best_score or (value == best_score and at < best_at):
            best, best_score, best_at = name, value, at
    for name, node in changed.items():
        if not _fits(task, demand, node, job_fixed):
            continue
        value = score(node.state(), demand, ctx)
        at = position[name]
        if best is None or value > best_score or (value == best_score and at < best_at):
            best, best_score, best_at = name, value, at
    return best


def _fit_order(spec: JobSpec) -> list[_Task]:
    tasks = [
        _Task(role, index, order)
        for order, role in enumerate(spec.roles)
        for index in range(role.replicas)
    ]
    # Largest first (first-fit decreasing): a big task placed last finds only fragments.
    return sorted(
        tasks,
        key=lambda t: (
            -gpu_count(t.role.resources),
            -t.role.resources.cpu,
            -t.role.resources.memory_mb,
        ),
    )


def _fixed_ports(role: RoleSpec) -> list[int]:
    return [p for spec in role.ports if spec.begin_at > 0 for p in _fixed_range(spec)]


def _fixed_range(spec: PortSpec) -> range:
    return range(spec.begin_at, spec.begin_at + spec.count)


def _fixed_ports_overlap(role: RoleSpec) -> bool:
    ports = _fixed_ports(role)
    return len(ports) != len(set(ports))


def _fits(task: _Task, demand: Demand, node: NodeFree, job_fixed: frozenset[int]) -> bool:
    """Whether the task fits on the node now: CPU (in floats, with slack), memory, GPUs
    (gpu_share's rules) and ports, without choosing any."""
    return _resources_fit(task, demand, node) and _node_fits(task, node, job_fixed)


def _resources_fit(task: _Task, demand: Demand, node: NodeFree) -> bool:
    """CPU, memory and GPUs: the part of ``_fits`` that reads only ``NodeFree.group_key``
    (``_best_node`` has it inlined)."""
    resources = task.role.resources
    if node.cpu + CPU_EPSILON < resources.cpu or node.memory_mb < resources.memory_mb:
        return False
    return gpus_fit(node.state(), demand)


def _node_particular(task: _Task) -> bool:
    """Whether ``_node_fits`` can say no (the task asks for something alike nodes may not
    all have); a check added to ``_node_fits`` belongs here too."""
    return bool(task.role.ports)


def _node_fits(task: _Task, node: NodeFree, job_fixed: frozenset[int]) -> bool:
    """The part of ``_fits`` particular to a node beyond its capacity (its ports): checked
    node by node even among alike nodes."""
    own: set[int] = set()
    for spec in task.role.ports:
        if spec.begin_at > 0:
            ports = list(_fixed_range(spec))
            if any(not node.port_free(p) or p in own for p in ports):
                return False
            own.update(ports)
    dynamic = sum(spec.count for spec in task.role.ports if spec.begin_at == 0)
    return not dynamic or node.dynamic_ports_free(job_fixed | frozenset(own)) >= dynamic


def _placement(
    task: _Task,
    demand: Demand,
    node: NodeFree,
    devices: tuple[int, ...],
    rng: random.Random,
    job_fixed: frozenset[int],
) -> TaskPlacement:
    groups: list[PortAssignment | None] = []
    own: set[int] = set()
    for spec in task.role.ports:
        if spec.begin_at > 0:
            ports = list(_fixed_range(spec))
            own.update(ports)
            groups.append(PortAssignment(label=spec.label, ports=ports))
        else:
            groups.append(None)
    taken = set(node.ports_taken) | job_fixed | own
    for i, spec in enumerate(task.role.ports):
        if groups[i] is not None:
            continue
        picked = pick_ports(node.spec.port_range, spec.count, taken, rng)
        assert picked is not None, "_fits counted enough free ports"
        taken.update(picked)
        groups[i] = PortAssignment(label=spec.label, ports=picked)

    return TaskPlacement(
        role=task.role.name,
        index=task.index,
        node=node.name,
        host_ip=node.spec.host_ip,
        gpu_indices=list(devices),
        gpu_milli=demand.gpu_milli if demand.is_share else None,
        ports=[group for group in groups if group is not None],
    )


# --- explaining a task that fits nowhere ---------------------------------------------


def _explain(
    task: _Task,
    nodes: list[NodeFree],
    job_fixed: frozenset[int],
    placed: int,
    total: int,
) -> tuple[str, ...]:
    if not nodes:
        return ("the cluster has no nodes",)
    role = task.role
    resources = role.resources
    found: list[str] = []

    found += _shortfall(
        "CPU", resources.cpu, nodes, free=lambda n: n.cpu, total=lambda n: n.spec.cpu
    )
    found += _shortfall(
        "MB memory",
        resources.memory_mb,
        nodes,
        free=lambda n: n.memory_mb,
        total=lambda n: n.spec.memory_mb,
    )
    share = gpu_milli(resources)
    models = resources.allowed_gpu_types()
    if share is not None:
        found += _share_shortfall(share, models, nodes)
    else:
        found += _gpu_shortfall(gpu_count(resources), models, nodes)

    if _fixed_ports_overlap(role):
        found.append("its fixed port ranges overlap each other")
    for spec in role.ports:
        if spec.begin_at > 0 and not any(
            all(node.port_free(p) for p in _fixed_range(spec)) for node in nodes
        ):
            found.append(f"{_port_text(spec)} (label {spec.label}) is taken on every node")
    dynamic = sum(spec.count for spec in role.ports if spec.begin_at == 0)
    if dynamic:
        best = max(nodes, key=lambda n: n.dynamic_ports_free(job_fixed))
        free = best.dynamic_ports_free(job_fixed)
        if free < dynamic:
            found.append(
                f"needs {dynamic} free ports from a node's port range, "
                f"most free on any node is {free} ({best.name})"
            )

    if not found:
        misfits = [
            f"{node.name}: {_misfit(role, node, job_fixed)}" for node in nodes[:MAX_NODES_EXPLAINED]
        ]
        more = len(nodes) - MAX_NODES_EXPLAINED
        shown = "; ".join(misfits) + (f"; {more} more" if more > 0 else "")
        found.append(f"no single node has {_needs_text(role)} free at once ({shown})")
    reasons = [f"role {role.name} task {task.index}: {text}" for text in found]
    if placed:
        reasons.insert(
            0,
            f"only {placed} of {total} tasks fit at once, and all tasks of a job are "
            "placed together or not at all",
        )
    return tuple(reasons)


def _misfit(role: RoleSpec, node: NodeFree, job_fixed: frozenset[int]) -> str:
    """The first thing this node lacks for the task, in the order _fits checks."""
    resources = role.resources
    if node.cpu + CPU_EPSILON < resources.cpu:
        return f"{_num(node.cpu)} CPU free"
    if node.memory_mb < resources.memory_mb:
        return f"{node.memory_mb} MB memory free"
    need_gpus = gpu_count(resources)
    if need_gpus and not gpu_type_matches(resources.allowed_gpu_types(), node.spec):
        return f"GPU type {node.spec.gpu_type}" if node.spec.gpus else "no GPUs"
    share = gpu_milli(resources)
    if share is not None and node.best_share < share:
        return f"at most {node.best_share} milli-GPU free on one GPU"
    if share is None and need_gpus and len(node.gpus) < need_gpus:
        return f"{_gpus(len(node.gpus))} free"
    for spec in role.ports:
        if spec.begin_at > 0 and not all(node.port_free(p) for p in _fixed_range(spec)):
            return f"{_port_text(spec)} (label {spec.label}) taken"
    return f"{node.dynamic_ports_free(job_fixed)} free ports in its range"


def _shortfall(
    unit: str,
    need: float,
    nodes: list[NodeFree],
    *,
    free: Callable[[NodeFree], float],
    total: Callable[[NodeFree], float],
) -> list[str]:
    largest = total(max(nodes, key=total))
    if largest + CPU_EPSILON < need:
        return [f"needs {_num(need)} {unit}, the largest node has {_num(largest)} {unit} in total"]
    best = max(nodes, key=free)
    if free(best) + CPU_EPSILON < need:
        return [
            f"needs {_num(need)} {unit}, most free on any node is {_num(free(best))} ({best.name})"
        ]
    return []


def _gpu_shortfall(need: int, models: list[str], nodes: list[NodeFree]) -> list[str]:
    if not need:
        return []
    of_type = _of_type(models)
    typed = [n for n in nodes if n.spec.gpus > 0 and gpu_type_matches(models, n.spec)]
    if not typed:
        return [
            f"no node has {_gpus(need)}{of_type} (the cluster has no {_model_text(models)}GPUs)"
        ]
    largest = max(typed, key=lambda n: n.spec.gpus)
    if largest.spec.gpus < need:
        total = _gpus(largest.spec.gpus)
        return [
            f"no node has {_gpus(need)}{of_type}; the largest has {total} in total ({largest.name})"
        ]
    best = max(typed, key=lambda n: len(n.gpus))
    if len(best.gpus) < need:
        kind = f" {best.spec.gpu_type}" if best.spec.gpu_type else ""
        free = f"{best.name} {_gpus(len(best.gpus))}{kind}"
        return [
            f"no node has {need} free GPU{'s' if need != 1 else ''}{of_type} (largest free: {free})"
        ]
    return []


def _share_shortfall(milli: int, models: list[str], nodes: list[NodeFree]) -> list[str]:
    of_type = _of_type(models)
    typed = [n for n in nodes if n.spec.gpus > 0 and gpu_type_matches(models, n.spec)]
    if not typed:
        return [f"no node has a GPU{of_type} (the cluster has no {_model_text(models)}GPUs)"]
    best = max(typed, key=lambda n: n.best_share)
    if best.best_share < milli:
        return [
            f"needs {milli} milli-GPU on one GPU{of_type}, most free on one GPU is "
            f"{best.best_share} ({best.name})"
        ]
    return []


def _of_type(models: list[str]) -> str:
    if not models:
        return ""
    return f" of type {models[0]}" if len(models) == 1 else f" of types {', '.join(models)}"


def _model_text(models: list[str]) -> str:
    """The models as a noun's modifier, with its space: "A100 ", "A100 or V100 ", ""."""
    return " or ".join(models) + " " if models else ""


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _num(value: float) -> str:
    return f"{value:g}"


def _port_text(spec: PortSpec) -> str:
    if spec.count == 1:
        return f"port {spec.begin_at}"
    return f"ports {spec.begin_at}-{spec.begin_at + spec.count - 1}"


def _needs_text(role: RoleSpec) -> str:
    resources = role.resources
    parts = [f"{_num(resources.cpu)} CPU", f"{resources.memory_mb} MB memory"]
    of_type = _of_type(resources.allowed_gpu_types())
    if (share := gpu_milli(resources)) is not None:
        parts.append(f"{share} milli-GPU{of_type}")
    elif gpus := gpu_count(resources):
        parts.append(_gpus(gpus) + of_type)
    if ports := sum(spec.count for spec in role.ports):
        parts.append(f"{ports} port{'s' if ports != 1 else ''}")
    return ", ".join(parts[:-1]) + " and " + parts[-1]
