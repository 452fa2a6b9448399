"""A route with a typed body answers a 422 that names the problem to a body that is not
even text, never a 500 (found by tests/security/test_fuzz.py); a route that meets the
bus down answers 503 with Retry-After, never a 500 (found by tests/e2e/test_crash.py)."""

from __future__ import annotations

import httpx
from pydantic import BaseModel
from starlette.requests import Request

from trainyard_common.errors import BusUnavailable
from trainyard_common.runtime import MAX_REQUEST, health_app


class Body(BaseModel):
    reason: str


async def test_a_body_that_is_not_utf8_is_a_422_not_a_500() -> None:
    app = health_app("probe")

    @app.post("/v1/things/{thing}/stop")
    async def stop(thing: str, body: Body | None = None) -> dict[str, str]:
        return {"id": thing}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
        answer = await http.post(
            "/v1/things/x/stop", content=b"\x80", headers={"Content-Type": "application/yaml"}
        )
        assert answer.status_code == 422, answer.text
        [error] = answer.json()["detail"]
        assert error["loc"][0] == "body" and error["input"] == "\ufffd"
        ok = await http.post("/v1/things/x/stop", json={"reason": "done"})
        assert ok.status_code == 200


async def test_the_bus_unavailable_is_a_503_to_retry_not_a_500() -> None:
    app = health_app("probe")

    @app.post("/v1/jobs")
    async def submit() -> dict[str, str]:
        raise BusUnavailable("the bus did not store the message on events: nats: timeout")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
        answer = await http.post("/v1/jobs", json={})
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert "bus is unavailable" in answer.json()["detail"]


async def test_a_path_nothing_serves_on_openpais_paths_is_its_rest_servers_no_api_error() -> None:
    """OpenPAI's catch-all (rest-server config/express.js): 404, NoApiError, "API <url>
    is not found." with the query the client sent, for a path nothing serves and for a
    method a path does not take; Trainyard's own paths keep FastAPI's."""
    app = health_app("probe")

    @app.get("/api/v2/jobs/{name}")
    async def job(name: str) -> dict[str, str]:
        return {"name": name}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
        # A method the path does not take: Express's router falls through to the same.
        wrong = await http.delete("/api/v2/jobs/a~b")
        assert wrong.status_code == 404 and "allow" not in wrong.headers
        assert wrong.json() == {
            "code": "NoApiError",
            "message": "API /api/v2/jobs/a~b is not found.",
        }
        answer = await http.get("/api/v2/no-such-api", params={"x": "1"})
        assert answer.status_code == 404
        assert answer.json() == {
            "code": "NoApiError", "message": "API /api/v2/no-such-api?x=1 is not found."
        }  # fmt: skip
        # As sent: Express's req.url is not decoded.
        sent = await http.get("/api/v2/a%20b%2Fc?q=%20x")
        assert sent.json()["message"] == "API /api/v2/a%20b%2Fc?q=%20x is not found."
        bare = await http.get("/api/v1/user/someone/no-such-api")
        assert bare.json()["message"] == "API /api/v1/user/someone/no-such-api is not found."
        own = await http.get("/v1/no-such-api")
        assert own.status_code == 404 and own.json() == {"detail": "Not Found"}


async def test_no_body_past_the_request_limit_is_read_whatever_its_route() -> None:
    # Only Trainyard's own JSON bodies were bounded before their route: a dialect's route
    # (and the gateway, forwarding any) read a body of gigabytes whole, no token needed.
    app = health_app("probe")
    read: list[int] = []

    @app.post("/api/v2/jobs")
    async def submit(request: Request) -> dict[str, int]:
        read.append(len(await request.body()))
        return {"read": read[-1]}

    async def chunks(total: int):  # type: ignore[no-untyped-def]
        for _ in range(total // 65536):
            yield b"x" * 65536

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
        yaml = {"Content-Type": "application/yaml"}
        answer = await http.post("/api/v2/jobs", content=chunks(MAX_REQUEST + 65536), headers=yaml)
        assert answer.status_code == 413 and str(MAX_REQUEST) in answer.json()["detail"]
        declared = {**yaml, "Content-Length": str(10 * MAX_REQUEST)}
        answer = await http.post("/api/v2/jobs", content=b"x", headers=declared)
        assert answer.status_code == 413  # said before a byte of it is read
        declared["Content-Length"] = "9" * 5000  # past what int() reads: no 500
        answer = await http.post("/api/v2/jobs", content=b"x", headers=declared)
        assert answer.status_code == 413
        assert read == []
        # A dialect's own bound (4 MiB) is still its route's, in its platform's shape.
        answer = await http.post("/api/v2/jobs", content=b"x" * (MAX_REQUEST - 1), headers=yaml)
        assert answer.json() == {"read": MAX_REQUEST - 1}
