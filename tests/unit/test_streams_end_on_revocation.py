"""A live feed or a watch opened before its token was revoked ends once the token no
longer resolves; it went on for as long as the connection lasted, sending every change
of the caller's jobs (an admin's: everyone's) (found by an audit of authorization)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from trainyard_common.auth import Identity, StillValid, TokenStore
from trainyard_status.app import sse


class Revocable(TokenStore):
    def __init__(self) -> None:
        super().__init__(None, None)
        self.revoked = False
        self.asked = 0

    async def resolve(self, token: str, fresh: bool = False) -> Identity | None:
        self.asked += 1
        return None if self.revoked else Identity("ops", admin=True)


async def test_a_token_is_asked_again_only_every_so_often() -> None:
    now = [0.0]
    tokens = Revocable()
    valid = StillValid(tokens, "t", every_s=15.0, clock=lambda: now[0])
    assert await valid() and tokens.asked == 0  # just checked, at connection
    now[0] = 14.0
    tokens.revoked = True
    assert await valid() and tokens.asked == 0
    now[0] = 15.0
    assert not await valid() and tokens.asked == 1
    assert not await valid() and tokens.asked == 1  # for good, not asked again


async def test_a_store_that_cannot_answer_is_no_revocation() -> None:
    class Away(Revocable):
        async def resolve(self, token: str, fresh: bool = False) -> Identity | None:
            raise ConnectionError("store away")

    valid = StillValid(Away(), "t", every_s=0.0)
    assert await valid()


class Feed:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[Any]]:
        yield self.queue


class Connected:
    async def is_disconnected(self) -> bool:
        return False


async def test_the_live_feed_ends_once_its_token_is_revoked() -> None:
    feed, tokens = Feed(), Revocable()
    stream = sse(feed, Identity("ops", admin=True), Connected(), None,  # type: ignore[arg-type]
                 StillValid(tokens, "t", every_s=0.0))  # fmt: skip
    assert (await anext(stream)).startswith(b"retry:")
    feed.queue.put_nowait({"id": "j1", "user": "alice"})
    assert b'"id": "j1"' in await anext(stream)
    tokens.revoked = True
    feed.queue.put_nowait({"id": "j2", "user": "alice"})
    sent = [chunk async for chunk in stream]  # ends rather than waiting for more
    assert sent == []
