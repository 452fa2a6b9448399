"""Node administration: add, drain, undrain and remove nodes while placement runs.

Every change is stored first (``adapters/nodes.py``), then applied to the scheduler's
state, then acted on, under the same lock as the event handlers:

- **add** — a new node (a name not in the cluster) joins after the others; queued jobs
  may fit now, so a cycle runs;
- **drain** — no new task is placed on the node; what runs there keeps running;
- **undrain** — the node takes tasks again (a cycle runs);
- **remove** — the node leaves the cluster, and every placed job with a task on it is
  interrupted (``handlers.interrupt_placed``: stored as interrupting, then
  ``InterruptJob`` with cause ``node_removed``, id ``derived_id(job, attempt,
  "interrupt", "node_removed")``); the launcher ends that attempt and answers
  ``JobInterrupted``, which gives the job's capacity back and queues its next attempt
  (no retry spent). Until then the job keeps what it holds on its other nodes. A job
  already being interrupted for another cause is left to that.

A restart applies the stored records over the configured cluster (:meth:`restore`),
so it rebuilds the same nodes, and interrupts again every job still on a removed node
(placed, or interrupting for that removal): a crash, or a bus failure, between storing
a removal and announcing it loses nothing, and the same derived id makes a repeat
harmless. Removing a removed node again does the same without a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainyard_common.cluster import NodeSpec
from trainyard_common.events import InterruptCause, InterruptJob, utcnow

from .adapters.nodes import NodeRecord, NodeStore
from .domain import Snapshot
from .domain.gpu_share import MILLI
from .domain.usage import waiting_by_queue
from .handlers import Deps, interrupt_id, interrupt_placed, publish, run_cycle

log = logging.getLogger("trainyard.placement.nodes")


class NodeError(Exception):
    """A node change that cannot be made; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def jobs_on(deps: Deps, node: str) -> list[str]:
    """Placed jobs with at least one task on ``node``."""
    return sorted(
        job_id
        for job_id, allocation in deps.state.placed.items()
        if any(task.node == node for task in allocation.tasks)
    )


class NodeAdmin:
    def __init__(self, deps: Deps, store: NodeStore) -> None:
        self.deps = deps
        self.store = store

    # --- restart ---------------------------------------------------------------------

    async def restore(self) -> None:
        """Apply the stored changes over the configured cluster and interrupt again
        whatever still runs on a removed node. Call after ``handlers.load`` and before
        ``handlers.start``."""
        removed = []
        for record in await self.store.all():
            self._apply(record)
            if record.state == "removed":
                removed.append(record.name)
        async with self.deps.lock:
            for name in removed:
                await self._interrupt(name, jobs_on(self.deps, name))

    def _apply(self, record: NodeRecord) -> None:
        state = self.deps.state
        known = self._node(record.name) is not None
        if record.state == "removed":
            if known:
                state.remove_node(record.name)
            return
        if record.spec is not None:
            if known:
                # Removed and added again through the API, or put in the cluster file
                # later: the API's spec and place (after the others) win, as they did in
                # the process that made the change.
                state.remove_node(record.name)
            state.add_node(record.spec)
        elif not known:
            log.warning(
                "node %s has a recorded state %r but is no longer in the cluster file; ignored",
                record.name,
                record.state,
            )
            return
        if record.state == "drained":
            state.drain_node(record.name)

    # --- changes ---------------------------------------------------------------------

    async def add(self, spec: NodeSpec) -> dict[str, Any]:
        async with self.deps.lock:
            if self._node(spec.name) is not None:
                raise NodeError(409, f"name: node {spec.name} already exists")
            holding = jobs_on(self.deps, spec.name)
            if holding:
                raise NodeError(
                    409,
                    f"name: node {spec.name} was removed and "
                    f"{len(holding)} job(s) still hold it until their "
                    f"interruption ends: {', '.join(holding)}",
                )
            await self.store.put(NodeRecord(spec.name, "ready", spec, utcnow()))
            self.deps.state.add_node(spec)
            await run_cycle(self.deps)
            return self._view(spec, self.deps.state.snapshot())

    async def drain(self, name: str) -> dict[str, Any]:
        return await self._set_state(name, "drained")

    async def undrain(self, name: str) -> dict[str, Any]:
        return await self._set_state(name, "ready")

    async def forget(self, name: str) -> dict[str, Any]:
        """The node is gone (Kubernetes deleted it): nothing more goes there, and the
        jobs it ran are not interrupted: their tasks went with it, and the launcher ends
        them as lost with their node (a platform failure, retried as such)."""
        async with self.deps.lock:
            if self._node(name) is None:
                return {"name": name, "state": "removed", "interrupted": []}
            record = await self.store.get(name)
            added_at = record.added_at if record else None
            await self.store.put(NodeRecord(name, "removed", None, added_at))
            self.deps.state.remove_node(name)
            await run_cycle(self.deps)
            return {"name": name, "state": "removed", "interrupted": []}

    async def sync(self, nodes: dict[str, tuple[NodeSpec, bool]]) -> None:
        """Follow the cluster's own nodes (name -> spec, schedulable): new ones added,
        gone ones forgotten, cordoned ones drained and uncordoned ones undrained."""
        current = {node["name"]: node for node in self.view()}
        for name, (spec, schedulable) in sorted(nodes.items()):
            if name not in current:
                try:
                    await self.add(spec)
                except NodeError as exc:
                    log.warning("node %s from the cluster: %s", name, exc)
                    continue
                if not schedulable:
                    await self.drain(name)
            elif not schedulable and current[name]["state"] != "drained":
                await self.drain(name)
            elif schedulable and current[name]["state"] == "drained":
                await self.undrain(name)
        for name in sorted(set(current) - set(nodes)):
            await self.forget(name)

    async def remove(self, name: str) -> dict[str, Any]:
        async with self.deps.lock:
            record = await self.store.get(name)
            if self._node(name) is None and record is not None and record.state == "removed":
                # Asked again (the first answer was lost, or its interrupts failed).
                interrupted = await self._interrupt(name, jobs_on(self.deps, name))
                return {"name": name, "state": "removed", "interrupted": interrupted}
            self._known(name)
            added_at = record.added_at if record else None
            await self.store.put(NodeRecord(name, "removed", None, added_at))
            interrupted = await self._interrupt(name, self.deps.state.remove_node(name))
            await run_cycle(self.deps)
            return {"name": name, "state": "removed", "interrupted": interrupted}

    async def _set_state(self, name: str, state: str) -> dict[str, Any]:
        async with self.deps.lock:
            node = self._known(name)
            record = await self.store.get(name)
            spec = record.spec if record else None
            added_at = record.added_at if record else None
            await self.store.put(NodeRecord(name, state, spec, added_at))  # type: ignore[arg-type]
            if state == "drained":
                self.deps.state.drain_node(name)
            else:
                self.deps.state.undrain_node(name)
            # Reasons of waiting jobs name free capacity; undrain may place them.
            await run_cycle(self.deps)
            return self._view(node, self.deps.state.snapshot())

    async def _interrupt(self, node: str, jobs: list[str]) -> list[str]:
        """Interrupt ``jobs`` for the removal of ``node``; returns those told to end."""
        cause = InterruptCause.NODE_REMOVED
        reason = f"node {node} was removed by an administrator"
        interrupted = []
        for job_id in jobs:
            record = await self.deps.store.get(job_id)
            if record is None:
                continue
            if record.state == "placed":
                if await interrupt_placed(self.deps, record, cause, reason):
                    interrupted.append(job_id)
            elif (
                record.state == "interrupting"
                and record.interrupt is not None
                and (record.interrupt[0] == cause)
            ):
                # Stored as interrupting, the InterruptJob maybe never sent: again, with
                # the same id (JetStream drops a repeat; the launcher ignores an attempt
                # that already ended).
                await publish(self.deps, InterruptJob(
                    event_id=interrupt_id(job_id, record.attempt, cause), job_id=job_id,
                    attempt=record.attempt, cause=cause, reason=record.interrupt[1],
                ))  # fmt: skip
                interrupted.append(job_id)
            # Anything else is leaving for another cause already, or has ended.
        return interrupted

    # --- views -----------------------------------------------------------------------

    def view(self) -> list[dict[str, Any]]:
        # The scheduler's kept snapshot, drained nodes included: allocations stay counted
        # on a drained node (the scheduler only stops placing there).
        snapshot = self.deps.state.snapshot()
        return [self._view(node, snapshot) for node in self.deps.state.cluster.nodes]

    def _view(self, node: NodeSpec, snapshot: Snapshot) -> dict[str, Any]:
        free = snapshot.node(node.name)
        gpu_free_milli = sum(free.gpu_free)
        capacity = {"cpu": node.cpu, "memory_mb": node.memory_mb, "gpus": node.gpus}
        return {
            "name": node.name,
            "state": "drained" if self.deps.state.is_drained(node.name) else "ready",
            "host_ip": node.host_ip,
            "gpu_type": node.gpu_type,
            "labels": {label.name: label.value for label in node.labels},
            "capacity": capacity,
            "allocated": {
                "cpu": round(node.cpu - free.cpu, 3),
                "memory_mb": node.memory_mb - free.memory_mb,
                "gpus": (node.gpus * MILLI - gpu_free_milli) / MILLI,
            },
            "free": {
                "cpu": round(free.cpu, 3),
                "memory_mb": free.memory_mb,
                "gpus": gpu_free_milli / MILLI,
                "whole_gpus": len(free.gpus),
            },
            "jobs": jobs_on(self.deps, node.name),
        }

    def _node(self, name: str) -> NodeSpec | None:
        return next((n for n in self.deps.state.cluster.nodes if n.name == name), None)

    def _known(self, name: str) -> NodeSpec:
        node = self._node(name)
        if node is None:
            raise NodeError(404, f"no node {name}")
        return node


def cluster_view(
    deps: Deps, admin: NodeAdmin, identity_sees: Callable[[str], bool]
) -> dict[str, Any]:
    """The cluster for anyone signed in (the console's cluster page): every node with
    what it has, holds and has free, and who holds its GPUs (another user's job is shown
    only as taken); every queue with its quota, what its jobs use and how many wait."""
    state = deps.state
    holders: dict[str, list[dict[str, Any]]] = {}
    for job_id, allocation in sorted(state.placed.items()):
        spec = allocation.spec
        mine = identity_sees(spec.user)
        for task in allocation.tasks:
            gpus = task.gpu_milli / MILLI if task.gpu_milli is not None else len(task.gpu_indices)
            holders.setdefault(task.node, []).append({
                "job_id": job_id if mine else None,
                "user": spec.user if mine else None,
                "queue": spec.queue,
                "task": f"{task.role}[{task.index}]" if mine else None,
                "gpu_indices": list(task.gpu_indices),
                "gpus": gpus,
            })  # fmt: skip
    nodes = []
    for node in admin.view():
        node.pop("jobs", None)
        node.pop("labels", None)
        node["tasks"] = holders.get(node["name"], [])
        nodes.append(node)
    usage = state.queue_usage()
    waiting = waiting_by_queue(state, (job for job, _ in deps.deferred.values()))
    queues = []
    for name in state.cluster.queue_names():
        queue = state.cluster.queue(name)
        used = usage.get(name)
        queues.append({
            "name": name,
            "quota": queue.quota.model_dump(),
            "used": {
                "cpu": used.cpu_milli / 1000 if used else 0,
                "memory_mb": used.memory_mb if used else 0,
                "gpus": used.gpu_milli / MILLI if used else 0,
            },
            "waiting": waiting.get(name, 0),
            "borrowing": queue.borrowing,
        })  # fmt: skip
    return {"nodes": nodes, "queues": queues}
