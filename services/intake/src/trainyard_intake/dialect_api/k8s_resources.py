"""T9k jobs and Kubeflow jobs as Kubernetes resources, written as kubectl and client-go
write them: create (``POST .../namespaces/<ns>/<plural>``, 409 AlreadyExists for a name in
use, ``fieldValidation`` and ``dryRun`` honoured), ``PUT`` and ``PATCH`` of
``.../<name>`` (JSON merge, JSON Patch and strategic merge patch) that label, annotate,
pause, resume or scale the job, ``DELETE`` of one (its job stopped, its name free at
once) or of a namespace's collection (by label and field selector).

Trainyard runs a submission asynchronously: the create answers 201 with the resource as
stored (``metadata.uid`` is the job id) once the job is on the bus, and its translation
warnings in ``Warning`` headers as the Kubernetes API server sends them. A job whose
fields are invalid is answered 422 with a Kubernetes ``Status`` naming each field (the
job is still recorded, as rejected, and holds no name). Checks against the cluster come
later: a GET then shows the job failed with reason Rejected, and it keeps its name until
deleted, as a Kubernetes object does. The namespace is part of the name, not a
permission boundary; the bearer token's user is. Every error is a ``Status``.
"""

from __future__ import annotations

import contextlib
import copy
import secrets
import string
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity
from trainyard_common.dialects import k8s_api, kubeflow, t9k, translate
from trainyard_common.dialects.fields import text
from trainyard_common.dialects.k8s_api import PatchError, SelectorError, Served
from trainyard_common.dialects.k8s_pod import MERGE_PATCH, Control, merge_patch
from trainyard_common.dialects.translation import UnknownDialect
from trainyard_common.events import (
    Event,
    FieldIssue,
    JobResourceChanged,
    PauseJob,
    ResumeJob,
    ScaleJob,
    derived_id,
)
from trainyard_common.parsing import BodyError, parse_json, parse_json_or_yaml, parse_yaml

from ..adapters.names import Claim
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
# How many times a write that met another one's is applied again before it is a 409.
CHANGE_TRIES = 5

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


def with_change(
    job_id: str,
    revision: int,
    pending: Sequence[Event],
    commands: list[Event],
    resource: JobResourceChanged,
) -> tuple[Event, ...]:
    """What a change at ``revision`` leaves to send: what an earlier one left (but its
    resource, which this one's replaces), then this one's commands and resource, under
    ids derived from the job and the revision, so a message sent again is a duplicate
    JetStream drops."""
    kept = [e for e in pending if not isinstance(e, JobResourceChanged)]
    mine = [
        e.model_copy(update={"event_id": derived_id(job_id, "resource", revision, i)})
        for i, e in enumerate([*commands, resource])
    ]
    return (*kept, *mine)


def status(
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A Kubernetes ``Status`` object, the body of every API error."""
    return JSONResponse(
        status_code=code,
        content=k8s_api.status_object(code, reason, message, details),
        headers=headers,
    )


def _decode(raw: bytes, content_type: str) -> Any:
    content_type = content_type.lower()
    if "yaml" in content_type:
        return parse_yaml(raw, MAX_BODY)
    if "json" in content_type:
        # What says it is JSON is read as JSON only, as the API server reads it: read
        # again as YAML, NaN and Infinity passed as the strings "NaN", "Infinity", and a
        # cut-off body was "not valid YAML".
        return parse_json(raw, MAX_BODY)
    # curl users often post YAML without saying so (curl -d says form-urlencoded).
    return parse_json_or_yaml(raw, MAX_BODY)


# As the Kubernetes API server bounds them: past 4 KiB of warnings in all, each is cut to
# 256 characters, and those that still do not fit are left out.
WARNINGS_MAX = 4096
WARNING_CUT = 256


def warning_headers(issues: list[FieldIssue]) -> list[str]:
    """RFC 7234 warn-values as the Kubernetes API server writes them: 299 - "text", in
    printable ASCII and bounded (a user's text echoed must not make the header invalid,
    nor too long for a client to read)."""
    texts = [f"{issue.path}: {issue.message}" for issue in issues]
    escaped = [_header_text(line, WARNINGS_MAX) for line in texts]
    if sum(len(line) for line in escaped) > WARNINGS_MAX:
        escaped = [_header_text(line, WARNING_CUT) for line in texts]
    headers: list[str] = []
    total = 0
    for line in escaped:
        total += len(line)
        if total > WARNINGS_MAX:
            break
        headers.append(f'299 - "{line}"')
    return headers


def _header_text(line: str, limit: int) -> str:
    """``line`` inside a quoted header string, cut (with "...") at ``limit`` characters
    escaped, never inside an escape."""
    out: list[str] = []
    size = 0
    for char in line:
        piece = _header_char(char)
        if size + len(piece) > limit - 3:
            return "".join(out) + "..."
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _header_char(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    if " " <= char <= "~":
        return char
    if char == "\n":
        return " "
    if ord(char) > 127:
        return char.encode("ascii", "backslashreplace").decode("ascii")
    return f"\\x{ord(char):02x}"


def _causes(errors: list[FieldIssue]) -> list[dict[str, str]]:
    return [
        {"reason": "FieldValueInvalid", "message": e.message, "field": e.path.removeprefix("$.")}
        for e in errors
    ]


def router(ctx: IntakeContext) -> APIRouter:
    api = APIRouter(tags=["kubernetes-style resources"])

    def not_found_resource(group: str, version: str, plural: str) -> JSONResponse:
        return status(
            404,
            "NotFound",
            f"the server could not find the requested resource ({group}/{version}, {plural})",
        )

    def not_found(served: Served, name: str) -> JSONResponse:
        return status(
            404,
            "NotFound",
            f'{served.plural}.{served.group} "{name}" not found',
            {"name": name, "group": served.group, "kind": served.plural},
        )

    def invalid(
        served: Served, name: str, errors: list[FieldIssue], uid: str | None = None
    ) -> JSONResponse:
        details: dict[str, Any] = {
            "name": name,
            "group": served.group,
            "kind": served.kind,
            "causes": _causes(errors),
        }
        if uid:
            details["uid"] = uid
        return status(
            422,
            "Invalid",
            f"{served.kind}.{served.group} {name!r} is invalid: "
            + "; ".join(f"{e.path}: {e.message}" for e in errors),
            details,
        )

    def strict_errors(
        request: Request, served: Served, warnings: list[FieldIssue]
    ) -> JSONResponse | None:
        """``fieldValidation=Strict`` (kubectl's default): an unknown field is an error."""
        if request.query_params.get("fieldValidation") != "Strict":
            return None
        unknown = [w for w in warnings if w.code == "unknown_field"]
        if not unknown:
            return None
        return status(
            400,
            "BadRequest",
            f"{served.kind} in version {served.version!r} cannot be handled as a "
            f"{served.kind}: strict decoding error: "
            + ", ".join(f'unknown field "{w.path.removeprefix("$.")}"' for w in unknown),
        )

    def shown(
        resource: dict[str, Any], job_id: str, generation: int, seq: int | None
    ) -> dict[str, Any]:
        meta = dict(resource.get("metadata") or {})
        meta.update(uid=job_id, generation=generation)
        if seq is not None:
            meta["resourceVersion"] = str(seq)
        return {**resource, "metadata": meta}

    def check_body(
        served: Served, payload: Any, namespace: str, name: str | None
    ) -> JSONResponse | None:
        if not isinstance(payload, dict):
            return status(400, "BadRequest", "the request body must be a single object")
        sent_kind = payload.get("kind")
        if not isinstance(sent_kind, str) or KIND_ALIASES.get(sent_kind, sent_kind) != served.kind:
            return status(
                400,
                "BadRequest",
                f"the body's kind {sent_kind!r} does not match "
                f"the resource {served.plural!r} (kind {served.kind})",
            )
        if payload.get("apiVersion") != served.group_version:
            return status(
                400,
                "BadRequest",
                f"the body's apiVersion {payload.get('apiVersion')!r} does not match the "
                f"path's {served.group_version}",
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
        if name is not None and meta.get("name") not in (None, name):
            return status(
                400,
                "BadRequest",
                "the name of the object "
                f"({meta.get('name')!r}) does not match the name on the URL ({name!r})",
            )
        return None

    @api.post("/apis/{group}/{version}/namespaces/{namespace}/{plural}")
    async def create(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_found_resource(group, version, plural)
        try:
            payload = _decode(await request.body(), request.headers.get("content-type", ""))
        except BodyError as exc:
            return status(exc.status, "BadRequest", str(exc))
        payload = copy.deepcopy(payload)
        problem = check_body(served, payload, namespace, None)
        if problem is not None:
            return problem
        payload = k8s_api.client_fields(payload)
        meta = payload["metadata"]
        meta["namespace"] = namespace
        if not meta.get("name") and isinstance(meta.get("generateName"), str):
            alphabet = string.ascii_lowercase + string.digits
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(alphabet) for _ in range(5)
            )
        name = text(meta.get("name"))
        translation = checked(
            translate(payload, dialect=served.dialect, user=identity.user), payload, ctx.deps
        )
        strict = strict_errors(request, served, translation.warnings)
        if strict is not None:
            return strict
        if request.query_params.get("dryRun") == "All":
            # Checked, and nothing kept: as the API server's dry run.
            if translation.errors:
                return invalid(served, name, translation.errors)
            held = translation.key and await ctx.deps.names.get(identity.user, translation.key)
            if held:
                return already_exists(served, name)
            return JSONResponse(status_code=201, content=shown(payload, "", 1, None))
        try:
            result = await submit_job(
                payload, identity, ctx.deps, dialect=served.dialect, translation=translation
            )
        except UnknownDialect as exc:
            return status(400, "BadRequest", str(exc))
        except PayloadTooLarge as exc:
            return status(413, "RequestEntityTooLarge", str(exc))
        except NameTaken:
            return already_exists(served, name)
        # Answered once a read shows it, as the API server does (bounded).
        await ctx.deps.settle(result.seq)
        if result.errors:
            response = invalid(served, name, result.errors, result.job_id)
        else:
            view = {
                "id": result.job_id,
                "name": name,
                "state": "SUBMITTED",
                "submitted_at": datetime.now(UTC),
                "warnings": [w.model_dump() for w in result.warnings],
                "tasks": [],
                "spec": None,
                "original": payload,
                "resource_version": result.seq,
                "generation": 1,
            }
            response = JSONResponse(
                status_code=201, content=jsonable_encoder(served.render(served.plural, view))
            )
        for warning in warning_headers(result.warnings):
            response.headers.append("Warning", warning)
        return response

    def already_exists(served: Served, name: str) -> JSONResponse:
        return status(
            409,
            "AlreadyExists",
            f'{served.plural}.{served.group} "{name}" already exists',
            {"name": name, "group": served.group, "kind": served.plural},
        )

    async def delete_one(
        served: Served, key: str, name: str, claim: Claim | None, identity: Identity
    ) -> str | None:
        """Stop the job under ``key`` and free its name; the job's id, None if none."""
        if claim is not None:
            ids = [claim.job_id]
        else:
            # A resource created by an earlier version, before names were claimed here.
            ids = await ctx.deps.owners.job_ids(identity.user, key)
        stopped = None
        for job_id in ids:
            try:
                seq = await request_stop(
                    job_id,
                    identity,
                    ctx.deps,
                    f"deleted by {identity.user} ({served.plural}/{name})",
                    delete=True,
                )
            except JobNotFound:
                continue
            stopped = job_id
            await ctx.deps.settle(seq)
        if claim is not None:
            # After the stop is on the bus: a name freed first could go to a new job
            # while the command for the old one was still to be sent.
            await ctx.deps.names.release(identity.user, key, claim.job_id)
        return stopped

    @api.delete("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}")
    async def delete(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_found_resource(group, version, plural)
        key = f"{namespace}/{plural}/{name}"
        stopped = await delete_one(
            served, key, name, await ctx.deps.names.get(identity.user, key), identity
        )
        if stopped is None:
            return not_found(served, name)
        return status(
            200,
            "",
            f'{plural}.{group} "{name}" deleted: its job is stopped',
            {"name": name, "group": group, "kind": plural, "uid": stopped},
        )

    @api.delete("/apis/{group}/{version}/namespaces/{namespace}/{plural}")
    async def delete_collection(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_found_resource(group, version, plural)
        try:
            labels = k8s_api.parse_label_selector(request.query_params.get("labelSelector"))
            fields = k8s_api.parse_field_selector(request.query_params.get("fieldSelector"))
        except SelectorError as exc:
            return status(400, "BadRequest", f"unable to parse requirement: {exc}")
        deleted = []
        for claim in await ctx.deps.names.within(identity.user, f"{namespace}/{plural}"):
            if claim.resource is None or not k8s_api.selected(claim.resource, labels, fields):
                continue
            name = claim.key.rpartition("/")[2]
            if await delete_one(served, claim.key, name, claim, identity) is not None:
                deleted.append(shown(claim.resource, claim.job_id, claim.generation, None))
        return JSONResponse(
            {
                "apiVersion": served.group_version,
                "kind": f"{served.kind}List",
                "metadata": {},
                "items": deleted,
            }
        )

    async def change(
        served: Served,
        namespace: str,
        name: str,
        identity: Identity,
        request: Request,
        new_of: Callable[[dict[str, Any]], Any],
    ) -> JSONResponse:
        """Apply a write (PUT, PATCH) to the resource as it now is: what it changes in
        the job goes out as commands, the resource itself as JobResourceChanged.

        Both are stored on the claim with the resource, in one update conditional on the
        claim's revision (a write that met another is applied again to what that one
        left), and sent after it; what an earlier write stored and did not send (a
        crash, the bus down: answered 503) is sent first, by any later write, even one
        that changes nothing (that write's retry). The ids derive from the revision, so
        a message sent twice is stored once."""
        key = f"{namespace}/{served.plural}/{name}"
        for _ in range(CHANGE_TRIES):
            claim = await ctx.deps.names.get(identity.user, key)
            if claim is None:
                return not_found(served, name)
            if claim.resource is None:
                return status(
                    409,
                    "Conflict",
                    f'{served.plural}.{served.group} "{name}" was created before its '
                    "resource was kept: delete and create it again to change it",
                )
            current = k8s_api.client_fields(claim.resource)
            try:
                wanted = new_of(copy.deepcopy(current))
            except PatchError as exc:
                return status(422, "Invalid", f"the patch cannot be applied: {exc}")
            problem = check_body(served, wanted, namespace, name)
            if problem is not None:
                return problem
            wanted = k8s_api.client_fields(wanted)
            wanted["metadata"].setdefault("name", name)
            wanted["metadata"]["namespace"] = namespace
            strict = strict_errors(
                request,
                served,
                translate(wanted, dialect=served.dialect, user=identity.user).warnings,
            )
            if strict is not None:
                return strict
            control = CONTROL[served.dialect](current, k8s_api.merge_diff(current, wanted))
            if control.errors:
                return invalid(served, name, control.errors, claim.job_id)
            generation = claim.generation + (current.get("spec") != wanted.get("spec"))
            if request.query_params.get("dryRun") == "All" or (
                wanted == current and not claim.pending
            ):
                return JSONResponse(shown(wanted, claim.job_id, generation, None))
            revision, pending = claim.revision, claim.pending
            if wanted != current:
                what = f"{request.method} {served.plural}/{name}"
                pending = with_change(
                    claim.job_id,
                    claim.revision + 1,
                    pending,
                    control_commands(claim.job_id, control, identity.user, what),
                    JobResourceChanged(job_id=claim.job_id, resource=wanted, generation=generation),
                )
                if not await ctx.deps.names.update(
                    identity.user,
                    key,
                    claim.job_id,
                    wanted,
                    generation,
                    revision=claim.revision,
                    pending=pending,
                ):
                    continue  # changed meanwhile: apply the write to it as it is now
                revision += 1
            seq = None
            for done, message in enumerate(pending):
                try:
                    seq = await ctx.deps.publish(message)
                except Exception:
                    # What went out is not sent again: past the bus's duplicate window
                    # it would be a second command (a pause after a resume made since).
                    with contextlib.suppress(Exception):
                        await ctx.deps.names.sent(
                            identity.user, key, claim.job_id, revision, pending, pending[done:]
                        )
                    raise
            await ctx.deps.names.sent(identity.user, key, claim.job_id, revision, pending)
            await ctx.deps.settle(seq)
            return JSONResponse(shown(wanted, claim.job_id, generation, seq))
        return status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {served.plural}.{served.group} "{name}": '
            "the object has been modified; please apply your changes to the latest version "
            "and try again",
        )

    @api.put("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}")
    async def replace(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_found_resource(group, version, plural)
        try:
            body = _decode(await request.body(), request.headers.get("content-type", ""))
        except BodyError as exc:
            return status(exc.status, "BadRequest", str(exc))
        return await change(served, namespace, name, identity, request, lambda _: body)

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
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_found_resource(group, version, plural)
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        appliers: dict[str, Callable[[Any, Any], Any]] = {
            MERGE_PATCH: merge_patch,
            k8s_api.JSON_PATCH: k8s_api.json_patch,
            k8s_api.STRATEGIC_PATCH: k8s_api.strategic_merge_patch,
        }
        if kind not in appliers:
            return status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(appliers)}",
            )
        try:
            body = parse_json(await request.body(), MAX_BODY)
        except BodyError as exc:
            return status(exc.status, "BadRequest", str(exc))
        if kind != k8s_api.JSON_PATCH and not isinstance(body, dict):
            return status(400, "BadRequest", f"a {kind} body is a JSON object")
        apply = appliers[kind]
        return await change(
            served, namespace, name, identity, request, lambda current: apply(current, body)
        )

    @api.put("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status")
    @api.patch("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status")
    async def write_status(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        if k8s_api.lookup(group, version, plural) is None:
            return not_found_resource(group, version, plural)
        return status(
            405,
            "MethodNotAllowed",
            f"the status of {plural}.{group} {name!r} is written by Trainyard from its job; "
            "change the resource itself (suspend, replicas) to act on the job",
        )

    return api
