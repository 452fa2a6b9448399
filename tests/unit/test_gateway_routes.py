import pytest

from trainyard_gateway.routes import route


@pytest.mark.parametrize(
    "method,path,service",
    [
        ("POST", "/v1/jobs", "intake"),
        ("POST", "/v1/jobs/abc/stop", "intake"),
        ("POST", "/v1/jobs/abc/pause", "intake"),
        ("POST", "/v1/jobs/abc/resume", "intake"),
        ("POST", "/v1/jobs/abc/restart", "intake"),
        ("POST", "/v1/placement/jobs/abc/scale", "placement"),
        ("POST", "/v1/tokens", "intake"),
        ("GET", "/v1/jobs", "status"),
        ("GET", "/v1/jobs/abc", "status"),
        ("GET", "/v1/jobs/abc/events", "status"),
        ("GET", "/v1/jobs/abc/tasks", "status"),
        ("GET", "/v1/jobs/abc/logs", "launcher"),
        ("GET", "/v1/placement/queue", "placement"),
        ("GET", "/v1/placement/nodes", "placement"),
        ("POST", "/v1/placement/nodes", "placement"),
        ("POST", "/v1/placement/nodes/n1/drain", "placement"),
        ("POST", "/v1/placement/nodes/n1/undrain", "placement"),
        ("DELETE", "/v1/placement/nodes/n1", "placement"),
        ("POST", "/v1/placement/queue", None),
        ("POST", "/v1/jobs:validate", "validation"),
        ("POST", "/api/v1/jobs", "intake"),
        ("GET", "/api/v1/jobs/dlc1", "status"),
        ("DELETE", "/api/v1/jobs/dlc1", "intake"),
        ("GET", "/api/v1/jobs/dlc1/pods/p0/logs", "launcher"),
        ("GET", "/api/v1/datasources", "intake"),
        ("POST", "/api/v2/jobs", "intake"),
        ("GET", "/api/v2/jobs/alice~job1", "status"),
        ("PUT", "/api/v2/jobs/alice~job1/executionType", "intake"),
        ("POST", "/api/v1/user/alice/jobs", "intake"),
        ("POST", "/apis/batch.tensorstack.dev/v1beta1/namespaces/ns/pytorchtrainingjobs", "intake"),
        (
            "GET",
            "/apis/batch.tensorstack.dev/v1beta1/namespaces/ns/pytorchtrainingjobs/j",
            "status",
        ),
        ("GET", "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs/j", "status"),
        ("POST", "/ti/v1/jobs", "intake"),
        ("GET", "/v1/jobs/abc/stop", None),
        ("GET", "/v1/jobs/abc/pause", None),
        ("GET", "/v1/jobs/abc/restart", None),
        ("POST", "/v1/jobs/abc/scale", None),
        ("DELETE", "/v1/jobs/abc", None),
        ("GET", "/v1/unknown", None),
    ],
)
def test_route_table(method: str, path: str, service: str | None) -> None:
    assert route(method, path) == service


@pytest.mark.parametrize(
    "method,sent,path,service",
    [
        ("GET", "/rest-server/api/v2/jobs", "/api/v2/jobs", "status"),
        ("POST", "/rest-server/api/v2/jobs", "/api/v2/jobs", "intake"),
        # OpenPAI's rest-server (k8s launcher) serves v2's job router at /api/v1/jobs.
        ("GET", "/rest-server/api/v1/jobs", "/api/v2/jobs", "status"),
        ("POST", "/rest-server/api/v1/jobs", "/api/v2/jobs", "intake"),
        ("PUT", "/rest-server/api/v1/jobs/a~b/executionType", "/api/v2/jobs/a~b/executionType",
         "intake"),
        ("GET", "/rest-server/api/v1/jobs-x", "/api/v1/jobs-x", None),  # not jobs/
        ("GET", "/rest-server/api/v1/virtual-clusters/vc1", "/api/v2/virtual-clusters/vc1",
         "placement"),
        ("GET", "/rest-server/api/v1/user/alice", "/api/v2/users/alice", "intake"),
        ("POST", "/rest-server/api/v1/user/alice/jobs", "/api/v1/user/alice/jobs", "intake"),
        ("GET", "/rest-server", "/", None),
    ],
)  # fmt: skip
def test_openpais_rest_server_paths(method: str, sent: str, path: str, service: str | None) -> None:
    from trainyard_gateway.routes import rest_server_path

    assert rest_server_path(sent) == path
    assert route(method, path) == service


def test_only_rest_server_paths_are_rewritten() -> None:
    from trainyard_gateway.routes import rest_server_path

    for path in ("/api/v1/jobs", "/rest-serverx/api/v2/jobs", "/v1/jobs", "/"):
        assert rest_server_path(path) is None
