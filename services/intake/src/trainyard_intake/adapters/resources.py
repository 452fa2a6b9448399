"""Kubernetes-style resources (T9k, Kubeflow) as they were created, by user and name, so
a PATCH can be applied to the resource it changes.

The first resource created under a name is kept: names are unique per user for ever, so a
later create under the same name is a resubmission that validation rejects, and must not
replace the resource of the job that runs."""

from __future__ import annotations

import json
from typing import Any, Protocol

from trainyard_common.storage import Collection, insert_once


class ResourceStore(Protocol):
    async def keep(self, user: str, key: str, resource: dict[str, Any]) -> bool: ...
    async def get(self, user: str, key: str) -> dict[str, Any] | None: ...


def _id(user: str, key: str) -> str:
    # Neither part holds a newline (a user name is a token's, a key is ns/plural/name).
    return f"{user}\n{key}"


class DocResourceStore:
    def __init__(self, collection: Collection) -> None:
        self._resources = collection

    async def keep(self, user: str, key: str, resource: dict[str, Any]) -> bool:
        # As JSON text: resource names such as nvidia.com/gpu are keys, and a document
        # store may refuse dotted keys.
        return await insert_once(
            self._resources, {"_id": _id(user, key), "resource_json": json.dumps(resource)}
        )

    async def get(self, user: str, key: str) -> dict[str, Any] | None:
        doc = await self._resources.find_one({"_id": _id(user, key)})
        return None if doc is None else json.loads(doc["resource_json"])


class InMemoryResourceStore:
    def __init__(self) -> None:
        self.resources: dict[str, dict[str, Any]] = {}

    async def keep(self, user: str, key: str, resource: dict[str, Any]) -> bool:
        return self.resources.setdefault(_id(user, key), resource) is resource

    async def get(self, user: str, key: str) -> dict[str, Any] | None:
        return self.resources.get(_id(user, key))
