"""Property-based fuzzing of every HTTP entry point: any path, parameters, headers and
body hypothesis makes, sent through the gateway of the real platform to every route
every service's OpenAPI document lists, is answered without a 5xx and in time.

Deterministic (a fixed seed, a bounded number of examples per route), so it runs in
``make test`` and a failure reproduces; hypothesis shrinks a failing request to the
smallest one that still fails."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_stack.platform import SERVICES, Platform

from ..e2e.conftest import start_platform

EXAMPLES_PER_ROUTE = 12
TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(tmp_path_factory.mktemp("fuzz"))
    yield platform
    platform.stop()


def streams(operation: dict[str, Any]) -> bool:
    """The route answers a stream that lasts (server-sent events): judged by its status
    and its first bytes, not by reading it to an end it never reaches."""
    answers = operation.get("responses", {}).values()
    return any("text/event-stream" in a.get("content", {}) for a in answers)


def routes(platform: Platform) -> list[tuple[str, str, list[str]]]:
    """Every (method, path template, query parameter names) of every service."""
    found = []
    with httpx.Client(timeout=10) as http:
        for service in SERVICES:
            if service == "gateway":
                continue
            document = http.get(f"{platform.service_url(service)}/openapi.json").json()
            for path, methods in document["paths"].items():
                for method, operation in methods.items():
                    query = [
                        p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"
                    ]
                    found.append((method.upper(), path, query))
                    if streams(operation):
                        STREAMING.add((method.upper(), path))
    return sorted(set((m, p, tuple(q)) for m, p, q in found))  # type: ignore[misc]


STREAMING: set[tuple[str, str]] = set()


# Text that has hurt parsers and stores: NUL, surrogates in percent-encoding, huge
# numbers, separators, unicode, very long strings.
NASTY = st.sampled_from(
    [
        "", "%00", "a%00b", "..", "../admin", "%ff%fe", "~", "admin~x", "*", ">",
        "1" * 40, "-1", "1e999999", "NaN", "😀", "a" * 3000, "ty-x", "default",
    ]
)  # fmt: skip
# Path segments as a client sends them: anything, percent-encoded (the nasty ones are
# sent as they are, some already encoded: %00, %ff).
SEGMENT = st.one_of(
    NASTY,
    st.text(min_size=1, max_size=40).map(lambda s: quote(s, safe="~!$&'()*+,;=:@") or "x"),
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=60),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=5)
    ),
    max_leaves=25,
)
RAW_BODY = st.one_of(
    JSON_VALUE.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    st.sampled_from(
        [
            b"[" * 5000,
            b'{"a": NaN}',
            b'"\\ud800"',
            b"a: &a [*a]",
            b"name: x\nroles:\n- {name: w, command: true}\n",
            b"{",
        ]
    ),
)
IDEMPOTENCY = string.ascii_letters + string.digits + "-_.~ "
CONTENT_TYPE = st.sampled_from(
    ["application/json", "application/yaml", "text/plain", "", "application/merge-patch+json"]
)


def request_for(
    method: str, path: str, query: tuple[str, ...]
) -> st.SearchStrategy[dict[str, Any]]:
    names = re.findall(r"{([^}]+)}", path)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        url = path
        for name in names:
            value = draw(SEGMENT)
            url = url.replace("{" + name + "}", value if value else "x", 1)
        params = {
            n: draw(st.one_of(NASTY, st.text(max_size=30))) for n in query if draw(st.booleans())
        }
        body = draw(RAW_BODY) if method in ("POST", "PUT", "PATCH") else b""
        headers = {"Content-Type": draw(CONTENT_TYPE)} if body else {}
        if draw(st.booleans()):
            # (HTTP allows no space at a header value's ends: clients refuse to send one)
            key = draw(st.text(alphabet=IDEMPOTENCY, max_size=20)).strip()
            headers["Idempotency-Key"] = key or "k"
        return {"url": url, "params": params, "content": body, "headers": headers}

    return build()


def fuzzer(http: httpx.Client, method: str, path: str, query: tuple[str, ...]) -> Any:
    """One route's property: whatever it is sent, it answers below 500 and in time."""

    @settings(
        max_examples=EXAMPLES_PER_ROUTE,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(request_for(method, path, query))
    def fuzz(request: dict[str, Any]) -> None:
        try:
            if (method, path) in STREAMING:
                with http.stream(method, **request) as answer:
                    if answer.status_code < 400:
                        next(answer.iter_bytes(), b"")  # it streams: its first bytes come
                    else:
                        answer.read()
            else:
                answer = http.request(method, **request)
        except httpx.TimeoutException:
            raise AssertionError(f"{method} {path} hung on {request!r:.300}") from None
        assert answer.status_code < 500, (
            f"{method} {path} answered {answer.status_code} to {request!r:.300}: "
            f"{answer.text[:300]}"
        )

    return fuzz


def test_no_route_answers_a_5xx_or_hangs_whatever_it_is_sent(platform: Platform) -> None:
    all_routes = routes(platform)
    assert len(all_routes) > 40  # every service's API, every dialect's
    failures: list[str] = []
    with httpx.Client(
        base_url=platform.url,
        timeout=TIMEOUT_S,
        headers={"Authorization": f"Bearer {platform.token}"},
    ) as http:
        for method, path, query in all_routes:
            try:
                fuzzer(http, method, path, query)()
            except AssertionError as exc:
                failures.append(str(exc)[:800])
    assert not failures, "\n\n".join(failures)
