"""The SDK client against the in-memory gateway (httpx.MockTransport), plus one real
refused connection."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from trainyard_sdk.client import (
    DEFAULT_URL,
    ApiError,
    Client,
    TrainyardError,
    UnreachableError,
    WaitTimeout,
    discover_token,
    format_detail,
    load_payload,
)
from trainyard_sdk.fake import FakeGateway

TOKEN = "admin-secret-1"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # The developer's own YARD_* settings must not leak into these tests.
    for var in ("YARD_TOKEN", "YARD_URL", "YARD_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def gw() -> FakeGateway:
    return FakeGateway(tokens={TOKEN: ("admin", True), "alice-tok": ("alice", False)})


@pytest.fixture
def client(gw: FakeGateway) -> Client:
    return Client("http://gw.test", TOKEN, transport=gw.transport, poll_interval=0)


def sent_token(gw: FakeGateway) -> str | None:
    header = gw.requests[-1].headers.get("authorization")
    return header.removeprefix("Bearer ") if header else None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- configuration ------------------------------------------------------------


def test_token_from_env_wins_over_data_dir_file(monkeypatch, tmp_path, gw):
    (tmp_path / "admin-token").write_text("from-file\n")
    monkeypatch.setenv("YARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("YARD_TOKEN", "from-env")
    gw.tokens["from-env"] = ("admin", True)
    Client("http://gw.test", transport=gw.transport).list()
    assert sent_token(gw) == "from-env"


def test_token_from_yard_data_dir_file(monkeypatch, tmp_path, gw):
    data = tmp_path / "elsewhere"
    data.mkdir()
    (data / "admin-token").write_text(TOKEN + "\n")
    monkeypatch.setenv("YARD_DATA_DIR", str(data))
    Client("http://gw.test", transport=gw.transport).list()
    assert sent_token(gw) == TOKEN


def test_token_from_dot_data_under_cwd(tmp_path, gw):
    (tmp_path / ".data").mkdir()
    (tmp_path / ".data" / "admin-token").write_text(TOKEN)
    Client("http://gw.test", transport=gw.transport).list()
    assert sent_token(gw) == TOKEN


def test_explicit_token_wins_over_env(monkeypatch, gw):
    monkeypatch.setenv("YARD_TOKEN", "from-env")
    Client("http://gw.test", "alice-tok", transport=gw.transport).list()
    assert sent_token(gw) == "alice-tok"


def test_no_token_anywhere_sends_none_and_401_explains(gw):
    assert discover_token()[0] is None
    c = Client("http://gw.test", transport=gw.transport)
    with pytest.raises(ApiError) as info:
        c.list()
    assert "authorization" not in gw.requests[-1].headers
    assert info.value.status == 401
    assert "missing or unknown bearer token" in str(info.value)
    assert "YARD_TOKEN" in str(info.value)


def test_rejected_token_401_names_where_it_came_from(monkeypatch, gw):
    monkeypatch.setenv("YARD_TOKEN", "stale")
    with pytest.raises(ApiError) as info:
        Client("http://gw.test", transport=gw.transport).get("job-1")
    assert info.value.status == 401
    assert "YARD_TOKEN" in str(info.value) and "not accepted" in str(info.value)


def test_base_url_from_env_then_default(monkeypatch, gw):
    assert Client(token="x").base_url == DEFAULT_URL
    monkeypatch.setenv("YARD_URL", "http://gw.example:9000/")
    c = Client(token=TOKEN, transport=gw.transport)
    c.list()
    assert str(gw.requests[-1].url).startswith("http://gw.example:9000/v1/jobs")


# -- calls ----------------------------------------------------------------------


def test_submit_sends_the_payload_and_returns_the_id(client, gw):
    payload = {"protocolVersion": 2, "name": "mnist", "taskRoles": {"w": {"instances": 1}}}
    answer = client.submit(payload)
    assert answer["state"] == "SUBMITTED" and answer["dialect"] == "openpai"
    assert gw.payloads[answer["id"]] == payload
    assert gw.requests[-1].method == "POST" and gw.requests[-1].url.path == "/v1/jobs"


def test_submit_forces_dialect(client, gw):
    client.submit({"name": "x", "roles": []}, dialect="openpai")
    assert gw.requests[-1].url.params["dialect"] == "openpai"


def test_submit_garbage_raises_the_servers_detail(client):
    with pytest.raises(ApiError) as info:
        client.submit({})
    assert info.value.status == 400
    assert info.value.detail == "the body is not a job: expected a JSON object"


def test_list_passes_filters_and_paging(client, gw):
    gw.add_job(state="RUNNING", user="alice")
    gw.add_job(state="FAILED", user="alice")
    page = client.list(state="RUNNING", user="alice", limit=5, offset=0)
    params = gw.requests[-1].url.params
    assert (params["state"], params["user"], params["limit"], params["offset"]) == (
        "RUNNING",
        "alice",
        "5",
        "0",
    )
    assert page["total"] == 1 and page["items"][0]["state"] == "RUNNING"


def test_get_unknown_job_is_a_404_api_error(client):
    with pytest.raises(ApiError) as info:
        client.get("nope")
    assert info.value.status == 404
    assert info.value.detail == "job nope not found"


def test_job_id_cannot_walk_the_api(client, gw):
    with pytest.raises(TrainyardError):
        client.get("../tokens")
    assert gw.requests == []


def test_events_and_stop(client, gw):
    job = gw.add_job()
    gw.events[job["id"]] = [{"seq": 1, "type": "JobSubmitted", "event": {}}]
    assert [e["type"] for e in client.events(job["id"])] == ["JobSubmitted"]
    # A long history comes a page at a time: the client reads it to the end.
    gw.events_page = 2
    gw.events[job["id"]] += [{"seq": n, "type": "TaskStateChanged", "event": {}} for n in (3, 4, 7)]
    assert [e["seq"] for e in client.events(job["id"])] == [1, 3, 4, 7]
    assert [r.url.params.get("after_seq") for r in gw.requests[-2:]] == [None, "3"]
    assert client.stop(job["id"]) == {"id": job["id"], "stop": "requested"}
    assert gw.stops == [job["id"]]


def test_pause_resume_and_scale(client, gw):
    job = gw.add_job(
        spec={"roles": [{"name": "worker", "replicas": 1, "min_replicas": 1, "max_replicas": 3}]}
    )
    assert client.pause(job["id"], reason="maintenance") == {"id": job["id"], "pause": "requested"}
    assert json.loads(gw.requests[-1].content) == {"reason": "maintenance"}
    assert client.resume(job["id"]) == {"id": job["id"], "resume": "requested"}
    assert client.scale(job["id"], "worker", 2)["replicas"] == 2
    assert gw.requests[-1].url.path == f"/v1/placement/jobs/{job['id']}/scale"
    assert gw.controls == [
        (job["id"], "pause"),
        (job["id"], "resume"),
        (job["id"], "scale worker 2"),
    ]
    with pytest.raises(ApiError) as refused:
        client.scale(job["id"], "worker", 4)
    assert refused.value.status == 400 and refused.value.detail.startswith("replicas: 4")


def test_restart(client, gw):
    job = gw.add_job(state="RUNNING")
    assert client.restart(job["id"], reason="new data") == {"id": job["id"], "restart": "requested"}
    assert gw.requests[-1].url.path == f"/v1/jobs/{job['id']}/restart"
    assert json.loads(gw.requests[-1].content) == {"reason": "new data"}
    assert client.restart(job["id"])["restart"] == "requested"
    assert gw.controls == [(job["id"], "restart")] * 2
    with pytest.raises(ApiError) as missing:
        client.restart("job-9999")
    assert missing.value.status == 404


def test_create_token(client, gw):
    answer = client.create_token("bob", admin=False)
    assert answer["user"] == "bob"
    assert gw.tokens[answer["token"]] == ("bob", False)
    assert json.loads(gw.requests[-1].content) == {"user": "bob", "admin": False}


def test_logs_follow_streams_chunks(client, gw):
    job = gw.add_job(tasks=[{"role": "worker", "index": 1}])
    chunks = ["epoch 1\n", "epoch 2\n", "done\n"]
    gw.set_logs(job["id"], chunks, role="worker", index=1, stream="stderr")
    chunks = list(client.logs(job["id"], role="worker", index=1, stream="stderr", follow=True))
    assert "".join(chunks) == "epoch 1\nepoch 2\ndone\n"
    params = gw.requests[-1].url.params
    assert (params["role"], params["index"], params["stream"], params["follow"]) == (
        "worker",
        "1",
        "stderr",
        "true",
    )


def test_logs_error_is_raised_on_iteration(client, gw):
    job = gw.add_job()
    with pytest.raises(ApiError) as info:
        list(client.logs(job["id"], role="ghost"))
    assert info.value.status == 404 and "ghost" in info.value.detail


# -- wait ---------------------------------------------------------------------------


def test_wait_follows_to_a_terminal_state_and_reports_changes(client, gw):
    job = gw.add_job()
    gw.script(
        job["id"],
        [
            {"state": "QUEUED"},
            {"state": "QUEUED"},
            {"state": "RUNNING", "tasks": [{"role": "w", "index": 0, "state": "STARTING"}]},
            {"tasks": [{"role": "w", "index": 0, "state": "RUNNING"}]},
            {"state": "SUCCEEDED", "tasks": [{"role": "w", "index": 0, "state": "SUCCEEDED"}]},
        ],
    )
    seen: list[tuple[str, str | None]] = []
    final = client.wait(
        job["id"],
        on_change=lambda j: seen.append((j["state"], (j["tasks"] or [{}])[0].get("state"))),
    )
    assert final["state"] == "SUCCEEDED"
    assert seen == [
        ("QUEUED", None),
        ("RUNNING", "STARTING"),
        ("RUNNING", "RUNNING"),
        ("SUCCEEDED", "SUCCEEDED"),
    ]


def test_wait_until_started_stops_at_running(client, gw):
    job = gw.add_job()
    gw.script(job["id"], [{"state": "PLACED"}, {"state": "RUNNING"}, {"state": "FAILED"}])
    assert client.wait(job["id"], until_terminal=False)["state"] == "RUNNING"


def test_wait_tolerates_a_status_view_that_lags_the_submission(gw):
    job = gw.add_job(state="SUCCEEDED")
    misses = []

    def lagging(request: httpx.Request) -> httpx.Response:
        if len(misses) < 2:  # the first looks happen before status projected the job
            misses.append(request.url.path)
            return httpx.Response(404, json={"detail": f"no job {job['id']}"})
        return gw.transport.handle_request(request)

    client = Client(
        "http://gw.test", TOKEN, transport=httpx.MockTransport(lagging), poll_interval=0
    )
    assert client.wait(job["id"])["state"] == "SUCCEEDED"
    assert len(misses) == 2


def test_wait_gives_up_on_a_job_that_never_appears(gw):
    client = Client(
        "http://gw.test", TOKEN, transport=gw.transport, poll_interval=0.01, visibility_grace_s=0.05
    )
    with pytest.raises(ApiError) as info:
        client.wait("never-submitted")
    assert info.value.status == 404


def test_wait_times_out(client, gw):
    job = gw.add_job(state="QUEUED")
    with pytest.raises(WaitTimeout) as info:
        client.wait(job["id"], timeout=0.05)
    assert "QUEUED" in str(info.value)


# -- errors ---------------------------------------------------------------------


def test_connection_refused_names_the_url_and_make_up():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(UnreachableError) as info:
        Client(url, "t").list()
    message = str(info.value)
    assert url in message and "make up" in message


def test_connection_refused_while_streaming_logs():
    c = Client(f"http://127.0.0.1:{closed_port()}", "t")
    with pytest.raises(UnreachableError):
        list(c.logs("job-1", follow=True))


def test_non_json_error_body_keeps_the_text():
    transport = httpx.MockTransport(lambda r: httpx.Response(502, text="Bad Gateway from proxy"))
    with pytest.raises(ApiError) as info:
        Client("http://gw.test", "t", transport=transport).get("x")
    assert info.value.status == 502 and info.value.detail == "Bad Gateway from proxy"


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ("plain", "plain"),
        ([{"loc": ["body", "name"], "msg": "field required"}], "body.name: field required"),
        (
            {"message": "invalid job", "errors": [{"path": "$.name", "message": "too long"}]},
            "invalid job\n  - $.name: too long",
        ),
    ],
)
def test_format_detail(detail, expected):
    assert format_detail(detail) == expected


# -- job files --------------------------------------------------------------------


def test_load_payload_json_yaml_and_by_content(tmp_path):
    doc = {"name": "mnist", "taskRoles": {"worker": {"instances": 2}}}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "a.yaml").write_text("name: mnist\ntaskRoles:\n  worker:\n    instances: 2\n")
    (tmp_path / "noext").write_text("name: mnist\ntaskRoles: {worker: {instances: 2}}\n")
    (tmp_path / "noext2").write_text(json.dumps(doc))
    for name in ("a.json", "a.yaml", "noext", "noext2"):
        assert load_payload(tmp_path / name) == doc, name


def test_load_payload_rejects_non_objects_and_broken_files(tmp_path):
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(TrainyardError, match="must be a JSON/YAML object"):
        load_payload(tmp_path / "list.yaml")
    with pytest.raises(TrainyardError, match="not valid JSON"):
        load_payload(tmp_path / "broken.json")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("deep.json", "[" * 100_000, "deep.json: JSON nested deeper than 64 levels"),
        ("nan.json", '{"a": NaN}', "nan.json: JSON NaN is not a number"),
        ("inf.json", '{"a": 1e400}', "inf.json: JSON number 1e400 is out of range"),
        ("long.json", '{"a": ' + "9" * 5_000 + "}", "Exceeds the limit (4300 digits)"),
        ("bytes.json", b'{"a": "\xff"}', "bytes.json: not UTF-8 text (byte 7)"),
        ("a-dir", None, "a-dir: Is a directory"),
    ],
)
def test_load_payload_refuses_what_the_platform_would(tmp_path, name, content, says):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TrainyardError) as info:
        load_payload(path)
    assert says in str(info.value)


def answering(content: str, content_type: str = "application/json") -> Client:
    """A client whose server answers every request with ``content``."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=content, headers={"content-type": content_type})

    return Client("http://gw.test", "t", transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("call", "content", "says"),
    [
        (lambda c: c.events("j1"), '{"items": [1]}', "/v1/jobs/j1/events: items[0] is a number"),
        (
            lambda c: c.nodes(),
            '{"nodes": {}}',
            "/v1/placement/nodes: nodes is an object, not a list",
        ),
        (lambda c: c.get("j1"), '{"id": "j1", "state": ["RUNNING"]}', "the job's state is a list"),
        (lambda c: c.get("j1"), "[" * 100_000, "not JSON: maximum recursion depth"),
        (lambda c: c.list(), '"jobs"', "/v1/jobs: a string, not an object"),
    ],
)
def test_a_reply_not_of_the_apis_shape_is_an_api_error(call, content, says):
    with pytest.raises(ApiError) as info:
        call(answering(content))
    assert info.value.status == 200 and says in str(info.value)


@pytest.mark.parametrize(
    ("data", "says"),
    [("[1]", "a list, not an object"), ('{"id": "j1", "state": 7}', "state is a number")],
)
def test_a_watched_change_not_of_a_jobs_shape_is_an_api_error(data, says):
    client = answering(f"event: job\ndata: {data}\n\n", "text/event-stream")
    with pytest.raises(ApiError) as info:
        list(client.watch())
    assert "unexpected reply from http://gw.test/v1/watch/jobs" in str(info.value)
    assert says in str(info.value)


def test_timeout_is_not_reported_as_refused():
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(UnreachableError) as info:
        Client("http://gw.test", "t", transport=httpx.MockTransport(slow)).get("x")
    assert "did not answer in time" in str(info.value)
    assert "make up" not in str(info.value)
