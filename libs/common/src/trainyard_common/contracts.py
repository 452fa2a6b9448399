"""Generate ``contracts/`` from the models: JSON Schemas, an AsyncAPI document and example
payloads, so producers in any language can publish submissions and read events.

``python -m trainyard_stack.bus_map`` (``make contracts``) writes them, with who sends
and who receives each event; ``render()`` is what a test compares with the checked-in
files, so they never go stale.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import BaseModel

from .events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    Event,
    FailureClass,
    FieldIssue,
    InterruptCause,
    InterruptJob,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobQueued,
    JobRejected,
    JobResourceChanged,
    JobRetrying,
    JobState,
    JobSubmitted,
    JobTagged,
    PauseJob,
    PortAssignment,
    RestartJob,
    ResumeJob,
    ScaleJob,
    SetPriority,
    StopJob,
    TaskPlacement,
    TasksPlaced,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from .jobspec import JobSpec, PortSpec, Resources, RoleSpec
from .subjects import STREAM, STREAM_SUBJECTS, subject_for, subjects_for

EXAMPLE_JOB_ID = "8f14e45fceea167a5a36dedd4bea2543"
EXAMPLE_TIME = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def example_spec() -> JobSpec:
    return JobSpec(
        name="pi-estimate",
        user="alice",
        roles=[
            RoleSpec(
                name="worker",
                replicas=2,
                command="python3 train.py",
                resources=Resources(cpu=1, memory_mb=512),
                ports=[PortSpec(label="http", begin_at=0, count=1)],
            )
        ],
    )


def example_events() -> list[Event]:
    spec = example_spec()
    common = {"job_id": EXAMPLE_JOB_ID, "occurred_at": EXAMPLE_TIME}
    tasks = [
        TaskPlacement(
            role="worker",
            index=i,
            node="node-0",
            host_ip="127.0.0.1",
            ports=[PortAssignment(label="http", ports=[20100 + i])],
        )
        for i in range(2)
    ]
    events: list[Event] = [
        JobSubmitted(
            event_id=derived_id("example", "submitted"), spec=spec, dialect="native", **common
        ),
        JobAccepted(event_id=derived_id("example", "accepted"), spec=spec, **common),
        JobRejected(
            event_id=derived_id("example", "rejected"),
            errors=[
                FieldIssue(
                    path="$.taskRoles[0].memoryMB",
                    message="must be at least 100 (got 50)",
                    code="minimum",
                )
            ],
            **common,
        ),
        JobQueued(
            event_id=derived_id("example", "queued"),
            position=1,
            reasons=["needs 4 CPU, most free on any node is 2"],
            **common,
        ),
        JobPlaced(event_id=derived_id("example", "placed"), spec=spec, tasks=tasks, **common),
        TasksPlaced(event_id=derived_id("example", "tasks", 2), tasks=tasks, **common),
        JobTagged(event_id=derived_id("example", "tag", "nightly"), tag="nightly", **common),
        TaskStateChanged(
            event_id=derived_id("example", "task"),
            role="worker",
            index=0,
            state=TaskState.SUCCEEDED,
            seq=3,
            node="node-0",
            exit_code=0,
            reason="exited with code 0",
            **common,
        ),
        JobFinished(
            event_id=derived_id("example", "finished"),
            state=JobState.SUCCEEDED,
            reason="all tasks ended",
            exit_code=0,
            **common,
        ),
        JobRetrying(
            event_id=derived_id("example", "retrying"),
            attempt=2,
            previous_attempt=1,
            reason="attempt 1 failed (platform failure): 1 of 2 worker task(s) failed, "
            "reaching minFailedTaskCount=1; worker[1] failed: lost while the "
            "launcher was down; retrying as attempt 2 of at most 3 after 10s",
            failure_class=FailureClass.PLATFORM,
            not_before=datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC),
            **common,
        ),
        JobInterrupted(
            event_id=derived_id("example", "interrupted"),
            attempt=1,
            cause=InterruptCause.PREEMPTED,
            reason="preempted by job 3a7bd3e2360a3d29eea436fcfb7e44c7 (priority 8)",
            **common,
        ),
        StopJob(event_id=derived_id("example", "stop"), requested_by="alice", **common),
        JobResourceChanged(
            event_id=derived_id("example", "resource"),
            resource={
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": "mnist", "namespace": "default", "labels": {"team": "a"}},
                "spec": {"runPolicy": {"suspend": True}},
            },
            generation=2,
            **common,
        ),
        PauseJob(event_id=derived_id("example", "pause"), requested_by="alice", **common),
        ResumeJob(event_id=derived_id("example", "resume"), requested_by="alice", **common),
        ScaleJob(
            event_id=derived_id("example", "scale"),
            requested_by="alice",
            role="worker",
            replicas=4,
            **common,
        ),
        SetPriority(
            event_id=derived_id("example", "priority"),
            requested_by="alice",
            priority=8,
            **common,
        ),
        InterruptJob(
            event_id=derived_id("example", "interrupt"),
            attempt=1,
            cause=InterruptCause.PAUSED,
            reason="paused by alice",
            **common,
        ),
        RestartJob(
            event_id=derived_id("example", "restart"),
            requested_by="alice",
            reason="restarted by alice",
            **common,
        ),
    ]
    return events


def _dump_json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# Which services send and which receive each event type, by service name: known to the
# composition root (trainyard_stack.bus_map, from the bus grants and the services'
# handler tables), which the shared library may not import.
Routes = Mapping[str, Iterable[type[Event]]]


def asyncapi(senders: Routes, receivers: Routes) -> dict:
    channels: dict[str, dict] = {}
    operations: dict[str, dict] = {}
    messages: dict[str, dict] = {}
    for model in EVENT_TYPES:
        name = model.__name__
        channel = f"{name[0].lower()}{name[1:]}"
        channels[channel] = {
            "address": subjects_for([model])[0],
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        summary = (model.__doc__ or name).strip().splitlines()[0]
        for action, routes in (("send", senders), ("receive", receivers)):
            for service in sorted(s for s, types in routes.items() if model in set(types)):
                operations[f"{service}.{action}{name}"] = {
                    "action": action,
                    "channel": {"$ref": f"#/channels/{channel}"},
                    "summary": summary,
                    "x-service": service,
                }
        messages[name] = {
            "name": name,
            "contentType": "application/json",
            "headers": {
                "type": "object",
                "properties": {
                    "Nats-Msg-Id": {
                        "type": "string",
                        "description": "= event_id (JetStream dedup)",
                    },
                    "traceparent": {"type": "string", "description": "W3C trace context"},
                },
            },
            "payload": {"$ref": f"schemas/{name}.json"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Trainyard events",
            "version": str(SCHEMA_VERSION),
            "description": (
                f"Every message lives in the JetStream stream {STREAM} "
                f"(subjects {', '.join(STREAM_SUBJECTS)}, file storage). Publishers set "
                "Nats-Msg-Id to the event_id; consumers are durable with explicit acks."
            ),
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def render(senders: Routes, receivers: Routes) -> dict[str, str]:
    """Every generated file, by path relative to ``contracts/``."""
    files: dict[str, str] = {}
    models: tuple[type[BaseModel], ...] = (JobSpec, *EVENT_TYPES)
    for model in models:
        files[f"schemas/{model.__name__}.json"] = _dump_json(model.model_json_schema())
    for event in example_events():
        files[f"examples/{type(event).__name__}.json"] = _dump_json(
            {"subject": subject_for(event), "payload": json.loads(event.model_dump_json())}
        )
    files["asyncapi.yaml"] = yaml.safe_dump(
        asyncapi(senders, receivers), sort_keys=False, allow_unicode=True
    )
    return files


def write(directory: Path, senders: Routes, receivers: Routes) -> list[Path]:
    written = []
    for relative, text in render(senders, receivers).items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
