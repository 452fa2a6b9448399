"""The embedded store's ``$set`` of top-level fields runs as SQLite's ``json_set`` on
the stored text; every other update decodes the document, applies it and writes it
whole. Both must leave the same text and count the same documents modified (the
services' conditional writes read ``modified_count``)."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.docstore import SqliteClient, SqliteCollection

KEYS = st.sampled_from(["a", "b", "state", "state_rank", "spec_json", "x_1", "Z"])
TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(['"', "\\", "\n", "\x00", "\x1f", "\ue000", "\ue001", "é", "🚀"]),
    ),
    max_size=12,
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=8))])),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(TEXT.filter(bool), inner, max_size=3)
    ),
    max_leaves=8,
)
DOCS = st.dictionaries(KEYS, VALUES, max_size=5)
SETS = st.dictionaries(KEYS, VALUES, min_size=1, max_size=4)
# A no-op second operator: the same $set, applied to the decoded document instead.
DECODED = {"$unset": {"never_there": ""}}


def stored(collection: SqliteCollection, doc_id: str) -> str:
    row = collection.database.conn.execute(
        f'SELECT doc FROM "{collection.name}" WHERE id = ?', (doc_id,)
    ).fetchone()
    return str(row[0])


def both(tmp: Path, name: str) -> tuple[SqliteCollection, SqliteCollection]:
    db = SqliteClient(tmp)[name]
    return db["in_place"], db["decoded"]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=DOCS, sets=SETS, guard=st.booleans())
def test_a_top_level_set_leaves_the_text_a_whole_rewrite_would(
    tmp_path: Path, doc: dict[str, Any], sets: dict[str, Any], guard: bool
) -> None:
    in_place, decoded = both(tmp_path, "prop")

    async def run() -> None:
        for collection in (in_place, decoded):
            await collection.delete_one({"_id": "d"})
            await collection.insert_one({"_id": "d", **doc})
        query: dict[str, Any] = {"_id": "d"}
        if guard:  # a condition beside the _id, as the status views' state guard
            query["never_there"] = None
        fast = await in_place.update_one(query, {"$set": sets})
        slow = await decoded.update_one(query, {"$set": sets, **DECODED})
        assert (fast.matched_count, fast.modified_count) == (
            slow.matched_count, slow.modified_count
        )  # fmt: skip
        assert stored(in_place, "d") == stored(decoded, "d")
        assert await in_place.find_one({"_id": "d"}) == await decoded.find_one({"_id": "d"})
        again = await in_place.update_one(query, {"$set": sets})
        assert (again.matched_count, again.modified_count) == (1, 0)

    asyncio.run(run())


def test_many_documents_and_no_match(tmp_path: Path) -> None:
    in_place, _ = both(tmp_path, "many")

    async def run() -> None:
        for i in range(4):
            await in_place.insert_one({"_id": f"d{i}", "n": i % 2, "s": "old"})
        await in_place.update_one({"_id": "d0"}, {"$set": {"s": "new"}})
        result = await in_place.update_many({"n": 0}, {"$set": {"s": "new"}})
        assert (result.matched_count, result.modified_count) == (2, 1)  # d0 had it already
        assert [d["s"] for d in [await in_place.find_one({"_id": f"d{i}"}) for i in range(4)]] == [
            "new", "old", "new", "old"
        ]  # fmt: skip
        missed = await in_place.update_one({"_id": "nope"}, {"$set": {"s": "x"}})
        assert (missed.matched_count, missed.modified_count) == (0, 0)
        assert await in_place.find_one({"_id": "nope"}) is None
        made = await in_place.update_one({"_id": "nope"}, {"$set": {"s": "x"}}, upsert=True)
        assert made.upserted_id == "nope"
        assert await in_place.find_one({"_id": "nope"}) == {"_id": "nope", "s": "x"}

    asyncio.run(run())


@pytest.mark.parametrize(
    "update",
    [
        {"$set": {"f": math.nan}},  # no JSON for it: applied to the decoded document
        {"$set": {"a.b": 1}},  # a nested field
        {"$set": {"_id": "d"}},
    ],
)
def test_what_json_set_cannot_take_is_still_applied(tmp_path: Path, update: dict) -> None:
    in_place, decoded = both(tmp_path, "other")

    async def run() -> None:
        for collection in (in_place, decoded):
            await collection.insert_one({"_id": "d", "a": {"c": 2}, "when": datetime(2026, 1, 1)})
        fast = await in_place.update_one({"_id": "d"}, update)
        slow = await decoded.update_one({"_id": "d"}, {**update, **DECODED})
        assert fast.modified_count == slow.modified_count
        assert stored(in_place, "d") == stored(decoded, "d")

    asyncio.run(run())
