"""Intake's and status's apps put the dialects' routes after Trainyard's own (a request
is matched against an app's routes in turn, and the dialects' are many). Checked here:
for every method and every path of any route's shape, and of any two routes' common
shape, the route that answers (the first full match, else the first that matches the
path but not the method: the 405) is the same with the dialects' routers first, as
they were, and after."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute, Match

from trainyard_common.auth import TokenStore
from trainyard_common.bus import DeadLetters
from trainyard_common.docstore import SqliteClient
from trainyard_common.runtime import health_app
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.app import create_app as intake_app
from trainyard_intake.handlers import Deps
from trainyard_status.adapters.views import JobViews
from trainyard_status.app import create_app as status_app

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def is_router(route: BaseRoute) -> bool:
    """An included router kept as one (FastAPI 0.16x); older versions flatten them."""
    return getattr(route, "original_router", None) is not None


def templates(items: Iterable[Any], prefix: str = "") -> Iterator[str]:
    for route in items:
        if is_router(route):
            yield from templates(
                route.original_router.routes, prefix + route.include_context.prefix
            )
        elif isinstance(getattr(route, "path", None), str):
            yield prefix + route.path


def samples(paths: Iterable[str]) -> set[str]:
    """A path of each template's shape ("x" for each parameter) and of each pair's
    common shape (a literal where either has one), with and without a final slash."""
    shapes = [p.strip("/").split("/") for p in set(paths)]
    found: set[str] = set()
    for a, b in itertools.product(shapes, repeat=2):
        if len(a) != len(b):
            continue
        merged = []
        for x, y in zip(a, b, strict=True):
            literal = [s for s in (x, y) if "{" not in s]
            if len(set(literal)) > 1:
                break
            merged.append(literal[0] if literal else "x")
        else:
            path = "/" + "/".join(merged)
            found.update({path, path.rstrip("/") + "/"})
    return found


def answering(routes: Sequence[BaseRoute], method: str, path: str) -> BaseRoute | None:
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route
        if match is Match.PARTIAL and partial is None:
            partial = route
    return partial


def differences(app: FastAPI) -> list[tuple[str, str]]:
    """Requests answered by another route had the dialects' routers come right after
    the routes every service's app starts with (health, metrics, the API's own docs),
    as they did."""
    now = list(app.router.routes)
    first = {getattr(r, "path", None) for r in health_app("probe").router.routes}
    own = [r for r in now if not is_router(r)]
    before = (
        [r for r in own if getattr(r, "path", None) in first]
        + [r for r in now if is_router(r)]
        + [r for r in own if getattr(r, "path", None) not in first]
    )
    paths = samples(templates(now))
    return [
        (method, path)
        for path in sorted(paths)
        for method in METHODS
        if answering(now, method, path) is not answering(before, method, path)
    ]


async def publish(event: object) -> int:
    return 1


def test_the_dialects_routes_last_change_no_answer(tmp_path: Path) -> None:
    tokens = TokenStore(None, "order-admin")
    intake = intake_app(Deps(publish=publish, owners=InMemoryOwnerRegistry()), tokens)
    letters = DeadLetters(SimpleNamespace(js=None))  # type: ignore[arg-type]
    status = status_app(JobViews(SqliteClient(tmp_path)["status"]), tokens, letters)
    for app in (intake, status):
        routers = [r for r in app.router.routes if is_router(r)]
        own = [r for r in app.router.routes if not is_router(r)]
        # The order this is about: every router after every route of the app's own.
        assert routers and app.router.routes[-len(routers) :] == routers, app.title
        assert any(getattr(r, "path", None) == "/v1/jobs" for r in own), app.title
        found = list(templates(app.router.routes))
        assert len(found) > 30, app.title  # the dialects' too
        # A parameter of one whole segment each, which "x" stands for (a converter such
        # as {path:path} or a segment like {name}:cancel would need other samples).
        assert all(re.fullmatch(r"(/([^{}/:]+|\{[a-z_]+\}))*/?", t) for t in found), found
        assert differences(app) == [], app.title


def test_a_dialects_route_that_would_answer_otherwise_is_found() -> None:
    app = FastAPI()

    @app.post("/v1/jobs/{job_id}/stop")
    async def stop(job_id: str) -> None: ...

    @app.get("/v1/me")
    async def me() -> None: ...

    dialect = APIRouter()

    @dialect.post("/v1/{kind}/now/stop")
    async def act(kind: str) -> None: ...

    @dialect.post("/v1/me")
    async def change_me() -> None: ...

    app.include_router(dialect)
    # Another endpoint for a path both match; another route's 405 for a method neither has.
    assert ("POST", "/v1/jobs/now/stop") in differences(app)
    assert ("PUT", "/v1/me") in differences(app)
    assert ("POST", "/v1/me") not in differences(app)
