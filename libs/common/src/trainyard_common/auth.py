"""Bearer-token identity, shared by every service that answers users.

The bootstrap admin token comes from ``YARD_TOKEN`` (or the file the platform writes
under the data directory when it is unset). Other tokens are issued by an admin and
stored hashed in the ``tokens`` collection of the auth database.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException, Request
from pymongo.asynchronous.collection import AsyncCollection

USER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # no "~": it joins user~jobName keys
ADMIN_USER = "admin"


@dataclass(frozen=True)
class Identity:
    user: str
    admin: bool = False

    def can_see(self, owner: str) -> bool:
        return self.admin or owner == self.user


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """Resolves bearer tokens. Positive answers are cached briefly: every request
    would otherwise cost a store round trip."""

    CACHE_S = 30.0

    def __init__(self, collection: AsyncCollection | None, admin_token: str | None) -> None:
        self._tokens = collection
        self._admin_token = admin_token
        self._cache: dict[str, tuple[float, Identity]] = {}

    async def issue(self, user: str, admin: bool = False) -> str:
        if not USER_NAME.match(user):
            raise ValueError(f"user name {user!r} must match {USER_NAME.pattern}")
        if self._tokens is None:
            raise RuntimeError("this service has no token store")
        token = new_token()
        await self._tokens.insert_one(
            {"_id": token_hash(token), "user": user, "admin": admin, "created_at": datetime.now(UTC)}
        )
        return token

    async def resolve(self, token: str) -> Identity | None:
        if self._admin_token and hmac.compare_digest(token, self._admin_token):
            return Identity(ADMIN_USER, admin=True)
        key = token_hash(token)
        hit = self._cache.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        if self._tokens is None:
            return None
        doc: dict[str, Any] | None = await self._tokens.find_one({"_id": key})
        if doc is None:
            return None
        identity = Identity(doc["user"], bool(doc.get("admin")))
        self._cache[key] = (time.monotonic() + self.CACHE_S, identity)
        return identity


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


def identity_dependency(store: TokenStore):
    """A FastAPI dependency that turns the request's bearer token into an Identity."""

    async def current_identity(request: Request) -> Identity:
        identity = await store.resolve(bearer(request))
        if identity is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return identity

    return current_identity


def tokens_collection(client: Any, db_prefix: str) -> AsyncCollection:
    return client[f"{db_prefix}_auth"]["tokens"]
