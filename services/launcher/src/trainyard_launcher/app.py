"""Bootstrap: settings, clients, adoption of running tasks, the consumer, the watcher,
and the HTTP app with the task-log API and ``exec`` in a running task."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from pymongo.asynchronous.database import AsyncDatabase

from trainyard_common.aliyun_auth import NONCE_TTL_S
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
from trainyard_common.bus import Bus, Delivery, KvNonces
from trainyard_common.config import Settings
from trainyard_common.dialects import dlc
from trainyard_common.events import Event
from trainyard_common.limits import MAX_INDEX, MAX_OFFSET
from trainyard_common.runtime import health_app, serve, setup_logging
from trainyard_common.secrets_box import SecretBox
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import subjects_for

from .adapters.backend import Stream, TaskBackend, TaskRef
from .adapters.kubernetes import KubernetesBackend, KubeSettings
from .adapters.limits import find_mechanisms
from .adapters.local import IsolationError, LocalBackend
from .adapters.store import LauncherStore, MongoLauncherStore, task_id
from .adapters.uids import MongoTaskUids
from .handlers import EVENT_HANDLERS, Deps, adopt, dispatch, watch_tasks
from .settings import LauncherSettings
from .taskexec import ExecRefused, exec_in_task

DURABLE = "launcher"
SUBJECTS = subjects_for(EVENT_HANDLERS)


EXEC_TIMEOUT_S = 60.0
EXEC_MAX_TIMEOUT_S = 600.0

log = logging.getLogger("trainyard.launcher")


class ExecRequest(BaseModel):
    command: list[str] | str = Field(description="argv, or a string run by bash")
    timeout_s: float = Field(EXEC_TIMEOUT_S, gt=0, le=EXEC_MAX_TIMEOUT_S)


def create_app(
    store: LauncherStore, tokens: TokenStore, backend: TaskBackend, deps: Deps | None = None
) -> FastAPI:
    app = health_app("launcher")
    current_identity = identity_dependency(tokens)

    @app.get("/v1/jobs/{job_id}/logs", response_class=Response)
    async def task_logs(
        job_id: str,
        role: str | None = None,
        index: int | None = Query(None, ge=0, le=MAX_INDEX),
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = Query(None, ge=1, le=MAX_INDEX),
        follow_: bool = Query(False, alias="follow"),
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
        identity: Identity = Depends(current_identity),
    ) -> Response:
        job = await store.get_job(job_id)
        if job is None or job.spec is None or not identity.can_see(job.user):
            # One answer for a job that is not here and one the caller may not see:
            # which ids are taken is not to be probed.
            raise HTTPException(404, f"no job {job_id} with tasks here (not placed yet?)")
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
        ref = TaskRef(job_id, attempt, role, index)
        if not follow_:
            chunk = await backend.read_log(ref, stream, offset)
            return Response(
                chunk.data,
                media_type="text/plain; charset=utf-8",
                headers={"X-Log-Offset": str(chunk.next_offset)},
            )

        async def ended() -> bool:
            now = await store.get_task(key)
            return now is None or now.state.terminal

        return StreamingResponse(
            backend.follow_log(ref, stream, offset, ended),
            media_type="text/plain; charset=utf-8",
        )

    if deps is not None:

        @app.get("/v1/admin/tasks")
        async def running_tasks(identity: Identity = Depends(current_identity)) -> dict:
            """The tasks this launcher watches (for the platform's shutdown)."""
            if not identity.admin:
                raise HTTPException(403, "only an admin can list every task")
            return {"running": len(deps.watching), "tasks": sorted(deps.watching)}

        @app.post("/v1/jobs/{job_id}/tasks/{role}/{index}/exec")
        async def exec_task(
            job_id: str,
            role: str,
            index: int,
            body: ExecRequest,
            identity: Identity = Depends(current_identity),
        ) -> dict:
            """Run a command in a running task (its environment, working directory and
            mount namespace): ``{exit_code, stdout, stderr, timed_out}``."""
            try:
                result = await exec_in_task(
                    deps, identity, job_id, role, index, body.command, body.timeout_s
                )
            except ExecRefused as exc:
                raise HTTPException(exc.status, exc.detail) from None
            return {
                "exit_code": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "timed_out": result.timed_out,
            }

    app.include_router(dlc_pod_logs(store, tokens, backend))
    return app


def dlc_pod_logs(store: LauncherStore, tokens: TokenStore, backend: TaskBackend) -> APIRouter:
    """PAI-DLC's GetPodLogs at the SDK's path: a pod is one task (its PodId is
    ``dialects.dlc.pod_id``, the one GetJob shows), its log the task's stdout then
    stderr, as lines."""
    api = APIRouter(route_class=AliyunRoute)
    signed = aliyun_identity_dependency(AccessKeyStore.beside(tokens), tokens)

    @api.get("/api/v1/jobs/{job_id}/pods/{pod_id}/logs")
    async def get_pod_logs(
        job_id: str,
        pod_id: str,
        request: Request,
        identity: Identity = Depends(signed),
        max_lines: int | None = Query(None, alias="MaxLines", ge=1, le=MAX_OFFSET),
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
        if found is None or task is None:
            raise AliyunError(404, "PodNotFound", f"job {job_id} has no pod {pod_id}")
        lines: list[str] = []
        ref = TaskRef(job_id, attempt, *task)
        streams: tuple[Stream, ...] = ("stdout", "stderr")
        for stream in streams:
            chunk = await backend.read_log(ref, stream, 0)
            lines += chunk.data.decode("utf-8", "replace").splitlines()
        if max_lines:
            lines = lines[-max_lines:]
        return {
            "JobId": job_id,
            "PodId": pod_id,
            "PodUid": f"{pod_id}-{attempt}",
            "Logs": lines,
            "RequestId": request_id(request),
        }

    return api


def make_backend(settings: Settings, launcher: LauncherSettings, db: AsyncDatabase) -> TaskBackend:
    """The backend YARD_LAUNCHER names: ``local`` (the default) or ``kubernetes``."""
    if launcher.backend == "kubernetes":
        kube = KubeSettings.from_env()
        log.info("tasks run as pods on Kubernetes, in namespace %s", kube.namespace)
        return KubernetesBackend(kube)
    mechanisms = find_mechanisms(launcher.cgroup_root)
    log.info(
        "task limits on this machine: cgroup v2 %s; /dev/shm per task %s",
        f"at {mechanisms.cgroup} ({', '.join(sorted(mechanisms.controllers))})"
        if mechanisms.cgroup
        else f"not used ({mechanisms.why_no_cgroup}); "
        "memory as RLIMIT_DATA per process, cpu and pids not enforced",
        "yes" if mechanisms.shm_namespace else f"no ({mechanisms.why_no_shm})",
    )
    return LocalBackend(
        settings.data_dir / "launcher",
        log_max_bytes=launcher.log_max_bytes,
        mechanisms=mechanisms,
        pip_args=launcher.pip_args,
        uids=task_uids(launcher, db),
    )


def task_uids(launcher: LauncherSettings, db: AsyncDatabase) -> MongoTaskUids | None:
    """Where each user's tasks run as (YARD_TASK_ISOLATION: ``auto``, the default, when
    the launcher is root; ``on``: refuse to start without; ``off``: tasks run as the
    launcher, for a single-user machine only)."""
    mode = launcher.task_isolation
    root = os.geteuid() == 0
    if mode == "on" and not root:
        raise IsolationError(
            "YARD_TASK_ISOLATION=on: tasks run under their users' own uids, which needs "
            "the launcher to run as root"
        )
    if mode == "off" or not root:
        log.warning(
            "tasks are NOT isolated: they run as the launcher's own user and can read what "
            "it can (%s)",
            "YARD_TASK_ISOLATION=off" if mode == "off" else "the launcher is not root",
        )
        return None
    return MongoTaskUids(db, base=launcher.task_uid_base)


async def main() -> None:
    settings = Settings.from_env("launcher")
    launcher = LauncherSettings.from_env()
    setup_logging("launcher")
    bus = await Bus.connect(settings.nats_url, name="launcher")
    client = mongo_client(settings.mongo_url)
    try:
        store = MongoLauncherStore(client[settings.db_name()])
        await store.ensure_indexes()
        backend = make_backend(settings, launcher, client[settings.db_name()])
        await backend.start()
        deps = Deps(
            store=store,
            backend=backend,
            publish=bus.publish,
            box=SecretBox.from_env(),
            default_fs_uri=launcher.default_fs_uri,
            kill_grace_s=launcher.kill_grace_s,
            minute_s=launcher.minute_s,
            retry_backoff_s=launcher.retry_backoff_s,
            start_deadline_s=launcher.start_deadline_s,
        )
        # Before consuming: a redelivered JobPlaced must find adopted tasks as they are.
        await adopt(deps)
        tokens = TokenStore(
            tokens_collection(client, settings.db_prefix),
            settings.admin_token,
            # PAI-DLC signatures' nonces, shared by every API and replica that checks them.
            await KvNonces.open(bus, NONCE_TTL_S),
        )

        async def handle(event: Event, delivery: Delivery) -> None:
            await dispatch(deps, event, delivery)

        async def consumer(stop: asyncio.Event) -> None:
            await bus.consume(DURABLE, SUBJECTS, handle, stop=stop)

        async def watcher(stop: asyncio.Event) -> None:
            await watch_tasks(deps, stop)

        await serve(settings, create_app(store, tokens, backend, deps), [consumer, watcher])
        await backend.close()
    finally:
        await bus.close()
        await client.close()
