"""``yard kubeconfig``: a kubeconfig for the platform's Kubernetes API, so kubectl, the
Kubernetes and Kubeflow SDKs and any client-go program reach Trainyard's Kubernetes-shaped
jobs as they would a cluster: its HTTPS server, the platform's CA (embedded, so the file
works anywhere) and the user's bearer token."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from trainyard_common.config import default_data_dir

NAME = "trainyard"


class KubeconfigError(ValueError):
    """What is missing to write one, and where it was looked for."""


def platform_state(data_dir: Path | None = None) -> dict[str, Any]:
    """What `make up` / `make run` wrote about where the platform answers."""
    path = (data_dir or default_data_dir()) / "run" / "platform.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def locate(server: str | None, ca_file: str | None) -> tuple[str, bytes]:
    """The API server URL and the CA certificate: given, else ``YARD_KUBE_URL`` /
    ``YARD_KUBE_CA``, else what the running platform wrote in its data directory."""
    state = platform_state().get("kubernetes") or {}
    server = server or os.environ.get("YARD_KUBE_URL") or state.get("server")
    ca_file = ca_file or os.environ.get("YARD_KUBE_CA") or state.get("ca")
    if not server:
        raise KubeconfigError(
            "no Kubernetes API URL: pass --server, set YARD_KUBE_URL, or start the platform "
            "(make up) with YARD_DATA_DIR pointing at its data directory"
        )
    if not server.startswith("https://"):
        raise KubeconfigError(f"{server!r}: kubectl sends a token only over https://")
    if not ca_file:
        raise KubeconfigError("no CA certificate: pass --ca-file or set YARD_KUBE_CA")
    try:
        return server, Path(ca_file).read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"the CA certificate {ca_file} cannot be read: {exc}") from exc


def kubeconfig(
    server: str, ca_pem: bytes, token: str, namespace: str = "default"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": NAME,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": NAME, "user": {"token": token}}],
        "contexts": [
            {"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": namespace}}
        ],
        "current-context": NAME,
        "preferences": {},
    }
