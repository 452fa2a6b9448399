"""Which service answers which request: the one table behind the single base URL.

Writes (submit, stop, delete) go to intake, which publishes them; reads go to status,
which owns the projections; task logs to the launcher, which owns the files; dry-run
validation to the validation service. Each dialect's API follows the same split."""

from __future__ import annotations

import re

ANY = "*"
READ = "GET"
WRITE = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# (methods, path pattern, service) — first match wins.
ROUTES: list[tuple[str | frozenset[str], re.Pattern[str], str]] = [
    # Trainyard's own API.
    ("POST", re.compile(r"^/v1/jobs:validate$"), "validation"),
    ("POST", re.compile(r"^/v1/jobs$"), "intake"),
    ("POST", re.compile(r"^/v1/jobs/[^/]+/(stop|pause|resume|restart)$"), "intake"),
    ("POST", re.compile(r"^/v1/tokens$"), "intake"),
    ("DELETE", re.compile(r"^/v1/users/[^/]+/credentials$"), "intake"),
    (WRITE, re.compile(r"^/v1/access-keys(/[^/]+)?$"), "intake"),
    (READ, re.compile(r"^/v1/jobs/[^/]+/logs$"), "launcher"),
    ("POST", re.compile(r"^/v1/jobs/[^/]+/tasks/[^/]+/[^/]+/exec$"), "launcher"),
    (READ, re.compile(r"^/v1/placement(/.*)?$"), "placement"),
    ("POST", re.compile(r"^/v1/placement/jobs/[^/]+/scale$"), "placement"),
    ("POST", re.compile(r"^/v1/placement/shutdown$"), "placement"),
    (READ, re.compile(r"^/v1/admin/tasks$"), "launcher"),
    (WRITE, re.compile(r"^/v1/placement/nodes(/[^/]+(/(drain|undrain))?)?$"), "placement"),
    (READ, re.compile(r"^/v1/jobs(/[^/]+(/events|/state|/tasks)?)?$"), "status"),
    (READ, re.compile(r"^/v1/watch/jobs$"), "status"),
    (READ, re.compile(r"^/v1/me$"), "status"),
    (ANY, re.compile(r"^/v1/admin/dead-letters(/[0-9]+/replay)?$"), "status"),
    ("POST", re.compile(r"^/v1/admin/rebuild$"), "status"),
    # Kubernetes pods (read-only, a Kubeflow job's tasks) and their logs, before DLC's.
    (READ, re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/log$"), "launcher"),
    (READ, re.compile(r"^/api/v1(/namespaces/[^/]+/pods(/[^/]+)?)?$"), "status"),
    # PAI-DLC (its paths as the official SDK calls them).
    (READ, re.compile(r"^/api/v1/jobs/[^/]+/(pods/[^/]+/logs|metrics)$"), "launcher"),
    (ANY, re.compile(r"^/api/v1/(datasources|codesources)(/.*)?$"), "intake"),
    (READ, re.compile(r"^/api/v1/ecsspecs$"), "status"),
    (READ, re.compile(r"^/api/v1/jobs(/.*)?$"), "status"),
    (WRITE, re.compile(r"^/api/v1/jobs(/.*)?$"), "intake"),
    # OpenPAI REST (v2, and v1's per-user submission path); its virtual clusters are
    # placement's queues.
    (READ, re.compile(r"^/api/v2/info$"), "status"),
    # OpenPAI's accounts: over intake's token registry (users are token holders).
    (ANY, re.compile(r"^/api/v2/(users|groups|tokens|storages|authn)(/.*)?$"), "intake"),
    (READ, re.compile(r"^/api/v2/virtual-clusters(/[^/]+(/sku-types)?)?$"), "placement"),
    (READ, re.compile(r"^/api/v[12]/(user/[^/]+/)?jobs(/.*)?$"), "status"),
    (WRITE, re.compile(r"^/api/v[12]/(user/[^/]+/)?jobs(/.*)?$"), "intake"),
    # Kubernetes resources: T9k jobs, Kubeflow jobs, and the discovery and OpenAPI
    # documents kubectl and client-go read first.
    (READ, re.compile(r"^/(version|api|apis|openapi/v2|openapi/v3(/.*)?)$"), "status"),
    (READ, re.compile(r"^/apis/(batch\.tensorstack\.dev|kubeflow\.org)(/.*)?$"), "status"),
    (WRITE, re.compile(r"^/apis/(batch\.tensorstack\.dev|kubeflow\.org)/.*$"), "intake"),
    # Tencent TI.
    (READ, re.compile(r"^/ti/.*$"), "status"),
    (WRITE, re.compile(r"^/ti/.*$"), "intake"),
]

BACKENDS = ("intake", "validation", "placement", "launcher", "status")

# The Tencent Cloud API: every action is a POST to "/", named by its X-TC-Action header.
CLOUD_ACTIONS = {
    "CreateJob": "intake",
    "DeleteJob": "intake",
    "DescribeJob": "status",
    "ListJobs": "status",
}


# OpenPAI's clients reach its rest-server under /rest-server (its pylon's path: the
# Python SDK's `{pai_uri}/rest-server/api`, the JS SDK's and the webportal's
# rest_server_uri). There, as its rest-server (k8s launcher) routes them, /api/v1/jobs
# is v2's job router, /api/v1/virtual-clusters v2's, and /api/v1/user/{user} a user:
# at the root, /api/v1/jobs is PAI-DLC's.
REST_SERVER = "/rest-server"
_V1_AS_V2 = re.compile(r"^/api/v1/(jobs|virtual-clusters)(?=/|$)")
_V1_USER = re.compile(r"^/api/v1/user/([^/]+)$")


def rest_server_path(path: str) -> str | None:
    """The path served here for ``path`` under OpenPAI's /rest-server; None when it is
    not under it. The same for a path still percent-encoded (the prefix and the
    segments it maps are plain ASCII)."""
    if path != REST_SERVER and not path.startswith(REST_SERVER + "/"):
        return None
    inner = path[len(REST_SERVER) :] or "/"
    inner = _V1_AS_V2.sub(r"/api/v2/\1", inner, count=1)
    return _V1_USER.sub(r"/api/v2/users/\1", inner, count=1)


def _allows(methods: str | frozenset[str], method: str) -> bool:
    if isinstance(methods, frozenset):
        return method in methods
    return methods == ANY or methods == method


def route(method: str, path: str, action: str | None = None) -> str | None:
    """The service that answers; ``action``: a Tencent Cloud API request's X-TC-Action."""
    if method == "POST" and path == "/":
        return CLOUD_ACTIONS.get(action or "")
    for methods, pattern, service in ROUTES:
        if _allows(methods, method) and pattern.match(path):
            return service
    return None
