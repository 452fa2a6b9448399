"""contracts/openapi.json: a valid OpenAPI 3.1 document (good enough to generate a client
from) of every route behind the gateway, each where the gateway really sends it, with
Trainyard's own bodies typed. (That it is current: test_contracts.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from openapi_spec_validator import validate

from trainyard_gateway.routes import route
from trainyard_stack.openapi import _example_path

DOC = json.loads((Path(__file__).resolve().parents[2] / "contracts" / "openapi.json").read_text())


def test_the_document_is_valid_openapi() -> None:
    validate(DOC)


def test_every_operation_is_where_the_gateway_sends_it() -> None:
    count = 0
    for template, operations in DOC["paths"].items():
        for method, operation in operations.items():
            assert route(method.upper(), _example_path(template)) == operation["x-service"]
            count += 1
    assert count >= 50


def ok_schema(path: str, method: str, status: str = "200") -> str:
    answer = DOC["paths"][path][method]["responses"][status]
    return answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]


def test_trainyards_own_api_is_typed() -> None:
    assert ok_schema("/v1/jobs", "get") == "JobList"
    assert ok_schema("/v1/jobs/{job_id}", "get") == "JobView"
    assert ok_schema("/v1/jobs/{job_id}/events", "get") == "History"
    assert ok_schema("/v1/jobs", "post", "202") == "SubmitAnswer"
    assert ok_schema("/v1/jobs:validate", "post") == "ValidationAnswer"
    assert ok_schema("/v1/jobs/{job_id}/stop", "post", "202") == "ControlAnswer"
    assert ok_schema("/v1/me", "get") == "Me"
    assert ok_schema("/v1/placement/cluster", "get") == "ClusterView"
    body = DOC["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/JobSpec"}
    assert "application/yaml" in body
    # Refusals are typed too, and every schema referred to is there.
    assert ok_schema("/v1/jobs/{job_id}", "get", "404") == "ErrorBody"
    text = json.dumps(DOC)
    schemas = DOC["components"]["schemas"]
    for name in {part.split('"')[0] for part in text.split("#/components/schemas/")[1:]}:
        assert name in schemas, name
    job = schemas["JobView"]["properties"]
    assert {"spec", "tasks", "attempts", "queue_reasons", "original"} <= set(job)
    assert DOC["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
