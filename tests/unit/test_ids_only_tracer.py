"""The tracer used while nothing is exported gives every span the context the SDK's
default sampler would give it, so what travels on and what the history keeps do not
depend on whether a service exports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from trainyard_common.telemetry import IdsOnlyTracer, IdsOnlyTracerProvider, inject_headers

SDK = TracerProvider().get_tracer("sdk")
OURS = IdsOnlyTracerProvider().get_tracer("ours")

PARENTS = {
    "sampled": SpanContext(0x1234, 0x99, True, TraceFlags(TraceFlags.SAMPLED)),
    "not sampled": SpanContext(0x1234, 0x99, True, TraceFlags(TraceFlags.DEFAULT)),
    "random ids, other flags": SpanContext(0x1234, 0x99, True, TraceFlags(0xFF)),
    "random ids, not sampled": SpanContext(0x1234, 0x99, False, TraceFlags(0x02)),
    "with state": SpanContext(
        0xABC, 0x5, True, TraceFlags(TraceFlags.SAMPLED), TraceState([("vendor", "x")])
    ),
}


def context_under(tracer: trace.Tracer, parent: SpanContext | None) -> SpanContext:
    ctx = trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None
    with tracer.start_as_current_span("work", context=ctx, attributes={"a": 1}) as span:
        assert trace.get_current_span() is span
        return span.get_span_context()


@pytest.mark.parametrize("parent", list(PARENTS))
def test_a_child_gets_the_context_the_sdk_gives_it(parent: str) -> None:
    sdk, ours = context_under(SDK, PARENTS[parent]), context_under(OURS, PARENTS[parent])
    assert isinstance(OURS, IdsOnlyTracer)
    assert (ours.trace_id, ours.trace_flags, ours.trace_state, ours.is_remote) == (
        sdk.trace_id, sdk.trace_flags, sdk.trace_state, sdk.is_remote
    )  # fmt: skip
    assert ours.span_id not in (0, PARENTS[parent].span_id)


def test_a_root_span_starts_a_new_sampled_trace() -> None:
    sdk, first, second = (context_under(t, None) for t in (SDK, OURS, OURS))
    assert first.trace_flags == sdk.trace_flags and first.trace_flags.sampled
    assert first.is_valid and second.is_valid
    assert first.trace_id != second.trace_id and first.span_id != second.span_id


def test_the_current_span_is_what_a_publish_carries_on() -> None:
    with OURS.start_as_current_span("outer") as outer:
        with OURS.start_as_current_span("inner") as inner:
            headers = inject_headers({})
    ids = inner.get_span_context()
    assert ids.trace_id == outer.get_span_context().trace_id
    assert headers["traceparent"] == f"00-{ids.trace_id:032x}-{ids.span_id:016x}-03"
    assert not inner.is_recording()


def test_an_error_inside_still_propagates() -> None:
    with pytest.raises(ValueError), OURS.start_as_current_span("failing"):
        raise ValueError("the handler's")
    assert not trace.get_current_span().get_span_context().is_valid


@pytest.mark.parametrize(
    ("env", "provider"),
    [
        ({}, "IdsOnlyTracerProvider"),
        ({"OTEL_TRACES_EXPORTER": "none"}, "IdsOnlyTracerProvider"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio"}, "TracerProvider"),
        ({"OTEL_SDK_DISABLED": "true"}, "TracerProvider"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "TracerProvider"),
    ],
)
def test_the_sdk_is_kept_where_it_is_asked_for(env: dict[str, str], provider: str) -> None:
    # A process sets its tracer provider once: each case in a fresh interpreter.
    script = (
        "from opentelemetry import trace\n"
        "from trainyard_common.telemetry import setup_telemetry\n"
        "setup_telemetry('t')\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "YARD_OTEL"))}
    done = subprocess.run(
        [sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == provider
