"""Status's query API."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse

from trainyard_common.api import (
    ERRORS,
    History,
    JobAsOf,
    JobList,
    JobView,
    Me,
    RebuildReport,
    TaskList,
    answers,
)
from trainyard_common.auth import (
    Identity,
    StillValid,
    TokenStore,
    bearer,
    identity_dependency,
)
from trainyard_common.bus import DeadLetters
from trainyard_common.errors import ReplayIncomplete
from trainyard_common.events import JobState
from trainyard_common.jobspec import JobKind
from trainyard_common.limits import MAX_DIGITS, MAX_OFFSET, MAX_PAGE, in_utc
from trainyard_common.runtime import health_app

from .adapters.feed import RESET, JobFeed
from .adapters.views import COUNT_MOST, JobViews, job_view
from .dead_letters import router as dead_letter_api
from .dialect_api import ROUTERS, StatusContext
from .domain.projection import job_as_of

MAX_NAME = 256
LABEL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
KEEPALIVE_S = 15.0
# A job's page shows its first tasks and a history page its first events; the rest come
# a page at a time (a job may have up to 100,000 tasks, and three events or more each).
TASKS_SHOWN = 1000
MAX_TASKS_PAGE = 5000
EVENTS_SHOWN = 1000
MAX_EVENTS_PAGE = 5000


def list_filters(
    queue: str | None,
    dialect: str | None,
    name: str | None,
    after: datetime | None,
    before: datetime | None,
) -> dict[str, Any]:
    where: dict[str, Any] = {}
    if queue:
        where["queue"] = queue
    if dialect:
        where["dialect"] = dialect
    if name:
        # A prefix, as a range (every store walks it in order).
        where["name"] = {"$gte": name, "$lt": name + "\U0010ffff"}
    for param, op, when in (
        ("submitted_after", "$gte", after),
        ("submitted_before", "$lt", before),
    ):
        if when is not None:
            try:
                where.setdefault("submitted_at", {})[op] = in_utc(when)
            except ValueError as exc:
                raise HTTPException(400, f"{param}: {exc}") from None
    return where


def make_cursor(submitted_at: datetime, job_id: str) -> str:
    raw = json.dumps([submitted_at.isoformat(), job_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_cursor(cursor: str) -> tuple[datetime, str]:
    """A ``next`` cursor back to (submitted_at, id); a 400 naming the field otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, job_id = json.loads(raw)
        when = datetime.fromisoformat(at)
        if not isinstance(job_id, str) or when.tzinfo is None:
            raise ValueError("not a cursor")
        when = in_utc(when)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise HTTPException(
            400, "cursor: not a cursor this API gave (use `next` as it is)"
        ) from exc
    return when, job_id


def task_cursor(task: dict[str, Any]) -> str:
    raw = json.dumps([task["attempt"], task["role"], task["index"]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_task_cursor(cursor: str) -> tuple[int, str, int]:
    """A tasks page's ``next`` back to (attempt, role, index); a 400 otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        attempt, role, index = json.loads(raw)
        if not (type(attempt) is int and isinstance(role, str) and type(index) is int):
            raise ValueError("not a cursor")
        if not (0 <= attempt <= 10**MAX_DIGITS and 0 <= index <= 10**MAX_DIGITS):
            raise ValueError("not a cursor")  # past a store's integers: its 500
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise HTTPException(
            400, "cursor: not a cursor this API gave (use `next` as it is)"
        ) from exc
    return attempt, role, index


async def sse(
    feed: JobFeed,
    identity: Identity,
    request: Request,
    job_id: str | None = None,
    valid: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[bytes]:
    """``valid``: whether the caller's token still holds (StillValid); the feed ends
    once it does not (it went on for as long as the connection lasted)."""
    yield b"retry: 2000\n: connected\n\n"
    async with feed.listen() as queue:
        while not await request.is_disconnected():
            try:
                change = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                change = None
            if valid is not None and not await valid():
                return
            if change is None:
                yield b": keep-alive\n\n"
                continue
            if change is RESET:
                yield b"event: reset\ndata: {}\n\n"
                return
            if not identity.can_see(change.get("user") or ""):
                continue
            if job_id is not None and change["id"] != job_id:
                continue
            body = json.dumps(change, default=_iso)
            yield f"event: job\ndata: {body}\n\n".encode()


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def create_app(
    views: JobViews,
    tokens: TokenStore,
    dead_letters: DeadLetters | None = None,
    feed: JobFeed | None = None,
    rebuild: Callable[[bool], Awaitable[dict[str, Any]]] | None = None,
) -> FastAPI:
    app = health_app("status")
    current = identity_dependency(tokens)
    context = StatusContext(views=views, tokens=tokens, current=current)

    async def visible_job(job_id: str, identity: Identity) -> dict:
        doc = await views.get_job(job_id)
        # Another user's job answers exactly like a missing one.
        if doc is None or doc.get("state") is None or not identity.can_see(doc.get("user", "")):
            raise HTTPException(404, f"no job {job_id}")
        return doc

    @app.get("/v1/jobs", responses=answers(JobList))
    async def list_jobs(
        identity: Identity = Depends(current),
        state: JobState | None = None,
        user: str | None = Query(None, max_length=MAX_NAME),
        queue: str | None = Query(None, max_length=MAX_NAME),
        dialect: str | None = Query(None, max_length=MAX_NAME),
        name: str | None = Query(None, max_length=MAX_NAME, description="names starting so"),
        kind: JobKind | None = None,
        id_prefix: str | None = Query(None, max_length=64, description="ids starting so"),
        label: list[str] = Query(
            [], max_length=20, description="`key=value`: jobs with this label (several: all)"
        ),
        submitted_after: datetime | None = None,
        submitted_before: datetime | None = None,
        order: Literal["newest", "oldest"] = "newest",
        cursor: str | None = Query(
            None, max_length=600, description="`next` of the page before: the page after it"
        ),
        counts: bool = Query(False, description="also count the matching jobs by state"),
        limit: int = Query(20, ge=1, le=500),
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
    ) -> dict:
        if not identity.admin:
            if user and user != identity.user:
                raise HTTPException(403, "only an admin can list other users' jobs")
            user = identity.user
        where = list_filters(queue, dialect, name, submitted_after, submitted_before)
        if kind is not None:
            where["kind"] = kind.value
        for text in label:
            key, sep, value = text.partition("=")
            if not sep or not LABEL_KEY.fullmatch(key):
                raise HTTPException(
                    400,
                    f"label: {text!r} is not key=value with a plain key (a letter or _, then "
                    "letters, digits and _)",
                )
            where[f"labels.{key}"] = value
        if id_prefix:
            where["_id"] = {"$gte": id_prefix, "$lt": id_prefix + "\U0010ffff"}
        after = read_cursor(cursor) if cursor else None
        skip = 0 if after else offset
        items, _ = await views.list_jobs(
            user=user,
            state=state.value if state else None,
            limit=limit,
            offset=skip,
            where=where,
            after=after,
            oldest_first=order == "oldest",
            count=False,
        )
        # Counted up to a bound, and for a bounded time: past either, "at least".
        counted = await views.count_jobs(
            user=user, state=state.value if state else None, where=where, most=COUNT_MOST
        )
        at_least = skip + len(items)
        if counted is None:  # the time ran out: what this page shows is known
            total, exact = at_least, False
        elif counted > COUNT_MOST:
            total, exact = max(COUNT_MOST, at_least), False
        else:
            total, exact = max(counted, at_least), True
        answer: dict[str, Any] = {
            "items": items,
            "total": total,
            "total_exact": exact,
            "limit": limit,
            "offset": offset,
        }
        last = items[-1] if len(items) == limit else None
        answer["next"] = make_cursor(last["submitted_at"], last["id"]) if last else None
        if counts:
            answer["counts"], answer["counts_exact"] = await views.count_states_within(
                {**where, **({"user": user} if user else {})}
            )
        return answer

    @app.get(
        "/v1/watch/jobs",
        responses={
            200: {
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
                "description": "events `job` (data: a JobSummary with its feed_seq) and `reset`",
            },
            **ERRORS,
        },
    )
    async def watch_jobs(
        request: Request,
        identity: Identity = Depends(current),
        job_id: str | None = Query(None, max_length=MAX_NAME, description="only this job"),
    ) -> Response:
        """Server-sent events: ``job`` with a job's summary each time its view changes
        (the caller's jobs, every job for an admin, or only ``job_id``), ``reset`` when
        the caller fell too far behind to follow (read again), a comment every 15 s."""
        if feed is None:
            raise HTTPException(503, "the live feed is not running here")
        return StreamingResponse(
            sse(feed, identity, request, job_id, StillValid(tokens, bearer(request))),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/admin/rebuild", responses=answers(RebuildReport))
    async def rebuild_views(
        identity: Identity = Depends(current),
        apply: bool = Query(False, description="write what the stream says over the views"),
    ) -> dict[str, Any]:
        """Read the whole stream again into fresh views and compare them with the live
        ones (an admin's check after an upgrade or a repair); ``apply`` repairs."""
        if not identity.admin:
            raise HTTPException(403, "only an admin can rebuild the views")
        if rebuild is None:
            raise HTTPException(503, "rebuilding is not available here")
        try:
            return await rebuild(apply)
        except ReplayIncomplete as exc:
            # Taken for the whole, the part read would delete or roll back live views.
            raise HTTPException(503, f"{exc}: nothing was compared or repaired; try again") from exc

    @app.get("/v1/me", responses=answers(Me))
    async def me(identity: Identity = Depends(current)) -> dict[str, Any]:
        """Who the token is (the console's sign-in)."""
        return {"user": identity.user, "admin": identity.admin}

    @app.get("/v1/jobs/{job_id}", responses=answers(JobView))
    async def get_job(job_id: str, identity: Identity = Depends(current)) -> dict:
        """The job with its tasks, up to 1,000: all of them where they fit, else its
        current attempt's first (``tasks_next``: the rest of that attempt's, from ``GET
        /v1/jobs/{id}/tasks``; an earlier attempt's with ``?attempt=``)."""
        doc = await visible_job(job_id, identity)
        tasks = await views.job_tasks(job_id, limit=TASKS_SHOWN + 1)
        if len(tasks) > TASKS_SHOWN and doc.get("attempt"):
            # Found in review: the first 1,000 by attempt were the earliest attempts',
            # and a job on its fifth attempt of 250 tasks showed none of the fifth.
            tasks = await views.job_tasks(
                job_id, limit=TASKS_SHOWN + 1, attempt=int(doc["attempt"])
            )
        view = job_view(doc, tasks[:TASKS_SHOWN])
        view["tasks_next"] = (
            task_cursor(tasks[TASKS_SHOWN - 1]) if len(tasks) > TASKS_SHOWN else None
        )
        return view

    @app.get("/v1/jobs/{job_id}/tasks", responses=answers(TaskList))
    async def get_tasks(
        job_id: str,
        identity: Identity = Depends(current),
        attempt: int | None = Query(None, ge=1, le=MAX_PAGE, description="this attempt's only"),
        cursor: str | None = Query(
            None,
            max_length=600,
            description="`next` of the page before (or the job's `tasks_next`): the page after it",
        ),
        limit: int = Query(TASKS_SHOWN, ge=1, le=MAX_TASKS_PAGE),
    ) -> dict[str, Any]:
        """A page of the job's tasks, by attempt, role and index (a job may have up to
        100,000)."""
        await visible_job(job_id, identity)
        after = read_task_cursor(cursor) if cursor else None
        tasks = await views.job_tasks(job_id, limit=limit + 1, after=after, attempt=attempt)
        more = len(tasks) > limit
        return {"items": tasks[:limit], "next": task_cursor(tasks[limit - 1]) if more else None}

    @app.get("/v1/jobs/{job_id}/state", responses=answers(JobAsOf))
    async def get_state_at(
        job_id: str,
        at: datetime = Query(description="the moment (ISO 8601; no zone: UTC)"),
        identity: Identity = Depends(current),
    ) -> dict[str, Any]:
        """The job as it was at ``at``: its history up to then, projected again."""
        await visible_job(job_id, identity)
        try:
            when = in_utc(at)
        except ValueError as exc:
            raise HTTPException(400, f"at: {exc}") from None
        view = job_as_of(await views.events_of(job_id), when)
        if view is None:
            raise HTTPException(404, f"at: job {job_id} had not been submitted at {when}")
        return {
            "id": job_id,
            "at": when,
            "state": view.get("state"),
            "attempt": view.get("attempt", 1),
            "reason": view.get("reason"),
            "queue_reasons": view.get("queue_reasons", []),
            "queue_position": view.get("queue_position"),
            "updated_at": view.get("updated_at"),
        }

    @app.get("/v1/jobs/{job_id}/events", responses=answers(History))
    async def get_events(
        job_id: str,
        identity: Identity = Depends(current),
        after_seq: int = Query(
            0,
            ge=0,
            le=10**MAX_DIGITS,  # a stream sequence; past a store's integers, a 500
            description="only the events after this stream sequence (the "
            "`next_after_seq` of the page before)",
        ),
        limit: int = Query(EVENTS_SHOWN, ge=1, le=MAX_EVENTS_PAGE),
    ) -> dict:
        """The job's history in stream order, a page of at most ``limit`` events (a job
        of many tasks has three or more a task)."""
        await visible_job(job_id, identity)
        items = await views.history(job_id, after_seq=after_seq, limit=limit + 1)
        more = len(items) > limit
        return {"items": items[:limit], "next_after_seq": items[limit - 1]["seq"] if more else None}

    # The dialects' routes after Trainyard's own, as in intake's app: matched in order,
    # the dialects' are many, and every request is answered by the same route either way
    # (tests/unit/test_route_order.py).
    for make_router in ROUTERS:
        app.include_router(make_router(context))
    if dead_letters is not None:
        app.include_router(dead_letter_api(dead_letters, current))
    return app
