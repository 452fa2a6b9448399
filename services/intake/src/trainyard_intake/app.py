"""Intake's HTTP entrypoint: decode the request, call a handler, encode the answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from trainyard_common.api import JOB_BODY, ControlAnswer, SubmitAnswer, answers
from trainyard_common.auth import AccessKeyStore, Identity, TokenStore, identity_dependency
from trainyard_common.dialects import UnknownDialect, forced_dialect, parse_job
from trainyard_common.parsing import BodyError
from trainyard_common.runtime import health_app
from trainyard_common.telemetry import tracer

from .dialect_api import ROUTERS, IntakeContext
from .handlers import (
    Deps,
    JobNotFound,
    NameTaken,
    PayloadTooLarge,
    request_pause,
    request_restart,
    request_resume,
    request_stop,
    submit_job,
)

MAX_BODY = 4 * 1024 * 1024
# A control verb's handler: (job id, who asks, deps, reason) -> its command published.
ControlRequest = Callable[[str, Identity, Deps, "str | None"], Awaitable[object]]


class StopRequest(BaseModel):
    reason: str | None = None


class TokenRequest(BaseModel):
    user: str
    admin: bool = False


def _decode_body(raw: bytes, content_type: str, dialect: str | None = None) -> Any:
    try:
        return parse_job(raw, content_type, MAX_BODY, dialect)
    except BodyError as exc:
        raise HTTPException(exc.status, str(exc)) from exc


def create_app(deps: Deps, tokens: TokenStore, db: Any = None) -> FastAPI:
    app = health_app("intake")
    current = identity_dependency(tokens)
    # Credentials are made only for a token the store still holds (not a cached one).
    fresh = identity_dependency(tokens, fresh=True)
    context = IntakeContext(deps=deps, tokens=tokens, current=current, fresh=fresh, db=db)
    trace = tracer("trainyard.intake")

    @app.post(
        "/v1/jobs",
        status_code=202,
        responses=answers(
            SubmitAnswer, 202, e409="job name used by another job", e413="body too large"
        ),
        openapi_extra=JOB_BODY,
    )
    async def post_job(
        request: Request,
        identity: Identity = Depends(current),
        dialect: str | None = Query(None, description="force a dialect instead of detecting it"),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        try:  # before anything is read, or kept on record as a job
            dialect = forced_dialect(dialect)
        except UnknownDialect as exc:
            raise HTTPException(400, str(exc)) from exc
        payload = _decode_body(
            await request.body(), request.headers.get("content-type", ""), dialect
        )
        with trace.start_as_current_span("submit job"):
            try:
                result = await submit_job(
                    payload, identity, deps, dialect=dialect, idempotency_key=idempotency_key
                )
            except UnknownDialect as exc:
                raise HTTPException(400, str(exc)) from exc
            except PayloadTooLarge as exc:
                raise HTTPException(413, str(exc)) from exc
            except NameTaken as exc:
                raise HTTPException(409, f"job name already used: {exc}") from exc
        return JSONResponse(
            status_code=202,
            content={
                "id": result.job_id,
                # Refused at once (its dialect's rules, or a cluster it can never run on):
                # on record, as rejected, with every reason.
                "state": "REJECTED" if result.errors else "SUBMITTED",
                "dialect": result.dialect,
                "warnings": [w.model_dump() for w in result.warnings],
                "errors": [e.model_dump() for e in result.errors],
            },
        )

    # The control verbs: each publishes its command for the job's owner or an admin.
    def control(verb: str, request: ControlRequest) -> None:
        async def post(
            job_id: str, body: StopRequest | None = None, identity: Identity = Depends(current)
        ) -> dict[str, str]:
            with trace.start_as_current_span(f"{verb} job"):
                try:
                    await request(job_id, identity, deps, body.reason if body else None)
                except JobNotFound as exc:
                    raise HTTPException(404, f"no job {job_id}") from exc
            return {"id": job_id, verb: "requested"}

        app.post(
            f"/v1/jobs/{{job_id}}/{verb}",
            status_code=202,
            name=f"{verb}_job",
            responses=answers(ControlAnswer, 202),
        )(post)

    async def resume(job_id: str, identity: Identity, deps: Deps, _reason: str | None) -> None:
        await request_resume(job_id, identity, deps)

    for verb, request in (
        ("stop", request_stop),
        ("pause", request_pause),
        ("resume", resume),
        ("restart", request_restart),
    ):
        control(verb, request)

    @app.post("/v1/tokens", status_code=201)
    async def post_token(body: TokenRequest, identity: Identity = Depends(fresh)) -> dict[str, str]:
        if not identity.admin:
            raise HTTPException(403, "only an admin can issue tokens")
        try:
            token = await tokens.issue(body.user, body.admin)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        return {"user": body.user, "token": token}

    @app.delete("/v1/users/{user}/credentials")
    async def revoke_user(user: str, identity: Identity = Depends(current)) -> dict[str, Any]:
        """Every token and stored AccessKey of ``user`` revoked: those an admin issued
        and those the user made for itself (OpenPAI's application tokens), which a
        revoke of one token leaves working."""
        if not identity.admin:
            raise HTTPException(403, "only an admin can revoke a user's credentials")
        revoked = await tokens.revoke_user(user)
        keys = await AccessKeyStore.beside(tokens).revoke_user(user)
        return {"user": user, "tokens": revoked, "access_keys": keys}

    # The dialects' routes after Trainyard's own: a request is matched against the
    # routes in order, and the dialects' are many (a submission went through intake's app
    # in 168 us of CPU instead of 245, in process). The order changes no answer: every
    # request is answered by the same route either way (tests/unit/test_route_order.py).
    for make_router in ROUTERS:
        app.include_router(make_router(context))
    return app
