"""OpenPAI rest-server's account calls (users, groups, tokens, storages), at its paths
and in its shapes, over what this platform has: bearer tokens an admin issues to named
users (``POST /v1/tokens``, ``yard token``), each user's or admin's, and no storage
claims. What OpenPAI keeps and this platform does not (passwords, e-mail addresses,
group memberships an admin edits, PVC storages) is answered as such:

- ``GET /api/v2/users/{user}`` — the caller's own record, or any user's to an admin:
  ``{username, admin, grouplist, email, virtualCluster, storageConfig, extension}``;
  every queue is each user's virtual cluster. ``GET /api/v2/users`` — all, to an admin.
- ``GET /api/v2/groups`` (``default``: everyone; ``admingroup``: the admins),
  ``GET /api/v2/groups/{name}`` and ``.../userlist`` (an admin's).
- ``GET /api/v2/tokens`` — ``{"tokens": [<this request's token>]}``: tokens are kept
  hashed, so the others cannot be shown again; ``POST /api/v2/tokens/application`` —
  a new token for the caller, without admin rights (OpenPAI's application tokens are
  for job operations), at most MAX_TOKENS_PER_USER held; ``DELETE
  /api/v2/tokens/{token}`` — revoke one of the caller's tokens (an admin: anyone's).
- ``GET /api/v2/storages`` — ``{"storages": []}``; ``GET /api/v2/storages/{name}`` —
  404 ``NoStorageError``.
- Signing in (``/api/v2/authn/basic/login``, ``.../logout``, OIDC) is refused (400)
  saying how: a bearer token.
- Creating, changing or deleting users and groups is refused (400
  ``InvalidParametersError``, to an admin; 403 to anyone else) saying how users are
  made here: their tokens.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity, bearer

from .context import IntakeContext
from .openpai import error

DEFAULT_GROUP = "default"
ADMIN_GROUP = "admingroup"
# The most tokens one user may mint for themselves (each is a row of the registry).
MAX_TOKENS_PER_USER = 100
USERS_HERE = (
    "users here are the holders of the tokens an admin issues (POST /v1/tokens, "
    "yard token); OpenPAI's user and group records are not kept"
)


def user_info(name: str, admin: bool, queues: list[str]) -> dict[str, Any]:
    return {
        "username": name,
        "admin": admin,
        "grouplist": [DEFAULT_GROUP, ADMIN_GROUP] if admin else [DEFAULT_GROUP],
        "email": "",
        "virtualCluster": queues,
        "storageConfig": [],
        "extension": {},
    }


def group_info(name: str, queues: list[str]) -> dict[str, Any]:
    admin = name == ADMIN_GROUP
    return {
        "groupname": name,
        "description": "the admins" if admin else "every user",
        "externalName": "",
        "extension": {"acls": {"admin": admin, "virtualClusters": queues, "storageConfigs": []}},
    }


async def sign_in_refused() -> JSONResponse:
    return error(
        400,
        "InvalidParametersError",
        "this platform signs in with a token (an admin issues it: POST /v1/tokens, yard "
        "token), not a password or OIDC: send it as Authorization: Bearer <token>",
    )


def router(ctx: IntakeContext) -> APIRouter:
    api = APIRouter(tags=["openpai"])

    def queues() -> list[str]:
        cluster = ctx.deps.cluster
        return cluster.queue_names() if cluster is not None else [DEFAULT_GROUP]

    def refused(identity: Identity, what: str) -> JSONResponse:
        if not identity.admin:
            return error(
                403, "ForbiddenUserError", f"User {identity.user} is not allowed to {what}."
            )
        return error(400, "InvalidParametersError", f"cannot {what}: {USERS_HERE}")

    def refuser(what: str) -> Callable[..., Awaitable[JSONResponse]]:
        async def refuse(identity: Identity = Depends(ctx.current)) -> JSONResponse:
            return refused(identity, what)

        return refuse

    @api.get("/api/v2/users/{username}")
    async def get_user(username: str, identity: Identity = Depends(ctx.current)) -> Any:
        if username != identity.user and not identity.admin:
            return error(
                403,
                "ForbiddenUserError",
                f"User {identity.user} is not allowed to read {username}.",
            )
        users = await ctx.tokens.users()
        if username == identity.user:
            users.setdefault(username, identity.admin)
        if username not in users:
            return error(404, "NoUserError", f"User {username} is not found.")
        return user_info(username, users[username], queues())

    @api.get("/api/v2/users")
    @api.get("/api/v2/users/")
    async def all_users(identity: Identity = Depends(ctx.current)) -> Any:
        if not identity.admin:
            return error(403, "ForbiddenUserError", f"User {identity.user} is not an admin.")
        users = await ctx.tokens.users()
        return [user_info(name, admin, queues()) for name, admin in sorted(users.items())]

    for method, path, what in (
        ("POST", "/api/v2/users", "create a user"),
        ("POST", "/api/v2/users/", "create a user"),
        ("PUT", "/api/v2/users", "update a user"),
        ("PUT", "/api/v2/users/me", "update a user"),
        ("DELETE", "/api/v2/users/{username}", "delete a user"),
        ("PUT", "/api/v2/users/{username}/group", "change a user's groups"),
        ("DELETE", "/api/v2/users/{username}/group", "change a user's groups"),
        ("PUT", "/api/v2/users/{username}/grouplist", "change a user's groups"),
        ("POST", "/api/v2/groups", "create a group"),
        ("PUT", "/api/v2/groups", "update a group"),
        ("DELETE", "/api/v2/groups/{groupname}", "delete a group"),
    ):
        # Refusals only: left out of the API document.
        api.add_api_route(path, refuser(what), methods=[method], include_in_schema=False)

    @api.get("/api/v2/groups")
    async def all_groups(identity: Identity = Depends(ctx.current)) -> Any:
        return [group_info(name, queues()) for name in (DEFAULT_GROUP, ADMIN_GROUP)]

    @api.get("/api/v2/groups/{groupname}")
    async def get_group(groupname: str, identity: Identity = Depends(ctx.current)) -> Any:
        if groupname not in (DEFAULT_GROUP, ADMIN_GROUP):
            return error(404, "NoGroupError", f"Group {groupname} is not found.")
        return group_info(groupname, queues())

    @api.get("/api/v2/groups/{groupname}/userlist")
    async def group_members(groupname: str, identity: Identity = Depends(ctx.current)) -> Any:
        if not identity.admin:
            return error(403, "ForbiddenUserError", f"User {identity.user} is not an admin.")
        if groupname not in (DEFAULT_GROUP, ADMIN_GROUP):
            return error(404, "NoGroupError", f"Group {groupname} is not found.")
        users = await ctx.tokens.users()
        return [
            user_info(name, admin, queues())
            for name, admin in sorted(users.items())
            if admin or groupname == DEFAULT_GROUP
        ]

    @api.get("/api/v2/tokens")
    async def tokens(request: Request, identity: Identity = Depends(ctx.current)) -> Any:
        return {"tokens": [bearer(request)]}

    @api.post("/api/v2/tokens/application")
    async def application_token(identity: Identity = Depends(ctx.fresh)) -> Any:
        if await ctx.tokens.count(identity.user) >= MAX_TOKENS_PER_USER:
            return error(
                400,
                "InvalidParametersError",
                f"User {identity.user} holds {MAX_TOKENS_PER_USER} tokens already: revoke "
                "one (DELETE /api/v2/tokens/<token>) first",
            )
        # Its own, never an admin's; the bootstrap admin may take its own name for one
        # (it gives nothing to anyone else).
        return {"token": await ctx.tokens.issue(identity.user, own=True), "application": True}

    @api.delete("/api/v2/tokens/{token}")
    async def revoke(token: str, identity: Identity = Depends(ctx.current)) -> Any:
        owner = await ctx.tokens.resolve(token)
        if owner is None:
            return error(404, "NoTokenError", "The token is not found.")
        if owner.user != identity.user and not identity.admin:
            return error(
                403, "ForbiddenUserError", f"User {identity.user} is not allowed to revoke it."
            )
        if not await ctx.tokens.revoke(token):
            return error(
                400, "InvalidParametersError", "the platform's bootstrap token cannot be revoked"
            )
        return {"message": "revoke successfully"}

    # Signing in: with a token here, never a password or an OIDC provider.
    for method, path in (
        ("POST", "/api/v2/authn/basic/login"),
        ("DELETE", "/api/v2/authn/basic/logout"),
        ("GET", "/api/v2/authn/oidc/login"),
        ("GET", "/api/v2/authn/oidc/logout"),
    ):
        api.add_api_route(path, sign_in_refused, methods=[method], include_in_schema=False)

    @api.get("/api/v2/storages")
    async def storages(identity: Identity = Depends(ctx.current)) -> Any:
        return {"storages": []}

    @api.get("/api/v2/storages/{name}")
    async def storage(name: str, identity: Identity = Depends(ctx.current)) -> Any:
        return error(404, "NoStorageError", f"Storage {name} is not found: none is configured.")

    return api
