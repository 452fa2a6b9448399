"""The two real stores for contract tests: every adapter runs the same tests on the
embedded SQLite store and on the MongoDB wire (FerretDB here, MongoDB when MONGO_URL is
set), and where it has one, on its in-memory fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from trainyard_common.docstore import SqliteClient
from trainyard_common.storage import Client, mongo_client

REAL_STORES = ["sqlite", "mongo"]


@asynccontextmanager
async def store_client(
    request: pytest.FixtureRequest, kind: str, db_prefix: str
) -> AsyncIterator[Client]:
    """A client of store ``kind``; the databases named ``<db_prefix>_*`` are dropped after."""
    client: Client
    if kind == "sqlite":
        client = SqliteClient(request.getfixturevalue("tmp_path") / "store")
    elif kind == "mongo":
        client = mongo_client(request.getfixturevalue("mongo_url"))
    else:
        raise ValueError(f"no store {kind!r}")
    try:
        yield client
    finally:
        if isinstance(client, SqliteClient):
            names = [p.name.removesuffix(".sqlite3") for p in client.directory.glob("*.sqlite3")]
        else:
            names = await client.list_database_names()
        for name in names:
            if name.startswith(db_prefix):
                await client.drop_database(name)
        await client.close()
