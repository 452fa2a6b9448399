"""Job names, unique per user (OpenPAI: "jobName ... 值唯一"). A claim is a document
whose ``_id`` is the user and name, so the unique key does the locking (no transactions
in FerretDB v1), and a redelivered submission finds its own claim and may proceed."""

from __future__ import annotations

from typing import Protocol

from trainyard_common.events import utcnow
from trainyard_common.storage import Database, insert_once

COLLECTION = "names"


def name_key(user: str, name: str) -> str:
    return f"{user}~{name}"


class NameRegistry(Protocol):
    async def claim(self, user: str, name: str, job_id: str) -> bool:
        """True when ``name`` is free for ``user`` or already claimed by ``job_id``."""
        ...

    async def holder(self, user: str, name: str) -> str | None:
        """The job holding ``name`` for ``user``, or None; claims nothing."""
        ...

    async def take(self, user: str, name: str, job_id: str) -> None:
        """Record ``job_id`` as the holder, whoever held the name before (intake
        decided, and a name freed there may be given to a new job)."""
        ...


class DocNameRegistry:
    def __init__(self, db: Database) -> None:
        self._names = db[COLLECTION]

    async def claim(self, user: str, name: str, job_id: str) -> bool:
        key = name_key(user, name)
        # Two rounds: a claim seen by the insert may be gone by the find (an operator
        # freed the name), and then the name is free again.
        for _ in range(2):
            document = {
                "_id": key,
                "user": user,
                "name": name,
                "job_id": job_id,
                "claimed_at": utcnow(),
            }
            if await insert_once(self._names, document):
                return True
            holder = await self._names.find_one({"_id": key}, {"job_id": 1})
            if holder is not None:
                return holder.get("job_id") == job_id
        return False

    async def holder(self, user: str, name: str) -> str | None:
        doc = await self._names.find_one({"_id": name_key(user, name)}, {"job_id": 1})
        return None if doc is None else doc.get("job_id")

    async def take(self, user: str, name: str, job_id: str) -> None:
        document = {
            "_id": name_key(user, name),
            "user": user,
            "name": name,
            "job_id": job_id,
            "claimed_at": utcnow(),
        }
        await self._names.replace_one({"_id": document["_id"]}, document, upsert=True)


class InMemoryNameRegistry:
    """The same contract in a dict, for unit tests of handlers."""

    def __init__(self) -> None:
        self.claims: dict[str, str] = {}

    async def claim(self, user: str, name: str, job_id: str) -> bool:
        return self.claims.setdefault(name_key(user, name), job_id) == job_id

    async def holder(self, user: str, name: str) -> str | None:
        return self.claims.get(name_key(user, name))

    async def take(self, user: str, name: str, job_id: str) -> None:
        self.claims[name_key(user, name)] = job_id
