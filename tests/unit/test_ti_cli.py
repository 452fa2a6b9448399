"""``yard ti job …`` (tictl's commands) through typer's CliRunner, against an in-memory
TI API behind an httpx MockTransport: the seed's tictl example verbatim, and the
get / list / delete commands."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from typer.testing import CliRunner

from trainyard_common.dialects import translate
from trainyard_common.dialects.ti import render, translate_ti
from trainyard_common.jobspec import JobKind
from trainyard_sdk.cli import make_app
from trainyard_sdk.client import Client
from trainyard_sdk.ti_cli import job_payload

SEED_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ti" / "tictl-job-create.txt"
TOKEN = "ti-token"
ENV = {
    "COLUMNS": "220",
    "NO_COLOR": "1",
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "YARD_TOKEN": None,
    "YARD_URL": None,
    "YARD_DATA_DIR": None,
}
JOB_PATH = re.compile(r"^/ti/v1/jobs/(?P<cluster>[^/]+)/(?P<name>[^/]+)$")


class FakeTi:
    """The TI routes as the platform answers them: 400 with field errors, 202 with the
    TI view, 404 for an unknown name."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[httpx.Request] = []
        self.deleted: list[tuple[str, str]] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"detail": "missing or unknown token"})
        path = request.url.path
        if path == "/ti/v1/jobs" and request.method == "POST":
            payload = json.loads(request.content)
            checked = translate_ti(payload)
            if checked.errors:
                return httpx.Response(
                    400,
                    json={
                        "detail": {
                            "message": "invalid TI job",
                            "errors": [e.model_dump() for e in checked.errors],
                        }
                    },
                )
            self.jobs[(payload["cluster"], payload["name"])] = payload
            view = render(
                {
                    "id": "job-1",
                    "name": payload["name"],
                    "state": "SUBMITTED",
                    "submitted_at": "2024-05-01T12:00:00Z",
                    "original": payload,
                }
            )
            view["warnings"] = [w.model_dump() for w in checked.warnings]
            return httpx.Response(202, json=view)
        if path == "/ti/v1/jobs" and request.method == "GET":
            cluster = request.url.params.get("cluster")
            views = [
                render(
                    {
                        "name": n,
                        "state": "RUNNING",
                        "original": p,
                        "submitted_at": "2024-05-01T12:00:00Z",
                    }
                )
                for (c, n), p in self.jobs.items()
                if cluster in (None, c)
            ]
            return httpx.Response(200, json={"jobs": views, "total": len(views)})
        match = JOB_PATH.match(path)
        if match:
            key = (unquote(match["cluster"]), unquote(match["name"]))
            if key not in self.jobs:
                return httpx.Response(404, json={"detail": f"no TI job {key[1]!r}"})
            if request.method == "DELETE":
                self.deleted.append(key)
                return httpx.Response(202, json={"stop": "requested"})
            return httpx.Response(
                200,
                json=render(
                    {
                        "name": key[1],
                        "state": "SUCCEEDED",
                        "original": self.jobs[key],
                        "submitted_at": "2024-05-01T12:00:00Z",
                        "finished_at": "2024-05-01T13:00:00Z",
                    }
                ),
            )
        return httpx.Response(404, json={"detail": "Not Found"})

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.method == "POST"]


@pytest.fixture
def fake() -> FakeTi:
    return FakeTi()


@pytest.fixture
def yard(fake: FakeTi):
    def connect(url: str | None, token: str | None) -> Client:
        return Client(url or "http://gw.test", token, transport=fake.transport)

    app = make_app(connect)
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, ["--token", TOKEN, *args], env=ENV)

    return run


def seed_argv() -> list[str]:
    """The seed's tictl command line, as bash reads it: the prompt off, line
    continuations joined (bash drops backslash-newline inside double quotes too)."""
    text = SEED_EXAMPLE.read_text()
    assert text.startswith("$ tictl job create test73")
    argv = shlex.split(text.removeprefix("$ ").replace("\\\n", ""))
    assert argv[0] == "tictl"
    return argv[1:]


def test_the_seed_tictl_example_verbatim(yard, fake: FakeTi) -> None:
    done = yard("ti", *seed_argv())
    assert done.exit_code == 0, done.output
    assert "job test73 created in cluster cls-rgaisoe4: Created" in done.output
    [payload] = fake.payloads()
    assert payload == {
        "name": "test73",
        "cluster": "cls-rgaisoe4",
        "region": "ap-guangzhou",
        "command": [
            "python",
            "/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py",
            "--model",
            "resnet50",
            "--batch_size",
            "32",
            "--variable_update",
            "tfplus",
        ],
        "runtimeVersion": "tfplus-1.6.0-gpu",
        "workerCount": 3,
        "workerType": "0U0G2P",
    }
    t = translate(payload)
    assert t.dialect == "ti" and t.errors == [] and t.key == "cls-rgaisoe4/test73"
    assert t.spec.kind is JobKind.TENSORFLOW
    assert [(r.name, r.replicas, r.resources.gpu) for r in t.spec.roles] == [("worker", 3, 2)]


def test_every_flag_lands_in_its_field(yard, fake: FakeTi) -> None:
    done = yard(
        "ti",
        "job",
        "create",
        "dist",
        "--cluster",
        "c1",
        "--command",
        "python t.py",
        "--args=--lr 0.1",
        "--args",
        "--name 'a b'",
        "--runtime",
        "tf-1.7.0-gpu-py3",
        "--wcount",
        "2",
        "--workertype",
        "2U4G1P",
        "--pscount",
        "1",
        "--pstype",
        "1U8G0P",
        "--mastertype",
        "1U2G1P",
        "--package-dir",
        "cos://b/code,cos://b/data",
        "--package-dir",
        "/out",
        "-o",
        "json",
    )
    assert done.exit_code == 0, done.output
    [payload] = fake.payloads()
    assert payload == {
        "name": "dist",
        "cluster": "c1",
        "command": ["python", "t.py"],
        "args": ["--lr", "0.1", "--name", "a b"],
        "runtimeVersion": "tf-1.7.0-gpu-py3",
        "workerCount": 2,
        "workerType": "2U4G1P",
        "parameterServerCount": 1,
        "parameterServerType": "1U8G0P",
        "masterType": "1U2G1P",
        "packageDir": ["cos://b/code", "cos://b/data", "/out"],
    }
    view = json.loads(done.stdout)
    assert view["state"] == "Created" and view["createTime"] == "2024-05-01T12:00:00.000Z"


def test_a_rejected_job_prints_the_field_errors(yard) -> None:
    done = yard(
        "ti",
        "job",
        "create",
        "bad",
        "--cluster",
        "c1",
        "--command",
        "python t.py",
        "--runtime",
        "tfplus-1.6.0-gpu",
        "--workertype",
        "1U2G0P",
    )
    assert done.exit_code == 1
    assert "$.workerType" in done.output and "GPU" in done.output


def test_warnings_are_shown(yard) -> None:
    done = yard(
        "ti",
        "job",
        "create",
        "w",
        "--cluster",
        "c1",
        "--command",
        "python t.py",
        "--runtime",
        "tf-1.7.0-gpu",
    )
    assert done.exit_code == 0, done.output
    assert "warning: $.runtimeVersion" in done.output


def test_a_command_line_that_does_not_parse_is_a_usage_error(yard, fake: FakeTi) -> None:
    done = yard("ti", "job", "create", "x", "--cluster", "c1", "--command", "python 'open")
    assert done.exit_code == 2 and fake.requests == []


def test_get_list_and_delete(yard, fake: FakeTi) -> None:
    assert yard("ti", "job", "create", "a", "--cluster", "c1", "--command", "true").exit_code == 0
    assert yard("ti", "job", "create", "b", "--cluster", "c2", "--command", "true").exit_code == 0

    shown = yard("ti", "job", "get", "a", "--cluster", "c1")
    assert shown.exit_code == 0, shown.output
    assert re.search(r"state\s+Succeeded", shown.output)
    assert re.search(r"endTime\s+2024-05-01T13:00:00.000Z", shown.output)
    as_json = json.loads(yard("ti", "job", "get", "a", "--cluster", "c1", "-o", "json").stdout)
    assert as_json["cluster"] == "c1" and as_json["command"] == ["true"]

    listed = yard("ti", "job", "list", "--cluster", "c2")
    rows = [line.split()[:3] for line in listed.stdout.splitlines()[1:]]
    assert listed.exit_code == 0 and rows == [["b", "c2", "Running"]]
    assert [r.url.params.get("cluster") for r in fake.requests if r.method == "GET"][-1] == "c2"

    deleted = yard("ti", "job", "delete", "a", "--cluster", "c1")
    assert deleted.exit_code == 0 and fake.deleted == [("c1", "a")]
    missing = yard("ti", "job", "delete", "zz", "--cluster", "c1")
    assert missing.exit_code == 1 and "no TI job" in missing.output


def test_names_with_a_slash_never_reach_the_api(yard, fake: FakeTi) -> None:
    done = yard("ti", "job", "get", "../x", "--cluster", "c1")
    assert done.exit_code == 1 and fake.requests == []


def test_job_payload_leaves_out_flags_not_given() -> None:
    assert job_payload("n", cluster="c", command="run.sh") == {
        "name": "n",
        "cluster": "c",
        "command": ["run.sh"],
    }
