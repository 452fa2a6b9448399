"""The gateway against real HTTP backends: it forwards the client's request as it came
(no header of its own, the raw path), takes turns over a service's replicas, and a
replica that is gone costs no request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from aiohttp import web

from trainyard_gateway.app import HOP_BY_HOP, WHOLE_ANSWER_BYTES, create_app
from trainyard_stack.components import free_port


async def backend(
    name: str, answer: Callable[[web.Request], Awaitable[web.Response]] | None = None
) -> tuple[web.AppRunner, str]:
    """An HTTP server on a free port that echoes each request (or ``answer``s it)."""

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "replica": name,
                "path": request.raw_path,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body.decode(),
            }
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer or echo)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def gateway() -> AsyncIterator[httpx.AsyncClient]:
    first, first_url = await backend("a")
    second, second_url = await backend("b")
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    app = create_app({"status": (first_url, second_url), "intake": (gone, first_url)})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://yard.test") as client:
        yield client
    await first.cleanup()
    await second.cleanup()


async def test_requests_pass_as_they_came_and_replicas_take_turns(
    gateway: httpx.AsyncClient,
) -> None:
    seen = []
    for _ in range(4):
        answer = await gateway.get("/v1/jobs/a%20b?limit=1", headers={"X-Acs-Signed": "1"})
        assert answer.status_code == 200, answer.text
        seen.append(answer.json())
    assert [s["replica"] for s in seen] == ["a", "b", "a", "b"]
    forwarded = seen[0]
    assert forwarded["path"] == "/v1/jobs/a%20b?limit=1"  # still percent-encoded
    headers = forwarded["headers"]
    assert headers["x-acs-signed"] == "1" and headers["x-forwarded-host"] == "yard.test"
    # The client's headers and nothing else (signatures cover some): no Content-Type
    # or other header of the gateway's HTTP client's own.
    sent = {k.lower(): v for k, v in answer.request.headers.items()}
    assert {k: v for k, v in headers.items() if k not in ("host", "x-forwarded-host")} == {
        k: v for k, v in sent.items() if k not in HOP_BY_HOP
    }


async def test_a_replica_that_is_gone_costs_no_request(gateway: httpx.AsyncClient) -> None:
    # A POST without an Idempotency-Key is not repeated after it was sent, but one that
    # could not even connect goes to the next replica.
    for i in range(4):
        answer = await gateway.post(
            "/v1/jobs", content=json.dumps({"n": i}), headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["replica"] == "a"
        assert json.loads(answer.json()["body"]) == {"n": i}
        assert answer.json()["headers"]["content-type"] == "application/json"


async def test_a_sized_answer_goes_back_whole_and_one_of_unknown_length_streams() -> None:
    async def sized(request: web.Request) -> web.Response:
        answer = web.Response(
            status=201, body=b'{"made": true}', headers={"X-Kept": "1"},
            content_type="application/json",
        )  # fmt: skip
        answer.headers.add("Set-Cookie", "a=1")
        answer.headers.add("Set-Cookie", "b=2")
        return answer

    async def chunked(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(headers={"Content-Type": "text/plain"})
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        for line in (b"one\n", b"two\n"):
            await answer.write(line)
        await answer.write_eof()
        return answer

    app = web.Application()
    app.router.add_post("/v1/jobs", sized)
    app.router.add_get("/v1/jobs/j/logs", chunked)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    transport = httpx.ASGITransport(app=create_app({"intake": (url,), "launcher": (url,)}))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://yard.test") as client:
            made = await client.post("/v1/jobs", content=b"{}")
            logs = await client.get("/v1/jobs/j/logs")
    finally:
        await runner.cleanup()
    # Whole: its length said, status and headers as the service gave them.
    assert made.status_code == 201 and made.json() == {"made": True}
    assert made.headers["content-length"] == str(len(b'{"made": true}'))
    assert made.headers["x-kept"] == "1" and made.headers["content-type"] == "application/json"
    assert made.headers.get_list("set-cookie") == ["a=1", "b=2"]  # repeated headers kept
    assert made.headers.get_list("content-length") == [str(len(b'{"made": true}'))]
    # The gateway's server writes its own Date and Server (not here, in process).
    assert "date" not in made.headers and "server" not in made.headers
    # Of unknown length (a followed log): relayed as it comes, no length made up.
    assert logs.status_code == 200 and logs.text == "one\ntwo\n"
    assert "content-length" not in logs.headers


async def test_a_large_answer_streams_and_one_cut_short_is_a_503() -> None:
    big = b"x" * (WHOLE_ANSWER_BYTES + 1)

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=big, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/v1/jobs", large)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()

    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request's head (a GET: no body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
        await writer.drain()
        writer.close()  # 5 bytes of the 100 it said

    server = await asyncio.start_server(cut_short, "127.0.0.1", 0)
    cut_port = server.sockets[0].getsockname()[1]
    backends = {
        "status": (f"http://127.0.0.1:{port}",),
        "launcher": (f"http://127.0.0.1:{cut_port}",),
    }
    transport = httpx.ASGITransport(app=create_app(backends))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://yard.test") as client:
            streamed = await client.get("/v1/jobs")
            broken = await client.get("/v1/jobs/j/logs")
    finally:
        await runner.cleanup()
        server.close()
    # Over the size read whole: streamed as it comes, so no length of the gateway's own.
    assert streamed.status_code == 200 and streamed.content == big
    assert "content-length" not in streamed.headers
    # An answer shorter than its length said is the service's failure, not a short 200.
    assert broken.status_code == 503 and "launcher service unavailable" in broken.text


async def test_only_the_forwarded_methods_pass(gateway: httpx.AsyncClient) -> None:
    listed = await gateway.get("/v1/jobs")
    assert listed.status_code == 200 and listed.json()["path"] == "/v1/jobs"
    for method in ("HEAD", "OPTIONS"):
        refused = await gateway.request(method, "/v1/jobs")
        assert refused.status_code == 405, method
        assert "HEAD" not in refused.headers["allow"]


async def test_a_path_no_service_serves_is_a_404_in_its_apis_shape(
    gateway: httpx.AsyncClient,
) -> None:
    """On OpenPAI's paths, its rest-server's catch-all (any method: Express answers an
    unrouted method so too); elsewhere the gateway's own words."""
    for method in ("GET", "PATCH"):
        lost = await gateway.request(method, "/api/v2/no-such-api?x=1")
        assert lost.status_code == 404, method
        assert lost.json() == {
            "code": "NoApiError", "message": "API /api/v2/no-such-api?x=1 is not found."
        }  # fmt: skip
    sent = await gateway.get("/api/v2/a%20b%2Fc?q=%20x")
    assert sent.json()["message"] == "API /api/v2/a%20b%2Fc?q=%20x is not found."
    own = await gateway.get("/v1/no-such-api")
    assert own.status_code == 404 and own.json() == {"detail": "no route for GET /v1/no-such-api"}
    # Under OpenPAI's /rest-server, every path is its rest-server's.
    token = await gateway.post("/rest-server/api/v1/token?x=1")
    assert token.json() == {
        "code": "NoApiError", "message": "API /rest-server/api/v1/token?x=1 is not found."
    }  # fmt: skip


async def test_openpais_clients_reach_it_under_rest_server(gateway: httpx.AsyncClient) -> None:
    # Its SDKs' base is {host}/rest-server/api (the pylon's path): nothing was served
    # there, and /api/v1/jobs at the root is PAI-DLC's ListJobs, while OpenPAI's
    # rest-server serves its v2 job router at v1's path.
    forwarded = {
        "/rest-server/api/v2/jobs?offset=0": "/api/v2/jobs?offset=0",
        "/rest-server/api/v1/jobs": "/api/v2/jobs",
        "/rest-server/api/v1/jobs/alice~a%20b/config": "/api/v2/jobs/alice~a%20b/config",
        "/rest-server/api/v1/user/alice/jobs/j": "/api/v1/user/alice/jobs/j",
        "/rest-server/api/v2/info": "/api/v2/info",
        "/api/v1/jobs": "/api/v1/jobs",  # PAI-DLC's, at the root
    }
    for sent, path in forwarded.items():
        answer = await gateway.get(sent)
        assert answer.status_code == 200, (sent, answer.text)
        assert answer.json()["path"] == path, sent


async def test_the_health_of_all_says_which_replica_is_wrong_and_not_where_it_is() -> None:
    # Answered without a token: a service's address is the inside's, not a prober's.
    async def failing(_request: web.Request) -> web.Response:
        return web.Response(status=500)

    runner, failing_url = await backend("b", failing)
    good, good_url = await backend("a")
    gone = f"http://127.0.0.1:{free_port()}"
    backends = {"status": (good_url, failing_url), "intake": (good_url, gone)}
    transport = httpx.ASGITransport(app=create_app(backends))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://yard.test") as client:
            answer = await client.get("/healthz/all")
    finally:
        await runner.cleanup()
        await good.cleanup()
    assert answer.status_code == 503
    assert answer.json() == {
        "gateway": "ok",
        "status": "replica 2: http 500",
        "intake": "replica 2: down",
    }
    assert "127.0.0.1" not in answer.text


async def test_a_replica_that_follows_passes_the_request_to_the_next() -> None:
    # Placement's replicas elect one leader; the others answer 503 to all but their
    # health. Taking turns over them, every other call failed (make up with placement
    # replicas; the chart's two did the same behind their Service).
    from trainyard_common.runtime import FOLLOWER_HEADER

    calls: list[str] = []

    async def follower(request: web.Request) -> web.Response:
        calls.append("follower")
        await request.read()
        return web.json_response({"detail": "not the leader"}, status=503,
                                 headers={FOLLOWER_HEADER: "true", "Retry-After": "1"})  # fmt: skip

    async def broken(request: web.Request) -> web.Response:
        calls.append("broken")
        return web.json_response({"detail": "down"}, status=503)

    lead, lead_url = await backend("leader")
    follows, follows_url = await backend("follower", follower)
    down, down_url = await backend("broken", broken)
    app = create_app({"placement": (follows_url, lead_url), "status": (down_url, lead_url)})
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://yard.test") as http:
            for _ in range(3):
                answer = await http.post("/v1/placement/nodes/n1/drain", content=b"{}")
                assert answer.status_code == 200 and answer.json()["replica"] == "leader"
                assert answer.json()["body"] == "{}"  # the body sent again whole
            assert calls.count("follower") == 3  # asked once a request, then the next
            # A 503 of a service's own trouble is its answer, not tried elsewhere.
            answer = await http.get("/v1/jobs")
            assert answer.status_code == 503 and calls[-1] == "broken"
    finally:
        for runner in (lead, follows, down):
            await runner.cleanup()
