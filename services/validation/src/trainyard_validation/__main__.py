"""``python -m trainyard_validation``: bootstrap. Settings, clients, the JobSubmitted
consumer, the node watch on Kubernetes, and the HTTP app."""

from __future__ import annotations

import asyncio
import logging

from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.bus import Bus, Delivery
from trainyard_common.cluster import load_cluster
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.kube_nodes import KubeNode, NodeWatch, cluster_from_nodes
from trainyard_common.runtime import run_service, serve, setup_logging
from trainyard_common.storage import open_store
from trainyard_common.telemetry import setup_telemetry

from .adapters.names import DocNameRegistry
from .app import SERVICE, create_app
from .handlers import EVENT_HANDLERS, SUBJECTS, Deps

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
    client = open_store(settings.mongo_url, settings.store_dir)
    deps = Deps(
        cluster=cluster, names=DocNameRegistry(client[settings.db_name()]), publish=bus.publish
    )

    async def dispatch(event: Event, delivery: Delivery) -> None:
        handler = EVENT_HANDLERS.get(type(event))
        if handler is not None:
            await handler(event, delivery, deps)

    async def consume_submitted(stop: asyncio.Event) -> None:
        await bus.consume(DURABLE, SUBJECTS, dispatch, stop=stop)

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
        tokens = TokenStore(tokens_collection(client, settings.db_prefix), settings.admin_token)
        await serve(settings, create_app(lambda: deps.cluster, deps.names, tokens), workers)
    finally:
        await bus.close()
        await client.close()


def main() -> None:
    run_service(run)


if __name__ == "__main__":
    main()
