"""The Kubernetes API machinery Trainyard's Kubernetes-shaped kinds (T9k jobs, Kubeflow
jobs) are served with, as pure functions over plain data: which kinds are served,
discovery (``/api``, ``/apis``, ``/apis/<group>/<version>``, ``/version``) and OpenAPI
(v2 and v3) documents for them, label and field selectors, a list's ``limit`` and
``continue``, JSON Patch (RFC 6902) and the
strategic merge patch of these kinds, ``Table`` rows for ``kubectl get``, and watch events.

kubectl and client-go read these exactly: the shapes follow
k8s.io/apimachinery/pkg/apis/meta/v1 (APIGroupList, APIResourceList, Status, Table,
WatchEvent) and kubectl's check that a server validates fields itself (an OpenAPI v3
PATCH operation of the kind with a ``fieldValidation`` query parameter)."""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..limits import digits, in_utc
from ..parsing import MAX_BODY, MAX_DEPTH, BodyError, json_depth
from . import kubeflow, t9k
from .k8s_pod import LABEL_KEY_RE, LABEL_VALUE_RE, MAX_KEY, SERVER_METADATA, merge_patch

KUBE_VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.0+trainyard"}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
MAX_PATCH_OPS = 1000


@dataclass(frozen=True)
class Served:
    group: str
    version: str
    plural: str
    kind: str
    dialect: str
    render: Callable[[str, dict[str, Any]], dict[str, Any]]
    short_names: tuple[str, ...] = ()

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def singular(self) -> str:
        return self.kind.lower()


def _served() -> dict[tuple[str, str, str], Served]:
    found: dict[tuple[str, str, str], Served] = {}
    for module in (t9k, kubeflow):
        for plural, kind in module.PLURALS.items():
            # A kind served at several versions (Kubeflow's MPIJob: v1 and v2beta1) is
            # one resource: each version shows the same jobs, at that version.
            for version in getattr(kind, "versions", (module.VERSION,)):
                found[(module.GROUP, version, plural)] = Served(
                    module.GROUP, version, plural, kind.name, module.DIALECT,
                    _at_version(module.render, f"{module.GROUP}/{version}"),
                )  # fmt: skip
    return found


def _at_version(
    render: Callable[[str, dict[str, Any]], dict[str, Any]], api_version: str
) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    def rendered(plural: str, view: dict[str, Any]) -> dict[str, Any]:
        return {**render(plural, view), "apiVersion": api_version}

    return rendered


SERVED = _served()
GROUPS: dict[str, list[str]] = {}
for _g, _v, _p in SERVED:
    GROUPS.setdefault(_g, [])
    if _v not in GROUPS[_g]:
        GROUPS[_g].append(_v)


def lookup(group: str, version: str, plural: str) -> Served | None:
    return SERVED.get((group, version, plural))


def status_object(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Kubernetes ``Status``: the body of every API error (and of a delete)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


# ------------------------------------------------------------------------------ discovery


def version_info() -> dict[str, Any]:
    return {
        **KUBE_VERSION,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "trainyard",
        "platform": "linux/amd64",
    }


def core_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }


def core_resources() -> dict[str, Any]:
    """Of the core group, only pods: read-only, the tasks of Kubeflow jobs (below)."""
    return {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get", "list"],
                "shortNames": ["po"],
                "categories": ["all"],
            },
            {
                "name": "pods/log",
                "singularName": "",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
            },
        ],
    }


def _group(name: str) -> dict[str, Any]:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in GROUPS[name]]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in GROUPS]}


def group(name: str) -> dict[str, Any] | None:
    if name not in GROUPS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


def resource_list(group_name: str, version: str) -> dict[str, Any] | None:
    kinds = [s for s in SERVED.values() if (s.group, s.version) == (group_name, version)]
    if not kinds:
        return None
    resources: list[dict[str, Any]] = []
    for s in kinds:
        resources.append(
            {
                "name": s.plural,
                "singularName": s.singular,
                "namespaced": True,
                "kind": s.kind,
                "verbs": VERBS,
                "shortNames": list(s.short_names),
                "categories": ["all", "trainyard"],
            }
        )
        resources.append(
            {
                "name": f"{s.plural}/status",
                "singularName": "",
                "namespaced": True,
                "kind": s.kind,
                "verbs": ["get"],
            }
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/{version}",
        "resources": resources,
    }


# -------------------------------------------------------------------------------- OpenAPI

_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}
_QUERY = {
    "dryRun": "string",
    "fieldManager": "string",
    "fieldValidation": "string",
}


def _gvk(s: Served) -> list[dict[str, str]]:
    return [{"group": s.group, "version": s.version, "kind": s.kind}]


def _definition(s: Served) -> str:
    return f"{'.'.join(reversed(s.group.split('.')))}.{s.version}.{s.kind}"


def _operations(s: Served, v3: bool) -> dict[str, Any]:
    """The paths of one kind: its collection, one item and its status."""

    def ref() -> dict[str, Any]:
        where = "#/components/schemas/" if v3 else "#/definitions/"
        return {"$ref": where + _definition(s)}

    def params(names: list[str]) -> list[dict[str, Any]]:
        out = []
        for name in names:
            param: dict[str, Any] = {"name": name, "in": "query", "description": name}
            if v3:
                param["schema"] = {"type": _QUERY.get(name, "string")}
            else:
                param["type"] = _QUERY.get(name, "string")
            out.append(param)
        return out

    def op(action: str, query: list[str], body: bool = False) -> dict[str, Any]:
        operation: dict[str, Any] = {
            "operationId": f"{action}{s.kind}",
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": _gvk(s)[0],
            "parameters": params(query),
            "responses": {"200": {"description": "OK"}},
        }
        if v3:
            operation["responses"]["200"]["content"] = {"application/json": {"schema": ref()}}
            if body:
                operation["requestBody"] = {
                    "content": {"application/json": {"schema": ref()}},
                    "required": True,
                }
        else:
            operation["responses"]["200"]["schema"] = ref()
            if body:
                operation["parameters"].append(
                    {"name": "body", "in": "body", "required": True, "schema": ref()}
                )
        return operation

    write = ["dryRun", "fieldManager", "fieldValidation"]
    base = f"/apis/{s.group}/{s.version}/namespaces/{{namespace}}/{s.plural}"
    return {
        base: {
            "get": op("list", ["labelSelector", "fieldSelector", "watch", "resourceVersion"]),
            "post": op("post", write, body=True),
            "delete": op("deletecollection", ["labelSelector", "fieldSelector"]),
        },
        base + "/{name}": {
            "get": op("get", []),
            "put": op("put", write, body=True),
            "patch": op("patch", write, body=True),
            "delete": op("delete", []),
        },
        base + "/{name}/status": {"get": op("get", [])},
    }


def _schema(s: Served) -> dict[str, Any]:
    return {**copy.deepcopy(_OBJECT_SCHEMA), "x-kubernetes-group-version-kind": _gvk(s)}


def openapi_v2() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    definitions: dict[str, Any] = {}
    for s in SERVED.values():
        paths.update(_operations(s, v3=False))
        definitions[_definition(s)] = _schema(s)
    return {
        "swagger": "2.0",
        "info": {"title": "Trainyard", "version": KUBE_VERSION["gitVersion"]},
        "paths": paths,
        "definitions": definitions,
    }


def openapi_v3(group_name: str, version: str) -> dict[str, Any] | None:
    kinds = [s for s in SERVED.values() if (s.group, s.version) == (group_name, version)]
    if not kinds:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for s in kinds:
        paths.update(_operations(s, v3=True))
        schemas[_definition(s)] = _schema(s)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Trainyard", "version": KUBE_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def openapi_v3_root() -> dict[str, Any]:
    """Where each group-version's document is; the hash changes when the document does."""
    paths = {}
    for g, versions in GROUPS.items():
        for v in versions:
            text = json.dumps(openapi_v3(g, v), sort_keys=True).encode()
            digest = hashlib.sha256(text).hexdigest()[:32].upper()
            paths[f"apis/{g}/{v}"] = {
                "serverRelativeURL": f"/openapi/v3/apis/{g}/{v}?hash={digest}"
            }
    return {"paths": paths}


# ------------------------------------------------------------------------------ selectors


class SelectorError(ValueError):
    """A selector that does not parse; the message says where."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case "=":
                return present and value == self.values[0]
            case "!=":
                return not present or value != self.values[0]
            case "in":
                return present and value in self.values
            case "notin":
                return not present or value not in self.values
            case "exists":
                return present
            case _:
                return not present


_SET = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)\s*$")


def _split_terms(text: str) -> list[str]:
    """Commas separate requirements, except inside a set's parentheses."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' at {i}")
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    if depth:
        raise SelectorError("unbalanced '('")
    terms.append(text[start:])
    return [t.strip() for t in terms]


def _key(key: str, selector: str) -> str:
    if not LABEL_KEY_RE.fullmatch(key) or len(key) > MAX_KEY:
        raise SelectorError(f"invalid label key {key!r} in {selector!r}")
    return key


def _value(value: str, selector: str) -> str:
    if not LABEL_VALUE_RE.fullmatch(value):
        raise SelectorError(f"invalid label value {value!r} in {selector!r}")
    return value


def parse_label_selector(text: str | None) -> list[Requirement]:
    """A label selector as ``kubectl -l`` writes it: ``k=v``, ``k==v``, ``k!=v``,
    ``k in (a,b)``, ``k notin (a)``, ``k``, ``!k``; comma means and."""
    if not text or not text.strip():
        return []
    if len(text) > 4096:
        raise SelectorError("label selector longer than 4096 characters")
    out: list[Requirement] = []
    for term in _split_terms(text):
        if not term:
            raise SelectorError(f"empty requirement in {text!r}")
        if found := _SET.match(term):
            values = tuple(_value(v.strip(), text) for v in found["values"].split(",") if v.strip())
            if not values:
                raise SelectorError(f"for 'in', 'notin' operators, values set can't be empty "
                                    f"in {text!r}")  # fmt: skip
            out.append(Requirement(_key(found["key"], text), found["op"], values))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            out.append(Requirement(_key(key.strip(), text), "!=", (_value(value.strip(), text),)))
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            out.append(Requirement(_key(key.strip(), text), "=", (_value(value.strip(), text),)))
        elif term.startswith("!"):
            out.append(Requirement(_key(term[1:].strip(), text), "!"))
        else:
            out.append(Requirement(_key(term, text), "exists"))
    return out


FIELDS = ("metadata.name", "metadata.namespace")


def parse_field_selector(text: str | None) -> list[Requirement]:
    """A field selector on what a custom resource can be selected by: ``metadata.name``
    and ``metadata.namespace``, with ``=``, ``==`` or ``!=``."""
    if not text or not text.strip():
        return []
    if len(text) > 4096:
        raise SelectorError("field selector longer than 4096 characters")
    out = []
    for term in _split_terms(text):
        op = "!=" if "!=" in term else "="
        if "=" not in term:
            raise SelectorError(f"invalid field selector {term!r}: want field=value")
        key, value = term.split("!=" if op == "!=" else ("==" if "==" in term else "="), 1)
        key = key.strip()
        if key not in FIELDS:
            raise SelectorError(
                f'field label not supported: "{key}" (a field selector may name '
                + " or ".join(FIELDS)
                + ")"
            )
        out.append(Requirement(key, op, (value.strip(),)))
    return out


def selected(
    resource: dict[str, Any], labels: list[Requirement], fields: list[Requirement]
) -> bool:
    meta = resource.get("metadata") or {}
    own: dict[str, str] = meta["labels"] if isinstance(meta.get("labels"), dict) else {}
    values = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}
    return all(r.matches(own) for r in labels) and all(
        r.matches({k: str(v) for k, v in values.items() if v is not None}) for r in fields
    )


# ---------------------------------------------------------------------------------- patch


def client_fields(resource: Any) -> Any:
    """A resource as its writer owns it: no status, no server-written metadata."""
    if not isinstance(resource, dict):
        return resource
    out = {k: copy.deepcopy(v) for k, v in resource.items() if k != "status"}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in SERVER_METADATA}
    return out


def merge_diff(before: Any, after: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``before`` into ``after``."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return copy.deepcopy(after)
    patch: dict[str, Any] = {}
    for key in before:
        if key not in after:
            patch[key] = None
    for key, value in after.items():
        if key not in before:
            patch[key] = copy.deepcopy(value)
        elif before[key] != value:
            patch[key] = merge_diff(before[key], value)
    return patch


class PatchError(ValueError):
    """A patch that cannot be applied; the message says which operation and why."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and digits(part) and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and digits(part) and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _index(container: list[Any], key: str, path: str, adding: bool) -> int:
    if key == "-" and adding:
        return len(container)
    if not digits(key) or (key.startswith("0") and key != "0"):
        raise PatchError(f"path {path!r}: {key!r} is not an array index")
    index = int(key)
    if index > len(container) or (index == len(container) and not adding):
        raise PatchError(f"path {path!r}: index {index} is out of range")
    return index


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent, key = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if key not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent.pop(key)
    if isinstance(parent, list):
        return parent.pop(_index(parent, key, path, adding=False))
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, key = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if replace and key not in parent:
            raise PatchError(f"path {path!r} does not exist")
        parent[key] = value
    elif isinstance(parent, list):
        index = _index(parent, key, path, adding=not replace)
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def _grown(size: int, value: Any, path: str) -> int:
    """The resource's size (as JSON, counted from above: what is removed is not taken
    off) once ``value`` is put at ``path``; PatchError when it would pass what a body
    may be, in size or in depth. Copies double a resource with each operation: 26 of a
    2 kB patch made gigabytes, and values put one below the other went past the depth
    any reader or the bus takes."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    size += len(text)
    if size > MAX_BODY:
        raise PatchError(f"the patched resource would be larger than {MAX_BODY} characters")
    try:
        json_depth(text, MAX_DEPTH - len(_pointer(path)))
    except BodyError:
        raise PatchError(
            f"the patched resource would be nested deeper than {MAX_DEPTH} levels"
        ) from None
    return size


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON Patch (``kubectl patch --type=json``): add, remove, replace, move,
    copy and test, applied in order to a copy; any failure fails the whole patch."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is an array of operations")
    if len(operations) > MAX_PATCH_OPS:
        raise PatchError(f"a JSON patch of more than {MAX_PATCH_OPS} operations")
    doc = copy.deepcopy(target)
    size = len(json.dumps(doc, ensure_ascii=False, default=str))
    for number, operation in enumerate(operations):
        if not isinstance(operation, dict) or not isinstance(operation.get("op"), str):
            raise PatchError(f"operation {number}: an object with an 'op'")
        op, path, source = operation["op"], operation.get("path"), operation.get("from", "")
        try:
            if not isinstance(path, str) or not isinstance(source, str):
                raise PatchError("'path' and 'from' are JSON pointer strings")
            match op:
                case "add" | "replace":
                    if "value" not in operation:
                        raise PatchError("missing 'value'")
                    size = _grown(size, operation["value"], path)
                    doc = _add(doc, path, copy.deepcopy(operation["value"]), op == "replace")
                case "remove":
                    _remove(doc, path)
                case "move":
                    if path.startswith(source + "/"):
                        raise PatchError("cannot move a value into itself")
                    _grown(0, _get(doc, source), path)  # deeper, not larger
                    doc = _add(doc, path, _remove(doc, source))
                case "copy":
                    size = _grown(size, _get(doc, source), path)
                    doc = _add(doc, path, copy.deepcopy(_get(doc, source)))
                case "test":
                    if _get(doc, path) != operation.get("value"):
                        raise PatchError(f"test of {path!r} failed")
                case _:
                    raise PatchError(f"unknown op {op!r}")
        except PatchError as exc:
            raise PatchError(f"operation {number} ({op} {path}): {exc}") from None
    return doc


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The strategic merge patch of these kinds: their schemas declare no merge keys, so
    every list is atomic and the patch merges as a JSON merge patch does (what the
    API server does for a schema without ``x-kubernetes-patch-merge-key``). Directives
    (``$patch``, ``$retainKeys``, ``$deleteFromPrimitiveList``...) are refused rather
    than stored as fields."""

    def check(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and key.startswith("$"):
                    raise PatchError(
                        f"{path}.{key}: strategic merge directives are not supported "
                        "for this kind (its lists have no merge keys)"
                    )
                check(item, f"{path}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                check(item, f"{path}[{i}]")

    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch is an object")
    check(patch, "$")
    return merge_patch(target, patch)


# ------------------------------------------------------------------------------ tables


def human_age(created: str, now: datetime) -> str:
    """How long ago, as kubectl writes an age (k8s.io/apimachinery's HumanDuration)."""
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = int((now - then).total_seconds())
    if seconds < -1:
        return "<invalid>"
    seconds = max(seconds, 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d"
    return f"{days // 365}y"


def table(resources: list[dict[str, Any]], meta: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of jobs, the columns Kubeflow's CRDs print (name, state,
    age), each row carrying its object's metadata for kubectl."""
    rows = []
    for resource in resources:
        conditions = (resource.get("status") or {}).get("conditions") or []
        state = ""
        for c in conditions:
            if isinstance(c, dict) and c.get("status") == "True":
                state = str(c.get("type") or "")
        phase = (resource.get("status") or {}).get("phase")
        rows.append(
            {
                "cells": [
                    (resource.get("metadata") or {}).get("name", ""),
                    phase or state,
                    human_age(str((resource.get("metadata") or {}).get("creationTimestamp")), now),
                ],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": resource.get("metadata") or {},
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "name"},
            {"name": "State", "type": "string", "format": "", "description": "state"},
            {"name": "Age", "type": "date", "format": "", "description": "created"},
        ],
        "rows": rows,
    }


# The most objects one page of a list holds, whatever its ``limit`` asks: a page may
# hold fewer, with a ``continue`` (Kubernetes' ListOptions), and each object is rendered
# with its tasks read (kubectl asks 500 at a time).
MAX_LIST_PAGE = 1000
_MAX_CONTINUE = 1024


class ContinueError(ValueError):
    """A list's ``limit`` or ``continue`` this server does not take (a 400)."""


def list_limit(asked: str) -> int:
    """A list's ``limit``: 0 (left out, 0 or less, as the API server takes them) for
    every object at once, else at most MAX_LIST_PAGE."""
    if not asked:
        return 0
    if not digits(asked.removeprefix("-").removeprefix("+")):
        raise ContinueError(f"limit {asked[:32]!r} is not a whole number")
    return max(0, min(int(asked), MAX_LIST_PAGE))


def continue_token(version: int, at: datetime, last: str) -> str:
    """A list page's ``metadata.continue``: the list's version (its first page's) and
    the last object's submission time and id, where the next page starts; opaque to
    clients, base64 of JSON as the API server's own."""
    text = json.dumps({"rv": version, "at": at.isoformat(), "id": last}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def parse_continue(token: str) -> tuple[int, datetime, str]:
    """``continue_token``'s parts, from a client's ``continue`` (bounded, checked; the
    API server's 400 message)."""
    try:
        if len(token) > _MAX_CONTINUE:
            raise ValueError(f"longer than {_MAX_CONTINUE} characters")
        padded = token + "=" * (-len(token) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii"))
        if not text.startswith(b"{"):
            raise ValueError("not a token of this server")  # nor nested arrays to parse
        found = json.loads(text)
        version, at, last = found["rv"], datetime.fromisoformat(found["at"]), found["id"]
        if type(version) is not int or version < 0 or not isinstance(last, str):
            raise ValueError("not a token of this server")
        if at.tzinfo is None:
            raise ValueError("not a token of this server")
        return version, in_utc(at), last
    except (ValueError, TypeError, KeyError, UnicodeError, binascii.Error, RecursionError) as exc:
        raise ContinueError(f"invalid continue token: continue key is not valid: {exc}") from None


def wants_table(accept: str) -> bool:
    """kubectl get asks for a Table first (``as=Table;g=meta.k8s.io``)."""
    return any(
        "as=Table" in part and "g=meta.k8s.io" in part and "v=v1" in part.replace(" ", "")
        for part in accept.split(",")
    )


def watch_event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


# ------------------------------------------------------------------------------- pods
#
# A read-only view of a job's tasks as the Pods its operator would have made, for the
# clients that look for them (the Kubeflow SDK's get_job_pods and get_job_logs, kubectl
# get pods / logs): named and labelled as the Training Operator names and labels them.

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
POD_VERBS = ["get", "list"]


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role.lower()}-{index}"


def parse_pod_name(name: str) -> tuple[str, str, int] | None:
    """(job name, replica type in lower case, index) of a pod name; None if not one."""
    job, _, rest = name.rpartition("-")
    job, _, rtype = job.rpartition("-")
    if not (job and rtype and digits(rest)) or len(rest) > 9:
        return None
    return job, rtype, int(rest)


def is_master(kind: str, role: str, index: int, roles: list[str]) -> bool:
    """The pod the Training Operator labels job-role=master (each controller's
    IsMasterRole): the Master, Chief or Launcher; a TFJob's worker 0 without a chief or
    master; a JAXJob's worker 0."""
    if role in ("Master", "Chief", "Launcher"):
        return True
    if kind == "TFJob" and not {"Chief", "Master"} & set(roles):
        return role == "Worker" and index == 0
    return kind == "JAXJob" and index == 0


_PHASES = {
    "PENDING": "Pending",
    "STARTING": "Pending",
    "RUNNING": "Running",
    "SUCCEEDED": "Succeeded",
    "FAILED": "Failed",
    "STOPPED": "Failed",
    "LOST": "Unknown",
}


def pod(resource: dict[str, Any], task: dict[str, Any], container: str) -> dict[str, Any]:
    """A task of a Kubernetes-style job as a ``v1`` Pod."""
    meta = resource.get("metadata") or {}
    job, kind = str(meta.get("name") or ""), str(resource.get("kind") or "")
    role, index = str(task.get("role")), int(task.get("index") or 0)
    roles = list(task.get("roles") or [])
    labels = {
        JOB_NAME_LABEL: job,
        REPLICA_TYPE_LABEL: role.lower(),
        REPLICA_INDEX_LABEL: str(index),
        OPERATOR_LABEL: f"{kind.lower()}-controller",
    }
    if is_master(kind, role, index, roles):
        labels[JOB_ROLE_LABEL] = "master"
    state = str(task.get("state") or "PENDING")
    status: dict[str, Any] = {"phase": _PHASES.get(state, "Unknown")}
    if task.get("host_ip"):
        status["hostIP"] = status["podIP"] = task["host_ip"]
    if task.get("started_at"):
        status["startTime"] = task["started_at"]
    running = state == "RUNNING"
    ended = state in ("SUCCEEDED", "FAILED", "STOPPED")
    container_state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
    if running:
        container_state = {"running": {"startedAt": task.get("started_at")}}
    elif ended:
        container_state = {
            "terminated": {
                "exitCode": task.get("exit_code") if task.get("exit_code") is not None else 1,
                "reason": "Completed" if state == "SUCCEEDED" else "Error",
                "message": task.get("reason") or "",
                "startedAt": task.get("started_at"),
                "finishedAt": task.get("ended_at"),
            }
        }
    status["containerStatuses"] = [
        {
            "name": container,
            "ready": running,
            "restartCount": max(0, int(task.get("attempt") or 1) - 1),
            "image": task.get("image") or "",
            "imageID": "",
            "state": container_state,
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(job, role, index),
            "namespace": meta.get("namespace", "default"),
            "uid": str(task.get("id") or ""),
            "creationTimestamp": task.get("created_at") or meta.get("creationTimestamp"),
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": resource.get("apiVersion"),
                    "kind": kind,
                    "name": job,
                    "uid": meta.get("uid"),
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": task.get("node"),
            "containers": [{"name": container, "image": task.get("image") or ""}],
        },
        "status": status,
    }
