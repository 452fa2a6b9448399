"""The gateway: one base URL in front of the separate services. It forwards requests
as they are (authentication stays with each service) and sends the answers back: whole
where the service said their length (up to 1 MiB), else streamed as they come, so a
followed log flows through it live."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send
from yarl import URL

from trainyard_common.runtime import FOLLOWER_HEADER, health_app, openpai_error, sent_url
from trainyard_common.tencent_auth import TencentError, error_answer, new_request_id

from .routes import BACKENDS, rest_server_path, route

# Hop-by-hop headers are the connection's, not the message's (RFC 9110 §7.6.1).
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "host",
    "content-length",
}


# What of a service's answer the gateway does not pass on: its own server writes these.
NOT_RELAYED = HOP_BY_HOP | {"date", "server"}
# The methods forwarded to the services (HEAD and OPTIONS are refused with a 405).
FORWARDED = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def create_app(backends: dict[str, tuple[str, ...]]) -> FastAPI:
    app = health_app("gateway")
    # A service run as several replicas gets the requests in turn.
    turns = {name: itertools.cycle(urls) for name, urls in backends.items()}
    # aiohttp, not httpx: httpx's pool polled every pooled connection on every request,
    # and that was half the gateway's CPU at 16 clients (bench/README.md). Made on the
    # first request, inside the running loop. Bodies go through as they are.
    sessions: list[aiohttp.ClientSession] = []

    def session() -> aiohttp.ClientSession:
        if not sessions:
            sessions.append(
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=30.0),
                    connector=aiohttp.TCPConnector(limit=0),
                    auto_decompress=False,
                    # Only the client's own headers: some are signed (DLC's ROA signatures
                    # cover Content-Type, Accept, ...), and none may be made up on the way.
                    skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                )
            )
        return sessions[0]

    # Answered without a token (a load balancer's probe): each service's state and which
    # replica is wrong, never where the services are (their addresses are the inside's).
    @app.get("/healthz/all")
    async def health_all() -> JSONResponse:
        async def check(name: str) -> tuple[str, str]:
            for replica, url in enumerate(backends[name], 1):
                try:
                    async with session().get(
                        f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=2.0)
                    ) as answer:
                        if answer.status != 200:
                            return name, f"replica {replica}: http {answer.status}"
                except (aiohttp.ClientError, TimeoutError):
                    return name, f"replica {replica}: down"
            return name, "ok"

        results = dict(await asyncio.gather(*(check(n) for n in BACKENDS if n in backends)))
        healthy = all(v == "ok" for v in results.values())
        return JSONResponse({"gateway": "ok", **results}, status_code=200 if healthy else 503)

    # The web console: static files from this package, at the base URL.
    @app.get("/", include_in_schema=False)
    @app.get("/console", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=302)

    app.mount("/console", Console(directory=CONSOLE, html=True), name="console")

    async def forward(request: Request) -> Response:
        path = request.url.path
        # The path as the client sent it (still percent-encoded): decoded, it may not
        # even be a URL any more.
        raw_path = (request.scope.get("raw_path") or path.encode()).decode("latin-1")
        if (inner := rest_server_path(path)) is not None:
            path, raw_path = inner, rest_server_path(raw_path) or inner
        service = route(request.method, path, request.headers.get("x-tc-action"))
        if service is None and request.method == "POST" and request.url.path == "/":
            # A Tencent Cloud API action Trainyard does not serve, in that API's shape.
            action = request.headers.get("x-tc-action") or "(none)"
            return error_answer(
                TencentError("InvalidAction", f"the action {action} is not served here"),
                new_request_id(),
            )
        if service is None or service not in backends:
            sent = sent_url(request.scope)
            if shaped := openpai_error(path, 404, "Not Found", sent, openpai=inner is not None):
                return shaped  # OpenPAI's catch-all: any method, any path it does not serve
            return JSONResponse(
                {"detail": f"no route for {request.method} {request.url.path}"}, 404
            )
        query = request.scope.get("query_string", b"").decode("latin-1")
        target = raw_path + (f"?{query}" if query else "")
        try:
            URL(target, encoded=True)
        except ValueError as exc:
            return JSONResponse({"detail": f"not a URL to forward: {exc}"}, 400)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        # The Host the client used, for signatures that cover it (Alibaba Cloud's ACS3).
        headers["x-forwarded-host"] = request.headers.get("host", "")
        body = await request.body()
        retry = idempotent(request.method, headers)
        # A replica that follows (placement's: one leads) did nothing but say so: the
        # request goes on to the next, each replica once.
        followers = len(backends[service]) - 1
        tries_left = 1
        while True:
            # A second try goes to the next replica, if there is one.
            url = URL(next(turns[service]) + target, encoded=True)
            try:
                answer = await session().request(
                    request.method, url, headers=headers, data=body or None, allow_redirects=False
                )
            except DROPPED as exc:
                # No connection (a replica gone: nothing was sent, any request may go to
                # another), or a pooled one the service had closed (it answered a bad
                # request and hung up, or restarted; only a request that may be repeated
                # goes once more, on a fresh one).
                if tries_left and (retry or isinstance(exc, aiohttp.ClientConnectorError)):
                    tries_left -= 1
                    continue
                return unavailable(service, exc)
            except (aiohttp.ClientError, ValueError) as exc:
                return unavailable(service, exc)
            if answer.status == 503 and FOLLOWER_HEADER in answer.headers and followers:
                followers -= 1
                answer.release()
                continue
            break
        length = answer.content_length
        response: Response
        if length is None or length > WHOLE_ANSWER_BYTES:
            response = StreamingResponse(relay(answer), status_code=answer.status)
        else:
            # An answer of a known, small size goes back whole: streamed, each one cost a
            # task group and a disconnect listener (the gateway's CPU in the held bench
            # fell by a fifth without them, bench/README.md).
            try:
                whole = await answer.read()
            except (aiohttp.ClientError, ValueError) as exc:
                answer.close()
                return unavailable(service, exc)
            answer.release()
            response = Response(whole, status_code=answer.status)
        # The service's headers as it sent them, repeated ones too (two Set-Cookie stay
        # two); the length, where there is one, is the response's own, and so are the
        # Date and Server the gateway's server adds (relayed, an answer had two of each).
        response.raw_headers.extend(
            (name.lower(), value)
            for name, value in answer.raw_headers
            if name.decode("latin-1").lower() not in NOT_RELAYED
        )
        return response

    # A plain Starlette route, not FastAPI's: every request that passes through the
    # gateway went through FastAPI's dependency solving and response checks for a
    # handler that takes the request as it is (a fifth of the gateway's CPU, py-spy).
    forwarding = Route("/{path:path}", forward, methods=FORWARDED, include_in_schema=False)
    forwarding.methods = set(FORWARDED)  # Starlette adds HEAD to a GET route: refused, as before
    app.router.routes.append(forwarding)
    return app


CONSOLE = Path(__file__).parent / "console"
# The console's pages run only their own script and talk only to this origin; nothing
# from a job (names, logs, specs) can become markup there (app.js writes text only).
CONSOLE_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


class Console(StaticFiles):
    """The console's files, with the headers that keep its pages to themselves."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *CONSOLE_HEADERS]
            await send(message)

        await super().__call__(scope, receive, with_headers)


async def relay(answer: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The answer's body as it comes (a followed log flows live); its connection goes
    back to the pool once read to the end, and is closed when the client leaves first."""
    try:
        async for chunk in answer.content.iter_any():
            yield chunk
    finally:
        if answer.content.at_eof():
            answer.release()
        else:
            answer.close()


# Answers up to this size with a Content-Length are read whole and sent on in one piece;
# larger ones, and those of unknown length (a followed log), stream as they come.
WHOLE_ANSWER_BYTES = 1 << 20


def unavailable(service: str, exc: BaseException) -> JSONResponse:
    return JSONResponse({"detail": f"{service} service unavailable: {exc!r}"}, 503)


# The connection went away under the request: nothing was answered on it.
DROPPED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def idempotent(method: str, headers: dict[str, str]) -> bool:
    """Repeating the request changes nothing: a safe or idempotent method, or a request
    that carries an Idempotency-Key (the service makes a retry the same job)."""
    return method in SAFE_METHODS or any(k.lower() == "idempotency-key" for k in headers)
