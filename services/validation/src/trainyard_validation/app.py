"""Bootstrap: settings, clients, the JobSubmitted consumer and the health endpoint."""

from __future__ import annotations

import asyncio
import logging

from trainyard_common.auth import TokenStore, identity_dependency, tokens_collection
from trainyard_common.bus import Bus, Delivery
from trainyard_common.cluster import load_cluster
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.kube_nodes import KubeNode, NodeWatch, cluster_from_nodes
from trainyard_common.runtime import health_app, serve, setup_logging
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import subjects_for
from trainyard_common.telemetry import setup_telemetry

from . import dry_run
from .adapters.names import MongoNameRegistry
from .handlers import EVENT_HANDLERS, Deps

SERVICE = "validation"
DURABLE = "validation"

log = logging.getLogger("trainyard.validation")


async def run() -> None:
    setup_logging(SERVICE)
    setup_telemetry(SERVICE)
    settings = Settings.from_env(SERVICE)
    cluster = load_cluster()
    if cluster.runtime == "kubernetes":
        cluster = await cluster_from_nodes(cluster)
    bus = await Bus.connect(settings.nats_url, name=f"trainyard-{SERVICE}")
    client = mongo_client(settings.mongo_url)
    deps = Deps(
        cluster=cluster, names=MongoNameRegistry(client[settings.db_name()]), publish=bus.publish
    )

    async def dispatch(event: Event, delivery: Delivery) -> None:
        handler = EVENT_HANDLERS.get(type(event))
        if handler is not None:
            await handler(event, deps)

    async def consume_submitted(stop: asyncio.Event) -> None:
        await bus.consume(DURABLE, subjects_for(EVENT_HANDLERS), dispatch, stop=stop)

    async def follow_nodes(stop: asyncio.Event) -> None:
        async def changed(nodes: dict[str, KubeNode]) -> None:
            # A cordoned node takes no new task: what fits is checked against the others.
            ready = [n.spec for n in nodes.values() if n.schedulable]
            deps.cluster = deps.cluster.model_copy(update={"nodes": ready})

        await NodeWatch(changed).run(stop)

    workers = [consume_submitted]
    if cluster.runtime == "kubernetes":
        workers.append(follow_nodes)

    log.info("validating against %d nodes, queues %s", len(cluster.nodes), cluster.queues)
    try:
        app = health_app(SERVICE)
        tokens = TokenStore(tokens_collection(client, settings.db_prefix), settings.admin_token)
        current = identity_dependency(tokens)
        app.include_router(dry_run.router(lambda: deps.cluster, deps.names, current))
        await serve(settings, app, workers)
    finally:
        await bus.close()
        await client.close()


def main() -> None:
    asyncio.run(run())
