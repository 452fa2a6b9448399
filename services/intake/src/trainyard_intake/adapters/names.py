"""Job names, claimed at submission so a used name is answered at once (409 in the
dialect's own shape) instead of being rejected later.

A claim is one document per user and dialect key (OpenPAI ``user~jobName``, a
Kubernetes-style ``namespace/plural/name``, a TI ``cluster/name``) whose ``_id`` is that
pair, so the store's unique key does the locking across intake replicas. It holds the job
that owns the name and, for the Kubernetes-style kinds, the resource as it now is (what a
PATCH or PUT applies to) with its ``generation``. A claim lasts as long as the platform it
imitates keeps the name: for ever on OpenPAI (finished jobs keep theirs), until the
resource is deleted on the Kubernetes-style APIs, until the job is deleted on TI. A job
rejected after its 202 (the checks against the cluster, which intake cannot make on
Kubernetes) gives its name back, but a Kubernetes-style resource's
(handlers.release_rejected_name).

A change of the resource is kept with what it asks of the job (the commands and its
``JobResourceChanged``) as the claim's ``pending`` messages, in the one conditional update
(on the claim's ``revision``, which every change moves on) that stores it; they are cleared
once they are on the bus. A change whose publishing failed or was cut short (a crash, the
bus down) leaves them there, and the next write of the resource, even one that changes
nothing (the client's retry), sends them first: their ids derive from the job and the
revision, so what had gone out already is a duplicate JetStream drops."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pymongo import ASCENDING

from trainyard_common.events import Event, decode
from trainyard_common.storage import Collection, insert_once


@dataclass(frozen=True)
class Claim:
    job_id: str
    resource: dict[str, Any] | None
    generation: int
    key: str = ""
    # Moves on with every change of the resource: what a change is conditional on.
    revision: int = 0
    # Messages a change stored and that may not be on the bus yet, oldest first.
    pending: tuple[Event, ...] = ()


def outlives_its_job(key: str) -> bool:
    """Whether the name is a Kubernetes-style resource's (``ns/plural/name``), which
    stays, its job rejected or ended, until it is deleted; OpenPAI's ``jobName`` and TI's
    ``cluster/name`` are only their jobs'."""
    return key.count("/") == 2


def scope_of(key: str) -> str:
    """What a key names its job within: ``ns/plural`` of ``ns/plural/name``."""
    return key.rpartition("/")[0]


class NameClaims(Protocol):
    async def claim(self, user: str, key: str, job_id: str, resource: dict[str, Any] | None) -> str:
        """Claim ``key`` for ``job_id``; returns the job holding it (``job_id`` itself
        when the claim is made or was already this job's)."""
        ...

    async def get(self, user: str, key: str) -> Claim | None: ...

    async def within(self, user: str, scope: str) -> list[Claim]:
        """The user's claims whose key is ``scope/<name>`` (a namespace's resources of
        one kind), by key."""
        ...

    async def update(
        self,
        user: str,
        key: str,
        job_id: str,
        resource: dict[str, Any],
        generation: int,
        *,
        revision: int,
        pending: Sequence[Event],
    ) -> bool:
        """Keep ``resource`` as the claim's, with the messages still to send, only while
        ``job_id`` holds it at ``revision`` (as read); the revision moves on by one."""
        ...

    async def sent(
        self,
        user: str,
        key: str,
        job_id: str,
        revision: int,
        sending: Sequence[Event],
        left: Sequence[Event] = (),
    ) -> bool:
        """``sending`` (the pending messages as this writer read or stored them) are on
        the bus but ``left``: keep only those, only while the claim is at ``revision``
        and still holds ``sending`` (a later change keeps them with its own, to send
        them itself; another writer that sent them meanwhile cleared them, and a late
        answer here must not bring them back to be sent again)."""
        ...

    async def release(self, user: str, key: str, job_id: str) -> bool:
        """Free the name, only if ``job_id`` holds it."""
        ...


def _id(user: str, key: str) -> str:
    # Neither part holds a newline (a user name is a token's, a key is ns/plural/name).
    return f"{user}\n{key}"


class DocNameClaims:
    def __init__(self, collection: Collection) -> None:
        self._claims = collection

    async def claim(self, user: str, key: str, job_id: str, resource: dict[str, Any] | None) -> str:
        # A claim seen by the insert may be released before the read: then try again.
        for _ in range(3):
            document = {
                "_id": _id(user, key),
                "user": user,
                "key": key,
                "scope": scope_of(key),
                "job_id": job_id,
                # As JSON text: keys such as nvidia.com/gpu hold dots, which a document
                # store may refuse as field names.
                "resource_json": None if resource is None else json.dumps(resource),
                "generation": 1,
                "revision": 0,
                "pending_json": None,
            }
            if await insert_once(self._claims, document):
                return job_id
            held = await self._claims.find_one({"_id": _id(user, key)}, {"job_id": 1})
            if held is not None:
                return str(held["job_id"])
        raise RuntimeError(f"the claim of {key!r} kept changing hands: try again")

    async def ensure_indexes(self) -> None:
        await self._claims.create_index([("user", ASCENDING), ("scope", ASCENDING)])

    async def get(self, user: str, key: str) -> Claim | None:
        doc = await self._claims.find_one({"_id": _id(user, key)})
        return None if doc is None else _claim(doc)

    async def within(self, user: str, scope: str) -> list[Claim]:
        cursor = self._claims.find({"user": user, "scope": scope}).sort([("key", ASCENDING)])
        return [_claim(doc) async for doc in cursor]

    async def update(
        self,
        user: str,
        key: str,
        job_id: str,
        resource: dict[str, Any],
        generation: int,
        *,
        revision: int,
        pending: Sequence[Event],
    ) -> bool:
        done = await self._claims.update_one(
            {"_id": _id(user, key), "job_id": job_id, "revision": _at(revision)},
            {
                "$set": {
                    "resource_json": json.dumps(resource),
                    "generation": generation,
                    "revision": revision + 1,
                    "pending_json": _pending_json(pending),
                }
            },
        )
        return bool(done.matched_count)

    async def sent(
        self,
        user: str,
        key: str,
        job_id: str,
        revision: int,
        sending: Sequence[Event],
        left: Sequence[Event] = (),
    ) -> bool:
        done = await self._claims.update_one(
            {
                "_id": _id(user, key),
                "job_id": job_id,
                "revision": _at(revision),
                "pending_json": _pending_json(sending),
            },
            {"$set": {"pending_json": _pending_json(left)}},
        )
        return bool(done.matched_count)

    async def release(self, user: str, key: str, job_id: str) -> bool:
        done = await self._claims.delete_one({"_id": _id(user, key), "job_id": job_id})
        return bool(done.deleted_count)


def _at(revision: int) -> Any:
    # A claim stored by an earlier version has no revision: it is at 0.
    return revision if revision else {"$in": [0, None]}


def _pending_json(pending: Sequence[Event]) -> str | None:
    # As JSON text, as the resource is (dotted keys).
    return json.dumps([e.model_dump(mode="json") for e in pending]) if pending else None


def _claim(doc: dict[str, Any]) -> Claim:
    text = doc.get("resource_json")
    pending = doc.get("pending_json")
    return Claim(
        str(doc["job_id"]),
        json.loads(text) if text else None,
        int(doc.get("generation") or 1),
        str(doc.get("key") or ""),
        int(doc.get("revision") or 0),
        tuple(decode(e) for e in json.loads(pending)) if pending else (),
    )


class InMemoryNameClaims:
    """The same contract in a dict, for unit tests of handlers."""

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}

    async def claim(self, user: str, key: str, job_id: str, resource: dict[str, Any] | None) -> str:
        held = self.claims.setdefault(_id(user, key), Claim(job_id, resource, 1, key))
        return held.job_id

    async def get(self, user: str, key: str) -> Claim | None:
        return self.claims.get(_id(user, key))

    async def within(self, user: str, scope: str) -> list[Claim]:
        prefix = _id(user, scope + "/")
        return [
            c
            for i, c in sorted(self.claims.items())
            if i.startswith(prefix) and scope_of(c.key) == scope
        ]

    async def update(
        self,
        user: str,
        key: str,
        job_id: str,
        resource: dict[str, Any],
        generation: int,
        *,
        revision: int,
        pending: Sequence[Event],
    ) -> bool:
        held = self.claims.get(_id(user, key))
        if held is None or held.job_id != job_id or held.revision != revision:
            return False
        self.claims[_id(user, key)] = Claim(
            job_id, resource, generation, key, revision + 1, tuple(pending)
        )
        return True

    async def sent(
        self,
        user: str,
        key: str,
        job_id: str,
        revision: int,
        sending: Sequence[Event],
        left: Sequence[Event] = (),
    ) -> bool:
        held = self.claims.get(_id(user, key))
        if (
            held is None
            or held.job_id != job_id
            or held.revision != revision
            or held.pending != tuple(sending)
        ):
            return False
        self.claims[_id(user, key)] = replace(held, pending=tuple(left))
        return True

    async def release(self, user: str, key: str, job_id: str) -> bool:
        held = self.claims.get(_id(user, key))
        if held is None or held.job_id != job_id:
            return False
        del self.claims[_id(user, key)]
        return True
