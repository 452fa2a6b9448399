"""Status's service layer: every event goes to the history, the views and the metrics;
and the views rebuilt from the stream (``yard admin rebuild``)."""

from __future__ import annotations

from functools import partial
from typing import Any

from trainyard_common.bus import Bus, Delivery, when_stored
from trainyard_common.events import Event
from trainyard_common.storage import Client
from trainyard_common.subjects import ALL_COMMANDS, ALL_EVENTS

from .adapters.metrics import observe
from .adapters.views import COLLECTIONS, JobViews, compare_views
from .domain.metrics import NEEDS_JOB, observations
from .domain.projection import project

REBUILD_DURABLE = "status-rebuild"


async def project_event(event: Event, delivery: Delivery, views: JobViews) -> None:
    # History first, then the views; both are idempotent, so a crash between them is
    # healed by the redelivery that follows. Only an event new to the history is
    # counted, with the job as it was before it, and only once its effects are stored
    # (bus.when_stored: in a batch, after the commit; a batch not stored undoes the
    # history row, and the redelivery finds the event new again and counts it then).
    # Metrics only, and not exact where a write went out and a later one failed (a
    # crash between them or before the count; on MongoDB a batch stored in part,
    # mongo_batch.py): the history row stays, and its redelivery is not counted.
    new = await views.record(event, delivery.stream_seq, delivery.trace_id)
    job = await views.get_job(event.job_id) if new and isinstance(event, NEEDS_JOB) else None
    await views.apply(project(event), delivery.stream_seq)
    if new:
        when_stored(partial(observe, observations(event, job)))


async def project_only(event: Event, delivery: Delivery, views: JobViews) -> None:
    """The projection without the metrics (a rebuild counts nothing again)."""
    await views.record(event, delivery.stream_seq, delivery.trace_id)
    await views.apply(project(event), delivery.stream_seq)


async def rebuild(
    bus: Bus, client: Client, db_name: str, live: JobViews, apply: bool
) -> dict[str, Any]:
    """Read the whole stream again, up to its newest message now, into fresh views
    (a scratch database, dropped afterwards), and compare them with the live ones;
    with ``apply``, make the live ones what the stream says. What changed after the
    rebuild began is left out of the comparison (it is newer than the replay). A
    replay that cannot reach the newest message raises ReplayIncomplete before anything
    is compared: the part read, taken for the whole, would delete and roll back views."""
    scratch_name = f"{db_name}_rebuild"
    await client.drop_database(scratch_name)
    scratch = JobViews(client[scratch_name])
    try:
        await scratch.ensure_indexes()
        until = await bus.last_seq()
        handled = await bus.replay_stream(
            REBUILD_DURABLE, [ALL_EVENTS, ALL_COMMANDS], partial(project_only, views=scratch), until
        )
        differences = await compare_views(live, scratch, until, apply)
        counts = {name: await getattr(scratch, name).count_documents({}) for name in COLLECTIONS}
    finally:
        await client.drop_database(scratch_name)
    return {
        "until_seq": until,
        "messages": handled,
        "rebuilt": counts,
        "different": len(differences),
        "differences": differences[:100],
        "applied": apply,
    }
