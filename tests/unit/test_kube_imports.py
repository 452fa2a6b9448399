"""The Kubernetes client is loaded only where Kubernetes is used.

Importing ``kubernetes_asyncio`` is about half of a service's start (1.1 s of 2.3 on
the 2-vCPU machine) and some 65 MB of its resident memory (150 MB against 85). On the
local backend, the embedded default, no service talks to Kubernetes: placement and
validation use ``trainyard_common.kube_nodes``, and the launcher its Kubernetes
backend, only when the cluster or ``YARD_LAUNCHER`` says so, and import the client
then (tests/e2e/test_kubernetes.py runs those paths)."""

from __future__ import annotations

import json
import subprocess
import sys

SERVICES = [
    "trainyard_gateway",
    "trainyard_intake",
    "trainyard_validation",
    "trainyard_placement",
    "trainyard_launcher",
    "trainyard_status",
]

# Each service's entry module in turn, in one fresh interpreter (as it starts): the
# Kubernetes modules present after each.
PROBE = """
import importlib, json, sys
found = {}
for service in sys.argv[1:]:
    importlib.import_module(service + ".__main__")
    found[service] = sorted(m for m in sys.modules
                            if m.split(".")[0] in ("kubernetes_asyncio", "kubernetes"))[:3]
print(json.dumps(found))
"""


def test_no_service_imports_the_kubernetes_client_to_start() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *SERVICES], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert list(found) == SERVICES
    assert found == {service: [] for service in SERVICES}
