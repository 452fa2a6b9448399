"""Status's service layer: every event goes to the history, the views and the metrics."""

from __future__ import annotations

from trainyard_common.bus import Delivery
from trainyard_common.events import Event

from .adapters.metrics import observe
from .adapters.views import JobViews
from .domain.metrics import NEEDS_JOB, observations
from .domain.projection import project


async def project_event(event: Event, delivery: Delivery, views: JobViews) -> None:
    # History first, then the views; both are idempotent, so a crash between them is
    # healed by the redelivery that follows. Only an event new to the history is
    # counted (before the views change: a redelivery after a failed apply counts
    # nothing again), with the job as it was before it.
    new = await views.record(event, delivery.stream_seq, delivery.trace_id)
    if new:
        job = await views.get_job(event.job_id) if isinstance(event, NEEDS_JOB) else None
        observe(observations(event, job))
    await views.apply(project(event), delivery.stream_seq)
