"""W3C trace context across the bus, so one trace follows a job through every service.

A tracer provider is always installed (spans get real ids that travel in message
headers); exporting them is off unless ``YARD_OTEL_EXPORTER`` says ``console`` or
``otlp`` (the OTLP endpoint comes from the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_configured = False


def setup_telemetry(service: str, exporter: str | None = None) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    provider = TracerProvider(resource=Resource.create({"service.name": f"trainyard-{service}"}))
    exporter = (exporter or os.environ.get("YARD_OTEL_EXPORTER", "none")).lower()
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


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
def continue_trace(traceparent: str | None) -> Iterator[None]:
    """Make a stored ``traceparent`` current again, so what is published later (by a
    watcher loop, not a consumer) stays in the job's trace."""
    if not traceparent:
        yield
        return
    token = context.attach(extract_context({"traceparent": traceparent}))
    try:
        yield
    finally:
        context.detach(token)
