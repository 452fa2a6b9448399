"""The services' HTTP server keeps an idle connection open longer than the clients that
call it keep theirs (httpx's pool: 5 s), so a request sent on a reused connection is
never met by the server's close; nor does an error close it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import uvicorn
from fastapi import FastAPI

from trainyard_common.runtime import KEEP_ALIVE_S, health_app, server_config

REQUEST = b"GET /ping HTTP/1.1\r\nHost: test\r\n\r\n"


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(REQUEST)
    await writer.drain()
    return await asyncio.wait_for(reader.read(4096), timeout=5)


@asynccontextmanager
async def connected(
    app: FastAPI,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``app`` served as every service serves (with a /ping route), and one connection."""

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(server_config(app, "127.0.0.1", port))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        yield reader, writer
        writer.close()
    finally:
        server.should_exit = True
        await serving


async def test_a_connection_idle_past_the_clients_expiry_still_answers() -> None:
    async with connected(FastAPI()) as (reader, writer):
        assert (await _answer(reader, writer)).startswith(b"HTTP/1.1 200")
        # Idle a second longer than httpx keeps a pooled connection (and than uvicorn's
        # default keep-alive, which closed it here at 5 s).
        assert KEEP_ALIVE_S > 6
        await asyncio.sleep(6)
        assert (await _answer(reader, writer)).startswith(b"HTTP/1.1 200")


async def test_a_routes_unhandled_error_is_a_500_on_a_connection_that_stays_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Starlette sent the 500 and raised on, and uvicorn then closed the connection: the
    # gateway, which had pooled it, failed the next request it sent there (another
    # user's POST, which it does not retry).
    app = health_app("test")

    @app.post("/boom")
    async def boom() -> None:
        raise TypeError("keys must be str")

    async with connected(app) as (reader, writer):
        writer.write(b"POST /boom HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b'"}'), timeout=5)
        assert answer.startswith(b"HTTP/1.1 500") and b"connection: close" not in answer.lower()
        assert b"internal error" in answer
        assert (await _answer(reader, writer)).startswith(b"HTTP/1.1 200")
    assert any("keys must be str" in (r.exc_text or "") for r in caplog.records)
