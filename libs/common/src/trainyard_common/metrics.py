"""Prometheus metrics every service exports at ``/metrics`` (prometheus-client's own
format and registry): its HTTP requests and its bus consumers. A service's own figures
(jobs, queues, placement) are declared in the service, on the same registry.

Names follow Prometheus's conventions (``_total`` counters, ``_seconds`` durations, base
units). Labels never hold a user's name, a job id or a token: what the series are is
bounded by the routes, durables, dialects, queues and nodes the platform has. The
scraper adds ``job`` and ``instance`` (deploy/prometheus/prometheus.yml: ``job`` is the
service), so no metric repeats the service's name."""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Latencies of a platform whose hops take milliseconds, up to the seconds a stuck one takes.
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

HTTP_REQUESTS = Counter(
    "trainyard_http_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "code"],
)
HTTP_DURATION = Histogram(
    "trainyard_http_request_duration_seconds",
    "Time from a request's arrival to the end of its answer (a streamed answer: to its "
    "start, status and headers), by route template and method.",
    ["route", "method"],
    buckets=FAST_BUCKETS,
)
BUS_MESSAGES = Counter(
    "trainyard_bus_messages_total",
    "Messages a durable consumer handled, by outcome: acked (its effect stored), "
    "retried (nak'd after a transient error) or dead (kept in the dead letters).",
    ["durable", "outcome"],
)
BUS_REDELIVERIES = Counter(
    "trainyard_bus_redeliveries_total",
    "Messages received again after an earlier delivery was not acked.",
    ["durable"],
)
BUS_BATCHES_SPLIT = Counter(
    "trainyard_bus_batches_split_total",
    "Fetched batches a consumer could not store whole, twice (a write the store "
    "refused), and handled again one message at a time.",
    ["durable"],
)
BUS_DEAD_LETTERS = Counter(
    "trainyard_bus_dead_letters_total",
    "Messages a durable consumer gave up on and kept in the dead letters.",
    ["durable"],
)
BUS_PENDING = Gauge(
    "trainyard_bus_consumer_pending_messages",
    "Messages of the stream not yet delivered to a durable consumer (its lag), as of the "
    "last batch it fetched; 0 once a fetch finds nothing.",
    ["durable"],
)
BUS_HANDLE = Histogram(
    "trainyard_bus_handle_seconds",
    "Time a durable consumer's handler took for one message.",
    ["durable"],
    buckets=FAST_BUCKETS,
)


def exposition() -> tuple[bytes, str]:
    """The registry in Prometheus's text format, and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST


UNMATCHED = "<unmatched>"


class HttpMetrics:
    """ASGI middleware counting every HTTP answer by its route's template (``/v1/jobs/
    {job_id}``, never the path itself: the series stay bounded), method and code, with
    its latency.

    The latency of an answer sent in one piece is to its end; of a streamed one (its
    first body part says more follows: an SSE watch, a followed log, a Kubernetes watch,
    what the gateway relays as it comes), to its start, the status and headers sent:
    timed to its end, a watch held for minutes said nothing of how fast it was answered,
    and put every such route's p99 at the histogram's top (the gateway's one route
    included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        code = 500
        started: float | None = None  # when the status and headers went
        took: float | None = None

        async def counted(message: Message) -> None:
            nonlocal code, started, took
            kind = message["type"]
            if kind == "http.response.start":
                code = message["status"]
            await send(message)
            if kind == "http.response.start":
                started = time.perf_counter()
            elif kind == "http.response.body" and took is None:
                if message.get("more_body", False) and started is not None:
                    took = started - start  # a stream: to its start
                else:
                    took = time.perf_counter() - start

        try:
            await self.app(scope, receive, counted)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            method = scope.get("method", "GET")
            HTTP_REQUESTS.labels(template, method, str(code)).inc()
            if took is None:
                # No body went (a client that left, a stream that sent nothing yet):
                # to the start where there was one.
                took = (started if started is not None else time.perf_counter()) - start
            HTTP_DURATION.labels(template, method).observe(took)
