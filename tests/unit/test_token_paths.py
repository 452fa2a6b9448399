"""OpenPAI's token routes carry a live bearer token in their path (DELETE
/api/v2/tokens/{token}): it is written to no log line and no trace span."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.util.http import parse_excluded_urls

from trainyard_common.runtime import AnswerErrors
from trainyard_common.telemetry import EXCLUDED_URLS, without_tokens

TOKEN = "Zq3-live-bearer-token-of-someone"


def test_the_token_routes_have_no_server_span() -> None:
    excluded = parse_excluded_urls(EXCLUDED_URLS)
    assert excluded.url_disabled(f"http://yard:8080/api/v2/tokens/{TOKEN}")
    assert excluded.url_disabled("http://yard:8080/healthz")
    assert not excluded.url_disabled("http://yard:8080/api/v2/jobs")
    assert not excluded.url_disabled("http://yard:8080/v1/jobs/abc")


async def test_a_failing_token_route_logs_its_path_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()
    app.add_middleware(AnswerErrors)  # as every service's app has it

    @app.delete("/api/v2/tokens/{token}")
    async def revoke(token: str) -> None:
        raise RuntimeError("the store went away")

    transport = httpx.ASGITransport(app=app)
    with caplog.at_level(logging.ERROR):
        async with httpx.AsyncClient(transport=transport, base_url="http://yard") as client:
            answer = await client.delete(f"/api/v2/tokens/{TOKEN}")
    assert answer.status_code == 500
    assert "DELETE /api/v2/tokens/<token> failed" in caplog.text
    assert TOKEN not in caplog.text
    assert without_tokens("/api/v2/jobs/a~b") == "/api/v2/jobs/a~b"
    # The gateway's forward (its aiohttp client span's url.full) the same way.
    forwarded = f"http://intake:8081/api/v2/tokens/{TOKEN}?x=1"
    assert without_tokens(forwarded) == "http://intake:8081/api/v2/tokens/<token>?x=1"
