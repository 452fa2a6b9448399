"""Status's query API."""

from __future__ import annotations

from fastapi import Depends, FastAPI, HTTPException, Query

from trainyard_common.auth import Identity, TokenStore, identity_dependency
from trainyard_common.bus import DeadLetters
from trainyard_common.events import JobState
from trainyard_common.limits import MAX_OFFSET
from trainyard_common.runtime import health_app

from .adapters.views import JobViews, job_view
from .dead_letters import router as dead_letter_api
from .dialect_api import ROUTERS, StatusContext


def create_app(
    views: JobViews, tokens: TokenStore, dead_letters: DeadLetters | None = None
) -> FastAPI:
    app = health_app("status")
    current = identity_dependency(tokens)
    context = StatusContext(views=views, tokens=tokens, current=current)
    for make_router in ROUTERS:
        app.include_router(make_router(context))
    if dead_letters is not None:
        app.include_router(dead_letter_api(dead_letters, current))

    async def visible_job(job_id: str, identity: Identity) -> dict:
        doc = await views.get_job(job_id)
        # Another user's job answers exactly like a missing one.
        if doc is None or doc.get("state") is None or not identity.can_see(doc.get("user", "")):
            raise HTTPException(404, f"no job {job_id}")
        return doc

    @app.get("/v1/jobs")
    async def list_jobs(
        identity: Identity = Depends(current),
        state: JobState | None = None,
        user: str | None = None,
        limit: int = Query(20, ge=1, le=500),
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
    ) -> dict:
        if not identity.admin:
            if user and user != identity.user:
                raise HTTPException(403, "only an admin can list other users' jobs")
            user = identity.user
        items, total = await views.list_jobs(
            user=user, state=state.value if state else None, limit=limit, offset=offset
        )
        return {"items": items, "total": total, "limit": limit, "offset": offset}

    @app.get("/v1/jobs/{job_id}")
    async def get_job(job_id: str, identity: Identity = Depends(current)) -> dict:
        doc = await visible_job(job_id, identity)
        return job_view(doc, await views.job_tasks(job_id))

    @app.get("/v1/jobs/{job_id}/events")
    async def get_events(job_id: str, identity: Identity = Depends(current)) -> dict:
        await visible_job(job_id, identity)
        return {"items": await views.history(job_id)}

    return app
