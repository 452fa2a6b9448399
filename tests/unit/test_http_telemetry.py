"""A service's HTTP requests make no spans of FastAPI's own: every service sets a tracer
provider (trace ids go into each job's history) whether or not spans leave the process,
and FastAPI (0.142 on) traces every request, its dependencies, endpoint and
serialisation, whenever one is set. Server spans come from ``instrument_app`` while
exporting (tests/e2e/test_traces.py)."""

from __future__ import annotations

import json
import subprocess
import sys

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
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    # The same request to a plain FastAPI app is traced: what health_app turns off is there.
    assert spans["plain"], spans
    assert spans["service"] == [], spans
