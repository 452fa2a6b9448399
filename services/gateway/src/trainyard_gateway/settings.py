"""The gateway's settings: where each service answers. ``YARD_<SERVICE>_URL`` wins, else
the service's port on this host (``YARD_<SERVICE>_PORT``, or its default)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from trainyard_common.config import DEFAULT_PORTS, SettingError, number_setting

from .routes import BACKENDS


@dataclass(frozen=True)
class GatewaySettings:
    backends: dict[str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        urls = {}
        for name in BACKENDS:
            variable = f"YARD_{name.upper()}_URL"
            url = env.get(variable)
            if url:
                parts = urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise SettingError(f"{variable}={url!r}: not an http(s) URL with a host")
            else:
                port = int(
                    number_setting(
                        env,
                        f"YARD_{name.upper()}_PORT",
                        DEFAULT_PORTS[name],
                        whole=True,
                        above=True,
                    )
                )
                url = f"http://127.0.0.1:{port}"
            urls[name] = url.rstrip("/")
        return cls(urls)
