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


def _time(value: str, field: str) -> datetime:
    """A DLC time filter (``2020-11-08T16:00:00Z``); a bad one is the caller's error."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AliyunError(
            400, "InvalidParameter", f"{field} {value!r} is not a time (2020-11-08T16:00:00Z)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


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
        sort_by: str = Query("Gpu", alias="SortBy", pattern="^(Cpu|Gpu|Memory|InstanceType)$"),
        order: str = Query("asc", alias="Order", pattern="^(?i:asc|desc)$"),
    ) -> dict:
        wanted = [t.strip() for t in (instance_types or "").split(",") if t.strip()]
        body = dlc.render_ecs_specs(
            ECS_CATALOG, accelerator_type, wanted, sort_by, order.lower() == "asc",
            page_number, page_size,
        )  # fmt: skip
        return {**body, "RequestId": request_id(request)}

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
        workspace_id: str | None = Query(None, alias="WorkspaceId"),
        job_type: str | None = Query(None, alias="JobType"),
        job_ids: str | None = Query(None, alias="JobIds", max_length=20000),
        username: str | None = Query(None, alias="Username"),
        start_time: str | None = Query(None, alias="StartTime"),
        end_time: str | None = Query(None, alias="EndTime"),
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
        if workspace_id:
            where[f"labels.{dlc.WORKSPACE_LABEL}"] = workspace_id
        if job_type:
            where[f"labels.{dlc.JOB_TYPE_LABEL}"] = job_type
        if job_ids:
            where["_id"] = {"$in": [j.strip() for j in job_ids.split(",") if j.strip()][:1000]}
        if username and identity.admin:
            where["user"] = username
        window = {
            op: _time(value, name)
            for op, value, name in (
                ("$gte", start_time, "StartTime"),
                ("$lte", end_time, "EndTime"),
            )
            if value
        }
        if window:
            # DLC's TimeRangeField defaults to GmtCreateTime: when the job was submitted.
            where["submitted_at"] = window
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
