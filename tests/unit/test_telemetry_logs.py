"""Log lines as JSON or text with the job and trace they are about, the choice of trace
exporter by the standard variables, and the subject templates spans are named by."""

from __future__ import annotations

import json
import logging

import pytest

from trainyard_common.subjects import subject_template
from trainyard_common.telemetry import (
    continue_trace,
    current_job,
    exporter_name,
    log_formatter,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def record(message: str = "hello %s", *args: object) -> logging.LogRecord:
    return logging.LogRecord(
        "trainyard.test", logging.INFO, __file__, 1, message, args or ("x",), None
    )


def test_a_json_line_carries_the_job_and_the_trace_it_is_about() -> None:
    formatter = log_formatter("launcher", "json")
    plain = json.loads(formatter.format(record()))
    assert plain["message"] == "hello x" and plain["service"] == "launcher"
    assert plain["level"] == "INFO" and "job_id" not in plain and "trace_id" not in plain
    with continue_trace(TRACEPARENT, "job-1"):
        line = json.loads(formatter.format(record()))
    assert line["job_id"] == "job-1"
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert line["span_id"] == "b7ad6b7169203331"
    assert current_job.get() is None  # left as it was


def test_a_text_line_for_people_and_an_unknown_format_refused() -> None:
    with continue_trace(TRACEPARENT, "job-2"):
        text = log_formatter("status", "text").format(record())
    assert " status INFO trainyard.test: hello x [job_id=job-2 trace_id=0af76519" in text
    with pytest.raises(ValueError, match="YARD_LOG_FORMAT"):
        log_formatter("status", "xml")


def test_the_exporter_follows_otel_traces_exporter_then_the_older_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("YARD_OTEL_EXPORTER", raising=False)
    assert exporter_name() == "none"
    monkeypatch.setenv("YARD_OTEL_EXPORTER", "console")
    assert exporter_name() == "console"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "OTLP")
    assert exporter_name() == "otlp"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        exporter_name()


def test_spans_name_subjects_by_their_template() -> None:
    assert subject_template("yard.job.placed") == "yard.job.placed"
    # A message stored before the job id left the subjects reads as today's.
    assert subject_template("yard.job.abc123.placed") == "yard.job.placed"
    assert subject_template("yard.cmd.abc123.stop") == "yard.cmd.stop"
    assert subject_template("yard.submit.alice.s1") == "yard.submit.{user}.{submission_id}"
    assert subject_template("yard.dead.x") == "yard.dead.x"
