"""Tencent TI's read API: ``GET /ti/v1/jobs[?cluster=]`` and
``GET /ti/v1/jobs/{cluster}/{name}``, answering in TI's Job shape (rendered by the
dialect's pure ``render`` from the canonical view)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from trainyard_common.auth import Identity
from trainyard_common.dialects.ti import DIALECT, render
from trainyard_common.limits import MAX_OFFSET

from .context import StatusContext


async def _started_at(ctx: StatusContext, job_id: str) -> Any:
    # The job view keeps no start time: it is when the first task of the latest attempt
    # ran, which the history holds.
    started = None
    attempt = 0
    for row in await ctx.views.history(job_id):
        event = row.get("event") or {}
        running = row.get("type") == "TaskStateChanged" and event.get("state") == "RUNNING"
        if running and event.get("attempt", 1) > attempt:
            attempt, started = event.get("attempt", 1), row.get("occurred_at")
    return started


async def ti_view(ctx: StatusContext, doc: dict[str, Any]) -> dict[str, Any]:
    original = doc.get("original_json")
    view = await ctx.full_view(doc)
    view["original"] = json.loads(original) if original else None
    view["started_at"] = await _started_at(ctx, doc["_id"])
    return render(view)


def router(ctx: StatusContext) -> APIRouter:
    api = APIRouter(prefix="/ti/v1", tags=["ti"])

    @api.get("/jobs")
    async def list_jobs(
        identity: Identity = Depends(ctx.current),
        cluster: str | None = None,
        limit: int = Query(20, ge=1, le=500),
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
    ) -> dict[str, Any]:
        where: dict[str, Any] = {"dialect": DIALECT}
        if cluster:
            where["queue"] = cluster
        # An admin sees every user's jobs, as on /v1/jobs.
        docs, total = await ctx.views.list_jobs(
            user=None if identity.admin else identity.user,
            state=None,
            limit=limit,
            offset=offset,
            where=where,
            full=True,
        )
        return {
            "jobs": [await ti_view(ctx, doc) for doc in docs],
            "total": total,
            "limit": limit,
            "offset": offset,
        }

    @api.get("/jobs/{cluster}/{name}")
    async def get_job(
        cluster: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> dict[str, Any]:
        doc = await ctx.views.find_by_key(identity.user, f"{cluster}/{name}", dialect=DIALECT)
        if doc is None:
            raise HTTPException(404, f"no TI job {name!r} in cluster {cluster!r}")
        return await ti_view(ctx, doc)

    return api
