"""The gateway's settings: where each service answers. ``YARD_<SERVICE>_URL`` wins (a
comma-separated list for a service run as several replicas: the gateway takes turns), else
the service's port on this host (``YARD_<SERVICE>_PORT``, or its default)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from trainyard_common.config import DEFAULT_PORTS, SettingError, number_setting
from trainyard_common.runtime import TlsListener

from .routes import BACKENDS


@dataclass(frozen=True)
class GatewaySettings:
    backends: dict[str, tuple[str, ...]]
    # The Kubernetes API over HTTPS (kubectl sends a token only over TLS): the port, and
    # the server certificate and key (YARD_KUBE_API_PORT, YARD_TLS_CERT, YARD_TLS_KEY).
    tls: TlsListener | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        urls: dict[str, tuple[str, ...]] = {}
        for name in BACKENDS:
            variable = f"YARD_{name.upper()}_URL"
            listed = [u.strip() for u in env.get(variable, "").split(",") if u.strip()]
            for url in listed:
                parts = urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise SettingError(f"{variable}={url!r}: not an http(s) URL with a host")
            if not listed:
                port = int(
                    number_setting(
                        env,
                        f"YARD_{name.upper()}_PORT",
                        DEFAULT_PORTS[name],
                        whole=True,
                        above=True,
                    )
                )
                listed = [f"http://127.0.0.1:{port}"]
            urls[name] = tuple(url.rstrip("/") for url in listed)
        return cls(urls, _tls(env))


def _tls(env: Mapping[str, str]) -> TlsListener | None:
    if not env.get("YARD_KUBE_API_PORT"):
        return None
    port = int(number_setting(env, "YARD_KUBE_API_PORT", 6443, whole=True, above=True))
    files = {name: env.get(name, "") for name in ("YARD_TLS_CERT", "YARD_TLS_KEY")}
    for name, path in files.items():
        if not path or not os.path.isfile(path):
            raise SettingError(f"YARD_KUBE_API_PORT is set, but {name}={path!r} is not a file")
    return TlsListener(port, files["YARD_TLS_CERT"], files["YARD_TLS_KEY"])
