"""PAI-DLC's read API at the SDK's paths: GetJob, ListJobs, GetJobEvents, rendered by
``trainyard_common.dialects.dlc`` from the canonical job view."""

from __future__ import annotations

import json
from datetime import UTC, datetime
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

# The longest ListJobs parameter value taken (a longer one is refused, named).
MAX_PARAM = 20000


def _original(doc: dict[str, Any]) -> dict[str, Any] | None:
    raw = doc.get("original_json")
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# The instance types ListEcsSpecs lists: the built-in table and YARD_DLC_ECS_CATALOG.
ECS_CATALOG = dlc.catalog_from_env()


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

    @api.get("/api/v1/jobs/{job_id}/pods/{pod_id}/events")
    async def get_pod_events(
        job_id: str,
        pod_id: str,
        request: Request,
        identity: Identity = Depends(signed),
        max_events: int = Query(2000, alias="MaxEventsNum", ge=1, le=MAX_OFFSET),
        pod_uid: str | None = Query(None, alias="PodUid"),
    ) -> dict:
        doc = await visible(job_id, identity)
        task = dlc.parse_pod_id(job_id, pod_id)
        roles = {r.get("name") for r in json.loads(doc.get("spec_json") or "{}").get("roles", [])}
        if task is None or task[0] not in roles:
            raise AliyunError(404, "PodNotFound", f"job {job_id} has no pod {pod_id}")
        events = dlc.render_events(await ctx.views.history(job_id), max_events, task)
        uid = pod_uid or f"{pod_id}-{doc.get('attempt') or 1}"
        return {
            "JobId": job_id,
            "PodId": pod_id,
            "PodUid": uid,
            "Events": events,
            "RequestId": request_id(request),
        }

    @api.get("/api/v1/ecsspecs")
    async def list_ecs_specs(
        request: Request,
        identity: Identity = Depends(signed),
        accelerator_type: str | None = Query(
            None, alias="AcceleratorType", pattern="^(?i:cpu|gpu)$"
        ),
        instance_types: str | None = Query(None, alias="InstanceTypes", max_length=4096),
        page_number: int = Query(1, alias="PageNumber", ge=1, le=MAX_PAGE),
        page_size: int = Query(50, alias="PageSize", ge=1, le=1000),
        sort_by: str = Query(
            "GPU", alias="SortBy", pattern="^(?i:cpu|gpu|memory|gmtcreatetime|instancetype)$"
        ),
        order: str = Query("asc", alias="Order", pattern="^(?i:asc|desc)$"),
        resource_type: str | None = Query(None, alias="ResourceType", pattern="^(?i:ecs|lingjun)$"),
    ) -> dict:
        wanted = [t.strip() for t in (instance_types or "").split(",") if t.strip()]
        body = dlc.render_ecs_specs(
            ECS_CATALOG, accelerator_type, wanted, sort_by, order.lower() == "asc",
            page_number, page_size, resource_type,
        )  # fmt: skip
        return {**body, "RequestId": request_id(request)}

    @api.get("/api/v1/jobs")
    async def list_jobs(
        request: Request,
        identity: Identity = Depends(signed),
        page_number: int = Query(1, alias="PageNumber", ge=1, le=MAX_PAGE),
        page_size: int = Query(50, alias="PageSize", ge=1, le=1000),
    ) -> dict:
        # Every documented filter (dlc.list_query), read by DLC's own names; a bounded
        # request: each value at most MAX_PARAM characters.
        params = dict(request.query_params.items())
        for name, value in params.items():
            if len(value) > MAX_PARAM:
                raise AliyunError(
                    400, "InvalidParameter", f"{name}: at most {MAX_PARAM} characters"
                )
        try:
            query = dlc.list_query(
                params, user=identity.user, admin=identity.admin, now=datetime.now(UTC)
            )
        except dlc.ListJobsError as exc:
            raise AliyunError(400, "InvalidParameter", str(exc)) from None
        if query.empty:
            return {**dlc.render_list([], 0), "RequestId": request_id(request)}
        docs, total = await ctx.views.list_jobs(
            user=None,
            state=None,
            limit=page_size,
            offset=(page_number - 1) * page_size,
            where=query.where,
            full=True,
            oldest_first=query.ascending,
            sort=query.sort,
        )
        items = [
            (job_view(doc, await ctx.views.job_tasks(doc["_id"])), _original(doc)) for doc in docs
        ]
        return {**dlc.render_list(items, total), "RequestId": request_id(request)}

    return api
