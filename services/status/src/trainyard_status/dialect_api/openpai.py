"""OpenPAI rest-server's read API, at its paths and in its shapes (rendered by the
dialect's pure ``render_status`` / ``render_list_item`` from the canonical view):

- ``GET /api/v2/jobs/{user}~{name}`` (and v1's ``GET /api/v1/user/{user}/jobs/{name}``);
- ``GET /api/v2/jobs/{user}~{name}/config``: the job as submitted, secrets hidden;
- ``GET /api/v2/jobs`` with OpenPAI's filters ``username``, ``vc``, ``state`` (each a
  comma list), ``tagsContain`` / ``tagsNotContain``, ``keyword`` (a substring of the
  user, name or VC), ``order`` (``field,ASC|DESC``), ``offset``, ``limit`` and
  ``withTotalCount``.

Jobs submitted in either OpenPAI dialect are shown. Unlike OpenPAI, a user sees only
their own jobs (an admin sees all): another user's job answers 404 like a missing one.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity
from trainyard_common.dialects import openpai, openpai_v2
from trainyard_common.dialects.openpai import render_list_item, render_status
from trainyard_common.limits import MAX_INDEX, MAX_OFFSET, MAX_PAGE_SIZE

from ..adapters.views import job_view
from .context import StatusContext

DIALECTS = (openpai.DIALECT, openpai_v2.DIALECT)
# OpenPAI's state filter, in our states. A job still waiting or running whose stop was
# asked for shows STOPPING (dialects/openpai.py _job_state), so it is that, not these.
WAITING = ("SUBMITTED", "ACCEPTED", "QUEUED", "PLACED", "PAUSED")
STATES: dict[str, dict[str, Any]] = {
    "WAITING": {"state": {"$in": list(WAITING)}, "stop_requested_by": None},
    "RUNNING": {"state": "RUNNING", "stop_requested_by": None},
    "STOPPING": {"state": {"$in": [*WAITING, "RUNNING"]}, "stop_requested_by": {"$ne": None}},
    "SUCCEEDED": {"state": "SUCCEEDED"},
    "FAILED": {"state": {"$in": ["FAILED", "REJECTED"]}},
    "STOPPED": {"state": "STOPPED"},
}
# OpenPAI's list limits (rest-server controllers/v2/job.js): 5000 unless asked, at most
# 50000 (above it, 400).
DEFAULT_LIMIT, MAX_LIMIT = 5000, 50000


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

    async def found_job(
        framework_name: str, identity: Identity
    ) -> tuple[dict[str, Any], dict[str, Any]] | JSONResponse:
        """The job named ``user~name`` and its canonical view, or OpenPAI's 404."""
        user, sep, name = framework_name.partition("~")
        missing = error(404, "NoJobError", f"Job {framework_name} is not found.")
        if not sep or not identity.can_see(user):
            return missing
        doc = await ctx.views.find_by_key(user, name)
        if doc is None or doc.get("dialect") not in DIALECTS:
            return missing
        return doc, _with_stop(await ctx.full_view(doc), doc)

    def attempt_of(view: dict[str, Any], job_attempt_id: int) -> int | None:
        """OpenPAI's jobAttemptId (from 0) as our attempt (from 1), if the job had it."""
        attempt = job_attempt_id + 1
        return attempt if attempt in openpai.attempt_numbers(view) else None

    @api.get("/api/v2/info")
    async def info() -> dict[str, Any]:
        return openpai.CLUSTER_INFO

    @api.get("/api/v2/jobs/{framework_name}/attempts/{job_attempt_id}")
    async def get_attempt(
        framework_name: str,
        job_attempt_id: int = Path(ge=0, le=MAX_INDEX),
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        found = await found_job(framework_name, identity)
        if isinstance(found, JSONResponse):
            return found
        _doc, view = found
        attempt = attempt_of(view, job_attempt_id)
        if attempt is None:
            return error(
                404, "NoJobError", f"Job {framework_name} has no attempt {job_attempt_id}."
            )
        return JSONResponse(render_status(view, attempt))

    @api.get("/api/v2/jobs/{framework_name}/job-attempts/healthz")
    async def attempts_healthz(framework_name: str) -> dict[str, Any]:
        return {}

    @api.get("/api/v2/jobs/{framework_name}/job-attempts")
    async def job_attempts(framework_name: str, identity: Identity = Depends(ctx.current)) -> Any:
        found = await found_job(framework_name, identity)
        if isinstance(found, JSONResponse):
            return found
        view = found[1]
        return [openpai.render_job_attempt(view, n) for n in openpai.attempt_numbers(view)]

    @api.get("/api/v2/jobs/{framework_name}/job-attempts/{attempt_index}")
    async def job_attempt(
        framework_name: str,
        attempt_index: int = Path(ge=0, le=MAX_INDEX),
        identity: Identity = Depends(ctx.current),
    ) -> Any:
        found = await found_job(framework_name, identity)
        if isinstance(found, JSONResponse):
            return found
        view = found[1]
        attempt = attempt_of(view, attempt_index)
        if attempt is None:
            return error(404, "NoJobError", f"Job {framework_name} has no attempt {attempt_index}.")
        return openpai.render_job_attempt(view, attempt)

    TASK = (
        "/api/v2/jobs/{framework_name}/attempts/{job_attempt_id}/taskRoles/{role}"
        "/taskIndex/{index}/attempts"
    )

    async def task_of(
        framework_name: str, job_attempt_id: int, role: str, index: int, identity: Identity
    ) -> tuple[dict[str, Any], int] | JSONResponse:
        found = await found_job(framework_name, identity)
        if isinstance(found, JSONResponse):
            return found
        view = found[1]
        attempt = attempt_of(view, job_attempt_id)
        if attempt is None or openpai.render_task(view, attempt, role, index) is None:
            return error(
                404,
                "NoTaskError",
                f"Task {role}[{index}] of job {framework_name} attempt {job_attempt_id} "
                "is not found.",
            )
        return view, attempt

    @api.get(TASK)
    async def get_task(
        framework_name: str,
        role: str,
        job_attempt_id: int = Path(ge=0, le=MAX_INDEX),
        index: int = Path(ge=0, le=MAX_INDEX),
        identity: Identity = Depends(ctx.current),
    ) -> Any:
        found = await task_of(framework_name, job_attempt_id, role, index, identity)
        if isinstance(found, JSONResponse):
            return found
        view, attempt = found
        return openpai.render_task(view, attempt, role, index)

    @api.get(TASK + "/{task_attempt_id}/logs")
    async def task_logs(
        framework_name: str,
        role: str,
        request: Request,
        job_attempt_id: int = Path(ge=0, le=MAX_INDEX),
        index: int = Path(ge=0, le=MAX_INDEX),
        task_attempt_id: int = Path(ge=0, le=0),
        identity: Identity = Depends(ctx.current),
    ) -> Any:
        """Where the task's logs are (OpenPAI's PodLogInfo): Trainyard's own log API,
        which takes the same bearer token."""
        found = await task_of(framework_name, job_attempt_id, role, index, identity)
        if isinstance(found, JSONResponse):
            return found
        view, attempt = found
        base = "{}://{}".format(
            request.headers.get("x-forwarded-proto", "http"),
            request.headers.get("x-forwarded-host") or request.url.netloc,
        )
        path = (
            f"{base}/v1/jobs/{view['id']}/logs?role={quote(role)}&index={index}&attempt={attempt}"
        )
        return {
            "locations": [
                {"name": "stdout", "uri": f"{path}&stream=stdout"},
                {"name": "stderr", "uri": f"{path}&stream=stderr"},
            ]
        }

    @api.get("/api/v2/jobs/{framework_name}/events")
    async def events(
        framework_name: str,
        identity: Identity = Depends(ctx.current),
        type: str | None = Query(None, pattern="^(Warning|Normal)$"),  # noqa: A002 - OpenPAI's
    ) -> Any:
        found = await found_job(framework_name, identity)
        if isinstance(found, JSONResponse):
            return found
        doc, view = found
        return openpai.render_events(view, await ctx.views.history(doc["_id"]), type)

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

    @api.get("/api/v2/jobs/{framework_name}/ssh")
    async def get_ssh_info(
        framework_name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        """OpenPAI's SSH info of a job (the keys its ssh plugin made). Trainyard runs no
        ssh plugin: a task's ``ssh`` port is in its status and PAI_CONTAINER_SSH_PORT,
        a shell in it is ``yard exec``. Answered as OpenPAI on Kubernetes answers a job
        without one."""
        found = await found_job(framework_name, identity)
        if isinstance(found, JSONResponse):
            return found
        return error(
            404,
            "NoJobSshInfoError",
            f"SSH info of job {framework_name} is not found: Trainyard runs no ssh plugin "
            "(a task's ssh port is PAI_CONTAINER_SSH_PORT; a shell in it is `yard exec`)",
        )

    # OpenPAI's v1 paths under a user: its rest-server rewrites /api/v1/user/{user}/jobs[/
    # {name}...] to the v2 routes of {user}~{name} (routes/rewrite.js), so do these.
    @api.get("/api/v1/user/{user}/jobs/{name}")
    async def get_job_v1(
        user: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await status_of(user, name, identity)

    @api.get("/api/v1/user/{user}/jobs/{name}/config")
    async def get_config_v1(
        user: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await get_config(f"{user}~{name}", identity)

    @api.get("/api/v1/user/{user}/jobs/{name}/ssh")
    async def get_ssh_info_v1(
        user: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await get_ssh_info(f"{user}~{name}", identity)

    # The list's ``order`` fields (rest-server controllers/v2/job.js) -> stored fields; an
    # unknown field or direction is passed over, as OpenPAI does.
    ORDER_FIELDS = {
        "jobName": "name",
        "submissionTime": "submitted_at",
        "username": "user",
        "vc": "queue",
        "state": "state",
        "completionTime": "finished_at",
    }
    ORDER_UNSUPPORTED = {"retries", "totalTaskNumber", "totalGpuNumber"}

    @api.get("/api/v2/jobs")
    async def list_jobs(
        identity: Identity = Depends(ctx.current),
        username: str | None = None,
        vc: str | None = None,
        state: str | None = None,
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
        limit: int = Query(DEFAULT_LIMIT, ge=1),
        withTotalCount: bool = False,  # noqa: N803 - OpenPAI's parameter name
        tagsContain: str | None = Query(None, max_length=4096),  # noqa: N803
        tagsNotContain: str | None = Query(None, max_length=4096),  # noqa: N803
        keyword: str | None = Query(None, max_length=1024),
        order: str | None = Query(None, max_length=64),
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
        either: list[list[dict[str, Any]]] = []
        if state:
            # An unknown state (UNKNOWN among them: never shown here) matches nothing.
            wanted = [STATES[s.upper()] for s in state.split(",") if s.upper() in STATES]
            either.append(wanted or [{"state": {"$in": []}}])
        # OpenPAI's tag filters: any of tagsContain, none of tagsNotContain.
        tags: dict[str, list[str]] = {}
        if tagsContain:
            tags["$in"] = [t for t in tagsContain.split(",") if t]
        if tagsNotContain:
            tags["$nin"] = [t for t in tagsNotContain.split(",") if t]
        if tags:
            where["tags"] = tags
        if keyword:
            # OpenPAI's keyword: a substring of the user, the job's name or its VC.
            found = {"$regex": re.escape(keyword)}
            either.append([{"user": found}, {"name": found}, {"queue": found}])
        if either:
            where["$and"] = [{"$or": alternatives} for alternatives in either]
        sort, ascending = "submitted_at", False  # OpenPAI's default: submissionTime,DESC
        if order:
            field, _, way = order.partition(",")
            if field in ORDER_UNSUPPORTED:
                return error(
                    400, "InvalidParametersError", f"order by {field} is not supported here"
                )
            if field in ORDER_FIELDS and way in ("ASC", "DESC"):
                sort, ascending = ORDER_FIELDS[field], way == "ASC"
        # OpenPAI answers up to its limit in one list: read here a store page at a
        # time (whole documents are large; their list items are not), so a client that
        # stops at a short page stops at the end. In submission order each page goes on
        # from the last job of the one before (a job submitted meanwhile shifts no page);
        # in another order, by offset.
        items: list[dict[str, Any]] = []
        total = 0
        after: tuple[Any, str] | None = None
        while True:
            page = min(limit - len(items), MAX_PAGE_SIZE)
            docs, counted = await ctx.views.list_jobs(
                user=None, state=None, limit=page, where=where, full=True, sort=sort,
                oldest_first=ascending, count=withTotalCount and not items, after=after,
                offset=0 if after else offset + len(items),
            )  # fmt: skip
            total = total or counted
            items += [render_list_item(_with_stop(job_view(doc, []), doc)) for doc in docs]
            if len(docs) < page or len(items) >= limit:
                break
            if sort == "submitted_at":
                after = (docs[-1]["submitted_at"], str(docs[-1]["_id"]))
        return {"totalCount": total, "data": items} if withTotalCount else items

    @api.get("/api/v1/user/{user}/jobs")
    async def list_jobs_v1(user: str, identity: Identity = Depends(ctx.current)) -> Any:
        """The v1 list of a user's jobs (openpaisdk's and the JS SDK's v1 clients)."""
        return await list_jobs(
            identity=identity, username=user, vc=None, state=None, offset=0,
            limit=DEFAULT_LIMIT, withTotalCount=False, tagsContain=None, tagsNotContain=None,
            keyword=None, order=None,
        )  # fmt: skip

    return api
