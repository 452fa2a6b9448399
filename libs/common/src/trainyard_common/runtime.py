"""Running a service process: its HTTP app (health and API) and its bus consumers under
one event loop, stopped together on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable

import uvicorn
from fastapi import FastAPI

from .config import Settings

Worker = Callable[[asyncio.Event], Awaitable[None]]

log = logging.getLogger("trainyard.runtime")


def setup_logging(service: str) -> None:
    level = os.environ.get("YARD_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )


async def serve(settings: Settings, app: FastAPI, workers: list[Worker]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]

    tasks = [
        asyncio.create_task(worker(stop), name=getattr(worker, "__name__", "worker"))
        for worker in workers
    ]
    http = asyncio.create_task(server.serve(), name="http")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    done, _ = await asyncio.wait([*tasks, http, stopper], return_when=asyncio.FIRST_COMPLETED)
    failed = [t for t in done if t is not stopper and t.exception() is not None]
    for task in failed:
        log.error("%s stopped: %r", task.get_name(), task.exception())
    stop.set()
    server.should_exit = True
    await asyncio.gather(*tasks, http, return_exceptions=True)
    if failed:
        raise SystemExit(1)


def health_app(service: str, title: str | None = None) -> FastAPI:
    app = FastAPI(title=title or f"trainyard-{service}")

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"service": service, "status": "ok"}

    return app
