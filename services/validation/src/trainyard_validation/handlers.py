"""The validation service's handlers: one per event it consumes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from trainyard_common.bus import Delivery, EventHandler
from trainyard_common.cluster import ClusterSpec
from trainyard_common.events import Event, JobAccepted, JobSubmitted
from trainyard_common.subjects import subjects_for

from .adapters.names import NameRegistry
from .domain.rules import decide, name_taken


@dataclass
class Deps:
    cluster: ClusterSpec
    names: NameRegistry
    publish: Callable[[Event], Awaitable[Any]]


async def validate_job(event: JobSubmitted, delivery: Delivery, deps: Deps) -> None:
    """Accept or reject a submission. A rejection is a normal outcome, published like
    an acceptance, so nothing is raised for it and the message is acked."""
    result = decide(event, deps.cluster)
    if event.name_claimed and event.dialect_key is not None:
        # Intake claimed the name before publishing (and refused it when used); the
        # record here follows it, for the dry run's check of a name.
        if isinstance(result, JobAccepted):
            await deps.names.take(result.spec.user, event.dialect_key, event.job_id)
        await deps.publish(result)
        return
    # A submission of an earlier version, not claimed at intake. The name is claimed only for a job that passed every other rule, so a rejected
    # job never holds a name; the claim (the stored effect) comes before the publish.
    # Dialects that name jobs only by id (DLC) have no key and nothing to claim.
    if (
        isinstance(result, JobAccepted)
        and event.dialect_key is not None
        and not await deps.names.claim(result.spec.user, event.dialect_key, event.job_id)
    ):
        result = name_taken(event)
    await deps.publish(result)


EVENT_HANDLERS: dict[type[Event], EventHandler[Deps]] = {
    JobSubmitted: validate_job,
}
# The consumer's subscription: exactly what the table handles.
SUBJECTS = subjects_for(EVENT_HANDLERS)
