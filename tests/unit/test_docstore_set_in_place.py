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


def test_a_document_that_is_not_strict_json_is_rewritten_whole(tmp_path: Path) -> None:
    """A NaN or an Infinity stored earlier (the encoder writes them) is text json_set
    refuses (SQLite 3.40) or reads as null (3.45 on): that document goes the other way."""
    in_place, decoded = both(tmp_path, "nan")
    statements: list[str] = []
    in_place.database.conn.set_trace_callback(statements.append)

    async def run() -> None:
        for collection in (in_place, decoded):
            await collection.insert_one({"_id": "odd", "x": math.nan, "y": math.inf, "s": "a"})
            await collection.insert_one({"_id": "plain", "s": "a"})
        for doc_id in ("odd", "plain"):
            fast = await in_place.update_one({"_id": doc_id}, {"$set": {"s": "b"}})
            slow = await decoded.update_one({"_id": doc_id}, {"$set": {"s": "b"}, **DECODED})
            assert (fast.matched_count, fast.modified_count) == (1, 1) == (
                slow.matched_count, slow.modified_count
            )  # fmt: skip
            assert stored(in_place, doc_id) == stored(decoded, doc_id)
        odd = await in_place.find_one({"_id": "odd"})
        assert odd is not None and math.isnan(odd["x"]) and odd["y"] == math.inf
        assert odd["s"] == "b"

    asyncio.run(run())
    # The plain document's change was json_set's, the odd one's a rewrite.
    updates = [s for s in statements if s.startswith('UPDATE "in_place"')]
    assert ["json_set" in s for s in updates] == [False, True]


def test_the_same_document_is_chosen_and_errors_come_as_before(tmp_path: Path) -> None:
    in_place, _ = both(tmp_path, "order")

    async def run() -> None:
        for doc_id in ("z", "a", "m"):
            await in_place.insert_one({"_id": doc_id, "n": 0})
        first = await in_place.find_one({})
        await in_place.update_one({}, {"$set": {"n": 1}})
        assert first is not None and (await in_place.find_one({"n": 1})) == {**first, "n": 1}
        # A value no document can hold: nothing matched, nothing to say; else the error.
        nothing = await in_place.update_one({"_id": "none"}, {"$set": {"bad": {1, 2}}})
        assert (nothing.matched_count, nothing.modified_count) == (0, 0)
        with pytest.raises(TypeError):
            await in_place.update_one({"_id": "a"}, {"$set": {"bad": {1, 2}}})

    asyncio.run(run())
