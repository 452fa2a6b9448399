"""The launcher's HTTP app: task logs (its own API and PAI-DLC's GetPodLogs) and ``exec``
in a running task."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any, BinaryIO, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from trainyard_common.auth import (
    AccessKeyStore,
    AliyunError,
    AliyunRoute,
    Identity,
    StillValid,
    TokenStore,
    aliyun_identity_dependency,
    bearer,
    identity_dependency,
    request_id,
)
from trainyard_common.dialects import dlc, k8s_api
from trainyard_common.limits import MAX_INDEX, MAX_OFFSET, digits
from trainyard_common.runtime import health_app

from .adapters.backend import Stream, TaskBackend, TaskHandle, TaskRef, Usage
from .adapters.store import LauncherStore, task_id
from .handlers import Deps
from .logs import tail, tail_text
from .taskexec import ExecRefused, exec_in_task

EXEC_TIMEOUT_S = 60.0
EXEC_MAX_TIMEOUT_S = 600.0

log = logging.getLogger("trainyard.launcher")


async def open_logs(backend: TaskBackend, ref: TaskRef, files: ExitStack) -> list[list[BinaryIO]]:
    """The task's stdout and stderr, each its parts open for reading (closed with
    ``files``): what a tail reads the end of (logs.tail, logs.tail_text)."""
    streams: tuple[Stream, ...] = ("stdout", "stderr")
    return [[files.enter_context(f) for f in await backend.open_log(ref, s)] for s in streams]


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
        request: Request,
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

        valid = StillValid(tokens, bearer(request))

        async def ended() -> bool:
            # Or the caller's token was revoked: followed as long as the task ran.
            now = await store.get_task(key)
            return now is None or now.state.terminal or not await valid()

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
    app.include_router(kube_pod_logs(store, tokens, backend, current_identity))
    return app


def kube_pod_logs(
    store: LauncherStore, tokens: TokenStore, backend: TaskBackend, current: Any
) -> APIRouter:
    """A Kubernetes pod's log (``kubectl logs``, the Kubernetes and Kubeflow SDKs'
    ``read_namespaced_pod_log``): the task the pod name stands for
    (``<job>-<replica type>-<index>``, ``k8s_api.pod_name``), of the user's newest job of
    that name in the namespace; its stdout then its stderr, as the container's one log."""
    api = APIRouter()

    def missing(name: str) -> JSONResponse:
        return JSONResponse(
            status_code=404,
            content=k8s_api.status_object(
                404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}
            ),
        )

    @api.get("/api/v1/namespaces/{namespace}/pods/{name}/log", response_model=None)
    async def pod_log(
        request: Request,
        namespace: str,
        name: str,
        follow: bool = False,
        tail_lines: int | None = Query(None, alias="tailLines", ge=0, le=MAX_OFFSET),
        identity: Identity = Depends(current),
    ) -> Response:
        parsed = k8s_api.parse_pod_name(name)
        if parsed is None:
            return missing(name)
        job_name, rtype, index = parsed
        job = await store.job_named(identity.user, namespace, job_name)
        if job is None or job.spec is None:
            return missing(name)
        role = next((r.name for r in job.spec.roles if r.name.lower() == rtype), None)
        task = await store.get_task(task_id(job.job_id, job.attempt, role, index)) if role else None
        if task is None or role is None:
            return missing(name)
        ref = TaskRef(job.job_id, job.attempt, role, index)
        if not follow and tail_lines is not None:
            with ExitStack() as files:
                stdout, stderr = await open_logs(backend, ref, files)
                return Response(tail(stdout + stderr, tail_lines), media_type="text/plain")
        if not follow:
            data = b"".join(
                [(await backend.read_log(ref, s, 0)).data for s in ("stdout", "stderr")]
            )
            return Response(data, media_type="text/plain")
        key = task.id
        valid = StillValid(tokens, bearer(request))

        async def ended() -> bool:
            now = await store.get_task(key)
            return now is None or now.state.terminal or not await valid()

        async def both() -> AsyncIterator[bytes]:
            async for chunk in backend.follow_log(ref, "stdout", 0, ended):
                yield chunk
            if await valid():  # not for a follower whose token was revoked meanwhile
                yield (await backend.read_log(ref, "stderr", 0)).data

        return StreamingResponse(both(), media_type="text/plain")

    return api


# GetJobMetrics' MetricType -> the figure of a task's usage.
JOB_METRICS: dict[str, Callable[[Usage], float]] = {
    "CpuCoreUsage": lambda used: round(used.cpu_cores, 3),
    "MemoryUsage": lambda used: float(used.memory_bytes),
}


def dlc_pod_logs(store: LauncherStore, tokens: TokenStore, backend: TaskBackend) -> APIRouter:
    """PAI-DLC's GetPodLogs at the SDK's path: a pod is one task (its PodId is
    ``dialects.dlc.pod_id``, the one GetJob shows), its log the task's stdout then
    stderr, as lines."""
    api = APIRouter(route_class=AliyunRoute)
    signed = aliyun_identity_dependency(AccessKeyStore.beside(tokens), tokens)

    @api.get("/api/v1/jobs/{job_id}/metrics")
    async def get_job_metrics(
        job_id: str,
        request: Request,
        identity: Identity = Depends(signed),
        metric_type: str = Query(alias="MetricType"),
    ) -> dict:
        """GetJobMetrics: each running pod's CPU (cores in use, sampled over 0.2 s) or
        memory (resident bytes) now, one point per pod. The other metrics (GPU, network,
        disk) are not collected here, and no history is kept: said as such."""
        if metric_type not in JOB_METRICS:
            raise AliyunError(
                400,
                "InvalidParameter",
                f"MetricType {metric_type!r} is not collected here; "
                f"these are: {', '.join(sorted(JOB_METRICS))}",
            )
        job = await store.get_job(job_id)
        if job is None or job.spec is None or not identity.can_see(job.user):
            raise AliyunError(404, "JobNotFound", f"job {job_id} does not exist")
        now = int(datetime.now(UTC).timestamp() * 1000)
        pods = []
        for task in await store.tasks_of(job_id, job.attempt):
            handle = TaskHandle(pid=task.pid, start_ticks=task.start_ticks, uid=task.uid)
            used = (
                None
                if task.state.terminal
                else await backend.usage(
                    TaskRef(job_id, job.attempt, task.role, task.index), handle
                )
            )
            value = None if used is None else JOB_METRICS[metric_type](used)
            pods.append({
                "PodId": dlc.pod_id(job_id, task.role, task.index),
                "Metrics": [] if value is None else [{"Time": now, "Value": value}],
            })  # fmt: skip
        return {"JobId": job_id, "PodMetrics": pods, "RequestId": request_id(request)}

    @api.get("/api/v1/jobs/{job_id}/pods/{pod_id}/logs")
    async def get_pod_logs(
        job_id: str,
        pod_id: str,
        request: Request,
        identity: Identity = Depends(signed),
        # The SDK's GetPodLogsRequest: "Default value: 2000".
        max_lines: int = Query(2000, alias="MaxLines", ge=1, le=MAX_OFFSET),
        pod_uid: str | None = Query(None, alias="PodUid"),
    ) -> dict:
        job = await store.get_job(job_id)
        if job is None or job.spec is None or not identity.can_see(job.user):
            raise AliyunError(404, "JobNotFound", f"job {job_id} has no pods")
        task = dlc.parse_pod_id(job_id, pod_id)
        attempt = job.attempt
        if pod_uid and pod_uid.startswith(f"{pod_id}-") and digits(pod_uid.rpartition("-")[2]):
            attempt = int(pod_uid.rpartition("-")[2])
        found = await store.get_task(task_id(job_id, attempt, *task)) if task else None
        if found is None or task is None:
            raise AliyunError(404, "PodNotFound", f"job {job_id} has no pod {pod_id}")
        ref = TaskRef(job_id, attempt, *task)
        with ExitStack() as files:
            lines = tail_text(await open_logs(backend, ref, files), max_lines)
        return {
            "JobId": job_id,
            "PodId": pod_id,
            "PodUid": f"{pod_id}-{attempt}",
            "Logs": lines,
            "RequestId": request_id(request),
        }

    return api
