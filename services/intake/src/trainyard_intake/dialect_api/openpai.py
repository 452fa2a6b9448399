"""OpenPAI rest-server's write API, at its paths and in its shapes:

- ``POST /api/v2/jobs`` — a protocol v2 YAML (or a v1 JSON) job; 202
  ``{"status": 202, "message": "Update job <name> for user <user> successfully."}``
  (rest-server ``controllers/v2/job.js`` update);
- ``POST /api/v1/user/{user}/jobs`` — a v1 JSON job; 202
  ``{"message": "update job <name> successfully"}`` and a Location (the v1 controller);
- ``PUT /api/v2/jobs/{user}~{name}/executionType`` ``{"value": "STOP"}`` — stop it; 202
  ``{"status": 202, "message": "Execute job <user>~<name> successfully."}``;
- ``PUT`` / ``DELETE /api/v2/jobs/{user}~{name}/tag`` ``{"value": "<tag>"}`` — add or
  remove a tag (JobTagged); 200 ``{"status": 200, "message": "Add tag ..."}``.

Errors are OpenPAI's ``{"code": "...", "message": "..."}``. A job the protocol rejects is
answered 400 at once (``InvalidProtocolError``), as OpenPAI does, and a name already
taken 409; checks against the cluster are answered at once on the local backend, and
with tasks on Kubernetes come later, from validation (the job then shows FAILED with
the reason).

OpenPAI names jobs ``user~name``, intake by id: the owner registry records every
submission's dialect key (the job name), which is how a stop by name finds the job.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse

from trainyard_common.auth import USER_NAME, Identity
from trainyard_common.dialects import openpai, openpai_v2
from trainyard_common.events import JobTagged
from trainyard_common.parsing import BodyError, parse_json, parse_yaml

from ..handlers import (
    JobNotFound,
    NameTaken,
    PayloadTooLarge,
    checked,
    request_stop,
    submit_job,
)
from .context import IntakeContext

MAX_BODY = 4 * 1024 * 1024
# The longest tag taken (OpenPAI names no limit; a bound keeps views small).
MAX_TAG = 256


def error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"code": code, "message": message, **extra})


def _decode(raw: bytes, content_type: str) -> Any:
    """The body as data. YAML is a superset of JSON, so a v1 JSON sent as YAML (or with no
    content type, as OpenPAI's SDKs do) reads the same."""
    # Either is JSON's data model (YAML's dates and number keys as JSON has them), the
    # YAML's scalars read as the rest-server's js-yaml reads them (yes is a word).
    if "json" in content_type:
        return parse_json(raw, MAX_BODY)
    return parse_yaml(raw, MAX_BODY, js_yaml=True)


def _split(framework_name: str) -> tuple[str, str] | None:
    user, sep, name = framework_name.partition("~")
    return (user, name) if sep and user and name else None


def router(ctx: IntakeContext) -> APIRouter:
    api = APIRouter(tags=["openpai"])

    async def submit(
        request: Request, identity: Identity, idempotency_key: str | None, v1_only: bool
    ) -> tuple[Any, str] | JSONResponse:
        try:
            payload = _decode(await request.body(), request.headers.get("content-type", ""))
        except BodyError as exc:
            return error(exc.status, "InvalidProtocolError", f"the job cannot be read: {exc}")
        if isinstance(payload, dict) and not v1_only and openpai_v2.is_v2(payload):
            dialect = openpai_v2.REGISTRATION
        elif isinstance(payload, dict) and ("jobName" in payload or "taskRoles" in payload):
            dialect = openpai.REGISTRATION
        else:
            expected = (
                "an OpenPAI v1 job (jobName, taskRoles)"
                if v1_only
                else "an OpenPAI job (protocolVersion 2, or a v1 jobName and taskRoles)"
            )
            return error(400, "InvalidProtocolError", f"the body is not {expected}")
        translation = checked(dialect.translate(payload, identity.user), payload, ctx.deps)
        errors = translation.errors
        if errors:
            summary = "; ".join(f"{e.path}: {e.message}" for e in errors)
            return error(
                400,
                "InvalidProtocolError",
                summary,
                errors=[e.model_dump() for e in errors],
            )
        try:
            result = await submit_job(
                payload,
                identity,
                ctx.deps,
                translation=translation,
                idempotency_key=idempotency_key,
            )
        except PayloadTooLarge as exc:
            return error(413, "RequestEntityTooLarge", str(exc))
        except NameTaken:
            # As OpenPAI's rest-server answers a framework that already exists.
            # "Job ${frameworkName} already exists.": user~name.
            framework = f"{identity.user}~{translation.spec.name}"
            return error(409, "ConflictJobError", f"Job {framework} already exists.")
        # Answered once a read shows the job (bounded), as OpenPAI's GET of user~name
        # finds it right after its 202.
        await ctx.deps.settle(result.seq)
        return result.job_id, translation.spec.name

    @api.post("/api/v2/jobs", status_code=202)
    async def submit_v2(
        request: Request,
        identity: Identity = Depends(ctx.current),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        done = await submit(request, identity, idempotency_key, v1_only=False)
        if isinstance(done, JSONResponse):
            return done
        job_id, name = done
        return JSONResponse(
            status_code=202,
            headers={"X-Trainyard-Job-Id": job_id},
            content={
                "status": 202,
                "message": f"Update job {name} for user {identity.user} successfully.",
            },
        )

    @api.post("/api/v1/user/{user}/jobs", status_code=202)
    async def submit_v1(
        user: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        if not USER_NAME.match(user):
            return error(
                400,
                "InvalidParametersError",
                f"user: {user[:80]!r} is not a user name (1 to 64 of A-Z, a-z, 0-9, '.', '_', '-')",
            )
        if user != identity.user and not identity.admin:
            return error(
                403,
                "ForbiddenUserError",
                f"User {identity.user} is not allowed to add job to {user}.",
            )
        # An admin submitting under another user's path submits as that user (v1 keeps
        # the job under the path's user).
        owner = identity if user == identity.user else Identity(user=user, admin=False)
        done = await submit(request, owner, idempotency_key, v1_only=True)
        if isinstance(done, JSONResponse):
            return done
        job_id, name = done
        return JSONResponse(
            status_code=202,
            headers={
                "Location": f"/api/v1/user/{user}/jobs/{name}",
                "X-Trainyard-Job-Id": job_id,
            },
            content={"message": f"update job {name} successfully"},
        )

    @api.put("/api/v2/jobs/{framework_name}/executionType", status_code=202)
    async def execute(
        framework_name: str, request: Request, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        try:
            body = parse_json(await request.body() or b"{}", MAX_BODY)
        except BodyError:
            body = None
        value = body.get("value") if isinstance(body, dict) else None
        if value not in ("STOP", "START"):
            return error(
                400,
                "InvalidParametersError",
                'executionType must be {"value": "STOP"} or {"value": "START"}',
            )
        parts = _split(framework_name)
        if parts is None:
            return error(404, "NoJobError", f"Job {framework_name} is not found.")
        user, name = parts
        if user != identity.user and not identity.admin:
            return error(
                403,
                "ForbiddenUserError",
                f"User {identity.user} is not allowed to execute job {framework_name}.",
            )
        job_ids = await ctx.deps.owners.job_ids(user, name)
        if not job_ids:
            return error(404, "NoJobError", f"Job {framework_name} is not found.")
        if value == "START":
            # A stopped OpenPAI job can be started again; a Trainyard job runs once.
            return error(
                400,
                "InvalidParametersError",
                "START is not supported: submit the job again under a new name",
            )
        stopped = 0
        for job_id in job_ids:
            try:
                await request_stop(
                    job_id, identity, ctx.deps, f"stopped by {identity.user} (executionType STOP)"
                )
                stopped += 1
            except JobNotFound:
                pass
        if not stopped:
            return error(404, "NoJobError", f"Job {framework_name} is not found.")
        return JSONResponse(
            status_code=202,
            content={
                "status": 202,
                "message": f"Execute job {framework_name} successfully.",
            },
        )

    @api.put("/api/v1/user/{user}/jobs/{name}/executionType", status_code=202)
    async def execute_v1(
        user: str, name: str, request: Request, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        """v1's path (openpaisdk's and the JS SDK's stop): OpenPAI's rest-server rewrites
        it to the v2 route of {user}~{name} (routes/rewrite.js)."""
        return await execute(f"{user}~{name}", request, identity)

    @api.put("/api/v2/jobs/{framework_name}/tag")
    async def add_tag(
        framework_name: str, request: Request, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await tag(framework_name, request, identity, present=True)

    @api.delete("/api/v2/jobs/{framework_name}/tag")
    async def delete_tag(
        framework_name: str, request: Request, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await tag(framework_name, request, identity, present=False)

    async def tag(
        framework_name: str, request: Request, identity: Identity, *, present: bool
    ) -> JSONResponse:
        """OpenPAI's job tags (rest-server controllers/v2/job.js addTag / deleteTag):
        ``{"value": "<tag>"}``, by the job's owner or an admin; 200 once a read of the
        job shows the change."""
        try:
            body = parse_json(await request.body() or b"{}", MAX_BODY)
        except BodyError:
            body = None
        value = body.get("value") if isinstance(body, dict) else None
        if not isinstance(value, str) or not 0 < len(value) <= MAX_TAG:
            return error(
                400,
                "InvalidParametersError",
                f'value: a tag must be {{"value": "<tag>"}}, 1 to {MAX_TAG} characters',
            )
        parts = _split(framework_name)
        if parts is None:
            return error(404, "NoJobError", f"Job {framework_name} is not found.")
        user, name = parts
        verb, preposition = ("add", "to") if present else ("delete", "from")
        if user != identity.user and not identity.admin:
            return error(
                403,
                "ForbiddenUserError",
                f"User {identity.user} is not allowed to {verb} tag {preposition} job "
                f"{framework_name}.",
            )
        job_ids = await ctx.deps.owners.job_ids(user, name)
        if not job_ids:
            return error(404, "NoJobError", f"Job {framework_name} is not found.")
        seq = None
        for job_id in job_ids:
            seq = await ctx.deps.publish(JobTagged(job_id=job_id, tag=value, present=present))
        await ctx.deps.settle(seq)
        done = f"Add tag {value} for" if present else f"Delete tag {value} from"
        return JSONResponse(
            status_code=200,
            content={"status": 200, "message": f"{done} job {framework_name} successfully."},
        )

    return api
