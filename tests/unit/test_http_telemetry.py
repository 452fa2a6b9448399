"""A service's HTTP requests make no spans of FastAPI's own: every service sets a tracer
provider (trace ids go into each job's history) whether or not spans leave the process,
and FastAPI (0.142 on) traces every request, its dependencies, endpoint and
serialisation, whenever one is set. Server spans come from ``instrument_app`` while
exporting (tests/e2e/test_traces.py); otherwise the caller's trace is still continued."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
from opentelemetry import trace

from trainyard_common.runtime import health_app

# In a process of its own: the global tracer provider can be set once per process.
PROBE = """
import json
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from trainyard_common.runtime import health_app

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def spans_of(app):
    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return {"keys": len(body)}

    exporter.clear()
    with TestClient(app) as client:
        answer = client.post("/echo", json={"a": 1})
        assert answer.status_code == 200 and answer.json() == {"keys": 1}, answer.text
    return [span.name for span in exporter.get_finished_spans()]


print(json.dumps({"plain": spans_of(FastAPI()), "service": spans_of(health_app("probe"))}))
"""


def test_a_services_requests_make_no_spans_of_fastapis_own() -> None:
    # Without the variables that would configure the probe's telemetry otherwise.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FASTAPI_OTEL"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    # The same request to a plain FastAPI app is traced: what health_app turns off is there.
    assert spans["plain"], spans
    assert spans["service"] == [], spans


async def test_not_exporting_a_request_still_continues_its_callers_trace() -> None:
    app = health_app("probe")

    @app.get("/trace")
    async def current() -> dict[str, str]:
        context = trace.get_current_span().get_span_context()
        return {"trace_id": format(context.trace_id, "032x") if context.is_valid else ""}

    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
        continued = (await client.get("/trace", headers={"traceparent": caller})).json()
        alone = (await client.get("/trace")).json()  # nothing left over from the one before
        # Two traceparent headers: the first, as OpenTelemetry's own instrumentation reads.
        twice = [("traceparent", caller), ("traceparent", other)]
        first = (await client.get("/trace", headers=twice)).json()
    assert continued == first == {"trace_id": "0af7651916cd43dd8448eb211c80319c"}
    assert alone == {"trace_id": ""}
