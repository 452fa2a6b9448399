"""One trace per job across every service, exported over OTLP as the standard
``OTEL_*`` variables say, into a receiver in this test; and log lines as JSON that carry
the job and the trace they are about."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from trainyard_stack.components import free_port
from trainyard_stack.platform import Platform, PlatformConfig

from .conftest import CLUSTER, Api, unique

SERVICES = {"gateway", "intake", "validation", "placement", "launcher", "status"}


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf bodies."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            {
                                "service": service,
                                "trace_id": span.trace_id.hex(),
                                "name": span.name,
                                "kind": span.kind,
                                "attributes": {
                                    a.key: a.value.string_value or a.value.int_value
                                    for a in span.attributes
                                },
                            }
                        )

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, Receiver]]:
    import yaml

    receiver = Receiver()
    root = tmp_path_factory.mktemp("traced")
    cluster = root / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    config = PlatformConfig.with_free_ports(
        root / "data",
        cluster_file=cluster,
        log_level="DEBUG",  # a line per message handled, each naming its job
        extra_env={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "YARD_LOG_FORMAT": "json",
        },
    )
    platform = Platform(config).start()
    yield platform, receiver
    platform.stop()
    receiver.server.shutdown()


def test_one_trace_follows_a_job_through_every_service_to_its_task(
    traced: tuple[Platform, Receiver],
) -> None:
    platform, receiver = traced
    api = Api(platform.url, platform.token)
    name = unique("traced")
    job_id = api.submit(
        {"name": name, "roles": [{"name": "w", "command": "true", "resources": {"cpu": 1}}]}
    )
    assert api.wait(job_id)["state"] == "SUCCEEDED"
    history = api.events(job_id)
    trace_ids = {e["trace_id"] for e in history}
    assert len(trace_ids) == 1, history  # every event of the job in one trace
    trace_id = trace_ids.pop()

    deadline = time.monotonic() + 30
    while True:
        spans = receiver.of_trace(trace_id)
        services = {s["service"].removeprefix("trainyard-") for s in spans}
        names = {s["name"] for s in spans}
        if (services >= SERVICES and "task end" in names) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert services >= SERVICES, services
    # Named by the conventions: HTTP server spans by method and route template, messages
    # by operation and subject template, and the task's own start and end.
    assert "POST /v1/jobs" in names, names
    assert "publish yard.job.submitted" in names, names
    assert "process yard.job.placed" in names, names
    assert {"task start", "task end"} <= names, names
    ends = [s for s in spans if s["name"] == "task end"]
    assert ends[0]["attributes"]["trainyard.job_id"] == job_id
    assert ends[0]["attributes"]["trainyard.task.state"] == "SUCCEEDED"
    by_service = {s["service"] for s in spans if s["name"].startswith("process ")}
    assert {
        f"trainyard-{s}" for s in ("validation", "placement", "launcher", "status")
    } <= by_service

    # The services' log lines about this job are JSON with its id and its trace's.
    lines = []
    for log in Path(platform.logs).glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if job_id in line and line.startswith("{"):
                lines.append(json.loads(line))
    about = [line for line in lines if line.get("job_id") == job_id]
    assert about, f"no JSON log line names {job_id}"
    assert all(line["trace_id"] == trace_id for line in about), about
