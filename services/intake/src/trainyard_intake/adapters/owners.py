"""Who owns which job, as intake recorded it at submission.

Intake needs this to authorise stop requests without asking another service. The
record is written before ``JobSubmitted`` is published, so every published job has an
owner on record."""

from __future__ import annotations

from typing import Protocol

from pymongo.asynchronous.collection import AsyncCollection

from trainyard_common.storage import insert_once


class OwnerRegistry(Protocol):
    async def record(self, job_id: str, user: str) -> bool: ...
    async def owner(self, job_id: str) -> str | None: ...


class MongoOwnerRegistry:
    def __init__(self, collection: AsyncCollection) -> None:
        self._jobs = collection

    async def record(self, job_id: str, user: str) -> bool:
        return await insert_once(self._jobs, {"_id": job_id, "user": user})

    async def owner(self, job_id: str) -> str | None:
        doc = await self._jobs.find_one({"_id": job_id}, {"user": 1})
        return None if doc is None else doc["user"]


class InMemoryOwnerRegistry:
    def __init__(self) -> None:
        self.owners: dict[str, str] = {}

    async def record(self, job_id: str, user: str) -> bool:
        if job_id in self.owners:
            return False
        self.owners[job_id] = user
        return True

    async def owner(self, job_id: str) -> str | None:
        return self.owners.get(job_id)
