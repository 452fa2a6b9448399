"""One OpenAPI document for the whole HTTP surface behind the gateway's base URL: each
service's own routes (from its FastAPI app, built here without starting anything), each
kept only where the gateway's route table sends that method and path to that service,
merged with their schemas under one bearer-token scheme. ``make contracts`` writes it to
``contracts/openapi.json``; a test keeps it fresh and validates it.

Trainyard's own API (``/v1/...``) has typed bodies (``trainyard_common.api``); the
dialects' routes answer in their platforms' own shapes and are listed with their
parameters."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI

from trainyard_common.api import ErrorBody
from trainyard_common.auth import TokenStore
from trainyard_common.jobspec import JobSpec
from trainyard_gateway.routes import route
from trainyard_intake.app import create_app as intake_app
from trainyard_launcher.app import create_app as launcher_app
from trainyard_placement.app import add_node_routes, build_app
from trainyard_status.app import create_app as status_app
from trainyard_validation.app import create_app as validation_app

VERSION = "1"
METHODS = ("get", "put", "post", "delete", "patch")


class _Unused:
    """Stands for a dependency no route is asked to use while only the schema is read."""


def service_apps() -> dict[str, FastAPI]:
    tokens = TokenStore(None, None)
    unused: Any = _Unused()
    placement = build_app(unused, tokens)
    add_node_routes(placement, unused, tokens)
    return {
        "intake": intake_app(unused, tokens, None),
        "validation": validation_app(unused, unused, tokens),
        "placement": placement,
        "launcher": launcher_app(unused, tokens, unused, unused),
        "status": status_app(unused, tokens, unused, unused),
    }


# Values that the gateway's patterns expect of some parameters (a resource group it
# serves, a number).
EXAMPLES = {"group": "kubeflow.org", "version": "v1", "seq": "1", "index": "0"}


def _example_path(template: str) -> str:
    """A concrete path for a template, to ask the gateway's table where it goes."""
    return re.sub(r"\{([^}]+)\}", lambda m: EXAMPLES.get(m.group(1), "x1"), template)


def _tidy(operation: dict[str, Any]) -> dict[str, Any]:
    """A response documented by its model says only that (not also the loose ``object``
    of the route's ``dict`` annotation beside it)."""
    for answer in operation.get("responses", {}).values():
        for content in answer.get("content", {}).values():
            schema = content.get("schema", {})
            if "$ref" in schema:
                content["schema"] = {"$ref": schema["$ref"]}
    return operation


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {}
    for service, app in service_apps().items():
        doc = app.openapi()
        for template, operations in sorted(doc.get("paths", {}).items()):
            for method, operation in operations.items():
                if method not in METHODS:
                    continue
                if route(method.upper(), _example_path(template)) != service:
                    continue  # the gateway sends this elsewhere (or nowhere)
                operation = {**_tidy(operation), "tags": [service], "x-service": service}
                operation["operationId"] = f"{service}_{operation['operationId']}"
                paths.setdefault(template, {})[method] = operation
        for name, schema in doc.get("components", {}).get("schemas", {}).items():
            schemas.setdefault(name, schema)
    # The request body routes refer to (declared by hand: any dialect goes through them).
    for model in (JobSpec, ErrorBody):
        if model.__name__ not in schemas:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in schema.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas[model.__name__] = schema
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Trainyard",
            "version": VERSION,
            "description": "Every route behind the gateway's base URL (docs/architecture.md). "
            "Authenticate with `Authorization: Bearer <token>`; the PAI-DLC routes also take "
            "Alibaba Cloud's signatures.",
        },
        "servers": [{"url": "http://127.0.0.1:8080", "description": "make run / make up"}],
        "security": [{"bearer": []}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
