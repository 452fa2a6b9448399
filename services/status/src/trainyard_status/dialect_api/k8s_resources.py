"""T9k jobs and Kubeflow PyTorchJob / TFJob read back as Kubernetes-style resources:

- ``GET /apis/<group>/<version>/namespaces/<ns>/<plural>/<name>``: the resource as it was
  submitted, with a status rendered by the dialect's pure ``render``; 404 is a
  Kubernetes ``Status`` with reason NotFound.
- ``GET /apis/<group>/<version>/namespaces/<ns>/<plural>`` (and ``/apis/<group>/<version>/
  <plural>`` for every namespace): a ``<Kind>List``.

A user sees their own jobs; an admin lists everyone's, and reads by name their own.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from trainyard_common.auth import Identity
from trainyard_common.dialects import kubeflow, t9k

from .context import StatusContext

# (group, version) -> (dialect name, plural -> kind name, render)
APIS: dict[tuple[str, str], tuple[str, dict[str, str], Any]] = {
    (t9k.GROUP, t9k.VERSION): (
        t9k.DIALECT,
        {p: k.name for p, k in t9k.PLURALS.items()},
        t9k.render,
    ),
    (kubeflow.GROUP, kubeflow.VERSION): (
        kubeflow.DIALECT,
        {p: k.name for p, k in kubeflow.PLURALS.items()},
        kubeflow.render,
    ),
}
PAGE = 500


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return JSONResponse(status_code=code, content=body)


def router(ctx: StatusContext) -> APIRouter:
    api = APIRouter(tags=["kubernetes-style resources"])

    async def resource(doc: dict[str, Any], plural: str, render: Any) -> dict[str, Any]:
        view = await ctx.full_view(doc)
        original = doc.get("original_json")
        view["original"] = json.loads(original) if original else {}
        return jsonable_encoder(render(plural, view))

    def resolve(group: str, version: str, plural: str) -> tuple[str, str, Any] | None:
        found = APIS.get((group, version))
        if found is None or plural not in found[1]:
            return None
        dialect, kinds, render = found
        return dialect, kinds[plural], render

    async def listing(
        group: str, version: str, plural: str, namespace: str | None, identity: Identity
    ) -> JSONResponse:
        found = resolve(group, version, plural)
        if found is None:
            return status(
                404,
                "NotFound",
                f"the server could not find the requested resource ({group}/{version}, {plural})",
            )
        dialect, kind, render = found
        prefix = f"{namespace}/{plural}/" if namespace else None
        chosen: dict[tuple[str, str], dict[str, Any]] = {}
        offset = 0
        while True:
            docs, total = await ctx.views.list_jobs(
                user=None if identity.admin else identity.user,
                state=None,
                limit=PAGE,
                offset=offset,
                where={"dialect": dialect},
                full=True,
            )
            for doc in docs:
                key = doc.get("dialect_key") or ""
                if key.split("/")[1:2] != [plural] or (prefix and not key.startswith(prefix)):
                    continue
                # One item per name, as find_by_key picks it: the newest job that was not
                # rejected (a rejected copy may share its name).
                slot = (str(doc.get("user")), key)
                held = chosen.get(slot)
                if held is None or (
                    held.get("state") == "REJECTED" and doc.get("state") != "REJECTED"
                ):
                    chosen[slot] = doc
            offset += PAGE
            if offset >= total or not docs:
                break
        items = [await resource(doc, plural, render) for doc in chosen.values()]
        return JSONResponse(
            {
                "apiVersion": f"{group}/{version}",
                "kind": f"{kind}List",
                "metadata": {"resourceVersion": ""},
                "items": items,
            }
        )

    @api.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}")
    async def list_namespaced(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        return await listing(group, version, plural, namespace, identity)

    @api.get("/apis/{group}/{version}/{plural}")
    async def list_all(
        group: str, version: str, plural: str, identity: Identity = Depends(ctx.current)
    ) -> JSONResponse:
        return await listing(group, version, plural, None, identity)

    @api.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}")
    async def get(
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        identity: Identity = Depends(ctx.current),
    ) -> JSONResponse:
        found = resolve(group, version, plural)
        if found is None:
            return status(
                404,
                "NotFound",
                f"the server could not find the requested resource ({group}/{version}, {plural})",
            )
        dialect, _kind, render = found
        doc = await ctx.views.find_by_key(identity.user, f"{namespace}/{plural}/{name}", dialect)
        if doc is None:
            return status(
                404,
                "NotFound",
                f'{plural}.{group} "{name}" not found',
                {"name": name, "group": group, "kind": plural},
            )
        return JSONResponse(await resource(doc, plural, render))

    return api
