"""T9k jobs and Kubeflow PyTorchJob / TFJob as Kubernetes-style resources: create
(``POST /apis/<group>/<version>/namespaces/<ns>/<plural>``), delete (``DELETE .../<name>``)
and a merge patch (``PATCH .../<name>``) that pauses, resumes or scales the job.

Trainyard runs a submission asynchronously: the create answers 201 with the resource as
stored (``metadata.uid`` is the job id) once the job is on the bus, and its translation
warnings in ``Warning`` headers as the Kubernetes API server sends them. A job whose
fields are invalid is answered 422 with a Kubernetes ``Status`` naming each field (the
job is still recorded, as rejected). Checks against the cluster come later: a GET then
shows phase Failed with reason Rejected. The namespace is part of the name, not a
permission boundary; the bearer token's user is.
"""

from __future__ import annotations

import copy
import secrets
import string
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity
from trainyard_common.dialects import kubeflow, t9k
from trainyard_common.dialects.fields import text
from trainyard_common.dialects.k8s_pod import MERGE_PATCH, Control, merge_patch
from trainyard_common.dialects.translation import UnknownDialect
from trainyard_common.events import Event, FieldIssue, PauseJob, ResumeJob, ScaleJob
from trainyard_common.parsing import BodyError, parse_json, parse_json_or_yaml, parse_yaml

from ..adapters.resources import DocResourceStore, InMemoryResourceStore, ResourceStore
from ..handlers import JobNotFound, PayloadTooLarge, request_stop, submit_job
from .context import IntakeContext

MAX_BODY = 4 * 1024 * 1024

# (group, version) -> (dialect name, plural -> kind name, render)
APIS: dict[tuple[str, str], tuple[str, dict[str, str], Any]] = {
    (t9k.GROUP, t9k.VERSION): (
        t9k.DIALECT,
        {p: k.name for p, k in t9k.PLURALS.items()},
        t9k.render,
    ),
    (kubeflow.GROUP, kubeflow.VERSION): (
        kubeflow.DIALECT,
        {p: k.name for p, k in kubeflow.PLURALS.items()},
        kubeflow.render,
    ),
}
KIND_ALIASES = t9k.KIND_SPELLINGS
# dialect -> what a merge patch of one of its resources asks for
CONTROL = {t9k.DIALECT: t9k.control_from_patch, kubeflow.DIALECT: kubeflow.control_from_patch}


def control_commands(job_id: str, control: Control, user: str, what: str) -> list[Event]:
    """The generic commands a PATCH stands for, scaling before pausing (a patch that does
    both leaves the job paused at its new size) and pausing before resuming."""
    commands: list[Event] = [
        ScaleJob(job_id=job_id, requested_by=user, role=role, replicas=replicas)
        for role, replicas in sorted(control.scale.items())
    ]
    if control.pause is True:
        commands.append(
            PauseJob(job_id=job_id, requested_by=user, reason=f"paused by {user} ({what})")
        )
    elif control.pause is False:
        commands.append(ResumeJob(job_id=job_id, requested_by=user))
    return commands


def status(
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A Kubernetes ``Status`` object, the body of every API error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return JSONResponse(status_code=code, content=body, headers=headers)


def _decode(raw: bytes, content_type: str) -> Any:
    if "yaml" in content_type:
        return parse_yaml(raw, MAX_BODY)
    # kubectl sends JSON; curl users often post YAML without saying so.
    return parse_json_or_yaml(raw, MAX_BODY)


def warning_header(issue: FieldIssue) -> str:
    """RFC 7234 warn-value as the Kubernetes API server writes it: 299 - "text"."""
    text = f"{issue.path}: {issue.message}".replace("\\", "\\\\").replace('"', '\\"')
    text = text.encode("ascii", "backslashreplace").decode("ascii").replace("\n", " ")
    return f'299 - "{text}"'


def _causes(errors: list[FieldIssue]) -> list[dict[str, str]]:
    return [
        {"reason": "FieldValueInvalid", "message": e.message, "field": e.path.removeprefix("$.")}
        for e in errors
    ]


def router(ctx: IntakeContext) -> APIRouter:
    api = APIRouter(tags=["kubernetes-style resources"])
    resources: ResourceStore = (
        DocResourceStore(ctx.db["k8s_resources"]) if ctx.db is not None else InMemoryResourceStore()
    )

    def resolve(group: str, version: str, plural: str) -> tuple[str, str, Any] | None:
        found = APIS.get((group, version))
        if found is None or plural not in found[1]:
            return None
        dialect, kinds, render = found
        return dialect, kinds[plural], render

    def not_found_resource(group: str, version: str, plural: str) -> JSONResponse:
        return status(
            404,
            "NotFound",
            f"the server could not find the requested resource ({group}/{version}, {plural})",
        )

    @api.post("/apis/{group}/{version}/namespaces/{namespace}/{plural}")
    async def create(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        found = resolve(group, version, plural)
        if found is None:
            return not_found_resource(group, version, plural)
        dialect, kind, render = found
        try:
            payload = _decode(await request.body(), request.headers.get("content-type", ""))
        except BodyError as exc:
            return status(exc.status, "BadRequest", str(exc))
        if not isinstance(payload, dict):
            return status(400, "BadRequest", "the request body must be a single object")
        payload = copy.deepcopy(payload)
        sent_kind = payload.get("kind")
        if not isinstance(sent_kind, str) or KIND_ALIASES.get(sent_kind, sent_kind) != kind:
            return status(
                400,
                "BadRequest",
                f"the body's kind {sent_kind!r} does not match "
                f"the resource {plural!r} (kind {kind})",
            )
        if payload.get("apiVersion") != f"{group}/{version}":
            return status(
                400,
                "BadRequest",
                f"the body's apiVersion "
                f"{payload.get('apiVersion')!r} does not match the path's "
                f"{group}/{version}",
            )
        meta = payload.get("metadata")
        if meta is None:
            meta = payload["metadata"] = {}
        if not isinstance(meta, dict):
            return status(400, "BadRequest", "metadata must be an object")
        if meta.get("namespace") not in (None, namespace):
            return status(
                400,
                "BadRequest",
                "the namespace of the provided object does not "
                "match the namespace sent on the request",
            )
        meta["namespace"] = namespace
        if not meta.get("name") and isinstance(meta.get("generateName"), str):
            alphabet = string.ascii_lowercase + string.digits
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(alphabet) for _ in range(5)
            )
        try:
            result = await submit_job(payload, identity, ctx.deps, dialect=dialect)
        except UnknownDialect as exc:
            return status(400, "BadRequest", str(exc))
        except PayloadTooLarge as exc:
            return status(413, "RequestEntityTooLarge", str(exc))
        name = text(meta.get("name"))
        headers = [("Warning", warning_header(w)) for w in result.warnings]
        if result.errors:
            response = status(
                422,
                "Invalid",
                f"{kind}.{group} {name!r} is invalid: "
                + "; ".join(f"{e.path}: {e.message}" for e in result.errors),
                {
                    "name": name,
                    "group": group,
                    "kind": kind,
                    "uid": result.job_id,
                    "causes": _causes(result.errors),
                },
            )
        else:
            # Kept for a later PATCH, which applies to the resource as created.
            await resources.keep(identity.user, f"{namespace}/{plural}/{name}", payload)
            view = {
                "id": result.job_id,
                "name": name,
                "state": "SUBMITTED",
                "submitted_at": datetime.now(UTC),
                "warnings": [w.model_dump() for w in result.warnings],
                "tasks": [],
                "spec": None,
                "original": payload,
            }
            response = JSONResponse(status_code=201, content=jsonable_encoder(render(plural, view)))
        for header, value in headers:
            response.headers.append(header, value)
        return response

    @api.delete("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}")
    async def delete(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        found = resolve(group, version, plural)
        if found is None:
            return not_found_resource(group, version, plural)
        key = f"{namespace}/{plural}/{name}"
        details = {"name": name, "group": group, "kind": plural}
        ids = await ctx.deps.owners.job_ids(identity.user, key)
        stopped = []
        for job_id in ids:
            # Every job ever created under this name is stopped: at most one can still be
            # running (names are unique per user); the others are finished or were
            # rejected, and a stop changes nothing for them.
            try:
                await request_stop(
                    job_id, identity, ctx.deps, f"deleted by {identity.user} ({plural}/{name})"
                )
            except JobNotFound:
                continue
            stopped.append(job_id)
        if not stopped:
            return status(404, "NotFound", f'{plural}.{group} "{name}" not found', details)
        return status(
            200,
            "",
            f'{plural}.{group} "{name}" deleted: its job is stopped',
            {**details, "uid": stopped[-1]},
        )

    @api.patch("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}")
    async def patch(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        found = resolve(group, version, plural)
        if found is None:
            return not_found_resource(group, version, plural)
        dialect, _, _ = found
        if request.headers.get("content-type", "").split(";")[0].strip() != MERGE_PATCH:
            return status(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an "
                f"unknown format - accepted media types include: {MERGE_PATCH} "
                "(kubectl patch --type=merge)",
            )
        try:
            body = parse_json(await request.body(), MAX_BODY)
        except BodyError as exc:
            return status(exc.status, "BadRequest", str(exc))
        key = f"{namespace}/{plural}/{name}"
        details = {"name": name, "group": group, "kind": plural}
        ids = await ctx.deps.owners.job_ids(identity.user, key)
        if not ids:
            return status(404, "NotFound", f'{plural}.{group} "{name}" not found', details)
        current = await resources.get(identity.user, key)
        if current is None:
            # Created with field errors (never kept), or before PATCH existed.
            return status(
                409,
                "Conflict",
                f'{plural}.{group} "{name}" has no resource to patch: it was rejected when created',
                details,
            )
        control = CONTROL[dialect](current, body)
        if control.errors:
            return status(
                422,
                "Invalid",
                f"{plural}.{group} {name!r} is invalid: "
                + "; ".join(f"{e.path}: {e.message}" for e in control.errors),
                {**details, "causes": _causes(control.errors)},
            )
        # As a delete does: every job created under the name gets the command; only the
        # one that was accepted can act on it.
        for job_id in ids:
            for command in control_commands(
                job_id, control, identity.user, f"PATCH {plural}/{name}"
            ):
                await ctx.deps.publish(command)
        patched = merge_patch(current, body)
        return JSONResponse(
            status_code=200,
            content={**patched, "metadata": {**(patched.get("metadata") or {}), "uid": ids[-1]}},
        )

    return api
