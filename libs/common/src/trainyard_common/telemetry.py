"""Traces and logs: W3C trace context across HTTP and the bus, so one trace follows a
job through every service, and log lines that carry their job and trace.

A tracer provider is always installed (spans get real ids that travel in message
headers, and each event's trace id is kept in the job's history); while nothing is
exported and neither a sampler nor ``OTEL_SDK_DISABLED`` is set, one that gives spans
their ids and nothing else (``IdsOnlyTracer``). Exporting follows the
standard variables: ``OTEL_TRACES_EXPORTER`` = ``otlp`` (to ``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, OTLP over HTTP), ``console`` or ``none`` (the
default; ``YARD_OTEL_EXPORTER`` is read when it is unset), ``OTEL_SERVICE_NAME`` (default
``trainyard-<service>``), ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``. While exporting, every
HTTP request served (FastAPI) or sent (aiohttp, httpx) and every MongoDB command is a
span too, by the OpenTelemetry instrumentation packages; not exporting, those are left
out (they would cost every request and be seen by nobody). docs/observability.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

# A root span's flags (sampled; its trace id random, W3C level 2), and what a child
# keeps of its parent's, as the SDK sets them.
_NEW_TRACE = trace.TraceFlags(trace.TraceFlags.SAMPLED | trace.TraceFlags.RANDOM_TRACE_ID)
_KEPT_FLAGS = trace.TraceFlags.SAMPLED | trace.TraceFlags.RANDOM_TRACE_ID

_configured = False
_exporting = False

EXPORTERS = ("otlp", "console", "none")

# The job the current work is for (a message's handler, a watcher's look at a task).
current_job: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "trainyard_job", default=None
)


def exporter_name() -> str:
    name = os.environ.get("OTEL_TRACES_EXPORTER") or os.environ.get("YARD_OTEL_EXPORTER") or "none"
    name = name.strip().lower()
    if name not in EXPORTERS:
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: must be one of {', '.join(EXPORTERS)}")
    return name


def setup_telemetry(service: str, exporter: str | None = None) -> None:
    global _configured, _exporting
    if _configured:
        return
    _configured = True
    exporter = (exporter or exporter_name()).lower()
    sdk_asked = os.environ.get("OTEL_TRACES_SAMPLER") or os.environ.get("OTEL_SDK_DISABLED")
    if exporter == "none" and not sdk_asked:
        # Spans for nobody: their ids and flags only (IdsOnlyTracer).
        trace.set_tracer_provider(IdsOnlyTracerProvider())
        _exporting = False
        return
    name = os.environ.get("OTEL_SERVICE_NAME") or f"trainyard-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _exporting = exporter != "none"
    if _exporting:
        _instrument_clients()


class IdsOnlyTracer(trace.Tracer):
    """What a span is to others when no span leaves the process: its context. Each span
    gets the ids and flags the SDK's default sampler (parent-based, always on) would
    give it: the parent's trace id, flags and trace state, or a new sampled trace at a
    root; a new span id. So the ``traceparent`` a message or a request carries on, and
    the trace id kept in the history, are what they are while exporting, and an
    exporting service downstream (or a task tracing itself) records as it would. What
    the SDK would also do, collect each span's attributes, events and timings for no
    exporter, is left out: about 12 µs a span (a held submission makes some nine)."""

    _ids = RandomIdGenerator()

    def start_span(
        self, name: str, context: Context | None = None, *_: Any, **__: Any
    ) -> trace.Span:
        # The span's kind, attributes, links and times: nothing keeps them.
        parent = trace.get_current_span(context).get_span_context()
        span_id = self._ids.generate_span_id()
        if not parent.is_valid:
            return trace.NonRecordingSpan(
                trace.SpanContext(self._ids.generate_trace_id(), span_id, False, _NEW_TRACE)
            )
        flags = parent.trace_flags & _KEPT_FLAGS  # sampled as the parent; random ids as its
        ids = trace.SpanContext(
            parent.trace_id, span_id, False, trace.TraceFlags(flags), parent.trace_state
        )
        return trace.NonRecordingSpan(ids)

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, name: str, context: Context | None = None, *_: Any, **__: Any
    ) -> Iterator[trace.Span]:
        # Ending a span that records nothing, or recording an exception on it, does
        # nothing; an exception inside passes on as ever.
        with trace.use_span(self.start_span(name, context), end_on_exit=False) as span:
            yield span


class IdsOnlyTracerProvider(trace.TracerProvider):
    """The tracer provider while no exporter is set and no sampler asked for."""

    _tracer = IdsOnlyTracer()

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return self._tracer


def exporting() -> bool:
    """Spans leave the process: the HTTP and MongoDB instrumentation is on."""
    return _exporting


_TOKEN_PATH = re.compile(r"(/api/v2/tokens/)[^/?#]+")


def without_tokens(text: str) -> str:
    """A path or URL as a log line or a span may keep it: OpenPAI's token routes carry a
    live bearer token in theirs (DELETE /api/v2/tokens/{token})."""
    return _TOKEN_PATH.sub(r"\1<token>", text)


def _instrument_clients() -> None:
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.pymongo import PymongoInstrumentor

    # The gateway forwards the token routes with aiohttp: its client span's url.full.
    AioHttpClientInstrumentor().instrument(url_filter=lambda url: without_tokens(str(url)))
    HTTPXClientInstrumentor().instrument()
    PymongoInstrumentor().instrument()


# Requests with no server span: health checks and scrapes, and OpenPAI's token routes,
# whose path holds a live bearer token (DELETE /api/v2/tokens/{token}): a span's
# url.path would carry it to the trace store.
EXCLUDED_URLS = "healthz,metrics,/api/v2/tokens/"


def instrument_app(app: Any) -> None:
    """Server spans for a FastAPI app's requests (health checks and scrapes left out),
    continuing the caller's trace from its ``traceparent``, while exporting; otherwise
    no span, but the caller's trace is still made current (``CallerTrace``)."""
    if not _exporting:
        app.add_middleware(CallerTrace)
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, excluded_urls=EXCLUDED_URLS, exclude_spans=["receive", "send"]
    )


class CallerTrace:
    """ASGI middleware: a request's ``traceparent`` (and ``tracestate``) made the current
    context while it is handled, so what it publishes (the submitted job's events, their
    history) stays in the caller's trace when no server span does that (not exporting)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        carrier: dict[str, str] = {}
        states: list[str] = []
        if scope["type"] == "http":
            # As OpenTelemetry's ASGI getter reads them: the first traceparent, and
            # every tracestate header joined.
            for name, value in scope.get("headers") or ():
                if name == b"traceparent":
                    carrier.setdefault("traceparent", value.decode("latin-1"))
                elif name == b"tracestate":
                    states.append(value.decode("latin-1"))
        if states:
            carrier["tracestate"] = ",".join(states)
        if "traceparent" not in carrier:
            await self.app(scope, receive, send)
            return
        token = context.attach(extract_context(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)


def tracer(name: str = "trainyard") -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers(headers: dict[str, str], ctx: Context | None = None) -> dict[str, str]:
    propagate.inject(headers, context=ctx)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def trace_id_of(headers: Mapping[str, str] | None) -> str | None:
    """The trace id in a ``traceparent`` header, or None."""
    parent = (headers or {}).get("traceparent")
    if not parent:
        return None
    parts = parent.split("-")
    return parts[1] if len(parts) >= 4 else None


def current_context() -> Context:
    return context.get_current()


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span, to store with work that outlives it."""
    return inject_headers({}).get("traceparent")


@contextlib.contextmanager
def continue_trace(traceparent: str | None, job_id: str | None = None) -> Iterator[None]:
    """Make a stored ``traceparent`` current again, so what is published later (by a
    watcher loop, not a consumer) stays in the job's trace; ``job_id`` goes on the log
    lines meanwhile."""
    job_token = current_job.set(job_id) if job_id is not None else None
    token = context.attach(extract_context({"traceparent": traceparent})) if traceparent else None
    try:
        yield
    finally:
        if token is not None:
            context.detach(token)
        if job_token is not None:
            current_job.reset(job_token)


# --- logs ---------------------------------------------------------------------------------

LOG_FORMATS = ("json", "text")


class JsonLogs(logging.Formatter):
    """One JSON object per line: time, service, level, logger, message, and the job and
    trace the line is about when there is one (an exception's traceback in ``exc``)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "service": self.service,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_where())
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextLogs(logging.Formatter):
    """For people: the same fields on one line, job and trace at its end."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        where = _where()
        if where:
            text += " [" + " ".join(f"{k}={v}" for k, v in where.items()) + "]"
        return text


def _where() -> dict[str, str]:
    found: dict[str, str] = {}
    if job := current_job.get():
        found["job_id"] = job
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        found["trace_id"] = format(span.trace_id, "032x")
        found["span_id"] = format(span.span_id, "016x")
    return found


def log_formatter(service: str, form: str | None = None) -> logging.Formatter:
    """``YARD_LOG_FORMAT``: ``json`` (the default: one object per line, for machines) or
    ``text`` (for people)."""
    form = (form or os.environ.get("YARD_LOG_FORMAT") or "json").strip().lower()
    if form not in LOG_FORMATS:
        raise ValueError(f"YARD_LOG_FORMAT={form!r}: must be one of {', '.join(LOG_FORMATS)}")
    return JsonLogs(service) if form == "json" else TextLogs(service)
