"""Running a service process: its HTTP app (health and API) and its bus consumers under
one event loop, stopped together on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import uvicorn
import uvloop
from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import Settings
from .errors import BusUnavailable
from .metrics import HttpMetrics, exposition
from .parsing import MAX_BODY, BodyError, parse_json
from .telemetry import instrument_app, log_formatter, without_tokens

Worker = Callable[[asyncio.Event], Coroutine[Any, Any, None]]

log = logging.getLogger("trainyard.runtime")


def setup_logging(service: str) -> None:
    """Log lines as JSON (job and trace ids on each) or text: ``YARD_LOG_FORMAT``."""
    level = os.environ.get("YARD_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler()
    handler.setFormatter(log_formatter(service))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def run_service(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service's ``main`` on uvloop (a dependency of the platform: with it and
    httptools, which uvicorn then picks, every hop of a job costs less CPU)."""
    uvloop.run(main())


@dataclass(frozen=True)
class TlsListener:
    """A second listener of the same app, over HTTPS (the gateway's Kubernetes API)."""

    port: int
    cert: str
    key: str


# How long an idle keep-alive connection stays open. Longer than the idle expiry of the
# clients that call the platform (httpx and Node's agents 4-5 s, Go's net/http 90 s), so
# the client, not the server, closes an idle connection: at uvicorn's 5 s a client's 5 s
# pool expiry raced the server's close, and a request sent on the connection as it
# closed got "Server disconnected without sending a response" and was never handled
# (the likely cause of two stops lost in an hour of bench/soak.py; none in the hour
# after this change).
KEEP_ALIVE_S = 100


def server_config(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> uvicorn.Config:
    """The HTTP server of every service (and, with a certificate, the gateway's HTTPS
    listener)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )


async def serve(
    settings: Settings, app: FastAPI, workers: Sequence[Worker], tls: TlsListener | None = None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    config = server_config(app, settings.host, settings.port)
    # uvicorn captures SIGTERM and SIGINT itself while it serves: its serve() then
    # returns, which ends the wait below like ``stop`` does, and it re-raises the signal
    # to the handlers above once it is done.
    server = uvicorn.Server(config)
    servers = [server]
    if tls is not None:
        servers.append(
            uvicorn.Server(
                server_config(
                    app, settings.host, tls.port, ssl_certfile=tls.cert, ssl_keyfile=tls.key
                )
            )
        )

    # What the service made to start (its modules, its app: some hundreds of thousands
    # of objects that live as long as it does) set aside from the cyclic collector.
    # Each full collection walked all of them, 40-240 ms on this machine, every few
    # seconds under load, with the event loop stopped: every request in flight waited
    # (bench/README.md, the submissions' p99). What the service makes from now on is
    # collected as ever.
    gc.collect()
    gc.freeze()
    tasks: list[asyncio.Task[None]] = [
        asyncio.create_task(worker(stop), name=getattr(worker, "__name__", "worker"))
        for worker in workers
    ]
    https = [asyncio.create_task(s.serve(), name=f"http:{s.config.port}") for s in servers]
    stopper = asyncio.create_task(stop.wait(), name="stop")
    done, _ = await asyncio.wait([*tasks, *https, stopper], return_when=asyncio.FIRST_COMPLETED)
    failed = [t for t in done if t is not stopper and t.exception() is not None]
    for task in failed:
        log.error("%s stopped: %r", task.get_name(), task.exception())
    stop.set()
    for each in servers:
        each.should_exit = True
    await asyncio.gather(*tasks, *https, return_exceptions=True)
    if failed:
        raise SystemExit(1)


# Trainyard's own API (not a dialect's, whose routes read and answer in their own shapes).
OWN_PATHS = ("/v1/",)
JSON_TYPES = ("application/json", "+json")


class AnswerErrors:
    """An exception no route handled is logged with its traceback and answered 500 on a
    connection that stays open. Left to Starlette, the 500 is sent and the exception
    raised on to the server, which then closes the connection: a client that had pooled
    it meanwhile (the gateway) failed its next request there, another user's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if started:
                raise  # half an answer: only closing the connection ends it
            log.exception(
                "%s %s failed", scope.get("method"), without_tokens(str(scope.get("path")))
            )
            await _refuse(send, 500, "internal error (logged by the service)")


# Said by a replica that follows another (placement's: one leads) with its 503: it did
# nothing, and the gateway tries the request on the next replica.
FOLLOWER_HEADER = "Trainyard-Follower"

# No request body is read past this, whatever its route (413): the dialects' routes
# bound their own bodies (4 MiB, TI's 1) and answer past that in their platform's shape,
# but read them whole first; the gateway forwards bodies whole. A request of gigabytes,
# no token needed, was held in memory whole.
MAX_REQUEST = 2 * MAX_BODY


class InputGuard:
    """Bad input is a 4xx that names the problem, before any route runs: a NUL in the
    path or query (no file, key or id has one), a path that is not UTF-8, any body past
    MAX_REQUEST (413), and, on Trainyard's own API, a JSON body too large (413), too
    deep, with NaN or an overflowing number, a lone surrogate, or not UTF-8 (400). The
    dialects' routes bound their own bodies (parsing.py) and answer in their platform's
    error shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _path_problem(scope)
        if problem is not None:
            await _refuse(send, 400, problem)
            return
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        path = scope.get("path", "")
        own_json = path.startswith(OWN_PATHS) and any(t in content_type for t in JSON_TYPES)
        limit = MAX_BODY if own_json else MAX_REQUEST
        declared = headers.get(b"content-length", b"").decode("latin-1")
        # (Its length first: int() refuses past 4300 digits.)
        if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            await _refuse(send, 413, f"request body larger than {limit} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _refuse(send, 413, f"request body larger than {limit} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body and own_json:
            try:
                parse_json(body, MAX_BODY)
            except BodyError as exc:
                await _refuse(send, exc.status, str(exc))
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _path_problem(scope: Scope) -> str | None:
    raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogatepass")
    query = scope.get("query_string") or b""
    for where, raw in (("path", raw_path), ("query", query)):
        decoded = unquote_to_bytes(raw)
        if b"\x00" in decoded:
            return f"the request {where} contains a NUL byte"
        try:
            text = decoded.decode("utf-8")
        except UnicodeDecodeError:
            return f"the request {where} is not UTF-8 once decoded"
        if where == "path" and any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
            return "the request path contains a control character"
    try:
        scope.get("path", "").encode("utf-8")
    except UnicodeEncodeError:
        return "the request path holds a lone surrogate"
    return None


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# Paths whose clients (OpenPAI's SDKs, its web portal) read OpenPAI's error shape,
# {"code", "message"} with its rest-server's codes, not FastAPI's {"detail"}.
OPENPAI_PATHS = ("/api/v2/", "/api/v1/user/")
OPENPAI_CODES = {
    400: "InvalidParametersError",
    401: "UnauthorizedUserError",
    403: "ForbiddenUserError",
    404: "NoApiError",  # only a path nothing serves comes here: the routes answer their own
    413: "RequestEntityTooLarge",
}


def openpai_error(
    path: str, status: int, detail: Any, url: str | None = None, *, openpai: bool = False
) -> JSONResponse | None:
    """FastAPI's own answer (an unknown path, a bad query parameter, no token) in
    OpenPAI's shape, on OpenPAI's paths (or any, with ``openpai``: under its
    /rest-server); None elsewhere. ``url``: the path and query as the client sent them
    (still percent-encoded)."""
    if not openpai and not path.startswith(OPENPAI_PATHS):
        return None
    if (status == 404 and detail == "Not Found") or status == 405:
        # The rest-server's catch-all (config/express.js) names its req.url, the URL as
        # sent, query and all; a method a path does not take falls through to it too.
        status, detail = 404, f"API {url or path} is not found."
    message = detail if isinstance(detail, str) else json.dumps(detail)
    code = OPENPAI_CODES.get(status, "UnknownError")
    return JSONResponse({"code": code, "message": message}, status_code=status)


def sent_url(scope: Scope) -> str:
    """The request's path and query as the client sent them, still percent-encoded."""
    raw = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
    query = scope.get("query_string") or b""
    return raw.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")


NO_NATIVE_TELEMETRY: TelemetryConfig = {
    "tracing": False, "metrics": False, "logs": False, "operation_spans": False,
}  # fmt: skip


def health_app(service: str, title: str | None = None) -> FastAPI:
    # FastAPI's own telemetry (0.142 on) traces every request, with spans for its
    # dependencies, endpoint and serialisation, whenever a tracer provider is set, and
    # every service sets one, exporting or not (trace ids go into each job's history):
    # two thirds of a plain request's CPU for spans that go nowhere. Server spans come
    # from instrument_app, and only while spans leave the process; metrics from
    # HttpMetrics.
    app = FastAPI(title=title or f"trainyard-{service}", telemetry=NO_NATIVE_TELEMETRY)
    app.add_middleware(AnswerErrors)
    app.add_middleware(InputGuard)
    # Outermost: what InputGuard refuses is counted too.
    app.add_middleware(HttpMetrics)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"service": service, "status": "ok"}

    instrument_app(app)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer puts the input in the error, and a body that is not UTF-8
        # (b"\x80" sent as YAML to a route that takes JSON) then failed to encode: a 500.
        errors = jsonable_encoder(
            exc.errors(), custom_encoder={bytes: lambda b: b.decode("utf-8", "replace")}
        )
        where = ".".join(str(part) for part in errors[0]["loc"][1:]) if errors else ""
        if shaped := openpai_error(
            request.url.path, 400, f"{where}: {errors[0]['msg']}" if errors else "invalid"
        ):
            return shaped
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        sent = sent_url(request.scope)
        if shaped := openpai_error(request.url.path, exc.status_code, exc.detail, sent):
            if exc.headers and shaped.status_code == exc.status_code:
                shaped.headers.update(exc.headers)
            return shaped
        return await http_exception_handler(request, exc)

    @app.exception_handler(BusUnavailable)
    async def bus_unavailable(_request: Request, exc: BusUnavailable) -> JSONResponse:
        # Down or restarting, or the ack was lost: the client sends it again (a job with
        # the same idempotency key, an event with the same id, is stored once).
        log.warning("answered 503: %s", exc)
        return JSONResponse(
            {"detail": "the event bus is unavailable; try again"},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """This process's metrics for Prometheus (docs/observability.md); no token, like
        any scrape target: no label holds a user, job or secret."""
        body, content_type = exposition()
        return Response(body, media_type=content_type)

    return app
