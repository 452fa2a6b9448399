"""Bootstrap: settings, clients, the state rebuilt from the store, one durable consumer
and the HTTP app, all under :func:`trainyard_common.runtime.serve`.

Replicas: every process serves its health check at once, then waits for the leader
lease (``adapters/lease.py``, bucket ``yard_leases``, key ``placement``). Only the holder
loads the state, consumes and answers the placement API; a follower answers 503 there
and never pulls from the shared durable consumer. A leader that loses its lease stops
consuming, drops its in-memory state and follows again; if it leads later it reloads
everything from the store, so two schedulers never act on two views of the cluster.
A clean stop gives the lease up, so a follower takes over at its next look.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trainyard_common.auth import Identity, TokenStore, identity_dependency, tokens_collection
from trainyard_common.bus import Bus, Delivery, key_value
from trainyard_common.cluster import NodeSpec, load_cluster
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.kube_nodes import KubeNode, NodeWatch, cluster_from_nodes
from trainyard_common.runtime import health_app, serve, setup_logging
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import subjects_for
from trainyard_common.telemetry import setup_telemetry

from .adapters.lease import Lease, LeaseLost
from .adapters.nodes import MongoNodeStore
from .adapters.store import MongoJobStore
from .domain.policies import scorer_named
from .handlers import (
    EVENT_HANDLERS,
    Deps,
    JobEnded,
    JobNotFound,
    ScaleRefused,
    handle,
    load,
    queue_view,
    request_scale,
    shut_down,
    start,
    wake_retries,
)
from .node_admin import NodeAdmin, NodeError
from .settings import PlacementSettings

SERVICE = "placement"
CONSUMER = "placement"
SUBJECTS = subjects_for(EVENT_HANDLERS)
LEASE_BUCKET = "yard_leases"
LEASE_KEY = "placement"

log = logging.getLogger("trainyard.placement")


class ScaleRequest(BaseModel):
    role: str
    replicas: int


def build_app(deps: Deps, tokens: TokenStore) -> FastAPI:
    app = health_app(SERVICE)
    current = identity_dependency(tokens)

    @app.get("/v1/placement/queue")
    async def queue(identity: Identity = Depends(current)) -> dict[str, Any]:
        # Everyone's place in line is shown to an admin; a user sees their own jobs.
        rows = [row for row in queue_view(deps) if identity.can_see(row["user"])]
        return {"jobs": rows}

    @app.post("/v1/placement/jobs/{job_id}/scale", status_code=202)
    async def scale(
        job_id: str, body: ScaleRequest, identity: Identity = Depends(current)
    ) -> dict[str, Any]:
        # Checked against the spec placement holds (a scale already asked for included).
        try:
            command = await request_scale(job_id, body.role, body.replicas, identity, deps)
        except JobNotFound as exc:
            raise HTTPException(404, f"no job {job_id}") from exc
        except JobEnded as exc:
            raise HTTPException(409, f"job {job_id} has ended; it cannot be scaled") from exc
        except ScaleRefused as exc:
            raise HTTPException(
                400, {"message": str(exc), "errors": [{"path": exc.field, "message": str(exc)}]}
            ) from exc
        return {
            "id": job_id,
            "role": command.role,
            "replicas": command.replicas,
            "scale": "requested",
        }

    @app.post("/v1/placement/shutdown")
    async def shutdown(identity: Identity = Depends(current)) -> dict[str, Any]:
        """For the platform's own shutdown (``make down``): place nothing more and end
        every running attempt; the next start runs them again."""
        if not identity.admin:
            raise HTTPException(403, "only an admin can shut placement down")
        return {"draining": True, "interrupted": await shut_down(deps)}

    return app


def add_node_routes(app: FastAPI, admin: NodeAdmin, tokens: TokenStore) -> None:
    """Node administration, for admins only (docs/placement.md)."""
    current = identity_dependency(tokens)

    async def admin_only(identity: Identity = Depends(current)) -> Identity:
        if not identity.admin:
            raise HTTPException(403, "only an admin can administer nodes")
        return identity

    guard = [Depends(admin_only)]

    # Every node operation refuses with a NodeError carrying its HTTP status.
    async def refused(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, NodeError)
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    app.add_exception_handler(NodeError, refused)

    @app.get("/v1/placement/nodes", dependencies=guard)
    async def list_nodes() -> dict[str, Any]:
        return {"nodes": admin.view()}

    @app.post("/v1/placement/nodes", status_code=201, dependencies=guard)
    async def add_node(spec: NodeSpec) -> dict[str, Any]:
        return await admin.add(spec)

    @app.post("/v1/placement/nodes/{name}/drain", dependencies=guard)
    async def drain_node(name: str) -> dict[str, Any]:
        return await admin.drain(name)

    @app.post("/v1/placement/nodes/{name}/undrain", dependencies=guard)
    async def undrain_node(name: str) -> dict[str, Any]:
        return await admin.undrain(name)

    @app.delete("/v1/placement/nodes/{name}", dependencies=guard)
    async def remove_node(name: str) -> dict[str, Any]:
        return await admin.remove(name)


# --- replicas --------------------------------------------------------------------------

LEADER_PATH = "/v1/placement/leader"


class Front:
    """What this replica answers: its health and who leads, always; everything else
    only while it leads (the leader's app), 503 while it follows."""

    def __init__(self, lease: Lease, tokens: TokenStore) -> None:
        self.lease = lease
        self.leader_app: ASGIApp | None = None
        self.app = health_app(SERVICE)
        current = identity_dependency(tokens)

        @self.app.get(LEADER_PATH)
        async def leader(identity: Identity = Depends(current)) -> dict[str, Any]:
            return {
                "replica": lease.replica,
                "leading": self.leader_app is not None,
                "leader": await lease.holder(),
            }

        self.app.add_middleware(LeaderSwitch, front=self)


class LeaderSwitch:
    OWN_PATHS = frozenset({"/healthz", LEADER_PATH})

    def __init__(self, app: ASGIApp, front: Front) -> None:
        self.app = app
        self.front = front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OWN_PATHS:
            await self.app(scope, receive, send)
            return
        leader_app = self.front.leader_app
        if leader_app is not None:
            await leader_app(scope, receive, send)
            return
        try:
            holder = await self.front.lease.holder()
        except Exception:  # noqa: BLE001 - the answer is 503 either way
            holder = None
        response = JSONResponse(
            {"detail": f"this placement replica ({self.front.lease.replica}) is not the "
                       f"leader; the leader is {holder or 'not known yet'}"},
            status_code=503, headers={"Retry-After": "1"},
        )  # fmt: skip
        await response(scope, receive, send)


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
    client = mongo_client(settings.mongo_url)
    try:
        db = client[settings.db_name()]
        store = MongoJobStore(db["jobs"])
        nodes = MongoNodeStore(db["nodes"])
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
                deps.state.scorer = scorer_named(placement.policy)
                deps.state.rules = placement.rules
                deps.growth_after_s = placement.growth_after_s
                admin = NodeAdmin(deps, nodes)
                await admin.restore()
                await start(deps)

                async def on_message(event: Event, delivery: Delivery) -> None:
                    if not lease.held:
                        raise NotLeading(f"replica {lease.replica} lost the lease")
                    await handle(event, delivery, deps)

                workers = [
                    asyncio.create_task(
                        bus.consume(CONSUMER, SUBJECTS, on_message, stop=stop), name="consume"
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
    asyncio.run(main())
