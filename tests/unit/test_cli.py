"""The ``yard`` CLI, run through typer's CliRunner against the in-memory gateway.

The app under test is built with ``make_app(connect)``: the factory hands the CLI a
client whose transport is the fake, so nothing in the CLI module is patched.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from trainyard_sdk.cli import make_app
from trainyard_sdk.client import Client
from trainyard_sdk.fake import FakeGateway

TOKEN = "admin-secret-1"
# Wide, colourless output so tables are neither cut nor full of escape codes.
ENV = {
    "COLUMNS": "220",
    "NO_COLOR": "1",
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "YARD_TOKEN": None,
    "YARD_URL": None,
    "YARD_DATA_DIR": None,
}


@pytest.fixture
def gw() -> FakeGateway:
    return FakeGateway(tokens={TOKEN: ("admin", True)})


@pytest.fixture
def yard(gw: FakeGateway, monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    connections: list[tuple[str | None, str | None]] = []

    def connect(url: str | None, token: str | None) -> Client:
        connections.append((url, token))
        return Client(url or "http://gw.test", token, transport=gw.transport, poll_interval=0)

    app = make_app(connect)
    runner = CliRunner()

    def run(*args: str, env: dict[str, Any] | None = None, input: str | None = None):
        return runner.invoke(app, list(args), env={**ENV, **(env or {})}, input=input)

    run.connections = connections  # type: ignore[attr-defined]
    return run


def with_token(*args: str) -> list[str]:
    return ["--token", TOKEN, *args]


RICH_JOB = {
    "name": "mnist-ddp",
    "user": "alice",
    "state": "FAILED",
    "reason": "task worker[1] failed",
    "dialect": "openpai",
    "exit_code": 3,
    "errors": [
        {
            "path": "$.taskRoles.worker.resourcePerInstance.memoryMB",
            "message": "below 100 MB",
            "code": "min",
        }
    ],
    "queue_reasons": ["waiting for 2 free GPUs of type v100"],
    "warnings": ["field jobRetryCount ignored"],
    "tasks": [
        {
            "role": "worker",
            "index": 0,
            "attempt": 1,
            "state": "SUCCEEDED",
            "exit_code": 0,
            "reason": None,
            "node": "node-a",
            "host_ip": "10.0.0.1",
            "gpu_indices": [0, 1],
            "ports": [
                {"label": "http", "ports": [20001]},
                {"label": "ssh", "ports": [20002, 20003]},
            ],
            "updated_at": "2025-01-01T00:00:00+00:00",
        },
        {
            "role": "worker",
            "index": 1,
            "attempt": 1,
            "state": "FAILED",
            "exit_code": 3,
            "reason": "exited with code 3",
            "node": "node-b",
            "host_ip": "10.0.0.2",
            "gpu_indices": [],
            "ports": [],
            "updated_at": "2025-01-01T00:00:00+00:00",
        },
    ],
}


# -- submit ---------------------------------------------------------------------


def test_submit_json_file_prints_the_id(yard, gw, tmp_path):
    doc = {"protocolVersion": 2, "name": "mnist", "taskRoles": {"w": {"instances": 1}}}
    (tmp_path / "job.json").write_text(json.dumps(doc))
    result = yard(*with_token("submit", "job.json"))
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert job_id in gw.jobs
    assert gw.payloads[job_id] == doc
    assert gw.jobs[job_id]["dialect"] == "openpai"


def test_submit_yaml_file_with_forced_dialect(yard, gw, tmp_path):
    (tmp_path / "job.yml").write_text("name: tiny\nroles:\n  - name: main\n    replicas: 1\n")
    result = yard(*with_token("submit", "job.yml", "--dialect", "native"))
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert gw.payloads[job_id] == {"name": "tiny", "roles": [{"name": "main", "replicas": 1}]}
    assert gw.requests[-1].url.params["dialect"] == "native"


def test_submit_from_stdin_as_json_output(yard, gw):
    result = yard(*with_token("submit", "-", "-o", "json"), input="name: piped\nroles: []\n")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["state"] == "SUBMITTED"
    assert gw.payloads[answer["id"]]["name"] == "piped"


def test_submit_missing_or_broken_file_is_exit_1(yard, gw, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    missing = yard(*with_token("submit", "nope.json"))
    broken = yard(*with_token("submit", "bad.json"))
    assert (missing.exit_code, broken.exit_code) == (1, 1)
    assert "nope.json: no such file" in missing.stderr
    assert "not valid JSON" in broken.stderr
    assert gw.requests == []


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("deep.json", "[" * 100_000, "JSON nested deeper than 64 levels"),
        ("deep", "[" * 100_000, "JSON nested deeper than 64 levels"),
        ("nan.json", '{"name": NaN}', "JSON NaN is not a number"),
        ("long.json", '{"replicas": ' + "1" * 5_000 + "}", "Exceeds the limit (4300 digits)"),
        ("latin1.json", b'{"name": "caf\xe9"}', "not UTF-8 text (byte 13)"),
    ],
)
def test_a_job_file_the_platform_would_refuse_is_one_error_line(
    yard, gw, tmp_path, name, text, says
):
    # Read with the platform's bounds: not a RecursionError, nor a ValueError from
    # int() or from httpx writing NaN out.
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = yard(*with_token("submit", name))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(f"error: {name}: ") and says in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert gw.requests == []


def test_submit_rejected_by_server_shows_detail(yard, tmp_path):
    (tmp_path / "empty.json").write_text("{}")
    result = yard(*with_token("submit", "empty.json"))
    assert result.exit_code == 1
    assert "the body is not a job" in result.stderr and "HTTP 400" in result.stderr
    assert result.stdout == ""


def test_submit_wait_success_exits_0(yard, gw, tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"name": "ok", "roles": []}))
    # Ids are sequential in the fake: the job about to be submitted is job-0001.
    gw.script(
        "job-0001",
        [
            {"state": "QUEUED"},
            {"state": "RUNNING", "tasks": [{"role": "main", "index": 0, "state": "RUNNING"}]},
            {"state": "SUCCEEDED", "tasks": [{"role": "main", "index": 0, "state": "SUCCEEDED"}]},
        ],
    )
    result = yard(*with_token("submit", "job.json", "--wait"))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "job-0001"
    for state in ("QUEUED", "RUNNING", "SUCCEEDED"):
        assert state in result.stderr


@pytest.mark.parametrize("final", ["FAILED", "STOPPED", "REJECTED"])
def test_wait_exits_1_unless_succeeded(yard, gw, final):
    job = gw.add_job(state="RUNNING")
    gw.script(
        job["id"],
        [
            {"state": "RUNNING"},
            {
                "state": final,
                "reason": "it went wrong",
                "errors": [{"path": "$.name", "message": "bad name", "code": "pattern"}],
                "tasks": [
                    {
                        "role": "main",
                        "index": 0,
                        "state": "FAILED",
                        "exit_code": 7,
                        "reason": "boom",
                    }
                ],
            },
        ],
    )
    result = yard(*with_token("wait", job["id"]))
    assert result.exit_code == 1
    assert f"job {job['id']} {final}: it went wrong" in result.stderr
    assert "$.name: bad name" in result.stderr
    assert "exit code 7: boom" in result.stderr


def test_wait_timeout_exits_1(yard, gw):
    job = gw.add_job(state="QUEUED")
    result = yard(*with_token("wait", job["id"], "--timeout", "0.05"))
    assert result.exit_code == 1
    assert "still QUEUED" in result.stderr


# -- get / ls / events ------------------------------------------------------------------


def test_get_table_shows_job_and_tasks(yard, gw):
    job = gw.add_job(**RICH_JOB)
    result = yard(*with_token("get", job["id"]))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in (
        job["id"],
        "mnist-ddp",
        "alice",
        "FAILED",
        "task worker[1] failed",
        "openpai",
        "$.taskRoles.worker.resourcePerInstance.memoryMB",
        "below 100 MB",
        "waiting for 2 free GPUs of type v100",
        "field jobRetryCount ignored",
        "node-a",
        "node-b",
        "http:20001",
        "ssh:20002,20003",
        "0,1",
        "exited with code 3",
    ):
        assert text in out, text
    worker0 = next(line for line in out.splitlines() if "node-a" in line)
    worker1 = next(line for line in out.splitlines() if "node-b" in line)
    assert "SUCCEEDED" in worker0 and "exited" not in worker0
    assert "FAILED" in worker1 and " 3 " in worker1


def test_get_output_json_is_the_raw_document(yard, gw):
    job = gw.add_job(**RICH_JOB)
    result = yard(*with_token("get", job["id"], "-o", "json"))
    assert result.exit_code == 0
    assert json.loads(result.stdout) == job
    assert result.stdout.startswith("{\n  ")  # pretty


def test_user_text_is_not_read_as_markup(yard, gw):
    job = gw.add_job(name="[bold]x[/bold]", reason="[red]nope")
    result = yard(*with_token("get", job["id"]))
    assert result.exit_code == 0, result.output
    assert "[bold]x[/bold]" in result.stdout and "[red]nope" in result.stdout


def test_control_characters_in_user_text_never_reach_the_terminal(yard, gw):
    # A code source named with escape sequences gets them back in git's message, which
    # becomes the job's reason: shown to whoever looks at the job, admins included.
    job = gw.add_job(
        name="x\x1b]0;owned\x07", state="FAILED", reason="\x1b[31mRED\x1b[2J\x9b\x1b gone"
    )
    for args, reason in ((("get", job["id"]), True), (("ls",), False)):
        result = yard(*with_token(*args), env={"FORCE_COLOR": "1", "NO_COLOR": None})
        assert result.exit_code == 0, result.output
        shown = re.sub("\x1b\\[[0-9;]*m", "", result.stdout)  # the console's own colours
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown), repr(shown)
        assert "x?]0;owned" in shown
        assert not reason or "?[31mRED?[2J?? gone" in shown, shown


def test_ls_lists_with_filters(yard, gw):
    a = gw.add_job(state="RUNNING", user="alice", name="first")
    gw.add_job(state="FAILED", user="alice", name="second")
    result = yard(*with_token("ls", "--state", "running", "--user", "alice", "--limit", "5"))
    assert result.exit_code == 0, result.output
    params = gw.requests[-1].url.params
    assert (params["state"], params["user"], params["limit"]) == ("RUNNING", "alice", "5")
    assert a["id"] in result.stdout and "first" in result.stdout
    assert "second" not in result.stdout
    assert "1-1 of 1 job(s)" in result.stderr


def test_ls_json(yard, gw):
    gw.add_job()
    gw.add_job()
    result = yard(*with_token("ls", "-o", "json"))
    page = json.loads(result.stdout)
    assert page["total"] == 2 and [j["id"] for j in page["items"]] == ["job-0002", "job-0001"]


def test_events_table(yard, gw):
    job = gw.add_job()
    gw.events[job["id"]] = [
        {
            "seq": 1,
            "type": "JobSubmitted",
            "event_id": "e1",
            "occurred_at": "2025-01-01T00:00:00+00:00",
            "event": {"type": "JobSubmitted", "job_id": job["id"], "spec": {"name": "x"}},
        },
        {
            "seq": 2,
            "type": "TaskStateChanged",
            "event_id": "e2",
            "occurred_at": "2025-01-01T00:00:01+00:00",
            "event": {
                "type": "TaskStateChanged",
                "role": "worker",
                "index": 0,
                "state": "RUNNING",
                "node": "node-a",
            },
        },
    ]
    result = yard(*with_token("events", job["id"]))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    submitted = next(i for i, line in enumerate(lines) if "JobSubmitted" in line)
    changed = next(i for i, line in enumerate(lines) if "TaskStateChanged" in line)
    assert submitted < changed
    assert "role=worker" in lines[changed] and "state=RUNNING" in lines[changed]
    assert "node=node-a" in lines[changed]


# -- logs / stop / token --------------------------------------------------------------


def test_logs_follow_prints_the_stream(yard, gw):
    job = gw.add_job(state="RUNNING", tasks=[{"role": "worker", "index": 0}])
    chunks = ["step 1\n", "step 2\n", "bye\n"]
    gw.set_logs(job["id"], chunks, role="worker", index=1, stream="stderr")
    args = ("logs", job["id"], "--role", "worker", "--index", "1", "--stderr", "-f")
    result = yard(*with_token(*args))
    assert result.exit_code == 0, result.output
    assert result.stdout == "step 1\nstep 2\nbye\n"
    params = gw.requests[-1].url.params
    assert (params["role"], params["index"], params["stream"], params["follow"]) == (
        "worker",
        "1",
        "stderr",
        "true",
    )


def test_logs_follow_waits_for_a_queued_job_to_start(yard, gw):
    job = gw.add_job(tasks=[{"role": "main", "index": 0}])
    gw.script(job["id"], [{"state": "QUEUED"}, {"state": "QUEUED"}, {"state": "RUNNING"}])
    gw.set_logs(job["id"], ["hello\n"], role="main", index=0)
    result = yard(*with_token("logs", job["id"], "-f"))
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello\n"
    gets = [r for r in gw.requests if r.url.path == f"/v1/jobs/{job['id']}"]
    assert len(gets) == 3  # polled until RUNNING, then followed


def test_logs_without_follow_asks_for_stdout(yard, gw):
    job = gw.add_job(tasks=[{"role": "main", "index": 0}])
    gw.set_logs(job["id"], ["hello\n"])
    result = yard(*with_token("logs", job["id"]))
    assert result.stdout == "hello\n"
    params = gw.requests[-1].url.params
    assert params["stream"] == "stdout" and "follow" not in params


def test_stop(yard, gw):
    job = gw.add_job(state="RUNNING")
    result = yard(*with_token("stop", job["id"]))
    assert result.exit_code == 0
    assert gw.stops == [job["id"]]
    assert f"stop requested for {job['id']}" in result.stdout


def test_pause_resume_and_scale(yard, gw):
    job = gw.add_job(
        state="RUNNING",
        spec={"roles": [{"name": "worker", "replicas": 1, "min_replicas": 1, "max_replicas": 2}]},
    )
    assert yard(*with_token("pause", job["id"])).exit_code == 0
    result = yard(*with_token("resume", job["id"]))
    assert f"resume requested for {job['id']}" in result.stdout
    result = yard(*with_token("scale", job["id"], "--role", "worker", "--replicas", "2"))
    assert result.exit_code == 0, result.output
    assert gw.controls == [
        (job["id"], "pause"),
        (job["id"], "resume"),
        (job["id"], "scale worker 2"),
    ]
    result = yard(*with_token("scale", job["id"], "--role", "worker", "--replicas", "3"))
    assert result.exit_code == 1 and "replicas: 3 is outside" in result.stderr


def test_restart(yard, gw):
    job = gw.add_job(state="RUNNING")
    result = yard(*with_token("restart", job["id"], "--reason", "new data"))
    assert result.exit_code == 0, result.output
    assert f"restart requested for {job['id']}" in result.stdout
    assert gw.controls == [(job["id"], "restart")]
    assert json.loads(gw.requests[-1].content) == {"reason": "new data"}
    assert yard(*with_token("restart", "job-9999")).exit_code == 1


def test_token_create_prints_the_token(yard, gw):
    result = yard(*with_token("token", "create", "bob", "--admin"))
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert gw.tokens[token] == ("bob", True)


# -- errors and configuration ----------------------------------------------------------


def test_401_without_token_explains_how_to_get_one(yard):
    result = yard("ls")
    assert result.exit_code == 1
    assert "missing or unknown bearer token (HTTP 401)" in result.stderr
    assert "YARD_TOKEN" in result.stderr
    assert result.stdout == ""


def test_token_from_env_and_from_data_dir(yard, gw, tmp_path):
    assert yard("ls", env={"YARD_TOKEN": TOKEN}).exit_code == 0
    assert gw.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    (tmp_path / ".data").mkdir()
    (tmp_path / ".data" / "admin-token").write_text(TOKEN)
    assert yard("ls").exit_code == 0
    assert gw.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"


def test_404_is_exit_1_with_detail(yard):
    missing = "0" * 32  # a full id is asked for as it is
    result = yard(*with_token("get", missing))
    assert result.exit_code == 1
    assert f"job {missing} not found (HTTP 404)" in result.stderr
    result = yard(*with_token("get", "job-9999"))
    assert result.exit_code == 1
    assert "no job whose id starts with, or whose name is, 'job-9999'" in result.stderr


def test_a_job_is_named_by_its_short_id_or_its_name(yard, gw):
    first = gw.add_job(name="mnist", user="alice")
    gw.add_job(name="mnist-2", user="alice")
    for ref in ("job-0001", "mnist"):
        result = yard(*with_token("stop", ref))
        assert result.exit_code == 0, result.output
        assert gw.stops[-1] == first["id"]
    # Ambiguous: both ids start with "job-000", and a name two jobs have.
    result = yard(*with_token("get", "job-000"))
    assert result.exit_code == 1 and "more than one job's id" in result.stderr
    gw.add_job(name="mnist", user="bob")
    result = yard(*with_token("get", "mnist"))
    assert result.exit_code == 1 and "several jobs are named 'mnist'" in result.stderr


def test_tables_piped_are_tab_separated_and_yaml_and_wide_outputs(yard, gw):
    job = gw.add_job(name="a b", user="alice", state="RUNNING")
    result = yard(*with_token("ls"))
    lines = result.stdout.splitlines()
    assert lines[0].split("\t")[:4] == ["ID", "NAME", "USER", "STATE"]
    assert lines[1].split("\t")[:4] == [job["id"], "a b", "alice", "RUNNING"]
    wide = yard(*with_token("ls", "-o", "wide")).stdout.splitlines()
    assert "QUEUE" in wide[0].split("\t")
    as_yaml = yard(*with_token("get", job["id"], "-o", "yaml"))
    assert as_yaml.exit_code == 0 and "name: a b" in as_yaml.stdout


FULL_ID = "a" * 32


@pytest.mark.parametrize(
    ("args", "reply", "says"),
    [
        (["ls"], [1, 2], "/v1/jobs: a list, not an object"),
        (["ls"], {"items": [None]}, "/v1/jobs: items[0] is null, not an object"),
        (["ls"], {"items": [{"id": "j1", "state": 3}]}, "items[0]'s state is a number"),
        (["get", FULL_ID], [1], f"/v1/jobs/{FULL_ID}: a list, not an object"),
        (["get", "abc"], [], "/v1/jobs: a list, not an object"),
        (["get", "abc"], {"items": [{"name": "abc"}]}, "items[0] has no job id"),
        (["queue"], [1], "/v1/placement/queue: a list, not an object"),
        (["queue"], {}, "/v1/placement/queue: no 'jobs' in it"),
        (["stop", "abc"], {"items": [{"id": None}]}, "items[0] has no job id"),
        (["ls", "--watch"], "event: job\ndata: {not json\n\n", "an event that is not JSON"),
    ],
)
def test_a_reply_not_of_the_apis_shape_is_one_error_line(args, reply, says):
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(reply, str):  # an event stream
            return httpx.Response(200, text=reply, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=reply)

    app = make_app(
        lambda url, token: Client("http://gw.test", token, transport=httpx.MockTransport(answer))
    )
    result = CliRunner().invoke(app, with_token(*args), env=ENV)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: unexpected reply from http://gw.test/")
    assert says in result.stderr and "(HTTP 200)" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "requested" not in result.stdout


def test_url_option_reaches_the_factory(yard):
    yard("--url", "http://other:1", "--token", "t", "ls")
    assert yard.connections[-1] == ("http://other:1", "t")


def test_connection_refused_with_the_real_client():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = CliRunner().invoke(make_app(), ["--url", url, "--token", "t", "ls"], env=ENV)
    assert result.exit_code == 1
    assert f"cannot reach Trainyard at {url}" in result.stderr
    assert "make up" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [["get"], ["get", "x", "-o", "xml"], ["ls", "--limit", "0"], ["nosuchcommand"]],
)
def test_usage_errors_exit_2(yard, args):
    assert yard(*args).exit_code == 2


def test_python_dash_m_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "trainyard_sdk", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "submit" in done.stdout and "token" in done.stdout


def test_queue_and_why_say_what_a_job_waits_for(yard, gw):
    waiting = gw.add_job(name="big", user="alice", state="QUEUED",
                         queue_reasons=["needs 8 GPUs; the largest free block has 4"])  # fmt: skip
    result = yard(*with_token("queue"))
    assert result.exit_code == 0, result.output
    row = result.stdout.splitlines()[1].split("\t")
    assert row[:3] == ["1", waiting["id"], "big"] and "largest free block has 4" in row[-1]
    why = yard(*with_token("why", "big"))
    assert why.exit_code == 0, why.output
    assert "big is QUEUED" in why.stdout and "largest free block has 4" in why.stdout
    failed = gw.add_job(**RICH_JOB)
    why = yard(*with_token("why", failed["id"]))
    assert "because: task worker[1] failed" in why.stdout
    assert "task worker[1] on node-b: exit code 3" in why.stdout


def test_version_and_completion(yard):
    result = yard("--version")
    assert result.exit_code == 0 and result.stdout.startswith("yard 0.")
    # Completion as bash asks for it (what --install-completion wires up); the shell is
    # named by the protocol, not guessed from the processes around the test.
    env = {"_YARD_COMPLETE": "complete_bash", "COMP_WORDS": "yard kubec", "COMP_CWORD": "1"}
    result = yard(env=env)
    assert result.exit_code == 0 and result.stdout.split() == ["kubeconfig"]


def test_a_terminal_of_100_columns_gets_a_readable_table(yard, gw):
    for n in range(3):
        gw.add_job(id="abc"[n] * 32, name=f"resnet50-imagenet-{n}", user="alice", state="FAILED",
                   reason="task worker[3] exited with code 137 after the OOM killer ended it " * 2)  # fmt: skip
    result = yard(
        *with_token("ls"), env={"COLUMNS": "100", "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"}
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    visible = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
    assert all(len(line) <= 100 for line in visible), visible
    rows = [line for line in visible if "resnet50" in line]
    assert len(rows) == 3
    # Short ids, whole names, the reason folded onto further lines instead of cut.
    assert rows[0].startswith("cccccccc ") and "c" * 32 not in result.stdout
    assert "resnet50-imagenet-2" in rows[0] and "OOM" in result.stdout
    assert "\t" not in result.stdout


def test_ls_sends_the_lists_other_filters(yard, gw):
    gw.add_job(name="resnet-a")
    result = yard(*with_token("ls", "-q", "gpu", "--dialect", "kubeflow", "--name", "resnet",
                              "--kind", "pytorch", "-l", "team=vision", "-l", "tier=1"))  # fmt: skip
    assert result.exit_code == 0, result.output
    params = gw.requests[-1].url.params
    assert (params["queue"], params["dialect"], params["name"], params["kind"]) == (
        "gpu",
        "kubeflow",
        "resnet",
        "pytorch",
    )
    assert params.get_list("label") == ["team=vision", "tier=1"]


def test_a_kubeconfig_written_over_an_older_file_is_mode_600(yard, tmp_path) -> None:
    # The mode was only that of a file the write made: one there before (0644) kept
    # its mode, the token in it readable by every user of the machine.
    from trainyard_stack import tls

    files = tls.ensure_tls(tmp_path / "tls")
    target = tmp_path / "kube" / "config"
    target.parent.mkdir()
    target.write_text("old\n")
    target.chmod(0o644)
    result = yard(*with_token("kubeconfig", "--server", "https://127.0.0.1:6443",
                              "--ca-file", str(files.ca_cert), "--file", str(target)))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert TOKEN in target.read_text()
    assert target.stat().st_mode & 0o777 == 0o600
