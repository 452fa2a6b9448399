"""Bearer-token identity, shared by every service that answers users.

The bootstrap admin token comes from ``YARD_TOKEN`` (or the file the platform writes
under the data directory when it is unset). Other tokens are issued by an admin and
stored hashed in the ``tokens`` collection of the auth database.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from .aliyun_auth import (
    MAX_AGE_S,
    MAX_AHEAD_S,
    SignatureError,
    SignedRequest,
    access_key_id,
    headers_of,
    nonce_key,
    verify,
)
from .secrets_box import SecretBox, SecretsUnavailable, open_value
from .storage import Collection

log = logging.getLogger("trainyard.auth")

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


class NonceRegistry(Protocol):
    async def first_use(self, key: str) -> bool:
        """True the first time ``key`` is seen within the signatures' validity window."""
        ...


class MemoryNonces:
    """Nonces seen by this process (one replica); ``KvNonces`` shares them."""

    def __init__(
        self, ttl_s: float = MAX_AGE_S + MAX_AHEAD_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._seen: dict[str, float] = {}

    async def first_use(self, key: str) -> bool:
        now = self.clock()
        if len(self._seen) > 10_000:
            self._seen = {k: t for k, t in self._seen.items() if t > now}
        if self._seen.get(key, 0.0) > now:
            return False
        self._seen[key] = now + self.ttl_s
        return True


# How many times revoke_user deletes a user's tokens while new ones keep appearing.
REVOKE_PASSES = 3


class TokenStore:
    """Resolves bearer tokens. Positive answers are cached briefly: every request
    would otherwise cost a store round trip. It also keeps the AccessKey signatures'
    nonces (``nonces``), so every API that verifies them shares one memory."""

    CACHE_S = 30.0
    # Past this many cached answers the expired ones go (each token ever presented,
    # revoked or deleted ones too, stayed for the process's life).
    CACHE_SWEEP = 10_000

    def __init__(
        self,
        collection: Collection | None,
        admin_token: str | None,
        nonces: NonceRegistry | None = None,
    ) -> None:
        self._tokens = collection
        self._admin_token = admin_token
        self._cache: dict[str, tuple[float, Identity]] = {}
        self._sweep_at = self.CACHE_SWEEP
        self.nonces: NonceRegistry = nonces or MemoryNonces()

    async def issue(self, user: str, admin: bool = False, *, own: bool = False) -> str:
        """A new token for ``user``; ``own``: the user mints it for itself (OpenPAI's
        application tokens), so even the bootstrap admin's name is its own to take."""
        check_user_name(user, admin or own)
        if self._tokens is None:
            raise RuntimeError("this service has no token store")
        token = new_token()
        await self._tokens.insert_one(
            {
                "_id": token_hash(token),
                "user": user,
                "admin": admin,
                "created_at": datetime.now(UTC),
            }
        )
        return token

    async def revoke(self, token: str) -> bool:
        """The token stops resolving: here at once, in other services' caches within
        CACHE_S. False for an unknown token (and the bootstrap admin token, which is
        not in the store)."""
        if self._tokens is None:
            return False
        key = token_hash(token)
        self._cache.pop(key, None)
        return bool((await self._tokens.delete_one({"_id": key})).deleted_count)

    async def revoke_user(self, user: str) -> int:
        """Every token of ``user`` stops resolving (those its holder made for itself
        too); how many there were. Here at once, in other services within CACHE_S. A
        token minted meanwhile (its holder's check passed just before the deletion) is
        deleted by the next pass: passes until one finds none."""
        self._cache = {k: v for k, v in self._cache.items() if v[1].user != user}
        total = 0
        for _ in range(REVOKE_PASSES):
            deleted = await _delete_all(self._tokens, user)
            total += deleted
            if not deleted or not await self.count(user):
                break
        return total

    async def count(self, user: str) -> int:
        """How many tokens ``user`` holds in the store."""
        if self._tokens is None:
            return 0
        return int(await self._tokens.count_documents({"user": user}))

    async def users(self) -> dict[str, bool]:
        """Every user a token was issued to (and the bootstrap admin), each with whether
        any of their tokens is an admin's."""
        found = {ADMIN_USER: True} if self._admin_token else {}
        if self._tokens is not None:
            async for doc in self._tokens.find({}, {"user": 1, "admin": 1}):
                user = str(doc.get("user"))
                found[user] = found.get(user, False) or bool(doc.get("admin"))
        return found

    async def resolve(self, token: str, fresh: bool = False) -> Identity | None:
        """Who ``token`` is; ``fresh``: asked of the store, not of this process's cache
        (for what makes a credential: a token revoked in another service would still
        be cached here for up to CACHE_S, time enough to mint one that outlives it)."""
        # As bytes: compare_digest raises on a str with non-ASCII characters.
        if self._admin_token and hmac.compare_digest(token.encode(), self._admin_token.encode()):
            return Identity(ADMIN_USER, admin=True)
        key = token_hash(token)
        hit = self._cache.get(key)
        if hit and hit[0] > time.monotonic() and not fresh:
            return hit[1]
        if self._tokens is None:
            return None
        doc: dict[str, Any] | None = await self._tokens.find_one({"_id": key})
        if doc is None:
            return None
        identity = Identity(doc["user"], bool(doc.get("admin")))
        now = time.monotonic()
        if len(self._cache) >= self._sweep_at:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            # Not again before it has doubled (each sweep is a pass over all of it).
            self._sweep_at = max(self.CACHE_SWEEP, 2 * len(self._cache))
        self._cache[key] = (now + self.CACHE_S, identity)
        return identity


def check_user_name(user: str, admin: bool = False) -> None:
    """ValueError unless ``user`` may be given a credential: a valid name, and not the
    bootstrap admin's without admin rights (it would see every job that admin made)."""
    if not USER_NAME.match(user):
        raise ValueError(f"user name {user!r} must match {USER_NAME.pattern}")
    if user == ADMIN_USER and not admin:
        raise ValueError(
            f"user name {ADMIN_USER!r} is the bootstrap admin's: only an admin "
            "credential may act as it"
        )


async def _delete_all(collection: Collection | None, user: str) -> int:
    """Delete every credential of ``user`` in ``collection``; how many."""
    if collection is None:
        return 0
    ids = [doc["_id"] async for doc in collection.find({"user": user}, {"_id": 1})]
    return sum([(await collection.delete_one({"_id": i})).deleted_count for i in ids])


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            401,
            "missing bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token.strip()


class StillValid:
    """Whether a long request's token (a live feed, a watch) still resolves, asked again
    at most every ``every_s``: a stream opened before its token was revoked ends within
    that and the token cache's CACHE_S, as any other request would be refused."""

    def __init__(
        self,
        store: TokenStore,
        token: str,
        every_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.token, self.every_s, self.clock = store, token, every_s, clock
        self._next = clock() + every_s
        self._revoked = False

    async def __call__(self) -> bool:
        if self._revoked:
            return False  # for good: a revoked token does not come back
        if self.clock() < self._next:
            return True
        self._next = self.clock() + self.every_s
        try:
            self._revoked = await self.store.resolve(self.token) is None
        except Exception as exc:  # noqa: BLE001 - the store away is no revocation
            log.warning("could not check a stream's token again (%r); asked later", exc)
        return not self._revoked


def identity_dependency(store: TokenStore, fresh: bool = False):
    """A FastAPI dependency that turns the request's bearer token into an Identity
    (``fresh``: asked of the store, for the routes that make credentials)."""

    async def current_identity(request: Request) -> Identity:
        identity = await store.resolve(bearer(request), fresh=fresh)
        if identity is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return identity

    return current_identity


def tokens_collection(client: Any, db_prefix: str) -> Collection:
    return client[f"{db_prefix}_auth"]["tokens"]


# ---------------------------------------------------------------- Alibaba Cloud keys
#
# PAI-DLC clients (the official SDK) sign each request with an AccessKey instead of
# sending a bearer token. The server must recompute the signature, so it needs the
# secret itself: unlike tokens, secrets are stored as they are (in the auth database,
# collection ``access_keys``), and ``YARD_ACCESS_KEYS`` may configure more.

ACCESS_KEYS_ENV = "YARD_ACCESS_KEYS"


@dataclass(frozen=True)
class AccessKey:
    id: str
    secret: str
    user: str


def parse_access_keys(text: str | None) -> dict[str, AccessKey]:
    """``id:secret:user,id:secret:user`` (the form of YARD_ACCESS_KEYS); ValueError
    names the entry that is malformed."""
    keys: dict[str, AccessKey] = {}
    for n, entry in enumerate((text or "").split(",")):
        entry = entry.strip()
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise ValueError(f"{ACCESS_KEYS_ENV} entry {n + 1} must be id:secret:user")
        key_id, secret, user = (p.strip() for p in parts)
        # The operator's own configuration: its names are taken as written (an entry
        # for the bootstrap admin's name is the operator's choice, not an API's).
        if not USER_NAME.match(user):
            raise ValueError(
                f"{ACCESS_KEYS_ENV} entry {n + 1}: user name {user!r} must "
                f"match {USER_NAME.pattern}"
            )
        keys[key_id] = AccessKey(key_id, secret, user)
    return keys


class AccessKeyStore:
    """AccessKeys from the environment and from the auth database. A secret cannot be
    stored as a hash (each request's HMAC is computed from it), so it is stored sealed
    with the platform's key (secrets_box.py): the store alone reveals none."""

    def __init__(
        self,
        collection: Collection | None,
        configured: dict[str, AccessKey] | None = None,
        box: SecretBox | None = None,
    ) -> None:
        self._keys = collection
        self._configured = configured or {}
        self._box = box if box is not None else SecretBox.from_env()

    @classmethod
    def beside(cls, tokens: TokenStore, environ: dict[str, str] | None = None) -> AccessKeyStore:
        """The store in the same auth database as ``tokens``, plus YARD_ACCESS_KEYS."""
        env = os.environ if environ is None else environ
        collection = None
        if tokens._tokens is not None:  # noqa: SLF001 - same module
            collection = tokens._tokens.database["access_keys"]  # noqa: SLF001
        return cls(collection, parse_access_keys(env.get(ACCESS_KEYS_ENV)))

    async def issue(self, user: str) -> AccessKey:
        check_user_name(user)
        if self._keys is None:
            raise RuntimeError("this service has no access key store")
        # Alibaba Cloud's shapes: LTAI + 20 characters, a 30-character secret.
        key = AccessKey("LTAI" + secrets.token_hex(10), secrets.token_urlsafe(22)[:30], user)
        stored = self._box.seal(key.secret, key.id) if self._box is not None else key.secret
        await self._keys.insert_one(
            {"_id": key.id, "secret": stored, "user": user, "created_at": datetime.now(UTC)}
        )
        return key

    async def revoke(self, key_id: str) -> bool:
        if self._keys is None:
            return False
        result = await self._keys.delete_one({"_id": key_id})
        return result.deleted_count > 0

    async def revoke_user(self, user: str) -> int:
        """Every stored AccessKey of ``user`` (those of YARD_ACCESS_KEYS are the
        environment's); how many there were."""
        return await _delete_all(self._keys, user)

    async def lookup(self, key_id: str) -> AccessKey | None:
        if key_id in self._configured:
            return self._configured[key_id]
        if self._keys is None:
            return None
        doc = await self._keys.find_one({"_id": key_id})
        if doc is None:
            return None
        try:
            secret = open_value(self._box, doc["secret"], key_id)
        except SecretsUnavailable:
            return None  # sealed with another key: as good as unknown
        return AccessKey(key_id, secret, doc["user"])


class AliyunError(Exception):
    """An error answered in Alibaba Cloud's shape ``{"Code", "Message", "RequestId"}``,
    which the official SDKs turn into their exceptions."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self, request_id: str) -> JSONResponse:
        return JSONResponse(
            {"Code": self.code, "Message": self.message, "RequestId": request_id},
            status_code=self.status,
        )


def request_id(request: Request) -> str:
    """One id per request, shown in answers (Alibaba Cloud's RequestId)."""
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = str(uuid.uuid4()).upper()
        request.state.request_id = rid
    return rid


class AliyunRoute(APIRoute):
    """A route whose errors are answered in Alibaba Cloud's shape: AliyunError as it is,
    malformed parameters as 400 InvalidParameter, HTTPException by its status."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await original(request)
            except AliyunError as exc:
                return exc.response(request_id(request))
            except RequestValidationError as exc:
                where = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: "
                    f"{e.get('msg', 'invalid')}"
                    for e in exc.errors()
                )
                return AliyunError(400, "InvalidParameter", where).response(request_id(request))
            except HTTPException as exc:
                code = {401: "InvalidAccessKeyId", 403: "Forbidden", 404: "NotFound"}.get(
                    exc.status_code,
                    "InvalidParameter" if exc.status_code < 500 else "InternalError",
                )
                return AliyunError(exc.status_code, code, str(exc.detail)).response(
                    request_id(request)
                )

        return handler


def _signed_request(request: Request, body: bytes) -> SignedRequest:
    headers = headers_of(request.headers.items())
    # Behind the gateway the Host the client signed arrives as X-Forwarded-Host.
    if "x-forwarded-host" in headers:
        headers["host"] = headers["x-forwarded-host"][:1]
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else request.url.path
    query = parse_qsl(request.url.query, keep_blank_values=True)
    return SignedRequest(request.method, path, query, headers, body)


def aliyun_identity_dependency(keys: AccessKeyStore, tokens: TokenStore):
    """A FastAPI dependency for Alibaba Cloud APIs: the request's AccessKey signature
    decides the user (a bearer token is accepted too, for curl and tests)."""

    async def current_identity(request: Request) -> Identity:
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            identity = await tokens.resolve(authorization[7:].strip())
            if identity is None:
                raise AliyunError(401, "InvalidToken", "unknown bearer token")
            return identity
        key_id = access_key_id(authorization)
        if key_id is None:
            raise AliyunError(
                401,
                "MissingAuthorization",
                "the request is not signed (no Alibaba Cloud Authorization)",
            )
        key = await keys.lookup(key_id)
        if key is None:
            raise AliyunError(
                401, "InvalidAccessKeyId.NotFound", f"AccessKey {key_id} does not exist"
            )
        signed = _signed_request(request, await request.body())
        try:
            verify(signed, key.secret, now=datetime.now(UTC))
            seen = nonce_key(signed, key.id)
        except SignatureError as exc:
            raise AliyunError(403 if exc.code != "MissingSignatureNonce" else 400,
                              exc.code, exc.message) from exc  # fmt: skip
        if not await tokens.nonces.first_use(seen):
            raise AliyunError(
                400, "SignatureNonceUsed", "Specified signature nonce was used already."
            )
        return Identity(key.user, admin=False)

    return current_identity
