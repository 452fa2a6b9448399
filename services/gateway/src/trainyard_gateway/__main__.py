"""``python -m trainyard_gateway``: the single base URL (default http://127.0.0.1:8080)."""

from __future__ import annotations

from trainyard_common.config import Settings
from trainyard_common.runtime import run_service, serve, setup_logging
from trainyard_common.telemetry import setup_telemetry

from .app import create_app
from .settings import GatewaySettings


async def main() -> None:
    settings = Settings.from_env("gateway")
    setup_logging("gateway")
    setup_telemetry("gateway")
    gateway = GatewaySettings.from_env()
    await serve(settings, create_app(gateway.backends), [], tls=gateway.tls)


if __name__ == "__main__":
    run_service(main)
