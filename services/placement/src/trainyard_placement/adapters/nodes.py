"""Node changes an administrator made through the API, in placement's own database
(collection ``nodes``): one document per node name, its latest state only.

``{_id: name, state: ready|drained|removed, spec, added_at}``; ``spec`` (a NodeSpec as a
JSON string) is set for a node added through the API and absent for a node of the
cluster file. At start the records are applied over the configured cluster in a fixed
order (``handlers``-independent, see ``node_admin.apply_records``), so a restart
rebuilds the same cluster. Only the leader writes, one change at a time, so a plain
upsert per node is enough.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from trainyard_common.cluster import NodeSpec
from trainyard_common.storage import Collection

NodeState = Literal["ready", "drained", "removed"]


@dataclass(frozen=True)
class NodeRecord:
    name: str
    state: NodeState
    # Set for a node added through the API; None for a node of the cluster file.
    spec: NodeSpec | None = None
    # When it was added through the API: added nodes follow the configured ones in
    # this order.
    added_at: datetime | None = None


def record_from_doc(doc: dict[str, Any]) -> NodeRecord:
    spec = doc.get("spec")
    return NodeRecord(
        name=doc["_id"],
        state=doc["state"],
        spec=NodeSpec.model_validate_json(spec) if spec else None,
        added_at=doc.get("added_at"),
    )


def record_doc(record: NodeRecord) -> dict[str, Any]:
    return {
        "_id": record.name,
        "state": record.state,
        "spec": record.spec.model_dump_json() if record.spec else None,
        "added_at": record.added_at,
    }


def in_order(records: list[NodeRecord]) -> list[NodeRecord]:
    """Added nodes by the time they were added, the rest by name (their order does not
    matter: they change nodes the cluster file already placed)."""
    return sorted(records, key=lambda r: (r.added_at is not None, r.added_at or 0, r.name))


class NodeStore(Protocol):
    async def all(self) -> list[NodeRecord]:
        """Every recorded change, in the order :func:`in_order` gives."""

    async def get(self, name: str) -> NodeRecord | None: ...

    async def put(self, record: NodeRecord) -> None:
        """Store the node's latest state, replacing what was recorded for it."""


class DocNodeStore:
    def __init__(self, collection: Collection) -> None:
        self._nodes = collection

    async def all(self) -> list[NodeRecord]:
        return in_order([record_from_doc(doc) async for doc in self._nodes.find({})])

    async def get(self, name: str) -> NodeRecord | None:
        doc = await self._nodes.find_one({"_id": name})
        return record_from_doc(doc) if doc else None

    async def put(self, record: NodeRecord) -> None:
        await self._nodes.replace_one({"_id": record.name}, record_doc(record), upsert=True)


@dataclass
class MemoryNodeStore:
    """The same contract in a dict (for unit tests)."""

    docs: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def all(self) -> list[NodeRecord]:
        return in_order([record_from_doc(copy.deepcopy(doc)) for doc in self.docs.values()])

    async def get(self, name: str) -> NodeRecord | None:
        doc = self.docs.get(name)
        return record_from_doc(copy.deepcopy(doc)) if doc else None

    async def put(self, record: NodeRecord) -> None:
        self.docs[record.name] = copy.deepcopy(record_doc(record))
