"""T9k and Kubeflow jobs read back as Kubernetes resources, the way kubectl and client-go
read them (the shapes of ``trainyard_common.dialects.k8s_api``):

- discovery: ``/version``, ``/api``, ``/apis``, ``/apis/<group>[/<version>]``,
  and OpenAPI ``/openapi/v2``, ``/openapi/v3[/apis/<group>/<version>]``;
- ``GET .../namespaces/<ns>/<plural>/<name>`` (and ``/status``): the resource as it now is
  (as created, or as last patched) with a status rendered by the dialect's pure
  ``render``, its ``resourceVersion`` (the stream sequence of the event that last changed
  it) and ``generation``;
- ``GET .../namespaces/<ns>/<plural>`` and ``/apis/<group>/<version>/<plural>``: a
  ``<Kind>List`` (or a ``Table`` for ``kubectl get``), with label and field selectors,
  a page at a time with ``limit`` and ``continue`` (kubectl asks 500 at a time);
  ``?watch=true`` streams ADDED / MODIFIED / DELETED events after ``resourceVersion``
  (and BOOKMARKs with ``allowWatchBookmarks``) until ``timeoutSeconds``.

A user sees their own jobs; an admin lists everyone's, and reads by name their own. Every
error is a Kubernetes ``Status``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse

from trainyard_common.auth import Identity, StillValid, bearer
from trainyard_common.dialects import k8s_api, kubeflow
from trainyard_common.dialects.k8s_api import ContinueError, SelectorError, Served
from trainyard_common.dialects.k8s_pod import latest_tasks
from trainyard_common.limits import digits

from ..adapters.views import is_resource
from .context import StatusContext

WATCH_POLL_S = 0.5
BOOKMARK_S = 30.0
MAX_WATCH_S = 1800


def watch_timeout(asked: str) -> int | None:
    """A watch's ``timeoutSeconds`` in seconds, at most MAX_WATCH_S; 0 or left out is
    the server's own (as Kubernetes picks one); None for what is no whole number (nan,
    -1, 1e9: the API server refuses them)."""
    if not asked:
        return MAX_WATCH_S
    if not digits(asked):
        return None
    return min(int(asked), MAX_WATCH_S) or MAX_WATCH_S


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=code, content=k8s_api.status_object(code, reason, message, details)
    )


def not_served(group: str, version: str, plural: str) -> JSONResponse:
    return status(
        404,
        "NotFound",
        f"the server could not find the requested resource ({group}/{version}, {plural})",
    )


def _key_parts(doc: dict[str, Any]) -> list[str]:
    return str(doc.get("dialect_key") or "").split("/")


def router(ctx: StatusContext) -> APIRouter:
    api = APIRouter(tags=["kubernetes-style resources"])
    views = ctx.views

    async def resource_view(doc: dict[str, Any]) -> dict[str, Any]:
        """The canonical view a dialect renders a resource from, with the API server's
        fields (the resource as it now is, its version and generation)."""
        view = await ctx.full_view(doc)
        original = doc.get("original_json")
        view["original"] = json.loads(original) if original else {}
        view["resource_version"] = str(doc.get("feed_seq") or 0)
        view["generation"] = doc.get("generation") or 1
        if doc.get("deleted_at"):
            view["deleted_at"] = doc["deleted_at"]
        return view

    async def resource(doc: dict[str, Any], served: Served) -> dict[str, Any]:
        return jsonable_encoder(served.render(served.plural, await resource_view(doc)))

    def mine(doc: dict[str, Any], identity: Identity) -> bool:
        return identity.admin or doc.get("user") == identity.user

    def of(doc: dict[str, Any], served: Served, namespace: str | None) -> bool:
        parts = _key_parts(doc)
        return (
            len(parts) == 3
            and parts[1] == served.plural
            and (namespace is None or parts[0] == namespace)
        )

    # -- discovery --------------------------------------------------------------------

    @api.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse(k8s_api.version_info())

    @api.get("/api")
    async def core() -> JSONResponse:
        return JSONResponse(k8s_api.core_versions())

    @api.get("/api/v1")
    async def core_v1() -> JSONResponse:
        return JSONResponse(k8s_api.core_resources())

    @api.get("/apis")
    async def groups() -> JSONResponse:
        return JSONResponse(k8s_api.group_list())

    @api.get("/apis/{group}")
    async def one_group(group: str) -> JSONResponse:
        found = k8s_api.group(group)
        if found is None:
            return status(404, "NotFound", f"the server could not find the group {group!r}")
        return JSONResponse(found)

    @api.get("/apis/{group}/{version}")
    async def resources_of(group: str, version: str) -> JSONResponse:
        found = k8s_api.resource_list(group, version)
        if found is None:
            return status(
                404,
                "NotFound",
                f"the server could not find the requested resource {group}/{version}",
            )
        return JSONResponse(found)

    @api.get("/openapi/v2")
    async def openapi_v2() -> JSONResponse:
        return JSONResponse(k8s_api.openapi_v2())

    @api.get("/openapi/v3")
    async def openapi_v3_root() -> JSONResponse:
        return JSONResponse(k8s_api.openapi_v3_root())

    @api.get("/openapi/v3/apis/{group}/{version}")
    async def openapi_v3(group: str, version: str) -> JSONResponse:
        found = k8s_api.openapi_v3(group, version)
        if found is None:
            return status(404, "NotFound", f"no OpenAPI document for {group}/{version}")
        return JSONResponse(found)

    # -- list and watch ---------------------------------------------------------------

    async def listing(
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        request: Request,
        identity: Identity,
    ) -> JSONResponse | StreamingResponse:
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_served(group, version, plural)
        query = request.query_params
        try:
            labels = k8s_api.parse_label_selector(query.get("labelSelector"))
            fields = k8s_api.parse_field_selector(query.get("fieldSelector"))
        except SelectorError as exc:
            return status(400, "BadRequest", f"unable to parse requirement: {exc}")
        table = k8s_api.wants_table(request.headers.get("accept", ""))
        if query.get("watch") in ("true", "1", "True"):
            return await watch(served, namespace, identity, request, labels, fields, table)
        try:
            limit = k8s_api.list_limit(query.get("limit") or "")
            start = k8s_api.parse_continue(query["continue"]) if query.get("continue") else None
        except ContinueError as exc:
            return status(400, "BadRequest", str(exc))
        if start is not None and query.get("resourceVersion") not in (None, "", "0"):
            # As the API server: a continued list is at its first page's version.
            return status(
                400, "BadRequest", "specifying resource version is not allowed when using continue"
            )
        user = None if identity.admin else identity.user
        items, meta = await list_page(served, namespace, user, labels, fields, limit, start)
        if table:
            return JSONResponse(k8s_api.table(items, meta, datetime.now(UTC)))
        return JSONResponse(
            {
                "apiVersion": served.group_version,
                "kind": f"{served.kind}List",
                "metadata": meta,
                "items": items,
            }
        )

    async def list_page(
        served: Served,
        namespace: str | None,
        user: str | None,
        labels: list[k8s_api.Requirement],
        fields: list[k8s_api.Requirement],
        limit: int,
        start: tuple[int, datetime, str] | None,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Up to ``limit`` objects of a list (0: every one), from where a ``continue``
        left off, and the page's list metadata: a ``continue`` where the page was full,
        and every page's ``resourceVersion`` the first one's (read before the first
        page: a watch from it may repeat a change, never miss one). Objects created
        after the first page are left out, as from the API server's snapshot; one
        changed or deleted meanwhile is read as it now is (the API server reads the
        snapshot's). The store is read ``limit`` jobs at a time, 100 at least (a selector
        or a namespace may keep few of them: one a read, with kubectl's chunks of one)."""
        version = start[0] if start else await views.last_change()
        after = (start[1], start[2]) if start else None
        items: list[dict[str, Any]] = []
        size = max(limit, 100) if limit else k8s_api.MAX_LIST_PAGE
        while True:
            docs = await views.resource_page(served.dialect, user, size, after)
            for doc in docs:
                after = (doc["submitted_at"], str(doc["_id"]))
                if (doc.get("created_seq") or 0) > version:
                    continue
                if not is_resource(doc) or not of(doc, served, namespace):
                    continue
                item = await resource(doc, served)
                if k8s_api.selected(item, labels, fields):
                    items.append(item)
                    if len(items) == limit:
                        token = k8s_api.continue_token(version, *after)
                        return items, {"resourceVersion": str(version), "continue": token}
            if len(docs) < size:
                return items, {"resourceVersion": str(version)}
            await asyncio.sleep(0)  # the requests beside it between pages

    async def watch(
        served: Served,
        namespace: str | None,
        identity: Identity,
        request: Request,
        labels: list[k8s_api.Requirement],
        fields: list[k8s_api.Requirement],
        table: bool,
    ) -> JSONResponse | StreamingResponse:
        query = request.query_params
        since = query.get("resourceVersion") or "0"
        if not digits(since):
            return status(400, "BadRequest", f"resourceVersion {since!r} is not a number")
        timeout = watch_timeout(query.get("timeoutSeconds") or "")
        if timeout is None:
            asked = query.get("timeoutSeconds") or ""
            return status(400, "BadRequest", f"timeoutSeconds {asked[:32]!r} is not a number")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        start = int(since)
        user = None if identity.admin else identity.user

        def framed(kind: str, obj: dict[str, Any]) -> bytes:
            if table and kind != "BOOKMARK":
                meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                obj = k8s_api.table([obj], meta, datetime.now(UTC))
            return k8s_api.watch_event(kind, obj)

        valid = StillValid(ctx.tokens, bearer(request))

        async def events() -> AsyncIterator[bytes]:
            seen = start
            added: set[str] = set()
            if start == 0:
                # No version: the current objects first, as ADDED, then what changes.
                seen = await views.last_change()
                for doc in await views.resources(served.dialect, user):
                    if of(doc, served, namespace):
                        item = await resource(doc, served)
                        if k8s_api.selected(item, labels, fields):
                            added.add(str(doc["_id"]))
                            yield framed("ADDED", item)
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + BOOKMARK_S
            while time.monotonic() < deadline:
                if not await valid():
                    return  # its token was revoked: the client's next request is refused
                for doc in await views.resource_changes(served.dialect, seen):
                    seen = max(seen, int(doc.get("feed_seq") or 0))
                    if not (mine(doc, identity) and of(doc, served, namespace)):
                        continue
                    if not is_resource(doc):
                        continue
                    item = await resource(doc, served)
                    if not k8s_api.selected(item, labels, fields):
                        continue
                    uid = str(doc["_id"])
                    if doc.get("deleted_at"):
                        kind = "DELETED"
                    elif uid not in added and int(doc.get("created_seq") or 0) > start:
                        kind = "ADDED"
                    else:
                        kind = "MODIFIED"
                    added.add(uid)
                    yield framed(kind, item)
                if bookmarks and time.monotonic() >= next_bookmark:
                    next_bookmark = time.monotonic() + BOOKMARK_S
                    yield k8s_api.watch_event(
                        "BOOKMARK",
                        {
                            "kind": served.kind,
                            "apiVersion": served.group_version,
                            "metadata": {"resourceVersion": str(seen)},
                        },
                    )
                await asyncio.sleep(WATCH_POLL_S)

        return StreamingResponse(events(), media_type="application/json")

    @api.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}", response_model=None)
    async def list_namespaced(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse | StreamingResponse:
        return await listing(group, version, plural, namespace, request, identity)

    @api.get("/apis/{group}/{version}/{plural}", response_model=None)
    async def list_all(
        group: str,
        version: str,
        plural: str,
        request: Request,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse | StreamingResponse:
        return await listing(group, version, plural, None, request, identity)

    # -- get ---------------------------------------------------------------------------

    async def get_one(
        group: str, version: str, namespace: str, plural: str, name: str, identity: Identity
    ) -> JSONResponse:
        served = k8s_api.lookup(group, version, plural)
        if served is None:
            return not_served(group, version, plural)
        found = await views.resources(served.dialect, identity.user, f"{namespace}/{plural}/{name}")
        if not found:
            return status(
                404,
                "NotFound",
                f'{plural}.{group} "{name}" not found',
                {"name": name, "group": group, "kind": plural},
            )
        # One object per name; should a store of an earlier version hold several, the
        # newest that was not rejected, as that version showed it.
        live = [doc for doc in found if doc.get("state") != "REJECTED"] or found
        return JSONResponse(await resource(live[-1], served))

    @api.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}")
    async def get(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        return await get_one(group, version, namespace, plural, name, identity)

    @api.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status")
    async def get_status(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        return await get_one(group, version, namespace, plural, name, identity)

    # -- pods (read-only: a Kubeflow job's tasks as its operator's pods) --------------

    kubeflow_kinds = [s for s in k8s_api.SERVED.values() if s.group == kubeflow.GROUP]

    async def pods_of(doc: dict[str, Any], served: Served) -> list[dict[str, Any]]:
        view = await resource_view(doc)
        resource = jsonable_encoder(served.render(served.plural, view))
        spec = view.get("spec") or {}
        roles = {str(r.get("name")): r for r in spec.get("roles") or [] if isinstance(r, dict)}
        container = kubeflow.KINDS[served.kind].container
        out = []
        for (role, index), task in sorted(latest_tasks(view).items()):
            attempt = int(task.get("attempt") or 1)
            detail = {
                **task,
                "id": f"{doc['_id']}:{attempt}:{role}:{index}",
                "roles": list(roles),
                "image": (roles.get(role) or {}).get("image") or spec.get("image"),
                "created_at": resource["metadata"].get("creationTimestamp"),
            }
            out.append(jsonable_encoder(k8s_api.pod(resource, detail, container)))
        return out

    def served_as(doc: dict[str, Any], namespace: str) -> Served | None:
        """The served kind a job's pods are listed under: its own version where the kind
        is served at two (MPIJob v1 and v2beta1: each job listed once)."""
        kinds = [s for s in kubeflow_kinds if of(doc, s, namespace)]
        if len(kinds) > 1:
            original = json.loads(doc.get("original_json") or "{}")
            written = original.get("apiVersion") if isinstance(original, dict) else None
            return next((s for s in kinds if s.group_version == written), kinds[0])
        return kinds[0] if kinds else None

    async def namespace_pods(namespace: str, identity: Identity) -> list[dict[str, Any]]:
        user = None if identity.admin else identity.user
        found = []
        for doc in await views.resources(kubeflow.DIALECT, user):
            served = served_as(doc, namespace)
            if served is not None:
                found += await pods_of(doc, served)
        return found

    @api.get("/api/v1/namespaces/{namespace}/pods")
    async def list_pods(
        namespace: str, request: Request, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        query = request.query_params
        if query.get("watch") in ("true", "1"):
            return status(405, "MethodNotAllowed", "pods cannot be watched here: list them again")
        try:
            labels = k8s_api.parse_label_selector(query.get("labelSelector"))
            fields = k8s_api.parse_field_selector(query.get("fieldSelector"))
        except SelectorError as exc:
            return status(400, "BadRequest", f"unable to parse requirement: {exc}")
        version_now = str(await views.last_change())
        items = [
            p for p in await namespace_pods(namespace, identity)
            if k8s_api.selected(p, labels, fields)
        ]  # fmt: skip
        meta = {"resourceVersion": version_now}
        if k8s_api.wants_table(request.headers.get("accept", "")):
            return JSONResponse(k8s_api.table(items, meta, datetime.now(UTC)))
        return JSONResponse(
            {"apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": items}
        )

    @api.get("/api/v1/namespaces/{namespace}/pods/{name}")
    async def get_pod(
        namespace: str, name: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        parsed = k8s_api.parse_pod_name(name)
        if parsed is not None:
            job = parsed[0]
            for served in kubeflow_kinds:
                key = f"{namespace}/{served.plural}/{job}"
                for doc in reversed(await views.resources(served.dialect, identity.user, key)):
                    for found in await pods_of(doc, served):
                        if found["metadata"]["name"] == name:
                            return JSONResponse(found)
        return status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})

    return api
