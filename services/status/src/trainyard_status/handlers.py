"""Status's service layer: every event goes to the history and the views."""

from __future__ import annotations

from trainyard_common.bus import Delivery
from trainyard_common.events import Event

from .adapters.views import JobViews
from .domain.projection import project


async def project_event(event: Event, delivery: Delivery, views: JobViews) -> None:
    # History first, then the views; both are idempotent, so a crash between them is
    # healed by the redelivery that follows.
    await views.record(event, delivery.stream_seq, delivery.trace_id)
    await views.apply(project(event))
