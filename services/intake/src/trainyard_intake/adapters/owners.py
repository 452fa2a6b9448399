"""Who owns which job, and under which dialect name, as intake recorded it at submission.

Intake needs this to authorise stop requests without asking another service, and a
dialect's API needs it to find the jobs it names (OpenPAI ``user~jobName``, a T9k
``namespace/plural/name``, a TI ``cluster/name``). The record is written before
``JobSubmitted`` is published, so every published job has an owner on record. Every
submission under a name is kept: a rejected resubmission must not hide the job that runs
under that name."""

from __future__ import annotations

from typing import Protocol

from pymongo import ASCENDING

from trainyard_common.storage import Collection, insert_once


class OwnerRegistry(Protocol):
    async def record(self, job_id: str, user: str, key: str | None = None) -> bool: ...
    async def owner(self, job_id: str) -> str | None: ...
    async def job_ids(self, user: str, key: str) -> list[str]: ...
    async def entry(self, job_id: str) -> tuple[str, str | None] | None:
        """The job's user and the dialect name it was submitted under."""
        ...

    async def mark_rejected(self, job_id: str) -> None:
        """Validation rejected the job (marked before its name, if it gives one back,
        is released: a retry of its submission reads it)."""
        ...

    async def rejected(self, job_id: str) -> bool: ...


class DocOwnerRegistry:
    def __init__(self, collection: Collection) -> None:
        self._jobs = collection

    async def ensure_indexes(self) -> None:
        await self._jobs.create_index([("user", ASCENDING), ("key", ASCENDING)])

    async def record(self, job_id: str, user: str, key: str | None = None) -> bool:
        return await insert_once(self._jobs, {"_id": job_id, "user": user, "key": key})

    async def owner(self, job_id: str) -> str | None:
        doc = await self._jobs.find_one({"_id": job_id}, {"user": 1})
        return None if doc is None else doc["user"]

    async def job_ids(self, user: str, key: str) -> list[str]:
        return [doc["_id"] async for doc in self._jobs.find({"user": user, "key": key}, {"_id": 1})]

    async def entry(self, job_id: str) -> tuple[str, str | None] | None:
        doc = await self._jobs.find_one({"_id": job_id})
        return None if doc is None else (doc["user"], doc.get("key"))

    async def mark_rejected(self, job_id: str) -> None:
        await self._jobs.update_one({"_id": job_id}, {"$set": {"rejected": True}})

    async def rejected(self, job_id: str) -> bool:
        return await self._jobs.find_one({"_id": job_id, "rejected": True}, {"_id": 1}) is not None


class InMemoryOwnerRegistry:
    def __init__(self) -> None:
        self.owners: dict[str, tuple[str, str | None]] = {}
        self.refused: set[str] = set()

    async def record(self, job_id: str, user: str, key: str | None = None) -> bool:
        if job_id in self.owners:
            return False
        self.owners[job_id] = (user, key)
        return True

    async def owner(self, job_id: str) -> str | None:
        found = self.owners.get(job_id)
        return None if found is None else found[0]

    async def job_ids(self, user: str, key: str) -> list[str]:
        return [job for job, (owner, k) in self.owners.items() if owner == user and k == key]

    async def entry(self, job_id: str) -> tuple[str, str | None] | None:
        return self.owners.get(job_id)

    async def mark_rejected(self, job_id: str) -> None:
        if job_id in self.owners:
            self.refused.add(job_id)

    async def rejected(self, job_id: str) -> bool:
        return job_id in self.refused
