"""``python -m trainyard_intake``: bootstrap and run the intake service."""

from __future__ import annotations

import asyncio

from trainyard_common.aliyun_auth import NONCE_TTL_S
from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.bus import Bus, Delivery, KvNonces
from trainyard_common.cluster import load_cluster
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.runtime import run_service, serve, setup_logging
from trainyard_common.secrets_box import SecretBox
from trainyard_common.storage import open_store
from trainyard_common.subjects import subjects_for, submissions
from trainyard_common.telemetry import setup_telemetry

from .adapters.names import DocNameClaims
from .adapters.owners import DocOwnerRegistry
from .adapters.sources import DocSourceRegistry
from .app import create_app
from .handlers import EVENT_HANDLERS, NAMES_DURABLE, Deps
from .producers import DURABLE, Submission, decode_submission, submit_published

# How long a Kubernetes-style write waits for status to show it before answering anyway.
SETTLE_S = 2.0


async def main() -> None:
    settings = Settings.from_env("intake")
    setup_logging("intake")
    setup_telemetry("intake")
    cluster = load_cluster()
    bus = await Bus.connect(settings.nats_url, name="intake")
    client = open_store(settings.mongo_url, settings.store_dir)
    owners = DocOwnerRegistry(client[settings.db_name()]["owners"])
    await owners.ensure_indexes()
    names = DocNameClaims(client[settings.db_name()]["names"])
    await names.ensure_indexes()
    # DLC's data and code sources (dialect_api/dlc.py): their indexes were never made,
    # and each list read every source and sorted them.
    await DocSourceRegistry(client[settings.db_name()]).ensure_indexes()
    tokens = TokenStore(
        tokens_collection(client, settings.db_prefix),
        settings.admin_token,
        # PAI-DLC signatures' nonces, shared by every API and replica that checks them.
        await KvNonces.open(bus, NONCE_TTL_S),
    )
    deps = Deps(
        publish=bus.publish,
        owners=owners,
        names=names,
        settled=lambda seq: bus.consumed("status", seq, SETTLE_S),
        # The nodes of a Kubernetes backend are known at run time (placement, validation).
        cluster=cluster if cluster.runtime == "local" else None,
        box=SecretBox.from_env(),
        # What the server takes, less room for the headers (trace context, ids).
        max_payload=bus.nc.max_payload - 4096,
    )
    app = create_app(deps, tokens, client[settings.db_name()])

    async def handle(submission: Submission, delivery: Delivery) -> None:
        await submit_published(submission, delivery, deps)

    async def producers(stop: asyncio.Event) -> None:
        await bus.consume(DURABLE, submissions(), handle, stop=stop, decoder=decode_submission)

    async def dispatch(event: Event, delivery: Delivery) -> None:
        handler = EVENT_HANDLERS.get(type(event))
        if handler is not None:
            await handler(event, delivery, deps)

    async def events(stop: asyncio.Event) -> None:
        # Rejected jobs give their names back (handlers.release_rejected_name).
        await bus.consume(NAMES_DURABLE, subjects_for(EVENT_HANDLERS), dispatch, stop=stop)

    try:
        await serve(settings, app, [producers, events])
    finally:
        await bus.close()
        await client.close()


if __name__ == "__main__":
    run_service(main)
