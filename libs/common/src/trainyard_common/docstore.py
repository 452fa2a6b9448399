"""The embedded store: documents in SQLite (the standard library's ``sqlite3``), one
database file per service, behind the same small document API the MongoDB adapters use.

Why (DESIGN §7, docs/architecture.md): FerretDB v1 scans its table for every operation
by ``_id`` and pushes no other filter or sort down; SQLite with real indexes answers the
same operations in microseconds whatever the size.

A collection is a table ``(id TEXT PRIMARY KEY, doc TEXT)``: the document is JSON, and
every field a service declares an index on (``create_index``, as it does for MongoDB)
becomes a generated column (its values keep their JSON types) with a real index over it; a filter or sort on such a
field reads the column, so SQLite uses the index. Fields nobody indexes stay in the JSON
and are still filterable (``json_extract``).

Only the subset of MongoDB the services use is implemented, and anything else is refused
loudly (``Unsupported``), never half-done: filters by equality (``None`` matches a missing
field, as in MongoDB), ``$in``, ``$nin`` (on a field holding an array: its elements),
``$ne``, ``$lt``, ``$lte``, ``$gt``, ``$gte``, ``$regex`` of an escaped literal (a
substring search, ``$options`` "i" or none), a top-level ``$or``; updates by ``$set``,
``$unset``, ``$push``,
``$addToSet``, ``$pull`` (of one value), ``$inc``; replacement with
upsert; sort, skip, limit, ``hint`` (by the index's keys) and ``max_time_ms``; a
datetime's day and a copy of a field as keys of their own (``day_key``, ``copy_key``:
this store's alone); inclusion
or exclusion projections; ``count_documents`` (with ``limit``, ``maxTimeMS`` and ``hint``);
``drop_index`` by the index's keys.

Datetimes keep their type: stored as fixed-width UTC ISO text behind a private-use mark
(so they sort and compare in time order) and read back as aware UTC datetimes, as
pymongo's ``tz_aware`` client gives them.

Writes: each operation is its own transaction (``BEGIN IMMEDIATE``: a conditional update
reads and writes under the database's write lock, so two replicas of a service sharing the
file never both win), or all of a ``transaction()`` block's operations are one. WAL with
``synchronous=NORMAL``: a committed write survives the process being killed (the crash
test does exactly that); a power cut may lose the last moments, as it may for the
JetStream file store with its default sync interval.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ASCENDING = 1
DESCENDING = -1

_DATE = "\ue000"  # marks a stored datetime
_ESC = "\ue001"  # marks a string that began with one of the two marks
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
# A field's path: names, dots between them; a name may hold what a label's key may (a
# DLC tag "app-name", "a/b:c"), each quoted in the JSON path.
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/:]{0,199}$")
_BUSY_TIMEOUT_MS = 30_000


class Unsupported(Exception):
    """A query or update outside the subset this store implements."""


class DuplicateKey(Exception):
    """An insert whose ``_id`` is already stored."""


class IndexNotFound(Exception):
    """A drop of an index that is not there (MongoDB's ``IndexNotFound``)."""


class TimedOut(Exception):
    """A count or a query that ran past its time limit (``maxTimeMS``, ``max_time_ms``:
    MongoDB's ``ExecutionTimeout``)."""


# --- values ---------------------------------------------------------------------------


def _date_text(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # naive means UTC, as for BSON
    value = value.astimezone(UTC)
    # The year in four digits as fromisoformat reads it (%Y writes year 999 as "999").
    return f"{_DATE}{value.year:04d}{value:-%m-%dT%H:%M:%S.%f}Z"


def encode(value: Any) -> Any:
    """A value as stored in the JSON: datetimes marked, marked-looking strings escaped."""
    if isinstance(value, str):
        return _ESC + value if value[:1] in (_DATE, _ESC) else value
    if isinstance(value, datetime):
        return _date_text(value)
    if isinstance(value, dict):
        return {_key(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    raise TypeError(f"cannot store a value of type {type(value).__name__}")


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"document keys must be strings, not {type(key).__name__}")
    return key


def decode(value: Any) -> Any:
    if isinstance(value, str):
        if value[:1] == _DATE:
            # The fixed form _date_text writes; fromisoformat reads it (UTC from the
            # "Z") some fifty times faster than strptime, on every document read.
            return datetime.fromisoformat(value[1:])
        return value[1:] if value[:1] == _ESC else value
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def _param(value: Any) -> Any:
    """A scalar as SQLite compares it with what ``json_extract`` returns."""
    if isinstance(value, dict | list | tuple):
        raise Unsupported("filters compare scalars only, not documents or arrays")
    return encode(value)


# Made once: json.dumps with any option makes a new encoder on every call.
_TO_TEXT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_TO_STRICT_TEXT = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def _dumps(doc: Mapping[str, Any]) -> str:
    return _TO_TEXT(encode(dict(doc)))


# --- results --------------------------------------------------------------------------


@dataclass(frozen=True)
class InsertOneResult:
    inserted_id: Any


@dataclass(frozen=True)
class UpdateResult:
    matched_count: int
    modified_count: int
    upserted_id: Any = None


@dataclass(frozen=True)
class DeleteResult:
    deleted_count: int


# --- the database ---------------------------------------------------------------------


class SqliteClient:
    """The databases under one directory, one file each (``<name>.sqlite3``); shaped like
    pymongo's client where the services use it (``client[name]``, ``close``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._open: dict[str, SqliteDatabase] = {}

    def __getitem__(self, name: str) -> SqliteDatabase:
        if name not in self._open:
            if not _NAME.match(name) or "." in name:
                raise ValueError(f"database name {name!r} is not a plain name")
            self._open[name] = SqliteDatabase(self.directory / f"{name}.sqlite3")
        return self._open[name]

    async def drop_database(self, name: str) -> None:
        database = self._open.pop(name, None)
        if database is not None:
            database.close()
        for suffix in ("", "-wal", "-shm"):
            (self.directory / f"{name}.sqlite3{suffix}").unlink(missing_ok=True)

    async def close(self) -> None:
        for database in self._open.values():
            database.close()
        self._open.clear()


class SqliteDatabase:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # One connection per database and process, used from the event loop's thread
        # (autocommit: transactions are explicit, see transaction()).
        self.conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=_BUSY_TIMEOUT_MS / 1000,
        )
        os.chmod(self.path, 0o600)
        # Every service opens the shared auth file at start: the switch of a new file to
        # WAL can answer "locked" at once, without waiting (SQLite's busy handler is
        # not asked on that path), while another process makes the same switch.
        for attempt in range(200):
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 199:
                    raise
                time.sleep(0.05)
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        self._collections: dict[str, SqliteCollection] = {}
        self._depth = 0
        self._owner: asyncio.Task[Any] | None = None

    def __getitem__(self, name: str) -> SqliteCollection:
        if name not in self._collections:
            if not _NAME.match(name) or "." in name:
                raise ValueError(f"collection name {name!r} is not a plain name")
            self._collections[name] = SqliteCollection(self, name)
        return self._collections[name]

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything inside is one transaction (nested blocks join the outer one).

        The connection is the process's one: a transaction open across an ``await``
        would take in another task's writes (and lose them with its own if it rolled
        back). Nothing here awaits; a consumer that batches its writes (bus.Atomic)
        never awaits inside, and the one caller that does (the migration) is its
        database's only user. A write from another task while one is open is refused
        loudly rather than joined."""
        if self._depth:
            if _task() is not self._owner:
                raise RuntimeError(f"{self.path.name}: another task's transaction is open")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        self._owner = _task()
        try:
            yield
        except BaseException:
            self._depth = 0
            if self.conn.in_transaction:  # SQLite may have ended it (a full disk)
                self.conn.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            self.conn.execute("COMMIT")
        except sqlite3.Error:
            # A commit that failed (a full disk) leaves the transaction open: end it,
            # so the next operation starts clean, and say so.
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction, a block whose writes are undone alone if it raises (the
        transaction goes on without them); outside one, a transaction of its own."""
        if not self._depth:
            with self.transaction():
                yield
            return
        if _task() is not self._owner:
            raise RuntimeError(f"{self.path.name}: another task's transaction is open")
        name = f"sp{self._depth}"
        self.conn.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self.conn.in_transaction:
                self.conn.execute(f"ROLLBACK TO {name}")
                self.conn.execute(f"RELEASE {name}")
            raise
        self._depth -= 1
        self.conn.execute(f"RELEASE {name}")


def _task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: plain synchronous use
        return None


_DAY = ":day"
_COPY = ":copy"
# The derived keys day_key and copy_key made, and the field each is of: a key a client
# wrote with the same ending (a DLC tag "team:copy") is no derived key, and is refused
# as any field that is not a plain path.
_DERIVED: dict[str, str] = {}


def day_key(field: str) -> str:
    """The key of a datetime field's UTC day ("2026-11-29"), for ``create_index``, filters
    and sorts on the embedded store alone (MongoDB has no such key). An index led by it
    keeps each day's documents apart: a range of another key (a name prefix) is then a
    search of each day in turn (``$in`` the days), and a sort by the datetime sorts one
    day's matches at a time (SQLite's sort of the right part of an ORDER BY), not every
    match of the range first."""
    _path(field)
    _DERIVED[field + _DAY] = field
    return field + _DAY


def copy_key(field: str) -> str:
    """The key of a copy of ``field``, for ``create_index``, filters and sorts on the
    embedded store alone: an index over copies serves only the queries that name
    them. SQLite's planner keeps no figures of how many documents a range holds, so an
    index over several fields meant for counts read alone (an exact total tested in
    the index, not in each document) would be taken for a page's walk as well, and
    every match sorted (a dialect's 333,333 of 1,000,000 jobs: 1.9 s)."""
    _path(field)
    _DERIVED[field + _COPY] = field
    return field + _COPY


def day_text(value: datetime) -> str:
    """``value``'s UTC day as ``day_key``'s column holds it."""
    return _date_text(value)[1:11]


def _column(field: str) -> str:
    # Derived keys' columns have names no plain field's can have ("f_" for those).
    if field in _DERIVED:
        kind = "d_" if field.endswith(_DAY) else "c_"
        return kind + _DERIVED[field].replace(".", "__")
    return "f_" + field.replace(".", "__")


def _plain(field: str) -> str:
    """The field a key is of: a derived key's own, or the key itself."""
    return _DERIVED.get(field, field)


def _generated(field: str) -> str:
    """The SQL of a field's value in a document: its JSON value (a ``copy_key``'s too),
    or (``day_key``) the day of the datetime text _date_text writes, behind its mark."""
    if field in _DERIVED and field.endswith(_DAY):
        return f"substr(json_extract(doc, '{_path(_plain(field))}'), 2, 10)"
    return f"json_extract(doc, '{_path(_plain(field))}')"


def _path(field: str) -> str:
    if not _FIELD.match(field):
        raise Unsupported(f"field {field!r} is not a plain field path")
    return "$." + ".".join(f'"{part}"' for part in field.split("."))


class SqliteCollection:
    """A table of documents; the methods are the subset of pymongo's ``AsyncCollection``
    the adapters use, with the same meaning."""

    def __init__(self, database: SqliteDatabase, name: str) -> None:
        self.database = database
        self.name = name
        self._table = f'"{name}"'
        conn = database.conn
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self._table} (id TEXT PRIMARY KEY, doc TEXT NOT NULL)"
        )
        self.columns = self._read_columns()

    def _read_columns(self) -> set[str]:
        rows = self.database.conn.execute(f"PRAGMA table_xinfo({self._table})")
        return {row[1] for row in rows} - {"id", "doc"}

    # -- schema ---------------------------------------------------------------------------

    async def create_index(
        self, keys: Sequence[tuple[str, int]] | str, *, unique: bool = False, name: str = ""
    ) -> str:
        """A generated column per field (once) and an index over them."""
        pairs = [(keys, ASCENDING)] if isinstance(keys, str) else list(keys)
        parts = []
        for field, direction in pairs:
            if field == "_id":
                parts.append("id" + (" DESC" if direction == DESCENDING else ""))
                continue
            column = _column(field)
            if not re.fullmatch(r"[A-Za-z0-9_]+", column):
                raise Unsupported(f"an index on {field!r}: its column needs a plain name")
            if column not in self.columns:
                with self.database.transaction():
                    # Looked up again under the write lock: another replica starting at
                    # the same moment may have added it since this one opened the table.
                    self.columns = self._read_columns()
                    if column not in self.columns:
                        self.database.conn.execute(
                            f"ALTER TABLE {self._table} ADD COLUMN {column} GENERATED "
                            f"ALWAYS AS ({_generated(field)}) VIRTUAL"
                        )
                self.columns.add(column)
            parts.append(column + (" DESC" if direction == DESCENDING else ""))
        index = name or self._index_name(pairs)
        self.database.conn.execute(
            f'CREATE {"UNIQUE " if unique else ""}INDEX IF NOT EXISTS "{index}" '
            f"ON {self._table} ({', '.join(parts)})"
        )
        return index

    async def drop_index(self, keys: Sequence[tuple[str, int]]) -> None:
        """As pymongo's: the index ``create_index`` made with these keys, dropped."""
        index = self._index_name(keys)
        found = self.database.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (index,)
        ).fetchone()
        if found is None:
            raise IndexNotFound(f"{self.name}: no index {index}")
        self.database.conn.execute(f'DROP INDEX IF EXISTS "{index}"')

    def _index_name(self, pairs: Sequence[tuple[str, int]]) -> str:
        if list(pairs) == [("_id", ASCENDING)]:
            return f"sqlite_autoindex_{self.name}_1"  # the table's own, as MongoDB's _id_
        return f"ix_{self.name}_" + "_".join(
            f"{f.replace('.', '__')}_{d}" for f, d in pairs
        ).replace("-", "m")

    # -- queries --------------------------------------------------------------------------

    def _source(self, hint: Sequence[tuple[str, int]]) -> str:
        """The table, or (``hint``) only this index of it (one create_index made with
        these keys): a statement naming one not made fails, loudly; one whose leading
        key the query does not test walks the whole index (SQLite 3.40)."""
        if not hint:
            return self._table
        return f'{self._table} INDEXED BY "{self._index_name(hint)}"'

    def _expr(self, field: str) -> str:
        if field == "_id":
            return "id"
        column = _column(field)
        if column in self.columns:
            return column
        return _generated(field)

    def _where(self, query: Mapping[str, Any] | None) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for field, cond in (query or {}).items():
            if field in ("$or", "$and") and isinstance(cond, list | tuple) and cond:
                if not all(isinstance(sub, Mapping) for sub in cond):
                    # MongoDB refuses them too ("entries need to be full objects"); an
                    # empty query here would match every document.
                    raise Unsupported(f"{field} entries must be documents")
                parts = [self._where(sub) for sub in cond]
                joint = f" {field[1:].upper()} "
                clauses.append("(" + joint.join(f"({w})" for w, _ in parts) + ")")
                params.extend(p for _, more in parts for p in more)
                continue
            if field.startswith("$"):
                raise Unsupported(f"query operator {field}")
            expr = self._expr(field)
            if isinstance(cond, Mapping) and cond and all(str(k).startswith("$") for k in cond):
                # A field that is not a column may hold an array: $in / $nin test its
                # elements then, as MongoDB does (a scalar is its one element).
                elements = (
                    None
                    if expr == "id" or not expr.startswith("json_extract")
                    else (f"json_each(doc, '{_path(_plain(field))}')")
                )
                for op, value in cond.items():
                    if op == "$options":
                        continue  # read with $regex
                    if op == "$regex":
                        clause, more = _contains(expr, value, cond.get("$options", ""))
                    else:
                        clause, more = _condition(expr, op, value, elements)
                    clauses.append(clause)
                    params.extend(more)
            elif cond is None:
                clauses.append(f"{expr} IS NULL")
            else:
                clauses.append(f"{expr} = ?")
                params.append(_param(cond))
        return (" AND ".join(clauses) or "1"), params

    def _select(
        self,
        query: Mapping[str, Any] | None,
        sort: Sequence[tuple[str, int]] = (),
        skip: int = 0,
        limit: int = 0,
        columns: str = "id, doc",
        hint: Sequence[tuple[str, int]] = (),
        max_ms: int | None = None,
    ) -> list[tuple[str, str]]:
        where, params = self._where(query)
        source = self._source(hint)
        order = ""
        if sort:
            order = " ORDER BY " + ", ".join(
                f"{self._expr(f)} {'DESC' if d == DESCENDING else 'ASC'}" for f, d in sort
            )
        page = ""
        if limit or skip:
            page = " LIMIT ? OFFSET ?"
            params += [limit if limit else -1, skip]
        if hint and order and page:
            # The page's ids first, sorted with what the index holds, then only their
            # documents read: sorting 125,000 matches of a name's index with their
            # documents took 1.3 s, their ids 30 ms (a test of a field outside the index
            # still reads each candidate's document).
            sql = (
                f"SELECT {columns} FROM {self._table} WHERE id IN "
                f"(SELECT id FROM {source} WHERE {where}{order}{page}){order}"
            )
        else:
            sql = f"SELECT {columns} FROM {source} WHERE {where}{order}{page}"
        with self._deadline(max_ms, "the query"):
            return self.database.conn.execute(sql, params).fetchall()

    @contextmanager
    def _deadline(self, max_ms: int | None, what: str) -> Iterator[None]:
        """A statement stopped at ``max_ms`` (``TimedOut``, as MongoDB's
        ``ExecutionTimeout``): the store answers on the event loop's thread, and a
        statement no index serves would hold the whole process meanwhile."""
        if max_ms is None:
            yield
            return
        conn = self.database.conn
        deadline = time.perf_counter() + max_ms / 1000
        # Asked every thousand steps of SQLite's machine (some tens of microseconds).
        conn.set_progress_handler(lambda: time.perf_counter() > deadline, 1000)
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "interrupt" not in str(exc):
                raise
            raise TimedOut(f"{self.name}: {what} took over {max_ms} ms") from None
        finally:
            conn.set_progress_handler(None, 0)

    async def find_one(
        self, query: Mapping[str, Any] | None = None, projection: Any = None
    ) -> dict[str, Any] | None:
        rows = self._select(query, limit=1)
        return project(_load(rows[0]), projection) if rows else None

    def find(self, query: Mapping[str, Any] | None = None, projection: Any = None) -> SqliteCursor:
        return SqliteCursor(self, query, projection)

    async def count_documents(
        self,
        query: Mapping[str, Any] | None = None,
        *,
        limit: int = 0,
        maxTimeMS: int | None = None,  # noqa: N803 - pymongo's name
        hint: Sequence[tuple[str, int]] = (),
    ) -> int:
        """As pymongo's: ``limit`` counts at most that many (the walk stops there);
        ``maxTimeMS`` stops a count that takes longer (``TimedOut``; ``_deadline``);
        ``hint`` names the index to walk, as ``SqliteCursor.hint``."""
        where, params = self._where(query)
        source = self._source(hint)
        sql = f"SELECT count(*) FROM {source} WHERE {where}"
        if limit:
            sql = f"SELECT count(*) FROM (SELECT 1 FROM {source} WHERE {where} LIMIT ?)"
            params.append(limit)
        with self._deadline(maxTimeMS, "the count"):
            return int(self.database.conn.execute(sql, params).fetchone()[0])

    # -- writes ---------------------------------------------------------------------------

    async def insert_one(self, document: Mapping[str, Any]) -> InsertOneResult:
        doc_id = _id_of(document)
        try:
            with self.database.transaction():
                self.database.conn.execute(
                    f"INSERT INTO {self._table} (id, doc) VALUES (?, ?)",
                    (doc_id, _dumps(document)),
                )
        except sqlite3.IntegrityError as exc:
            raise DuplicateKey(f"{self.name}: _id {doc_id!r} exists") from exc
        return InsertOneResult(doc_id)

    async def replace_one(
        self, query: Mapping[str, Any], document: Mapping[str, Any], upsert: bool = False
    ) -> UpdateResult:
        if any(str(k).startswith("$") for k in document):
            raise Unsupported("replace_one takes a whole document, not operators")
        with self.database.transaction():
            rows = self._select(query, limit=1)
            if not rows:
                if not upsert:
                    return UpdateResult(0, 0)
                doc = {**upsert_base(query), **document}
                self._insert(doc)
                return UpdateResult(0, 0, _id_of(doc))
            doc_id, old = rows[0]
            new = {**dict(document), "_id": doc_id}
            if "_id" in document and document["_id"] != doc_id:
                raise Unsupported("replace_one cannot change a document's _id")
            text = _dumps(new)
            if text == old:
                return UpdateResult(1, 0)
            self._store(doc_id, text)
            return UpdateResult(1, 1)

    async def update_one(
        self, query: Mapping[str, Any], update: Mapping[str, Any], upsert: bool = False
    ) -> UpdateResult:
        return self._update(query, update, upsert, many=False)

    async def update_many(
        self, query: Mapping[str, Any], update: Mapping[str, Any], upsert: bool = False
    ) -> UpdateResult:
        return self._update(query, update, upsert, many=True)

    async def delete_one(self, query: Mapping[str, Any]) -> DeleteResult:
        with self.database.transaction():
            rows = self._select(query, limit=1)
            if not rows:
                return DeleteResult(0)
            self.database.conn.execute(f"DELETE FROM {self._table} WHERE id = ?", (rows[0][0],))
        return DeleteResult(1)

    def _update(
        self, query: Mapping[str, Any], update: Mapping[str, Any], upsert: bool, many: bool
    ) -> UpdateResult:
        if not update or not all(str(k).startswith("$") for k in update):
            raise Unsupported("an update is operators ($set, ...), not a document")
        sets = _top_level_sets(update)
        with self.database.transaction():
            # With a $set that json_set can apply, a document's text is read only where
            # it cannot: text that is not strict JSON (a NaN or an Infinity _dumps wrote).
            rows: Sequence[tuple[str, str | None]] = self._select(
                query,
                limit=0 if many else 1,
                columns="id, doc" if sets is None else f"id, {_UNLESS_STRICT_JSON}",
            )
            if not rows:
                if not upsert:
                    return UpdateResult(0, 0)
                doc = apply_update(copy.deepcopy(upsert_base(query)), update)
                self._insert(doc)
                return UpdateResult(0, 0, _id_of(doc))
            modified = 0
            if sets is not None:
                modified = self._set_in_place([i for i, text in rows if text is None], sets)
            for doc_id, old in rows:
                if old is None:
                    continue
                new = apply_update(decode(json.loads(old)), update)
                if new.get("_id") != doc_id:
                    raise Unsupported("an update cannot change a document's _id")
                text = _dumps(new)
                if text != old:
                    self._store(doc_id, text)
                    modified += 1
            return UpdateResult(len(rows), modified)

    def _set_in_place(self, ids: list[str], sets: list[tuple[str, str]]) -> int:
        """``$set`` of top-level fields by SQLite's ``json_set`` on the stored text: the
        document is neither decoded nor encoded whole (a status job's view, a few kB
        with its spec, was both on every change of its state). ``json_set`` keeps the
        text of what it does not touch and puts a new field last, as ``_dumps`` of the
        decoded document would write it: the same text either way
        (tests/unit/test_docstore_set_in_place.py), so "modified" means the same.
        Returns how many it modified."""
        if not ids:
            return 0
        setter = "json_set(doc, " + ", ".join("?, json(?)" for _ in sets) + ")"
        args = [part for pair in sets for part in pair]
        cursor = self.database.conn.executemany(
            f"UPDATE {self._table} SET doc = {setter} WHERE id = ? AND doc IS NOT {setter}",
            [(*args, doc_id, *args) for doc_id in ids],
        )
        return int(cursor.rowcount)

    def _insert(self, doc: Mapping[str, Any]) -> None:
        self.database.conn.execute(
            f"INSERT INTO {self._table} (id, doc) VALUES (?, ?)", (_id_of(doc), _dumps(doc))
        )

    def _store(self, doc_id: str, text: str) -> None:
        self.database.conn.execute(f"UPDATE {self._table} SET doc = ? WHERE id = ?", (text, doc_id))


class SqliteCursor:
    """``find``'s answer: ``sort``/``skip``/``limit`` chain, then ``async for``; the
    query runs when it is first read."""

    def __init__(
        self, collection: SqliteCollection, query: Mapping[str, Any] | None, projection: Any
    ) -> None:
        self._collection = collection
        self._query = query
        self._projection = projection
        self._sort: list[tuple[str, int]] = []
        self._skip = 0
        self._limit = 0
        self._hint: list[tuple[str, int]] = []
        self._max_ms: int | None = None

    def sort(
        self, key: str | Sequence[tuple[str, int]], direction: int = ASCENDING
    ) -> SqliteCursor:
        self._sort = [(key, direction)] if isinstance(key, str) else list(key)
        return self

    def skip(self, n: int) -> SqliteCursor:
        self._skip = n
        return self

    def limit(self, n: int) -> SqliteCursor:
        self._limit = n
        return self

    def hint(self, index: Sequence[tuple[str, int]]) -> SqliteCursor:
        """Read through the index ``create_index`` made with these keys, as pymongo's
        ``hint``: for a query whose best index depends on the data, which a planner
        without statistics cannot know (SQLite's estimates ignore how many documents
        a range holds)."""
        self._hint = list(index)
        return self

    def max_time_ms(self, ms: int) -> SqliteCursor:
        """As pymongo's: a query running longer stops (``TimedOut`` when read)."""
        self._max_ms = ms
        return self

    def _documents(self) -> list[dict[str, Any]]:
        rows = self._collection._select(
            self._query, self._sort, self._skip, self._limit, hint=self._hint, max_ms=self._max_ms
        )
        return [project(_load(row), self._projection) for row in rows]

    def __aiter__(self) -> _AsyncList:
        return _AsyncList(self._documents())


class _AsyncList:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self._items = iter(items)

    def __aiter__(self) -> _AsyncList:
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None


# --- the pure parts ---------------------------------------------------------------------


def _condition(
    expr: str, op: str, value: Any, elements: str | None = None
) -> tuple[str, list[Any]]:
    comparisons = {"$lt": "<", "$lte": "<=", "$gt": ">", "$gte": ">="}
    if op in comparisons:
        if value is None:
            raise Unsupported(f"{op} null")
        return f"{expr} {comparisons[op]} ?", [_param(value)]
    if op == "$ne":
        if value is None:  # spelled out, so an index on the field serves it
            return f"{expr} IS NOT NULL", []
        # Like MongoDB: a missing field is "not equal" to any value.
        return f"{expr} IS NOT ?", [_param(value)]
    if op in ("$in", "$nin"):
        if not isinstance(value, list | tuple | set | frozenset):
            raise Unsupported(f"{op} needs a list")
        values = [_param(v) for v in value if v is not None]
        has_null = any(v is None for v in value)
        marks = ", ".join("?" * len(values))
        inside = f"{expr} IN ({marks})" if values else "0"
        if elements is not None and values:
            inside = f"EXISTS (SELECT 1 FROM {elements} WHERE value IN ({marks}))"
        if op == "$in":
            return (f"({inside} OR {expr} IS NULL)" if has_null else inside), values
        # $nin matches a missing field unless null is among the values.
        if has_null:
            return f"({expr} IS NOT NULL AND NOT {inside})", values
        return f"({expr} IS NULL OR NOT {inside})", values
    raise Unsupported(f"query operator {op}")


_LITERAL = re.compile(r"(?:\\.|[^\\.^$*+?()\[\]{}|])*")


def _contains(expr: str, pattern: Any, options: Any) -> tuple[str, list[Any]]:
    """``$regex`` of a literal (``re.escape``'d) pattern, ``$options`` "" or "i": the
    substring searches the services make. Any other pattern is refused."""
    if not isinstance(pattern, str) or not _LITERAL.fullmatch(pattern) or options not in ("", "i"):
        raise Unsupported("$regex other than an escaped literal (options '' or 'i')")
    literal = re.sub(r"\\(.)", r"\1", pattern)
    if options == "i":
        return f"instr(lower({expr}), lower(?)) > 0", [literal]
    return f"instr({expr}, ?) > 0", [literal]


def apply_update(doc: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``update``'s operators applied to ``doc`` (decoded, the caller's own copy)."""
    out = doc
    for op, fields in update.items():
        if not isinstance(fields, Mapping):
            raise Unsupported(f"{op} takes a document of fields")
        for field, value in fields.items():
            parent, last = _parent(out, field, create=op not in ("$unset", "$pull"))
            if parent is None:
                continue
            if op == "$set":
                parent[last] = value
            elif op == "$unset":
                parent.pop(last, None)
            elif op == "$inc":
                if not isinstance(value, int | float):
                    raise Unsupported("$inc takes a number")
                parent[last] = parent.get(last, 0) + value
            elif op in ("$push", "$addToSet"):
                items = parent.setdefault(last, [])
                if not isinstance(items, list):
                    raise Unsupported(f"{op} on {field}: not an array")
                if isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
                    raise Unsupported(f"{op} modifiers ($each, ...)")
                if op == "$push" or encode(value) not in [encode(i) for i in items]:
                    items.append(value)
            elif op == "$pull":
                items = parent.get(last)
                if items is None:
                    continue
                if not isinstance(items, list) or isinstance(value, Mapping):
                    raise Unsupported(f"$pull on {field}: an array and a value to remove")
                parent[last] = [i for i in items if encode(i) != encode(value)]
            else:
                raise Unsupported(f"update operator {op}")
    return out


def _parent(doc: dict[str, Any], field: str, create: bool) -> tuple[dict[str, Any] | None, str]:
    parts = field.split(".")
    node: Any = doc
    for part in parts[:-1]:
        if not isinstance(node, dict):
            raise Unsupported(f"{field}: a path through a non-document")
        if part not in node:
            if not create:
                return None, parts[-1]
            node[part] = {}
        node = node[part]
    if not isinstance(node, dict):
        raise Unsupported(f"{field}: a path through a non-document")
    return node, parts[-1]


# A row's text where it is not strict JSON (RFC 8259: json_set would refuse it, or on
# SQLite 3.45 and later read a NaN as null), else NULL.
_UNLESS_STRICT_JSON = "CASE WHEN json_valid(doc) THEN NULL ELSE doc END"


def _top_level_sets(update: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """An update that is only ``$set`` of plain top-level fields (not ``_id``) as
    (JSON path, value as JSON) pairs, for ``json_set``; None for any other update (or a
    value JSON cannot hold: NaN), which is applied to the decoded document instead."""
    if len(update) != 1 or not isinstance(fields := update.get("$set"), Mapping) or not fields:
        return None
    sets = []
    for field, value in fields.items():
        if not isinstance(field, str) or field == "_id" or "." in field or not _NAME.match(field):
            return None
        try:
            text = _TO_STRICT_TEXT(encode(value))
        except (ValueError, TypeError):  # the other way says it, if a document matches
            return None
        sets.append((_path(field), text))
    return sets


def upsert_base(query: Mapping[str, Any]) -> dict[str, Any]:
    """The equality fields of an upsert's query, as MongoDB seeds the new document."""
    return {
        k: v
        for k, v in query.items()
        if not (isinstance(v, Mapping) and any(str(o).startswith("$") for o in v))
    }


def _id_of(doc: Mapping[str, Any]) -> str:
    doc_id = doc.get("_id")
    if not isinstance(doc_id, str):
        raise Unsupported("documents here need a string _id")
    return doc_id


def _load(row: tuple[str, str]) -> dict[str, Any]:
    doc: dict[str, Any] = decode(json.loads(row[1]))
    return doc


def project(doc: dict[str, Any], projection: Any) -> dict[str, Any]:
    if not projection:
        return doc
    fields = dict.fromkeys(projection, 1) if isinstance(projection, list) else dict(projection)
    include = {k for k, v in fields.items() if v and k != "_id"}
    if include:
        keep = include | ({"_id"} if fields.get("_id", 1) else set())
        return {k: v for k, v in doc.items() if k in keep}
    drop = {k for k, v in fields.items() if not v}
    return {k: v for k, v in doc.items() if k not in drop}
