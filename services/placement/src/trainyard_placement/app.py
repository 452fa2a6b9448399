"""Placement's HTTP app: the queue view, scale, shutdown and node admin; and the front every
replica serves (its health and who leads), which hands the rest to the leader's app."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trainyard_common.api import ClusterView, QueueView, answers
from trainyard_common.auth import Identity, TokenStore, identity_dependency
from trainyard_common.cluster import NodeSpec
from trainyard_common.dialects import openpai
from trainyard_common.runtime import FOLLOWER_HEADER, health_app

from .adapters.lease import Lease
from .handlers import (
    Deps,
    JobEnded,
    JobNotFound,
    ScaleRefused,
    queue_view,
    request_scale,
    shut_down,
)
from .node_admin import NodeAdmin, NodeError, cluster_view

log = logging.getLogger("trainyard.placement")

SERVICE = "placement"


class ScaleRequest(BaseModel):
    role: str
    replicas: int


def build_app(deps: Deps, tokens: TokenStore) -> FastAPI:
    app = health_app(SERVICE)
    current = identity_dependency(tokens)

    @app.get("/v1/placement/queue", responses=answers(QueueView))
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

    @app.get("/v1/placement/cluster", responses=answers(ClusterView))
    async def cluster(identity: Identity = Depends(current)) -> dict[str, Any]:
        return cluster_view(admin.deps, admin, identity.can_see)

    # OpenPAI's virtual clusters (its SDK's and webportal's calls): the queues.
    def no_vc(name: str) -> JSONResponse:
        return JSONResponse(
            {"code": "NoVirtualClusterError", "message": f"Virtual cluster {name} is not found."},
            status_code=404,
        )

    @app.get("/api/v2/virtual-clusters")
    async def virtual_clusters(identity: Identity = Depends(current)) -> dict[str, Any]:
        return openpai.render_virtual_clusters(cluster_view(admin.deps, admin, identity.can_see))

    @app.get("/api/v2/virtual-clusters/{name}", response_model=None)
    async def virtual_cluster(
        name: str, identity: Identity = Depends(current)
    ) -> dict[str, Any] | JSONResponse:
        found = openpai.render_virtual_clusters(
            cluster_view(admin.deps, admin, identity.can_see)
        ).get(name)
        return found if found is not None else no_vc(name)

    @app.get("/api/v2/virtual-clusters/{name}/sku-types", response_model=None)
    async def sku_types(
        name: str, identity: Identity = Depends(current)
    ) -> dict[str, Any] | JSONResponse:
        view = cluster_view(admin.deps, admin, identity.can_see)
        if name not in openpai.render_virtual_clusters(view):
            return no_vc(name)
        return openpai.render_sku_types(view)

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
            status_code=503, headers={"Retry-After": "1", FOLLOWER_HEADER: "true"},
        )  # fmt: skip
        await response(scope, receive, send)
