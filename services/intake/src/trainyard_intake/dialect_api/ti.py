"""Tencent TI's write API: ``POST /ti/v1/jobs`` (a TI Job object) and
``DELETE /ti/v1/jobs/{cluster}/{name}`` (stop it).

TI names jobs by cluster and name, intake by id: the owner registry records every
submission's dialect key (``<cluster>/<name>``), which is how a delete finds the job."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Body, Depends, Header, HTTPException
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity
from trainyard_common.dialects.ti import DIALECT, render, translate_ti

from ..handlers import JobNotFound, NameTaken, PayloadTooLarge, request_stop, submit_job
from .context import IntakeContext


def router(ctx: IntakeContext) -> APIRouter:
    api = APIRouter(prefix="/ti/v1", tags=["ti"])

    @api.post("/jobs", status_code=202)
    async def create_job(
        payload: Any = Body(...),
        identity: Identity = Depends(ctx.current),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        # TI answers a malformed job at once, field by field, as tictl expects; only the
        # checks against the cluster (queue, capacity, name taken) come later.
        checked = translate_ti(payload, identity.user)
        if checked.errors:
            raise HTTPException(
                400,
                {
                    "message": "invalid TI job",
                    "errors": [e.model_dump() for e in checked.errors],
                    "warnings": [w.model_dump() for w in checked.warnings],
                },
            )
        try:
            result = await submit_job(
                payload, identity, ctx.deps, dialect=DIALECT, idempotency_key=idempotency_key
            )
        except PayloadTooLarge as exc:
            raise HTTPException(413, str(exc)) from exc
        except NameTaken as exc:
            raise HTTPException(
                409,
                {
                    "message": f"job name {checked.spec.name!r} is already used by job "
                    f"{exc.holder}",
                    "errors": [{"path": "$.name", "message": "already used", "code": "name_taken"}],
                },
            ) from exc
        view = render(
            {
                "id": result.job_id,
                "name": checked.spec.name,
                "queue": checked.spec.queue,
                "state": "SUBMITTED",
                "submitted_at": datetime.now(UTC),
                "original": payload,
            }
        )
        view["warnings"] = [w.model_dump() for w in result.warnings]
        return JSONResponse(status_code=202, content=view)

    @api.delete("/jobs/{cluster}/{name}", status_code=202)
    async def delete_job(
        cluster: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> dict[str, Any]:
        job_ids = await ctx.deps.owners.job_ids(identity.user, f"{cluster}/{name}")
        stopped = []
        for job_id in job_ids:
            try:
                await request_stop(
                    job_id, identity, ctx.deps, f"deleted through the TI API by {identity.user}"
                )
            except JobNotFound:
                continue
            stopped.append(job_id)
        if not stopped:
            raise HTTPException(404, f"no TI job {name!r} in cluster {cluster!r}")
        return {"name": name, "cluster": cluster, "stop": "requested", "ids": stopped}

    return api
