"""``python -m trainyard_status``: bootstrap and run the status service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import Any

from trainyard_common.aliyun_auth import NONCE_TTL_S
from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.bus import Bus, DeadLetters, KvNonces
from trainyard_common.config import Settings
from trainyard_common.runtime import run_service, serve, setup_logging
from trainyard_common.storage import batch_writes, batching, open_store, reads_ahead
from trainyard_common.subjects import ALL_COMMANDS, ALL_EVENTS
from trainyard_common.telemetry import setup_telemetry

from .adapters.feed import JobFeed
from .adapters.metrics import keep_state_counts
from .adapters.views import JobViews
from .app import create_app
from .handlers import project_event, rebuild

log = logging.getLogger("trainyard.status")
RETRY_S = 10


async def main() -> None:
    settings = Settings.from_env("status")
    setup_logging("status")
    setup_telemetry("status")
    bus = await Bus.connect(settings.nats_url, name="status")
    client = open_store(settings.mongo_url, settings.store_dir)
    db = batching(client[settings.db_name()])
    views = JobViews(db)
    await views.ensure_indexes()
    tokens = TokenStore(
        tokens_collection(client, settings.db_prefix),
        settings.admin_token,
        # PAI-DLC signatures' nonces, shared by every API and replica that checks them.
        await KvNonces.open(bus, NONCE_TTL_S),
    )

    async def consume(stop: asyncio.Event) -> None:
        handler = partial(project_event, views=views)
        # The projection writes only to its store: a fetched batch is stored at once
        # (bus.Atomic; one transaction on SQLite, bounded bulk writes on MongoDB).
        await bus.consume(
            "status", [ALL_EVENTS, ALL_COMMANDS], handler, stop=stop,
            atomic=batch_writes(db),
            before_batch=views.preload if reads_ahead(db) else None,
        )  # fmt: skip

    try:

        async def count(stop: asyncio.Event) -> None:
            await keep_state_counts(views, stop)

        async def fill_labels(stop: asyncio.Event) -> None:
            # Once, for a store from before the labels' index; an error (the store away
            # for a moment) is said and the fill goes on from where it was, the
            # service serving meanwhile (a label filter walks the jobs until it is done).
            while not stop.is_set():
                try:
                    await views.fill_labels(stop)
                    break
                except Exception:
                    log.exception("filling the labels' index failed; again in %d s", RETRY_S)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), RETRY_S)
            await stop.wait()

        feed = JobFeed(views)

        async def rebuild_views(apply: bool) -> dict[str, Any]:
            return await rebuild(bus, client, settings.db_name(), views, apply)

        app = create_app(views, tokens, DeadLetters(bus), feed, rebuild_views)
        await serve(settings, app, [consume, count, fill_labels, feed.run])
    finally:
        await bus.close()
        await client.close()


if __name__ == "__main__":
    run_service(main)
