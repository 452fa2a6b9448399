"""One unprivileged uid per platform user, for that user's tasks on the local backend.

A user's tasks run as the user's own uid (and a group of the same number), never as
root and never as the services' uid, so they cannot read the platform's files, the
services' environment or ``/proc``, nor another user's tasks (docs/security.md). The
uids come from a range no account of the machine uses (``YARD_TASK_UID_BASE``, 200000
by default) and are kept in the launcher's store, so a user keeps the same uid across
restarts and two users never share one, even with two launchers allocating at once:
each allocation claims ``uid:<n>`` and then ``user:<name>`` by ``_id`` alone, the one
guarantee every store gives.
"""

from __future__ import annotations

from typing import Any, Protocol

from trainyard_common.storage import Database, insert_once

DEFAULT_BASE = 200_000
DEFAULT_COUNT = 65_536


class UidsExhausted(Exception):
    """Every uid of the range is taken."""


class _Claims(Protocol):
    async def get(self, key: str) -> dict[str, Any] | None: ...

    async def claim(self, key: str, doc: dict[str, Any]) -> bool: ...

    async def count(self) -> int: ...


async def _uid_for(claims: _Claims, user: str, base: int, count: int) -> int:
    key = f"user:{user}"
    if (found := await claims.get(key)) is not None:
        return int(found["uid"])
    # Start past the uids claimed so far: a range with n claims has its first free uid
    # at or after base + n unless claims were lost to races, which the loop steps over.
    start = await claims.count() // 2
    for n in range(start, count):
        uid = base + n
        if not await claims.claim(f"uid:{uid}", {"user": user}):
            continue
        if await claims.claim(key, {"uid": uid}):
            return uid
        # Another launcher gave the user a uid first; that one is the user's.
        found = await claims.get(key)
        assert found is not None
        return int(found["uid"])
    raise UidsExhausted(f"no free task uid in [{base}, {base + count})")


class TaskUids(Protocol):
    async def uid_for(self, user: str) -> int: ...


class DocTaskUids:
    def __init__(self, db: Database, base: int = DEFAULT_BASE, size: int = DEFAULT_COUNT):
        self.collection = db["task_uids"]
        self.base = base
        self.size = size

    async def get(self, key: str) -> dict[str, Any] | None:
        return await self.collection.find_one({"_id": key})

    async def claim(self, key: str, doc: dict[str, Any]) -> bool:
        return await insert_once(self.collection, {"_id": key, **doc})

    async def count(self) -> int:
        return await self.collection.count_documents({})

    async def uid_for(self, user: str) -> int:
        return await _uid_for(self, user, self.base, self.size)


class MemoryTaskUids:
    def __init__(self, base: int = DEFAULT_BASE, size: int = DEFAULT_COUNT) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.base = base
        self.size = size

    async def get(self, key: str) -> dict[str, Any] | None:
        return self.docs.get(key)

    async def claim(self, key: str, doc: dict[str, Any]) -> bool:
        if key in self.docs:
            return False
        self.docs[key] = doc
        return True

    async def count(self) -> int:
        return len(self.docs)

    async def uid_for(self, user: str) -> int:
        return await _uid_for(self, user, self.base, self.size)
