"""Moving a platform's data from a MongoDB-wire store (the embedded FerretDB of earlier
versions, or a MongoDB) into the embedded SQLite store: every database of the platform's
prefix, every collection, every document as it is.

Safe to run again: a document already copied (same ``_id``) is left as it is, so an
interrupted migration is finished by running it once more. Run it with the platform
stopped; the services declare their indexes when they start."""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient

from trainyard_common.docstore import SqliteClient
from trainyard_common.storage import insert_once


async def copy_databases(
    source: AsyncMongoClient[dict[str, Any]], target: SqliteClient, prefix: str
) -> dict[str, tuple[int, int]]:
    """Copy ``<prefix>_*``; per collection, (documents read, documents newly written)."""
    report: dict[str, tuple[int, int]] = {}
    for name in sorted(await source.list_database_names()):
        if not name.startswith(f"{prefix}_"):
            continue
        database = source[name]
        for collection in sorted(await database.list_collection_names()):
            read = written = 0
            destination = target[name][collection]
            # One transaction per collection: a crash leaves it wholly copied or not at all.
            with target[name].transaction():
                async for document in database[collection].find({}):
                    read += 1
                    written += await insert_once(destination, document)
            report[f"{name}.{collection}"] = (read, written)
    return report
