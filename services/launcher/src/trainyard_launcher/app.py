"""Bootstrap: settings, clients, adoption of running tasks, the consumer, the watcher,
and the HTTP app with the task-log API."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import Response, StreamingResponse

from trainyard_common.auth import Identity, TokenStore, identity_dependency, tokens_collection
from trainyard_common.bus import Bus, Delivery
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.runtime import health_app, serve, setup_logging
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import commands_of, events_of

from .adapters.local import LocalBackend
from .adapters.store import LauncherStore, MongoLauncherStore, task_id
from .handlers import Deps, adopt, dispatch, watch_tasks
from .logs import follow, read_from

DURABLE = "launcher"
SUBJECTS = events_of("placed") + commands_of("stop")


def create_app(store: LauncherStore, tokens: TokenStore) -> FastAPI:
    app = health_app("launcher")
    current_identity = identity_dependency(tokens)

    @app.get("/v1/jobs/{job_id}/logs", response_class=Response)
    async def task_logs(
        job_id: str,
        role: str | None = None,
        index: int | None = Query(None, ge=0),
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = Query(None, ge=1),
        follow_: bool = Query(False, alias="follow"),
        offset: int = Query(0, ge=0),
        identity: Identity = Depends(current_identity),
    ) -> Response:
        job = await store.get_job(job_id)
        if job is None or job.spec is None:
            raise HTTPException(404, f"job {job_id} has no tasks on this launcher")
        if not identity.can_see(job.user):
            raise HTTPException(404, f"no job {job_id}")  # as status answers: ids are not to be probed
        if role is None:
            if not job.tasks:
                raise HTTPException(404, f"job {job_id} has no tasks")
            role = job.tasks[0].role
            if index is None:
                index = job.tasks[0].index
        index = index or 0
        attempt = attempt or job.attempt
        key = task_id(job_id, attempt, role, index)
        task = await store.get_task(key)
        if task is None:
            raise HTTPException(
                404, f"job {job_id} has no task {role}[{index}] in attempt {attempt}"
            )
        path = Path(task.dir) / f"{stream}.log"
        if not follow_:
            data = read_from(path, offset)
            return Response(data, media_type="text/plain; charset=utf-8",
                            headers={"X-Log-Offset": str(offset + len(data))})

        async def ended() -> bool:
            now = await store.get_task(key)
            return now is None or now.state.terminal

        return StreamingResponse(follow(path, offset, ended), media_type="text/plain; charset=utf-8")

    return app


async def main() -> None:
    settings = Settings.from_env("launcher")
    setup_logging("launcher")
    bus = await Bus.connect(settings.nats_url, name="launcher")
    client = mongo_client(settings.mongo_url)
    try:
        store = MongoLauncherStore(client[settings.db_name()])
        await store.ensure_indexes()
        deps = Deps(
            store=store,
            backend=LocalBackend(settings.data_dir / "launcher"),
            publish=bus.publish,
            default_fs_uri=os.environ.get("YARD_DEFAULT_FS_URI", ""),
            kill_grace_s=float(os.environ.get("YARD_LAUNCHER_KILL_GRACE_S") or 10.0),
        )
        # Before consuming: a redelivered JobPlaced must find adopted tasks as they are.
        await adopt(deps)
        tokens = TokenStore(tokens_collection(client, settings.db_prefix), settings.admin_token)

        async def handle(event: Event, delivery: Delivery) -> None:
            await dispatch(deps, event, delivery)

        async def consumer(stop: asyncio.Event) -> None:
            await bus.consume(DURABLE, SUBJECTS, handle, stop=stop)

        async def watcher(stop: asyncio.Event) -> None:
            await watch_tasks(deps, stop)

        await serve(settings, create_app(store, tokens), [consumer, watcher])
    finally:
        await bus.close()
        await client.close()
