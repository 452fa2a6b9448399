"""The gateway: one base URL in front of the separate services. It forwards requests
as they are (authentication stays with each service) and streams answers back, so a
followed log flows through it live."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from trainyard_common.runtime import health_app

from .routes import BACKENDS, route

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


def create_app(backends: dict[str, str]) -> FastAPI:
    app = health_app("gateway")
    client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))

    @app.get("/healthz/all")
    async def health_all() -> JSONResponse:
        async def check(name: str) -> tuple[str, str]:
            try:
                answer = await client.get(f"{backends[name]}/healthz", timeout=2.0)
                return name, "ok" if answer.status_code == 200 else f"http {answer.status_code}"
            except httpx.HTTPError as exc:
                return name, f"down ({type(exc).__name__})"

        results = dict(await asyncio.gather(*(check(n) for n in BACKENDS if n in backends)))
        healthy = all(v == "ok" for v in results.values())
        return JSONResponse({"gateway": "ok", **results}, status_code=200 if healthy else 503)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def forward(request: Request, path: str) -> Response:
        service = route(request.method, request.url.path)
        if service is None or service not in backends:
            return JSONResponse(
                {"detail": f"no route for {request.method} {request.url.path}"}, 404
            )
        # The path as the client sent it (still percent-encoded): decoded, it may not
        # even be a URL any more.
        raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        try:
            url = httpx.URL(backends[service] + raw_path, query=request.url.query.encode())
        except httpx.InvalidURL as exc:
            return JSONResponse({"detail": f"not a URL to forward: {exc}"}, 400)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        # The Host the client used, for signatures that cover it (Alibaba Cloud's ACS3).
        headers["x-forwarded-host"] = request.headers.get("host", "")
        body = await request.body()
        retry = idempotent(request.method, headers)
        for tries_left in (1, 0) if retry else (0,):
            upstream = client.build_request(request.method, url, headers=headers, content=body)
            try:
                answer = await client.send(upstream, stream=True)
                break
            except DROPPED as exc:
                # A pooled connection the service had closed (it answered a bad request
                # and hung up, or restarted): that connection is gone from the pool, and
                # a request that may be repeated goes once more on a fresh one.
                if tries_left:
                    continue
                return JSONResponse({"detail": f"{service} service unavailable: {exc!r}"}, 503)
            except httpx.HTTPError as exc:
                return JSONResponse({"detail": f"{service} service unavailable: {exc!r}"}, 503)
        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers=out_headers,
            background=_closer(answer),
        )

    return app


# The connection went away under the request: nothing was answered on it.
DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def idempotent(method: str, headers: dict[str, str]) -> bool:
    """Repeating the request changes nothing: a safe or idempotent method, or a request
    that carries an Idempotency-Key (the service makes a retry the same job)."""
    return method in SAFE_METHODS or any(k.lower() == "idempotency-key" for k in headers)


def _closer(answer: httpx.Response) -> BackgroundTask:
    return BackgroundTask(answer.aclose)
