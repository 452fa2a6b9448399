"""Loading the state from the store at start, the first cycle, waking retries whose
backoff ended, and the queue view."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from trainyard_common.cluster import ClusterSpec

from ..adapters.store import (
    JobStore,
)
from ..domain import SchedulerState
from .common import Deps, Publisher, adopt_record
from .cycle import run_cycle, run_due_cycle

log = logging.getLogger("trainyard.placement")


async def load(store: JobStore, publisher: Publisher, cluster: ClusterSpec) -> Deps:
    """Rebuild the in-memory state from the store: every queued and placed job, each
    counted once, since capacity is derived from the placed jobs' allocations."""
    deps = Deps(store=store, publisher=publisher, state=SchedulerState(cluster))
    for record in await store.active():
        adopt_record(deps, record)
    return deps


async def start(deps: Deps) -> None:
    """First cycle after a (re)start: re-announces unannounced placements and places
    whatever fits after changes the previous process stored but did not act on."""
    async with deps.lock:
        await run_cycle(deps)


async def wake_retries(deps: Deps, stop: asyncio.Event, interval_s: float = 0.2) -> None:
    """Run a cycle when a retried job's backoff ends (no event marks that moment)."""
    while not stop.is_set():
        now = deps.clock()
        if any(not_before <= now for _, not_before in deps.deferred.values()):
            deps.cycle_due = True
        try:
            # Also a batch's cycle that failed: it is tried again here.
            if deps.cycle_due:
                await run_due_cycle(deps)
        except Exception:  # noqa: BLE001 - the next event or look runs the cycle again
            log.exception("placing failed; trying again")
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            pass


def queue_view(deps: Deps) -> list[dict[str, Any]]:
    rows = []
    for verdict in sorted(deps.waiting.values(), key=lambda w: w.position):
        job = deps.state.queued.get(verdict.job_id)
        if job is None and verdict.job_id in deps.deferred:
            job = deps.deferred[verdict.job_id][0]
        if job is None:
            continue
        rows.append({
            "job_id": verdict.job_id,
            "name": job.spec.name,
            "user": job.spec.user,
            "queue": job.spec.queue,
            "priority": job.spec.priority,
            "position": verdict.position,
            "reasons": list(verdict.reasons),
        })  # fmt: skip
    return rows
