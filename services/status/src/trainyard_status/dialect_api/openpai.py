"""OpenPAI rest-server's read API, at its paths and in its shapes (rendered by the
dialect's pure ``render_status`` / ``render_list_item`` from the canonical view):

- ``GET /api/v2/jobs/{user}~{name}`` (and v1's ``GET /api/v1/user/{user}/jobs/{name}``);
- ``GET /api/v2/jobs/{user}~{name}/config``: the job as submitted, secrets hidden;
- ``GET /api/v2/jobs`` with OpenPAI's filters ``username``, ``vc``, ``state`` (each a
  comma list), ``offset``, ``limit`` and ``withTotalCount``.

Jobs submitted in either OpenPAI dialect are shown. Unlike OpenPAI, a user sees only
their own jobs (an admin sees all): another user's job answers 404 like a missing one.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity
from trainyard_common.dialects import openpai, openpai_v2
from trainyard_common.dialects.openpai import render_list_item, render_status
from trainyard_common.limits import MAX_OFFSET, MAX_PAGE_SIZE

from ..adapters.views import job_view
from .context import StatusContext

DIALECTS = (openpai.DIALECT, openpai_v2.DIALECT)
# OpenPAI's state filter, in our states.
STATES = {
    "WAITING": ("SUBMITTED", "ACCEPTED", "QUEUED", "PLACED", "PAUSED"),
    "RUNNING": ("RUNNING",),
    "SUCCEEDED": ("SUCCEEDED",),
    "FAILED": ("FAILED", "REJECTED"),
    "STOPPED": ("STOPPED",),
}
MAX_LIMIT = 50000  # OpenPAI's own maximum


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"code": code, "message": message})


def _with_stop(view: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    view["stop_requested"] = bool(doc.get("stop_requested_by"))
    return view


def router(ctx: StatusContext) -> APIRouter:
    api = APIRouter(tags=["openpai"])

    async def status_of(user: str, name: str, identity: Identity) -> JSONResponse:
        missing = error(404, "NoJobError", f"Job {user}~{name} is not found.")
        if not identity.can_see(user):
            return missing
        doc = await ctx.views.find_by_key(user, name)
        if doc is None or doc.get("dialect") not in DIALECTS:
            return missing
        return JSONResponse(render_status(_with_stop(await ctx.full_view(doc), doc)))

    @api.get("/api/v2/jobs/{framework_name}")
    async def get_job(
        framework_name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        user, sep, name = framework_name.partition("~")
        if not sep:
            return error(404, "NoJobError", f"Job {framework_name} is not found.")
        return await status_of(user, name, identity)

    @api.get("/api/v2/jobs/{framework_name}/config")
    async def get_config(
        framework_name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        """The job as it was submitted (OpenPAI's job config), secrets hidden: what a
        user resubmits or edits, and what the round trip through this dialect keeps."""
        user, sep, name = framework_name.partition("~")
        missing = error(404, "NoJobError", f"Job {framework_name} is not found.")
        if not sep or not identity.can_see(user):
            return missing
        doc = await ctx.views.find_by_key(user, name)
        if doc is None or doc.get("dialect") not in DIALECTS or not doc.get("original_json"):
            return missing
        return JSONResponse(json.loads(doc["original_json"]))

    @api.get("/api/v1/user/{user}/jobs/{name}")
    async def get_job_v1(
        user: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await status_of(user, name, identity)

    @api.get("/api/v2/jobs")
    async def list_jobs(
        identity: Identity = Depends(ctx.current),
        username: str | None = None,
        vc: str | None = None,
        state: str | None = None,
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
        limit: int = Query(5000, ge=1, le=MAX_PAGE_SIZE),
        withTotalCount: bool = False,  # noqa: N803 - OpenPAI's parameter name
    ) -> Any:
        if limit > MAX_LIMIT:
            return error(400, "InvalidParametersError", f"Limit exceeds max number {MAX_LIMIT}.")
        users = [u for u in (username or "").split(",") if u]
        if not identity.admin:
            if any(u != identity.user for u in users):
                return error(
                    403,
                    "ForbiddenUserError",
                    f"User {identity.user} is not allowed to list other users' jobs.",
                )
            users = [identity.user]
        where: dict[str, Any] = {"dialect": {"$in": list(DIALECTS)}}
        if users:
            where["user"] = {"$in": users}
        if vc:
            where["queue"] = {"$in": vc.split(",")}
        if state:
            wanted = [ours for s in state.split(",") for ours in STATES.get(s.upper(), ())]
            where["state"] = {"$in": wanted}
        docs, total = await ctx.views.list_jobs(
            user=None, state=None, limit=limit, offset=offset, where=where, full=True
        )
        items = [render_list_item(_with_stop(job_view(doc, []), doc)) for doc in docs]
        return {"totalCount": total, "data": items} if withTotalCount else items

    return api
