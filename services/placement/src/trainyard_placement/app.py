"""Bootstrap: settings, clients, the state rebuilt from the store, one durable consumer
and the HTTP app, all under :func:`trainyard_common.runtime.serve`."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import Depends, FastAPI

from trainyard_common.auth import Identity, TokenStore, identity_dependency, tokens_collection
from trainyard_common.bus import Bus, Delivery
from trainyard_common.cluster import load_cluster
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.runtime import health_app, serve, setup_logging
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import commands_of, events_of
from trainyard_common.telemetry import setup_telemetry

from .adapters.store import MongoJobStore
from .domain.policies import scorer_named
from .handlers import Deps, handle, load, queue_view, start, wake_retries

SERVICE = "placement"
CONSUMER = "placement"
SUBJECTS = events_of("accepted", "finished", "retrying") + commands_of("stop")


def build_app(deps: Deps, tokens: TokenStore) -> FastAPI:
    app = health_app(SERVICE)
    current = identity_dependency(tokens)

    @app.get("/v1/placement/queue")
    async def queue(identity: Identity = Depends(current)) -> dict[str, Any]:
        # Everyone's place in line is shown to an admin; a user sees their own jobs.
        rows = [row for row in queue_view(deps) if identity.can_see(row["user"])]
        return {"jobs": rows}

    return app


async def main() -> None:
    settings = Settings.from_env(SERVICE)
    setup_logging(SERVICE)
    setup_telemetry(SERVICE)
    cluster = load_cluster()
    # An unknown policy name stops the service here, before it takes any job.
    scorer = scorer_named(os.environ.get("YARD_PLACEMENT_POLICY"))
    bus = await Bus.connect(settings.nats_url, name=SERVICE)
    client = mongo_client(settings.mongo_url)
    try:
        store = MongoJobStore(client[settings.db_name()]["jobs"])
        deps = await load(store, bus, cluster)
        deps.state.scorer = scorer
        await start(deps)

        async def on_message(event: Event, delivery: Delivery) -> None:
            await handle(event, delivery, deps)

        async def consume(stop: asyncio.Event) -> None:
            await bus.consume(CONSUMER, SUBJECTS, on_message, stop=stop)

        async def wake(stop: asyncio.Event) -> None:
            await wake_retries(deps, stop)

        tokens = TokenStore(tokens_collection(client, settings.db_prefix), settings.admin_token)
        await serve(settings, build_app(deps, tokens), [consume, wake])
    finally:
        await bus.close()
        await client.close()


def run() -> None:
    asyncio.run(main())
