"""Bootstrap: settings, clients, adoption of running tasks, the consumer, the watcher,
and the HTTP app with the task-log API."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse

from trainyard_common.auth import (
    AccessKeyStore,
    AliyunError,
    AliyunRoute,
    Identity,
    TokenStore,
    aliyun_identity_dependency,
    identity_dependency,
    request_id,
    tokens_collection,
)
from trainyard_common.bus import Bus, Delivery
from trainyard_common.config import Settings
from trainyard_common.dialects import dlc
from trainyard_common.events import Event
from trainyard_common.runtime import health_app, serve, setup_logging
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import commands_of, events_of

from .adapters.local import LocalBackend
from .adapters.store import LauncherStore, MongoLauncherStore, task_id
from .domain.failure import BACKOFF_BASE_S
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

    app.include_router(dlc_pod_logs(store, tokens))
    return app


def dlc_pod_logs(store: LauncherStore, tokens: TokenStore) -> APIRouter:
    """PAI-DLC's GetPodLogs at the SDK's path: a pod is one task (its PodId is
    ``dialects.dlc.pod_id``, the one GetJob shows), its log the task's stdout then
    stderr, as lines."""
    api = APIRouter(route_class=AliyunRoute)
    signed = aliyun_identity_dependency(AccessKeyStore.beside(tokens), tokens)

    @api.get("/api/v1/jobs/{job_id}/pods/{pod_id}/logs")
    async def get_pod_logs(
        job_id: str, pod_id: str, request: Request, identity: Identity = Depends(signed),
        max_lines: int | None = Query(None, alias="MaxLines", ge=1),
        pod_uid: str | None = Query(None, alias="PodUid"),
    ) -> dict:
        job = await store.get_job(job_id)
        if job is None or job.spec is None or not identity.can_see(job.user):
            raise AliyunError(404, "JobNotFound", f"job {job_id} has no pods")
        task = dlc.parse_pod_id(job_id, pod_id)
        attempt = job.attempt
        if pod_uid and pod_uid.startswith(f"{pod_id}-") and pod_uid.rpartition("-")[2].isdigit():
            attempt = int(pod_uid.rpartition("-")[2])
        found = await store.get_task(task_id(job_id, attempt, *task)) if task else None
        if found is None:
            raise AliyunError(404, "PodNotFound", f"job {job_id} has no pod {pod_id}")
        lines: list[str] = []
        for stream in ("stdout", "stderr"):
            text = read_from(Path(found.dir) / f"{stream}.log", 0).decode("utf-8", "replace")
            lines += text.splitlines()
        if max_lines:
            lines = lines[-max_lines:]
        return {"JobId": job_id, "PodId": pod_id, "PodUid": f"{pod_id}-{attempt}",
                "Logs": lines, "RequestId": request_id(request)}

    return api


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
            pip_args=tuple(shlex.split(os.environ.get("YARD_PIP_ARGS", ""))),
            minute_s=float(os.environ.get("YARD_LAUNCHER_MINUTE_S") or 60.0),
            retry_backoff_s=float(os.environ.get("YARD_RETRY_BACKOFF_S") or BACKOFF_BASE_S),
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
