"""A consumer's fetched batch as one unit of work on MongoDB (``bus.Atomic``): its
writes go to the store as a few bounded, ordered ``bulk_write`` commands once the batch
is handled, and its messages are acked after that.

MongoDB (and FerretDB v1) give no transaction here (DESIGN §7), so a batch is held in
the process instead: inside it, the collections of a ``BatchedDatabase`` answer a read
by ``_id`` from what the batch has already read or written (each document read from the
store once per batch: an identity map) and keep each write by ``_id``, applied to that
copy and queued for the store (``docstore.apply_update``, the embedded store's own
update rules). Anything else (a write by another filter, a count, the rest of the
API) sends what is queued first and then goes to the store as it is; a query cursor
(``find``) with writes queued is refused, never answered stale, and so is a task
started inside the batch that uses its collections.

- A message's writes are undone alone when its handler fails (``savepoint``), as the
  embedded store's savepoints do: its queued writes are dropped and the copies it
  changed restored. Had a barrier (above) sent some of them already, those stay, as
  every write on MongoDB outside a batch does; the handlers' writes are all safe to
  repeat, and the message is redelivered.
- The guards stay in the update filters that go to the store, so another replica
  writing the same documents meanwhile is still safe. An insert that meets a document
  another replica made since the batch read fails the bulk write: the whole batch is
  then redelivered, and its handlers see that document.
- Writes to different documents may be sent in another order than made (``inserts_first``):
  a collection with a unique key other than ``_id`` is not for a batch (the status
  views, its one user, declare none).
- Each command carries at most ``MAX_OPS`` writes: FerretDB v1 never answers an update
  command of 50 statements or more (DESIGN §7).

Only the task that opened a batch sees it (a context variable, and the task it names):
the same collections serve the service's HTTP reads meanwhile, straight from the store."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from pymongo import DeleteOne, InsertOne, ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError
from pymongo.results import DeleteResult, InsertOneResult, UpdateResult

from .docstore import Unsupported, apply_update, project, upsert_base

# Writes per bulk_write command (FerretDB v1 hangs at 50 statements).
MAX_OPS = 40

Key = tuple[str, Any]  # (collection, _id)
WriteOp = InsertOne[Any] | UpdateOne | ReplaceOne[Any] | DeleteOne
_UNREAD = object()  # a journal's mark: the batch had not read this document before
_NO_ID = object()  # a filter that names no one document by its _id


class _Work:
    """One batch: the documents read or written (None: known absent), the writes
    queued, and a journal per open savepoint of each copy's value before it."""

    def __init__(self, database: BatchedDatabase) -> None:
        self.database = database
        self.owner = asyncio.current_task()
        self.docs: dict[Key, dict[str, Any] | None] = {}
        self.queued: list[tuple[str, Any, WriteOp]] = []  # (collection, _id, write)
        self.flushes = 0
        self.journals: list[dict[Key, Any]] = []
        self.unstored: BaseException | None = None  # a flush that failed

    def put(self, key: Key, doc: dict[str, Any] | None) -> None:
        if self.journals and key not in self.journals[-1]:
            self.journals[-1][key] = self.docs.get(key, _UNREAD)
        self.docs[key] = doc

    async def load(self, collection: str, doc_id: Any) -> dict[str, Any] | None:
        key = (collection, doc_id)
        if key not in self.docs:
            raw = AsyncCollection(self.database, collection)
            self.put(key, await raw.find_one({"_id": doc_id}))
        return self.docs[key]

    async def preload(self, collection: str, ids: Iterable[Any]) -> None:
        """Read in one query the documents of ``ids`` this batch has not read yet. An
        ``_id`` with a write queued always has its copy (each write reads first), so
        nothing read here can miss a queued write."""
        missing = list(dict.fromkeys(i for i in ids if (collection, i) not in self.docs))
        if not missing:
            return
        raw: AsyncCollection[Any] = AsyncCollection(self.database, collection)
        found = {doc["_id"]: doc async for doc in raw.find({"_id": {"$in": missing}})}
        for doc_id in missing:
            self.put((collection, doc_id), found.get(doc_id))

    def forget(self, collection: str) -> None:
        """Drop the copies of ``collection`` (after a write the batch could not follow;
        always after a flush, so a savepoint undone later drops every copy anyway)."""
        for key in [k for k in self.docs if k[0] == collection]:
            del self.docs[key]

    async def flush(self) -> None:
        """Send what is queued: per collection, each document's writes in the order
        made, ``MAX_OPS`` a command. A failure raises (the caller's batch is then
        redelivered)."""
        if not self.queued:
            return
        queued, self.queued = self.queued, []
        self.flushes += 1
        per_collection: dict[str, list[tuple[Any, WriteOp]]] = {}
        for name, doc_id, op in queued:
            per_collection.setdefault(name, []).append((doc_id, op))
        try:
            for name, writes in per_collection.items():
                ops = inserts_first(writes)
                raw: AsyncCollection[Any] = AsyncCollection(self.database, name)
                for start in range(0, len(ops), MAX_OPS):
                    await raw.bulk_write(ops[start : start + MAX_OPS], ordered=True)
        except BaseException as exc:
            # Earlier messages' writes may be among those not stored: the whole batch
            # fails, even when the message that sent them only fails itself.
            self.unstored = exc
            raise


def inserts_first(writes: list[tuple[Any, WriteOp]]) -> list[WriteOp]:
    """The writes with every insert that is its document's first write moved to the
    front; each document's own writes keep their order. Writes to different documents
    commute (each filter names one ``_id``; a unique key besides ``_id`` would make
    them not: none in a batched collection, see the module's docstring). An ordered
    bulk write sends one command per run of one kind of write: a batch of new jobs'
    inserts and updates goes as two runs this way, not two per job."""
    seen: set[Any] = set()
    front: list[WriteOp] = []
    rest: list[WriteOp] = []
    for doc_id, op in writes:
        (front if isinstance(op, InsertOne) and doc_id not in seen else rest).append(op)
        seen.add(doc_id)
    return front + rest


_current: ContextVar[_Work | None] = ContextVar("trainyard_mongo_batch", default=None)


def _running(database: AsyncDatabase[Any]) -> _Work | None:
    """The batch this task opened on ``database``, if any. A task started inside a
    batch inherits the context variable, not the batch: its reads and writes would go
    around the batch's queue, so it is refused."""
    work = _current.get()
    if work is None or work.database is not database:
        return None
    if work.owner is not asyncio.current_task():
        raise RuntimeError("a task started inside a batch uses its collections")
    return work


class BatchedDatabase(AsyncDatabase[dict[str, Any]]):
    """A MongoDB database whose collections join the running task's batch, if any
    (``MongoBatches``); outside one they are plain ``AsyncCollection``s."""

    def __getitem__(self, name: str) -> BatchedCollection:
        return BatchedCollection(self, name)


def batched(database: AsyncDatabase[dict[str, Any]]) -> BatchedDatabase:
    return BatchedDatabase(
        database.client,
        database.name,
        codec_options=database.codec_options,
        read_preference=database.read_preference,
        write_concern=database.write_concern,
        read_concern=database.read_concern,
    )


def _plain_id(query: Mapping[str, Any]) -> Any:
    """The ``_id`` a query names by value, or _NO_ID."""
    doc_id = query.get("_id", _NO_ID)
    if isinstance(doc_id, Mapping | list):
        return _NO_ID
    return doc_id


class BatchedCollection(AsyncCollection[dict[str, Any]]):
    def _work(self) -> _Work | None:
        return _running(self.database)

    async def _barrier(self, work: _Work) -> None:
        await work.flush()
        work.forget(self.name)

    async def preload(self, ids: Iterable[Any]) -> None:
        """Inside a batch, read the documents of ``ids`` in one query, for the batch's
        reads by ``_id`` to find (one query instead of one per message: on FerretDB v1,
        one scan of the table instead of one per document); nothing outside one."""
        work = self._work()
        if work is not None:
            await work.preload(self.name, ids)

    async def find_one(self, filter: Any | None = None, *args: Any, **kwargs: Any) -> Any:
        work = self._work()
        by_id = isinstance(filter, Mapping) and len(filter) == 1
        doc_id = _plain_id(filter) if by_id and isinstance(filter, Mapping) else _NO_ID
        if work is None or doc_id is _NO_ID or len(args) > 1:
            if work is not None:
                await work.flush()
            return await super().find_one(filter, *args, **kwargs)
        projection = args[0] if args else kwargs.pop("projection", None)
        if kwargs:
            await work.flush()
            return await super().find_one(filter, projection, **kwargs)
        doc = await work.load(self.name, doc_id)
        return None if doc is None else project(copy.deepcopy(doc), projection)

    async def insert_one(self, document: Any, *args: Any, **kwargs: Any) -> InsertOneResult:
        work = self._work()
        if work is None or args or kwargs or "_id" not in document:
            if work is not None:
                await self._barrier(work)
            return await super().insert_one(document, *args, **kwargs)
        doc_id = document["_id"]
        if await work.load(self.name, doc_id) is not None:
            raise DuplicateKeyError(f"E11000 duplicate key error: _id {doc_id!r}", 11000)
        work.put((self.name, doc_id), copy.deepcopy(dict(document)))
        work.queued.append((self.name, doc_id, InsertOne(document)))
        return InsertOneResult(doc_id, True)

    async def update_one(
        self,
        filter: Mapping[str, Any],
        update: Any,
        upsert: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> UpdateResult:
        work = self._work()
        doc_id = _plain_id(filter)
        if work is None or doc_id is _NO_ID or args or kwargs or not isinstance(update, Mapping):
            if work is not None:
                await self._barrier(work)
            return await super().update_one(filter, update, upsert, *args, **kwargs)
        doc = await work.load(self.name, doc_id)
        new: dict[str, Any] | None = None
        try:
            if doc is not None and matches(doc, filter):
                new = apply_update(copy.deepcopy(doc), update)
            elif doc is None and upsert:
                new = apply_update(copy.deepcopy(upsert_base(filter)), update)
        except Unsupported:
            await self._barrier(work)
            return await super().update_one(filter, update, upsert)
        # Queued whatever the copy says: the store judges the filter again when it
        # gets it (another replica may have written since).
        work.queued.append((self.name, doc_id, UpdateOne(filter, update, upsert=upsert)))
        if new is None:
            return UpdateResult({"n": 0, "nModified": 0}, True)
        work.put((self.name, doc_id), new)
        if doc is None:
            return UpdateResult({"n": 1, "nModified": 0, "upserted": doc_id}, True)
        return UpdateResult({"n": 1, "nModified": int(new != doc)}, True)

    async def replace_one(
        self,
        filter: Mapping[str, Any],
        replacement: Mapping[str, Any],
        upsert: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> UpdateResult:
        work = self._work()
        doc_id = _plain_id(filter)
        if work is None or doc_id is _NO_ID or len(filter) != 1 or args or kwargs:
            if work is not None:
                await self._barrier(work)
            return await super().replace_one(filter, replacement, upsert, *args, **kwargs)
        doc = await work.load(self.name, doc_id)
        work.queued.append((self.name, doc_id, ReplaceOne(filter, replacement, upsert=upsert)))
        if doc is None and not upsert:
            return UpdateResult({"n": 0, "nModified": 0}, True)
        work.put((self.name, doc_id), {**copy.deepcopy(dict(replacement)), "_id": doc_id})
        if doc is None:
            return UpdateResult({"n": 1, "nModified": 0, "upserted": doc_id}, True)
        return UpdateResult({"n": 1, "nModified": 1}, True)

    async def delete_one(
        self, filter: Mapping[str, Any], *args: Any, **kwargs: Any
    ) -> DeleteResult:
        work = self._work()
        doc_id = _plain_id(filter)
        if work is None or doc_id is _NO_ID or len(filter) != 1 or args or kwargs:
            if work is not None:
                await self._barrier(work)
            return await super().delete_one(filter, *args, **kwargs)
        doc = await work.load(self.name, doc_id)
        work.queued.append((self.name, doc_id, DeleteOne(filter)))
        work.put((self.name, doc_id), None)
        return DeleteResult({"n": int(doc is not None)}, True)

    async def update_many(
        self,
        filter: Mapping[str, Any],
        update: Any,
        upsert: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> UpdateResult:
        result: UpdateResult = await self._write_around(
            "update_many", filter, update, upsert, *args, **kwargs
        )
        return result

    async def count_documents(self, filter: Mapping[str, Any], *args: Any, **kwargs: Any) -> int:
        count: int = await self._read_around("count_documents", filter, *args, **kwargs)
        return count

    # The rest of the API, inside a batch: what writes sends the queue first and drops
    # the copies after; what reads sends the queue first.

    async def _write_around(self, method: str, *args: Any, **kwargs: Any) -> Any:
        work = self._work()
        if work is not None:
            await work.flush()
        result = await getattr(super(), method)(*args, **kwargs)
        if work is not None:
            work.forget(self.name)
        return result

    async def _read_around(self, method: str, *args: Any, **kwargs: Any) -> Any:
        work = self._work()
        if work is not None:
            await work.flush()
        return await getattr(super(), method)(*args, **kwargs)

    async def insert_many(self, *args: Any, **kwargs: Any) -> Any:
        return await self._write_around("insert_many", *args, **kwargs)

    async def delete_many(self, *args: Any, **kwargs: Any) -> Any:
        return await self._write_around("delete_many", *args, **kwargs)

    async def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        return await self._write_around("bulk_write", *args, **kwargs)

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        return await self._write_around("find_one_and_update", *args, **kwargs)

    async def find_one_and_replace(self, *args: Any, **kwargs: Any) -> Any:
        return await self._write_around("find_one_and_replace", *args, **kwargs)

    async def find_one_and_delete(self, *args: Any, **kwargs: Any) -> Any:
        return await self._write_around("find_one_and_delete", *args, **kwargs)

    async def distinct(self, *args: Any, **kwargs: Any) -> Any:
        return await self._read_around("distinct", *args, **kwargs)

    async def aggregate(self, *args: Any, **kwargs: Any) -> Any:
        return await self._read_around("aggregate", *args, **kwargs)

    async def estimated_document_count(self, *args: Any, **kwargs: Any) -> Any:
        return await self._read_around("estimated_document_count", *args, **kwargs)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        work = self._work()
        if work is not None and work.queued:
            # A cursor reads later, outside any await here: it cannot be made to see
            # the queued writes. Refused rather than answered stale.
            raise RuntimeError(f"{self.name}: find() inside a batch with writes queued")
        return super().find(*args, **kwargs)


class MongoBatches:
    """``bus.Atomic`` for a ``BatchedDatabase``: ``transaction()`` holds a fetched
    batch, ``savepoint()`` one message of it."""

    def __init__(self, database: BatchedDatabase) -> None:
        self.database = database

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if _running(self.database) is not None:
            yield  # joined the batch already open
            return
        work = _Work(self.database)
        token = _current.set(work)
        try:
            yield
            if work.unstored is not None:
                raise RuntimeError("a write of this batch was not stored") from work.unstored
            await work.flush()
        finally:
            _current.reset(token)

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        work = _running(self.database)
        if work is None:
            async with self.transaction():
                yield
            return
        mark, flushes = len(work.queued), work.flushes
        work.journals.append({})
        try:
            yield
        except BaseException:
            journal = work.journals.pop()
            if work.flushes == flushes:
                del work.queued[mark:]
                for key, before in journal.items():
                    if before is _UNREAD:
                        work.docs.pop(key, None)
                    else:
                        work.docs[key] = before
            else:
                # A barrier inside sent what was queued before it: all still queued is
                # this message's own. Dropped, and every copy read again.
                work.queued.clear()
                work.docs.clear()
            raise
        journal = work.journals.pop()
        if work.journals:
            for key, before in journal.items():
                work.journals[-1].setdefault(key, before)


# -- a query's filter, evaluated on a copy ---------------------------------------------------

_ORDERED = (int, float, str, datetime)


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """Whether ``doc`` answers ``query`` (field equality and $eq, $ne, $lt, $lte, $gt,
    $gte, $in, $nin on top-level and dotted fields); Unsupported for anything else, and
    for an order comparison of a missing field or of values MongoDB would order by type."""
    for field, condition in query.items():
        if field.startswith("$"):
            raise Unsupported(f"query operator {field}")
        value = _get(doc, field)
        if isinstance(condition, Mapping) and any(str(k).startswith("$") for k in condition):
            if not all(_test(value, op, arg) for op, arg in condition.items()):
                return False
        elif not _test(value, "$eq", condition):
            return False
    return True


_MISSING = object()


def _get(doc: Mapping[str, Any], field: str) -> Any:
    node: Any = doc
    for part in field.split("."):
        if isinstance(node, list):
            raise Unsupported(f"{field}: a path through an array")
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _test(value: Any, op: str, arg: Any) -> bool:
    if isinstance(value, list):
        raise Unsupported(f"{op} on an array field (MongoDB matches its elements)")
    present = None if value is _MISSING else value
    if op == "$eq":
        return bool(present == arg)
    if op == "$ne":
        return bool(present != arg)
    if op in ("$in", "$nin"):
        if not isinstance(arg, list) or isinstance(present, list):
            raise Unsupported(f"{op} of a list, on a field that is not one")
        return (present in arg) == (op == "$in")
    if op in ("$lt", "$lte", "$gt", "$gte"):
        comparable = isinstance(value, _ORDERED) and isinstance(arg, _ORDERED)
        if not comparable or isinstance(value, str) != isinstance(arg, str):
            raise Unsupported(f"{op} between {type(value).__name__} and {type(arg).__name__}")
        if isinstance(value, datetime) != isinstance(arg, datetime):
            raise Unsupported(f"{op} between a date and a number")
        if op == "$lt":
            return bool(value < arg)
        if op == "$lte":
            return bool(value <= arg)
        if op == "$gt":
            return bool(value > arg)
        return bool(value >= arg)
    raise Unsupported(f"query operator {op}")
