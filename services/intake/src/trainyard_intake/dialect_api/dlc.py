"""PAI-DLC's write API at the paths the official SDK (``alibabacloud_pai_dlc20201203``)
calls: CreateJob, StopJob, DeleteJob, and the data-source / code-source registry; plus
Trainyard's admin API for the AccessKeys those clients sign with.

Every DLC route authenticates by the request's AccessKey signature (a bearer token also
works) and answers errors as ``{"Code", "Message", "RequestId"}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel

from trainyard_common.auth import (
    AccessKeyStore,
    AliyunError,
    AliyunRoute,
    Identity,
    aliyun_identity_dependency,
    request_id,
)
from trainyard_common.dialects import dlc
from trainyard_common.limits import MAX_PAGE
from trainyard_common.parsing import BodyError, parse_json
from trainyard_common.telemetry import tracer

from ..adapters.sources import DocSourceRegistry, Kind, SourceRegistry
from ..handlers import (
    JobNotFound,
    PayloadTooLarge,
    checked,
    request_priority,
    request_stop,
    submit_job,
)
from .context import IntakeContext

MAX_BODY = 4 * 1024 * 1024

SORT_FIELDS = {
    "GmtCreateTime": "created_at",
    "GmtModifyTime": "modified_at",
    "DisplayName": "DisplayName",
}
_ID_FIELD: dict[Kind, str] = {"data": "DataSourceId", "code": "CodeSourceId"}
_FIELDS: dict[Kind, tuple[str, ...]] = {
    "data": dlc.DATA_SOURCE_FIELDS,
    "code": dlc.CODE_SOURCE_FIELDS,
}
_REQUIRED: dict[Kind, tuple[str, ...]] = {
    "data": ("DisplayName",),
    "code": ("DisplayName", "CodeRepo"),
}
_LIST_KEY: dict[Kind, str] = {"data": "DataSources", "code": "CodeSources"}
_NOUN: dict[Kind, str] = {"data": "data source", "code": "code source"}


class AccessKeyRequest(BaseModel):
    user: str


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return {}
    try:
        return parse_json(raw, MAX_BODY)
    except BodyError as exc:
        raise AliyunError(exc.status, "InvalidParameter", str(exc)) from exc


def _fields(kind: Kind, body: Any, *, creating: bool) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise AliyunError(400, "InvalidParameter", "$: the body must be a JSON object")
    fields = {}
    for key in _FIELDS[kind]:
        if key in body and body[key] is not None:
            if not isinstance(body[key], str):
                raise AliyunError(400, "InvalidParameter", f"$.{key}: {key} must be a string")
            fields[key] = body[key]
    if creating:
        for key in _REQUIRED[kind]:
            if not fields.get(key, "").strip():
                raise AliyunError(400, "MissingParameter", f"$.{key}: {key} is required")
    return fields


async def _resolve(payload: Any, user: str | None, sources: SourceRegistry) -> dlc.Sources:
    """The registered sources a CreateJob body names; an unknown id is the caller's
    error, at its path."""
    resolved = dlc.Sources()
    if not isinstance(payload, dict):
        return resolved
    data = payload.get("DataSources")
    for i, entry in enumerate(data if isinstance(data, list) else []):
        ds_id = entry.get("DataSourceId") if isinstance(entry, dict) else None
        if not isinstance(ds_id, str) or not ds_id:
            continue
        doc = await sources.get("data", user, ds_id)
        if doc is None:
            raise AliyunError(
                400,
                "InvalidParameter",
                f"$.DataSources[{i}].DataSourceId: no "
                f"data source {ds_id!r} (create it with CreateDataSource)",
            )
        resolved.data[ds_id] = dlc.resolved_data(doc)
    code = payload.get("CodeSource")
    code_id = code.get("CodeSourceId") if isinstance(code, dict) else None
    if isinstance(code_id, str) and code_id:
        doc = await sources.get("code", user, code_id)
        if doc is None:
            raise AliyunError(
                400,
                "InvalidParameter",
                f"$.CodeSource.CodeSourceId: no code "
                f"source {code_id!r} (create it with CreateCodeSource)",
            )
        resolved.code[code_id] = dlc.resolved_code(doc)
    return resolved


def router(ctx: IntakeContext) -> APIRouter:
    outer = APIRouter()
    api = APIRouter(route_class=AliyunRoute)
    keys = AccessKeyStore.beside(ctx.tokens)
    signed = aliyun_identity_dependency(keys, ctx.tokens)
    sources: SourceRegistry = DocSourceRegistry(ctx.db)
    trace = tracer("trainyard.intake.dlc")

    # -- AccessKeys (Trainyard's admin API, bearer tokens) ---------------------------------

    @outer.post("/v1/access-keys", status_code=201)
    async def create_access_key(
        body: AccessKeyRequest, identity: Identity = Depends(ctx.fresh)
    ) -> dict[str, str]:
        if not identity.admin:
            raise HTTPException(403, "only an admin can issue access keys")
        try:
            key = await keys.issue(body.user)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        return {"AccessKeyId": key.id, "AccessKeySecret": key.secret, "user": key.user}

    @outer.delete("/v1/access-keys/{key_id}", status_code=204)
    async def delete_access_key(key_id: str, identity: Identity = Depends(ctx.current)) -> Response:
        if not identity.admin:
            raise HTTPException(403, "only an admin can revoke access keys")
        if not await keys.revoke(key_id):
            raise HTTPException(404, f"no access key {key_id}")
        return Response(status_code=204)

    # -- jobs ---------------------------------------------------------------------------

    @api.post("/api/v1/jobs")
    async def create_job(request: Request, identity: Identity = Depends(signed)) -> dict:
        payload = await _json_body(request)
        owner = None if identity.admin else identity.user
        with trace.start_as_current_span("dlc create job"):
            resolved = await _resolve(payload, owner, sources)
            translation = checked(
                dlc.translate_dlc(payload, identity.user, resolved), payload, ctx.deps
            )
            errors = translation.errors
            if errors:
                # DLC refuses a bad CreateJob at once; no job id is handed out for it.
                raise AliyunError(
                    400,
                    "InvalidParameter",
                    "; ".join(f"{e.path}: {e.message}" for e in errors),
                )
            try:
                submitted = await submit_job(payload, identity, ctx.deps, translation=translation)
            except PayloadTooLarge as exc:
                raise AliyunError(413, "InvalidParameter", str(exc)) from exc
        # Answered once a read shows the job (bounded): the SDK's usual script gets the
        # job right after creating it, and DLC finds it (a 404 JobNotFound here raised
        # in the client).
        await ctx.deps.settle(submitted.seq)
        return {"JobId": submitted.job_id, "RequestId": request_id(request)}

    async def _stop(job_id: str, identity: Identity, reason: str) -> None:
        try:
            await request_stop(job_id, identity, ctx.deps, reason)
        except JobNotFound as exc:
            raise AliyunError(404, "JobNotFound", f"job {job_id} does not exist") from exc

    @api.post("/api/v1/jobs/{job_id}/stop")
    async def stop_job(job_id: str, request: Request, identity: Identity = Depends(signed)) -> dict:
        await _stop(job_id, identity, f"StopJob by {identity.user}")
        return {"JobId": job_id, "RequestId": request_id(request)}

    @api.put("/api/v1/jobs/{job_id}")
    async def update_job(
        job_id: str, request: Request, identity: Identity = Depends(signed)
    ) -> dict:
        """UpdateJob: a job's Priority (1-9), which placement applies where the job waits
        or runs. The other fields UpdateJob takes (description, accessibility, the job's
        specs and command) are refused naming the field: a submitted job's spec does not
        change here, and Trainyard keeps no description apart from the job."""
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise AliyunError(400, "InvalidParameter", "$: the body must be a JSON object")
        unchangeable = sorted(k for k in body if k != "Priority" and body[k] is not None)
        if unchangeable:
            raise AliyunError(
                400,
                "InvalidParameter",
                f"{', '.join(unchangeable)}: only Priority can be updated on a submitted job",
            )
        priority = body.get("Priority")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 9:
            raise AliyunError(400, "InvalidParameter", "Priority must be an integer from 1 to 9")
        try:
            await request_priority(job_id, identity, ctx.deps, priority)
        except JobNotFound as exc:
            raise AliyunError(404, "JobNotFound", f"job {job_id} does not exist") from exc
        return {"JobId": job_id, "RequestId": request_id(request)}

    @api.delete("/api/v1/jobs/{job_id}")
    async def delete_job(
        job_id: str, request: Request, identity: Identity = Depends(signed)
    ) -> dict:
        # Trainyard keeps every job's history: DeleteJob stops the job (a no-op for one
        # that has ended) and the record stays readable.
        await _stop(job_id, identity, f"DeleteJob by {identity.user}")
        return {"JobId": job_id, "RequestId": request_id(request)}

    # -- data sources and code sources --------------------------------------------------

    def source_routes(kind: Kind, path: str) -> None:
        id_field = _ID_FIELD[kind]

        async def found(identity: Identity, source_id: str) -> dict[str, Any]:
            doc = await sources.get(kind, None if identity.admin else identity.user, source_id)
            if doc is None:
                raise AliyunError(404, "NotFound", f"{_NOUN[kind]} {source_id} does not exist")
            return doc

        def render(doc: dict[str, Any]) -> dict[str, Any]:
            return dlc.render_data_source(doc) if kind == "data" else dlc.render_code_source(doc)

        @api.post(path, name=f"create_{kind}_source")
        async def create(request: Request, identity: Identity = Depends(signed)) -> dict:
            fields = _fields(kind, await _json_body(request), creating=True)
            doc = await sources.create(kind, identity.user, fields)
            return {id_field: doc["_id"], "RequestId": request_id(request)}

        @api.get(path, name=f"list_{kind}_sources")
        async def list_(
            request: Request,
            identity: Identity = Depends(signed),
            page_number: int = Query(1, alias="PageNumber", ge=1, le=MAX_PAGE),
            page_size: int = Query(50, alias="PageSize", ge=1, le=1000),
            sort_by: str = Query("GmtCreateTime", alias="SortBy"),
            order: str = Query("desc", alias="Order"),
            display_name: str | None = Query(None, alias="DisplayName"),
            source_type: str | None = Query(None, alias="DataSourceType"),
        ) -> dict:
            if sort_by not in SORT_FIELDS:
                raise AliyunError(
                    400, "InvalidParameter", f"SortBy must be one of {', '.join(SORT_FIELDS)}"
                )
            if order.lower() not in ("asc", "desc"):
                raise AliyunError(400, "InvalidParameter", "Order must be asc or desc")
            where: dict[str, Any] = {}
            if display_name:
                where["DisplayName"] = display_name
            if source_type and kind == "data":
                where["DataSourceType"] = source_type
            docs, total = await sources.list(
                kind,
                None if identity.admin else identity.user,
                where=where,
                offset=(page_number - 1) * page_size,
                limit=page_size,
                ascending=order.lower() == "asc",
                sort_by=SORT_FIELDS[sort_by],
            )
            return {
                _LIST_KEY[kind]: [render(d) for d in docs],
                "TotalCount": total,
                "RequestId": request_id(request),
            }

        @api.get(f"{path}/{{source_id}}", name=f"get_{kind}_source")
        async def get(
            source_id: str, request: Request, identity: Identity = Depends(signed)
        ) -> dict:
            return {**render(await found(identity, source_id)), "RequestId": request_id(request)}

        @api.put(f"{path}/{{source_id}}", name=f"update_{kind}_source")
        async def update(
            source_id: str, request: Request, identity: Identity = Depends(signed)
        ) -> dict:
            fields = _fields(kind, await _json_body(request), creating=False)
            await found(identity, source_id)
            owner = None if identity.admin else identity.user
            if await sources.update(kind, owner, source_id, fields) is None:
                raise AliyunError(404, "NotFound", f"{_NOUN[kind]} {source_id} does not exist")
            return {id_field: source_id, "RequestId": request_id(request)}

        @api.delete(f"{path}/{{source_id}}", name=f"delete_{kind}_source")
        async def delete(
            source_id: str, request: Request, identity: Identity = Depends(signed)
        ) -> dict:
            owner = None if identity.admin else identity.user
            if not await sources.delete(kind, owner, source_id):
                raise AliyunError(404, "NotFound", f"{_NOUN[kind]} {source_id} does not exist")
            return {id_field: source_id, "RequestId": request_id(request)}

    source_routes("data", "/api/v1/datasources")
    source_routes("code", "/api/v1/codesources")

    outer.include_router(api)
    return outer
