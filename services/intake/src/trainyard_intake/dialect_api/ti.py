"""Tencent TI's write API: ``POST /ti/v1/jobs`` (a TI Job object) and
``DELETE /ti/v1/jobs/{cluster}/{name}`` (stop it).

TI names jobs by cluster and name, intake by id: the owner registry records every
submission's dialect key (``<cluster>/<name>``), which is how a delete finds the job."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse

from trainyard_common.auth import AccessKeyStore, Identity
from trainyard_common.dialects.ti import render, render_cloud, translate_ti
from trainyard_common.parsing import BodyError, parse_json
from trainyard_common.tencent_auth import (
    TencentError,
    answer,
    error_answer,
    new_request_id,
    read_body,
    tencent_identity,
)

from ..handlers import (
    JobNotFound,
    NameTaken,
    PayloadTooLarge,
    checked,
    request_stop,
    submit_job,
)
from .context import IntakeContext

MAX_BODY = 1024 * 1024
TI_JOB_BODY = {
    "requestBody": {
        "required": True,
        "description": "A TI Job object (JSON)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
_STEP = re.compile(r"\.([^.\[]+)|\[([0-9]+)\]")


def absent(body: Any, path: str) -> bool:
    """Whether the field at ``path`` ($.A.B[0].C) was left out of ``body``."""
    node = body
    for key, index in _STEP.findall(path[1:]):
        if key and isinstance(node, dict) and key in node:
            node = node[key]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return True
    return node is None


def router(ctx: IntakeContext) -> APIRouter:
    api = APIRouter(prefix="/ti/v1", tags=["ti"])

    @api.post("/jobs", status_code=202, openapi_extra=TI_JOB_BODY)
    async def create_job(
        request: Request,
        identity: Identity = Depends(ctx.current),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        # Read as every body is (bounded in size and depth, no lone surrogate): FastAPI's
        # own reading took any size and depth, and a surrogate made the answer a 500.
        try:
            payload = parse_json(await request.body(), MAX_BODY)
        except BodyError as exc:
            raise HTTPException(exc.status, {"message": str(exc)}) from exc
        # TI answers a malformed job at once, field by field, as tictl expects, and one
        # the cluster as configured can never run (its queue, capacity) or a name in use.
        found = checked(translate_ti(payload, identity.user), payload, ctx.deps)
        errors = found.errors
        if errors:
            raise HTTPException(
                400,
                {
                    "message": "invalid TI job",
                    "errors": [e.model_dump() for e in errors],
                    "warnings": [w.model_dump() for w in found.warnings],
                },
            )
        try:
            result = await submit_job(
                payload, identity, ctx.deps, translation=found, idempotency_key=idempotency_key
            )
        except PayloadTooLarge as exc:
            raise HTTPException(413, str(exc)) from exc
        except NameTaken as exc:
            raise HTTPException(
                409,
                {
                    "message": f"job name {found.spec.name!r} is already used by job {exc.holder}",
                    "errors": [{"path": "$.name", "message": "already used", "code": "name_taken"}],
                },
            ) from exc
        # Answered once a read shows the job (bounded): tictl and the Tencent Cloud SDK
        # describe a job right after creating it, and TI finds it.
        await ctx.deps.settle(result.seq)
        view = render(
            {
                "id": result.job_id,
                "name": found.spec.name,
                "queue": found.spec.queue,
                "state": "SUBMITTED",
                "submitted_at": datetime.now(UTC),
                "original": payload,
            }
        )
        view["warnings"] = [w.model_dump() for w in result.warnings]
        return JSONResponse(status_code=202, content=view)

    async def delete(identity: Identity, cluster: str, name: str, reason: str) -> list[str]:
        """Stop every job under ``cluster/name`` and free the name (a TI job name is
        unique in its cluster while the job exists: deleted, it may be used again); the
        jobs stopped."""
        key = f"{cluster}/{name}"
        claim = await ctx.deps.names.get(identity.user, key)
        stopped = []
        for job_id in await ctx.deps.owners.job_ids(identity.user, key):
            try:
                await request_stop(job_id, identity, ctx.deps, reason)
            except JobNotFound:
                continue
            stopped.append(job_id)
        if claim is not None and claim.job_id in stopped:
            # After the stops are on the bus: a name freed first could go to a new job
            # while the command for the old one was still to be sent. Only a stopped
            # job's: a submission between its claim and its owner record holds the name
            # for a job not listed yet, which this delete did not stop.
            await ctx.deps.names.release(identity.user, key, claim.job_id)
        return stopped

    @api.delete("/jobs/{cluster}/{name}", status_code=202)
    async def delete_job(
        cluster: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> dict[str, Any]:
        stopped = await delete(
            identity, cluster, name, f"deleted through the TI API by {identity.user}"
        )
        if not stopped:
            raise HTTPException(404, f"no TI job {name!r} in cluster {cluster!r}")
        return {"name": name, "cluster": cluster, "stop": "requested", "ids": stopped}

    api_root = APIRouter(tags=["ti"])
    signed = tencent_identity(AccessKeyStore.beside(ctx.tokens), ctx.tokens)

    @api_root.post("/", response_model=None)
    async def cloud_api(request: Request) -> JSONResponse:
        """The Tencent Cloud API's writes (X-TC-Action CreateJob, DeleteJob), signed
        TC3-HMAC-SHA256, in its ``{"Response": ...}`` shapes: the job body in PascalCase
        (``tccli tia CreateJob``), its problems named by its own fields."""
        rid = new_request_id()
        try:
            action = request.headers.get("x-tc-action", "")
            if action not in ("CreateJob", "DeleteJob"):
                raise TencentError("InvalidAction", f"the action {action!r} is not served here")
            identity = await signed(request)
            body = read_body(await request.body(), MAX_BODY)
            if action == "DeleteJob":
                name, cluster = body.get("Name"), body.get("Cluster")
                if not isinstance(name, str) or not isinstance(cluster, str):
                    raise TencentError("MissingParameter", "Name and Cluster are required")
                if not await delete(identity, cluster, name, f"DeleteJob by {identity.user}"):
                    raise TencentError(
                        "ResourceNotFound", f"job {name!r} does not exist in cluster {cluster!r}"
                    )
                return answer({}, rid)
            found = checked(translate_ti(body, identity.user, cloud=True), body, ctx.deps)
            errors = found.errors
            if errors:
                # Tencent's codes: a parameter left out is MissingParameter; one sent
                # empty is there, with a value it cannot take.
                missing = any(e.code == "required" and absent(body, e.path) for e in errors)
                raise TencentError(
                    "MissingParameter" if missing else "InvalidParameterValue",
                    "; ".join(f"{e.path}: {e.message}" for e in errors),
                )
            try:
                result = await submit_job(body, identity, ctx.deps, translation=found)
            except PayloadTooLarge as exc:
                raise TencentError("InvalidParameter", str(exc)) from exc
            except NameTaken as exc:
                # The code TIA's API defines for it (its errorcodes: 资源已存在).
                raise TencentError(
                    "FailedOperation.AlreadyExists",
                    f"job {found.spec.name!r} already exists in cluster "
                    f"{found.spec.queue!r} (job {exc.holder})",
                ) from exc
            await ctx.deps.settle(result.seq)
            view = {
                "id": result.job_id,
                "name": found.spec.name,
                "queue": found.spec.queue,
                "state": "SUBMITTED",
                "submitted_at": datetime.now(UTC),
                "original": body,
                "user": identity.user,
            }
            return answer({"Job": render_cloud(view)}, rid)
        except TencentError as exc:
            return error_answer(exc, rid)

    outer = APIRouter()
    outer.include_router(api)
    outer.include_router(api_root)
    return outer
