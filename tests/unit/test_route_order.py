"""Intake's and status's apps put the dialects' routes after Trainyard's own (a request
is matched against the routes in order, and the dialects' are many). That reorder is
only safe while no request could be matched by a route of both: checked here on every
pair, by each route's own pattern against a path of the other's shape."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import compile_path

from trainyard_common.auth import TokenStore, identity_dependency
from trainyard_common.docstore import SqliteClient
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.app import create_app as intake_app
from trainyard_intake.dialect_api import ROUTERS as INTAKE_ROUTERS
from trainyard_intake.dialect_api import IntakeContext
from trainyard_intake.handlers import Deps
from trainyard_status.adapters.views import JobViews
from trainyard_status.app import create_app as status_app
from trainyard_status.dialect_api import ROUTERS as STATUS_ROUTERS
from trainyard_status.dialect_api import StatusContext

ALL = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
Route = tuple[str, frozenset[str], re.Pattern[str]]  # a path of its shape, methods, pattern


def routes(items: Iterable[Any], prefix: str = "") -> Iterator[Route]:
    """Every route with a path pattern, through included routers (FastAPI keeps them as
    routers of their own since 0.16x) and their prefixes."""
    for route in items:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from routes(inner.routes, prefix + route.include_context.prefix)
            continue
        if hasattr(route, "path_regex"):
            path = prefix + route.path
            pattern = compile_path(path)[0]
            yield re.sub(r"\{[^}]+\}", "x", path), frozenset(route.methods or ALL), pattern


def own_routes(app: FastAPI) -> list[Route]:
    return list(routes(r for r in app.router.routes if not hasattr(r, "original_router")))


def collisions(own: list[Route], dialects: list[Route]) -> list[tuple[str, str]]:
    return [
        (mine, theirs)
        for mine, my_methods, my_pattern in own
        for theirs, their_methods, their_pattern in dialects
        if my_methods & their_methods and (my_pattern.match(theirs) or their_pattern.match(mine))
    ]


async def publish(event: object) -> int:
    return 1


def test_no_request_is_served_by_a_trainyard_route_and_a_dialects_route(tmp_path: Path) -> None:
    tokens = TokenStore(None, "order-admin")
    current = identity_dependency(tokens)
    deps = Deps(publish=publish, owners=InMemoryOwnerRegistry())
    intake = intake_app(deps, tokens)
    intake_context = IntakeContext(deps=deps, tokens=tokens, current=current, db=None)
    views = JobViews(SqliteClient(tmp_path)["status"])
    status = status_app(views, tokens)
    status_context = StatusContext(views=views, tokens=tokens, current=current)
    for app, dialect_routes in (
        (intake, [r for make in INTAKE_ROUTERS for r in routes(make(intake_context).routes)]),
        (status, [r for make in STATUS_ROUTERS for r in routes(make(status_context).routes)]),
    ):
        own = own_routes(app)
        assert any(path == "/v1/jobs" for path, _, _ in own), own  # the app's own are there
        assert len(dialect_routes) > 10, dialect_routes
        assert collisions(own, dialect_routes) == []


def test_a_dialect_route_shadowing_one_of_trainyards_is_found() -> None:
    # The check above can fail: a dialect router with a route of the same shape.
    app = FastAPI()

    @app.post("/v1/jobs/{job_id}/stop")
    async def stop(job_id: str) -> None: ...

    other = APIRouter()

    @other.post("/v1/jobs/{name}/{action}")
    async def act(name: str, action: str) -> None: ...

    @other.get("/v1/jobs/{name}/stop")
    async def read(name: str) -> None: ...

    assert collisions(own_routes(app), list(routes(other.routes))) == [
        ("/v1/jobs/x/stop", "/v1/jobs/x/x")
    ]
