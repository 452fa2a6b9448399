"""PAI-DLC's read API at the SDK's paths: GetJob, ListJobs, GetJobEvents, rendered by
``trainyard_common.dialects.dlc`` from the canonical job view."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from trainyard_common.auth import (
    AccessKeyStore,
    AliyunError,
    AliyunRoute,
    Identity,
    aliyun_identity_dependency,
    request_id,
)
from trainyard_common.dialects import dlc
from trainyard_common.limits import MAX_OFFSET, MAX_PAGE

from ..adapters.views import job_view
from .context import StatusContext

# ListJobs' SortBy values Trainyard can order by; every one orders by submission time,
# the only order the job store keeps an index for.
SORT_BY = {"GmtCreateTime", "GmtSubmittedTime", "GmtModifiedTime"}


def _original(doc: dict[str, Any]) -> dict[str, Any] | None:
    raw = doc.get("original_json")
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _running_at(history: list[dict[str, Any]]) -> Any:
    for row in history:
        if row["type"] == "TaskStateChanged" and row["event"].get("state") == "RUNNING":
            return row["occurred_at"]
    return None


def router(ctx: StatusContext) -> APIRouter:
    api = APIRouter(route_class=AliyunRoute)
    signed = aliyun_identity_dependency(AccessKeyStore.beside(ctx.tokens), ctx.tokens)

    async def visible(job_id: str, identity: Identity) -> dict[str, Any]:
        doc = await ctx.views.get_job(job_id)
        # Another user's job answers exactly like a missing one.
        if doc is None or doc.get("state") is None or not identity.can_see(doc.get("user", "")):
            raise AliyunError(404, "JobNotFound", f"job {job_id} does not exist")
        return doc

    @api.get("/api/v1/jobs/{job_id}")
    async def get_job(
        job_id: str,
        request: Request,
        identity: Identity = Depends(signed),
        need_detail: bool | None = Query(None, alias="NeedDetail"),
    ) -> dict:
        doc = await visible(job_id, identity)
        view = job_view(doc, await ctx.views.job_tasks(job_id))
        history = await ctx.views.history(job_id)
        body = dlc.render_job(view, _original(doc), _running_at(history))
        return {**body, "RequestId": request_id(request)}

    @api.get("/api/v1/jobs/{job_id}/events")
    async def get_job_events(
        job_id: str,
        request: Request,
        identity: Identity = Depends(signed),
        max_events: int = Query(2000, alias="MaxEventsNum", ge=1, le=MAX_OFFSET),
    ) -> dict:
        await visible(job_id, identity)
        events = dlc.render_events(await ctx.views.history(job_id), max_events)
        return {"JobId": job_id, "Events": events, "RequestId": request_id(request)}

    @api.get("/api/v1/jobs")
    async def list_jobs(
        request: Request,
        identity: Identity = Depends(signed),
        page_number: int = Query(1, alias="PageNumber", ge=1, le=MAX_PAGE),
        page_size: int = Query(50, alias="PageSize", ge=1, le=1000),
        display_name: str | None = Query(None, alias="DisplayName"),
        status: str | None = Query(None, alias="Status"),
        job_id: str | None = Query(None, alias="JobId"),
        resource_id: str | None = Query(None, alias="ResourceId"),
        sort_by: str = Query("GmtCreateTime", alias="SortBy"),
        order: str = Query("desc", alias="Order"),
        show_own: bool | None = Query(None, alias="ShowOwn"),
    ) -> dict:
        if sort_by not in SORT_BY:
            raise AliyunError(
                400, "InvalidParameter", f"SortBy must be one of {', '.join(sorted(SORT_BY))}"
            )
        if order.lower() not in ("asc", "desc"):
            raise AliyunError(400, "InvalidParameter", "Order must be asc or desc")
        where: dict[str, Any] = {"dialect": dlc.DIALECT}
        if display_name:
            where["name"] = display_name
        if job_id:
            where["_id"] = job_id
        if resource_id:
            where["queue"] = resource_id
        if status:
            states = sorted({s for part in status.split(",") for s in dlc.states_for(part)})
            if not states:
                raise AliyunError(
                    400,
                    "InvalidParameter",
                    f"Status {status!r} is not one of "
                    f"{', '.join(sorted(set(dlc.STATUS.values())))}",
                )
            where["state"] = {"$in": states}
        user = identity.user if (not identity.admin or show_own) else None
        offset = (page_number - 1) * page_size
        if order.lower() == "asc":
            # The store lists newest first: the asc page is a reversed slice from the end.
            _, total = await ctx.views.list_jobs(
                user=user, state=None, limit=1, offset=0, where=where
            )
            end = max(0, total - offset)
            start = max(0, end - page_size)
            docs, total = await ctx.views.list_jobs(
                user=user,
                state=None,
                limit=max(1, end - start),
                offset=start,
                where=where,
                full=True,
            )
            docs = list(reversed(docs[: end - start]))
        else:
            docs, total = await ctx.views.list_jobs(
                user=user, state=None, limit=page_size, offset=offset, where=where, full=True
            )
        items = [
            (job_view(doc, await ctx.views.job_tasks(doc["_id"])), _original(doc)) for doc in docs
        ]
        return {**dlc.render_list(items, total), "RequestId": request_id(request)}

    return api
