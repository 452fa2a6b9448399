"""``python -m trainyard_gateway``: the single base URL (default http://127.0.0.1:8080)."""

from __future__ import annotations

import asyncio
import os

from trainyard_common.config import DEFAULT_PORTS, Settings
from trainyard_common.runtime import serve, setup_logging

from .app import create_app
from .routes import BACKENDS


def backend_urls() -> dict[str, str]:
    """``YARD_<SERVICE>_URL`` wins, else the service's port on this host."""
    urls = {}
    for name in BACKENDS:
        port = os.environ.get(f"YARD_{name.upper()}_PORT") or DEFAULT_PORTS[name]
        urls[name] = os.environ.get(f"YARD_{name.upper()}_URL") or f"http://127.0.0.1:{port}"
    return urls


async def main() -> None:
    settings = Settings.from_env("gateway")
    setup_logging("gateway")
    await serve(settings, create_app(backend_urls()), [])


if __name__ == "__main__":
    asyncio.run(main())
