"""A round trip through each dialect's own view keeps the job: translate a payload,
render the job the way that dialect's API shows it, translate what it shows, and the
canonical job is the same."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_common.dialects import Translation, dlc, kubeflow, t9k, ti, translate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
AT = datetime(2026, 1, 1, tzinfo=UTC)


def view_of(t: Translation, payload: Any) -> dict[str, Any]:
    """The canonical job view (status's job_view) of a finished job, with its payload."""
    return {
        "id": "j1",
        "name": t.spec.name,
        "user": "u",
        "state": "SUCCEEDED",
        "dialect": t.dialect,
        "submitted_at": AT,
        "updated_at": AT,
        "finished_at": AT,
        "started_at": AT,
        "reason": "done",
        "exit_code": 0,
        "errors": [],
        "warnings": [],
        "queue": t.spec.queue,
        "priority": t.spec.priority,
        "attempt": 1,
        "queue_reasons": [],
        "spec": json.loads(t.spec.model_dump_json()),
        "tasks": [],
        "original": payload,
    }


def k8s_examples() -> list[Path]:
    complete = [p for p in sorted((EXAMPLES / "t9k").glob("*.yaml")) if "snippet" not in p.name]
    return complete + sorted((EXAMPLES / "kubeflow").glob("*.yaml"))


@pytest.mark.parametrize("path", k8s_examples(), ids=lambda p: p.name)
def test_kubernetes_style_resources(path: Path) -> None:
    payload = yaml.safe_load(path.read_text())
    first = translate(payload, user="u")
    module = t9k if first.dialect == "t9k" else kubeflow
    kind_name = t9k.KIND_SPELLINGS.get(payload["kind"], payload["kind"])
    plural = next(p for p, kind in module.PLURALS.items() if kind.name == kind_name)
    shown = module.render(plural, view_of(first, payload))
    assert "status" in shown
    shown.pop("status")
    again = translate(shown, user="u")
    assert again.dialect == first.dialect
    assert again.spec == first.spec and again.key == first.key


@pytest.mark.parametrize("path", sorted((EXAMPLES / "ti").glob("*.json")), ids=lambda p: p.name)
def test_ti_jobs(path: Path) -> None:
    payload = json.loads(path.read_text())
    first = translate(payload, user="u")
    shown = ti.render(view_of(first, payload))
    assert shown["state"] == "Succeeded" and shown["createTime"].startswith("2026-01-01T")
    output_only = {"state", "message", "createTime", "startTime", "endTime", "id", "warnings"}
    again = translate(
        {k: v for k, v in shown.items() if k not in output_only}, dialect="ti", user="u"
    )
    assert again.spec == first.spec and again.key == first.key


def test_dlc_get_job_carries_what_create_job_sent() -> None:
    body = {
        "DisplayName": "tf-mnist-test",
        "JobType": "TFJob",
        "JobSpecs": [
            {"Type": "Worker", "Image": "img", "PodCount": 3, "EcsSpec": "ecs.gn6e-c12g1.3xlarge"},
            {
                "Type": "PS",
                "Image": "img",
                "PodCount": 1,
                "ResourceConfig": {"CPU": "4", "Memory": "8Gi"},
            },
        ],
        "UserCommand": "python /root/code/mnist.py",
        "Envs": {"A": "1"},
        "Priority": 3,
        "ThirdpartyLibs": ["numpy==1.16.1"],
        "ThirdpartyLibDir": "/root/code/",
    }
    first = translate(body, user="u")
    shown = dlc.render_job(view_of(first, body), original=body)
    create_fields = (
        "DisplayName",
        "JobType",
        "JobSpecs",
        "UserCommand",
        "Envs",
        "Priority",
        "ThirdpartyLibs",
        "ThirdpartyLibDir",
        "ResourceId",
    )
    again = translate({k: shown[k] for k in create_fields if k in shown}, dialect="dlc", user="u")
    # GetJob has no JobMaxRunningTimeMinutes in the SDK's model; everything else returns.
    assert again.spec == first.spec
