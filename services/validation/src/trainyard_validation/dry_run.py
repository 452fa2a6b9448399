"""``POST /v1/jobs:validate``: the same checks a submission gets, without submitting.

Returns the canonical job as it would be accepted (secrets hidden) and every error and
warning with its JSON path. The name check only reads the registry: a dry run claims
nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from trainyard_common.api import JOB_BODY, ValidationAnswer, answers
from trainyard_common.auth import Identity
from trainyard_common.cluster import ClusterSpec
from trainyard_common.dialects import (
    UnknownDialect,
    detect,
    forced_dialect,
    parse_job,
    translate,
)
from trainyard_common.events import JobAccepted, JobSubmitted
from trainyard_common.parsing import BodyError

from .adapters.names import NameRegistry
from .domain.rules import decide, name_taken


def router(cluster: Callable[[], ClusterSpec], names: NameRegistry, current: Any) -> APIRouter:
    """The dry run, against the cluster as it is at each request (``cluster()``)."""
    api = APIRouter()

    @api.post("/v1/jobs:validate", responses=answers(ValidationAnswer), openapi_extra=JOB_BODY)
    async def validate(
        request: Request,
        identity: Identity = Depends(current),
        dialect: str | None = Query(None, description="force a dialect instead of detecting it"),
    ) -> dict[str, Any]:
        try:  # before anything is read, or kept on record as a job
            dialect = forced_dialect(dialect)
        except UnknownDialect as exc:
            raise HTTPException(400, str(exc)) from exc
        try:
            payload = parse_job(
                await request.body(), request.headers.get("content-type", ""), dialect=dialect
            )
        except BodyError as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        try:
            chosen = dialect or detect(payload)
        except UnknownDialect as exc:
            raise HTTPException(400, str(exc)) from exc
        translation = translate(payload, dialect=chosen, user=identity.user)
        submitted = JobSubmitted(
            job_id="dry-run",
            spec=translation.spec,
            dialect=translation.dialect,
            dialect_key=translation.key,
            original=payload if isinstance(payload, dict) else None,
            translation_errors=translation.errors,
            warnings=translation.warnings,
        )
        result = decide(submitted, cluster())
        if isinstance(result, JobAccepted) and translation.key is not None:
            holder = await names.holder(identity.user, translation.key)
            if holder is not None:
                result = name_taken(submitted)
        accepted = isinstance(result, JobAccepted)
        spec = result.spec if isinstance(result, JobAccepted) else translation.spec
        return {
            "valid": accepted,
            "dialect": translation.dialect,
            "spec": json.loads(spec.redacted().model_dump_json()),
            "errors": []
            if isinstance(result, JobAccepted)
            else [e.model_dump() for e in result.errors],
            "warnings": [
                w.model_dump()
                for w in (
                    result.warnings if isinstance(result, JobAccepted) else translation.warnings
                )
            ],
        }

    return api
