import pytest

from trainyard_gateway.routes import route


@pytest.mark.parametrize("method,path,service", [
    ("POST", "/v1/jobs", "intake"),
    ("POST", "/v1/jobs/abc/stop", "intake"),
    ("POST", "/v1/tokens", "intake"),
    ("GET", "/v1/jobs", "status"),
    ("GET", "/v1/jobs/abc", "status"),
    ("GET", "/v1/jobs/abc/events", "status"),
    ("GET", "/v1/jobs/abc/logs", "launcher"),
    ("GET", "/v1/placement/queue", "placement"),
    ("GET", "/v1/jobs/abc/stop", None),
    ("DELETE", "/v1/jobs/abc", None),
    ("GET", "/v1/unknown", None),
])
def test_route_table(method: str, path: str, service: str | None) -> None:
    assert route(method, path) == service
