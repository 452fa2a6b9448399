"""The PAI-DLC data-source and code-source registry, in intake's own database.

A source belongs to the user who created it; another user's id reads as missing. The
documents keep DLC's field names (``DisplayName``, ``Path``, ``CodeRepo`` …) so the API
shows them back as they were given."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from pymongo import ASCENDING, DESCENDING

from trainyard_common.storage import Collection, Database

Kind = Literal["data", "code"]
COLLECTIONS: dict[Kind, str] = {"data": "dlc_datasources", "code": "dlc_codesources"}
# DLC's id shapes: d-xxxxxxxx for data sources, code-<time>-xxxxxxxx for code sources.
PREFIX: dict[Kind, str] = {"data": "d-", "code": "code-"}


class SourceRegistry(Protocol):
    async def create(self, kind: Kind, user: str, fields: dict[str, Any]) -> dict[str, Any]: ...
    async def get(self, kind: Kind, user: str | None, source_id: str) -> dict[str, Any] | None: ...
    async def update(
        self, kind: Kind, user: str | None, source_id: str, fields: dict[str, Any]
    ) -> dict[str, Any] | None: ...
    async def delete(self, kind: Kind, user: str | None, source_id: str) -> bool: ...
    async def list(
        self,
        kind: Kind,
        user: str | None,
        *,
        where: dict[str, Any],
        offset: int,
        limit: int,
        ascending: bool,
        sort_by: str,
    ) -> tuple[list[dict[str, Any]], int]: ...


def new_source_id(kind: Kind, now: datetime) -> str:
    if kind == "code":
        return f"code-{now:%Y%m%d%H%M%S}-{secrets.token_hex(4)}"
    return f"d-{secrets.token_hex(8)}"


class DocSourceRegistry:
    def __init__(self, db: Database) -> None:
        self._db = db

    def _col(self, kind: Kind) -> Collection:
        return self._db[COLLECTIONS[kind]]

    async def ensure_indexes(self) -> None:
        for kind in COLLECTIONS:
            await self._col(kind).create_index([("user", ASCENDING), ("created_at", DESCENDING)])

    @staticmethod
    def _owned(user: str | None, source_id: str) -> dict[str, Any]:
        # user None: an admin, who sees every source.
        return {"_id": source_id} if user is None else {"_id": source_id, "user": user}

    async def create(self, kind: Kind, user: str, fields: dict[str, Any]) -> dict[str, Any]:
        now = datetime.now(UTC)
        doc = {
            "_id": new_source_id(kind, now),
            "user": user,
            "created_at": now,
            "modified_at": now,
            **fields,
        }
        await self._col(kind).insert_one(doc)
        return doc

    async def get(self, kind: Kind, user: str | None, source_id: str) -> dict[str, Any] | None:
        return await self._col(kind).find_one(self._owned(user, source_id))

    async def update(
        self, kind: Kind, user: str | None, source_id: str, fields: dict[str, Any]
    ) -> dict[str, Any] | None:
        query = self._owned(user, source_id)
        result = await self._col(kind).update_one(
            query, {"$set": {**fields, "modified_at": datetime.now(UTC)}}
        )
        if result.matched_count == 0:
            return None
        return await self._col(kind).find_one(query)

    async def delete(self, kind: Kind, user: str | None, source_id: str) -> bool:
        result = await self._col(kind).delete_one(self._owned(user, source_id))
        return result.deleted_count > 0

    async def list(
        self,
        kind: Kind,
        user: str | None,
        *,
        where: dict[str, Any],
        offset: int,
        limit: int,
        ascending: bool,
        sort_by: str,
    ) -> tuple[list[dict[str, Any]], int]:
        query = {**where, **({"user": user} if user is not None else {})}
        total = await self._col(kind).count_documents(query)
        order = ASCENDING if ascending else DESCENDING
        cursor = (
            self._col(kind)
            .find(query)
            .sort([(sort_by, order), ("_id", order)])
            .skip(offset)
            .limit(limit)
        )
        return [doc async for doc in cursor], total
