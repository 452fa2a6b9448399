"""``python -m trainyard_placement``: bootstrap. Settings, clients, the state rebuilt from the
store, one durable consumer and the HTTP app, all under :func:`trainyard_common.runtime.serve`.

Replicas: every process serves its health check at once, then waits for the leader
lease (``adapters/lease.py``, bucket ``yard_leases``, key ``placement``). Only the holder
loads the state, consumes and answers the placement API; a follower answers 503 there
and never pulls from the shared durable consumer. A leader that loses its lease stops
consuming, drops its in-memory state and follows again; if it leads later it reloads
everything from the store, so two schedulers never act on two views of the cluster.
A clean stop gives the lease up, so a follower takes over at its next look."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.bus import Bus, Delivery, key_value
from trainyard_common.cluster import load_cluster
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.kube_nodes import KubeNode, NodeWatch, cluster_from_nodes
from trainyard_common.runtime import run_service, serve, setup_logging
from trainyard_common.storage import open_store
from trainyard_common.telemetry import setup_telemetry

from .adapters.lease import Lease, LeaseLost
from .adapters.metrics import FIGURES
from .adapters.nodes import DocNodeStore
from .adapters.store import DocJobStore
from .app import SERVICE, Front, add_node_routes, build_app
from .domain.policies import scorer_named
from .handlers import (
    SUBJECTS,
    handle,
    load,
    run_due_cycle,
    start,
    wake_retries,
)
from .node_admin import NodeAdmin
from .settings import PlacementSettings

log = logging.getLogger("trainyard.placement")


CONSUMER = "placement"
LEASE_BUCKET = "yard_leases"
LEASE_KEY = "placement"


class NotLeading(Exception):
    """A message reached a replica whose lease ran out: nak it for the next leader."""


async def follow_nodes(admin: NodeAdmin, stop: asyncio.Event) -> None:
    async def changed(nodes: dict[str, KubeNode]) -> None:
        await admin.sync({name: (n.spec, n.schedulable) for name, n in nodes.items()})

    await NodeWatch(changed).run(stop)


def replica_id() -> str:
    return f"{socket.gethostname() or 'localhost'}:{os.getpid()}"


async def main() -> None:
    settings = Settings.from_env(SERVICE)
    setup_logging(SERVICE)
    setup_telemetry(SERVICE)
    cluster = load_cluster()
    if cluster.runtime == "kubernetes":
        cluster = await cluster_from_nodes(cluster)
    # An unknown policy name or a bad lease ttl stops the service here, before it
    # takes any job.
    placement = PlacementSettings.from_env()
    bus = await Bus.connect(settings.nats_url, name=SERVICE)
    client = open_store(settings.mongo_url, settings.store_dir)
    try:
        db = client[settings.db_name()]
        store = DocJobStore(db["jobs"])
        await store.ensure_indexes()
        nodes = DocNodeStore(db["nodes"])
        tokens = TokenStore(tokens_collection(client, settings.db_prefix), settings.admin_token)
        lease = Lease(
            await key_value(bus, LEASE_BUCKET), LEASE_KEY, replica_id(), placement.lease_ttl_s
        )
        front = Front(lease, tokens)

        async def lead_once(stop: asyncio.Event) -> None:
            log.info("placement replica %s leads", lease.replica)
            keeper = asyncio.create_task(lease.keep(stop), name="lease")
            workers: list[asyncio.Task[None]] = []
            try:
                deps = await load(store, bus, cluster)
                deps.leading = lambda: lease.held
                deps.state.scorer = scorer_named(placement.policy)
                deps.state.rules = placement.rules
                deps.growth_after_s = placement.growth_after_s
                admin = NodeAdmin(deps, nodes)
                await admin.restore()
                await start(deps)
                FIGURES.source = lambda: (deps.state, (job for job, _ in deps.deferred.values()))

                async def on_message(event: Event, delivery: Delivery) -> None:
                    if not lease.held:
                        raise NotLeading(f"replica {lease.replica} lost the lease")
                    await handle(event, delivery, deps)

                deps.defer_cycles = True

                async def after_batch() -> None:
                    await run_due_cycle(deps)

                workers = [
                    asyncio.create_task(
                        bus.consume(
                            CONSUMER, SUBJECTS, on_message, stop=stop, after_batch=after_batch
                        ),
                        name="consume",
                    ),
                    asyncio.create_task(wake_retries(deps, stop), name="wake"),
                ]
                if cluster.runtime == "kubernetes":
                    # The cluster's own Nodes, followed as they come and go.
                    workers.append(asyncio.create_task(follow_nodes(admin, stop), name="nodes"))
                app = build_app(deps, tokens)
                add_node_routes(app, admin, tokens)
                front.leader_app = app
                done, _ = await asyncio.wait(
                    [keeper, *workers], return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    task.result()  # LeaseLost: follow again; a worker's failure ends the process
                await asyncio.gather(*workers)
            finally:
                # Lost or stopping: nothing acts for this replica any longer, and only
                # then is a lease still held given up.
                front.leader_app = None
                FIGURES.source = lambda: None
                for task in (keeper, *workers):
                    task.cancel()
                await asyncio.gather(keeper, *workers, return_exceptions=True)
                try:
                    await lease.release()
                except Exception:  # noqa: BLE001 - a follower takes over after the ttl then
                    log.exception("giving the lease up failed")

        async def lead(stop: asyncio.Event) -> None:
            # A replica that loses its lease (the bus away longer than the held time)
            # stops acting, goes back to following and may lead again later, with
            # its state reloaded from the store: no supervisor has to restart it.
            while await lease.acquire(stop):
                try:
                    await lead_once(stop)
                except LeaseLost:
                    log.warning(
                        "placement replica %s lost the lease; following again", lease.replica
                    )

        await serve(settings, front.app, [lead])
    finally:
        await bus.close()
        await client.close()


def run() -> None:
    run_service(main)


if __name__ == "__main__":
    run()
