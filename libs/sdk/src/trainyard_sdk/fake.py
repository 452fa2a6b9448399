"""An in-memory stand-in for the gateway's HTTP API, for testing code that uses the
client without a running platform::

    gw = FakeGateway(tokens={"t0k": ("admin", True)})
    client = Client("http://fake", "t0k", transport=gw.transport)

It speaks the same routes, status codes and ``{"detail": ...}`` errors as the real
API, keeps every request in ``gw.requests``, and can script a job's progress (each
``GET /v1/jobs/{id}`` moves it one step along :meth:`FakeGateway.script`).
It implements no scheduling: what it answers is what the test put in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

JOB_PATH = re.compile(
    r"^/v1/jobs/(?P<id>[^/]+)(?P<rest>/events|/logs|/stop|/pause|/resume|/restart)?$"
)
SCALE_PATH = re.compile(r"^/v1/placement/jobs/(?P<id>[^/]+)/scale$")


def _now() -> str:
    return datetime.now(UTC).isoformat()


class FakeGateway:
    def __init__(self, tokens: Mapping[str, tuple[str, bool]] | None = None) -> None:
        self.tokens: dict[str, tuple[str, bool]] = dict(tokens or {})
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.events_page = 1000  # a history page's events (the service's default)
        self.logs: dict[tuple[str, str, int, str], list[str]] = {}
        self.payloads: dict[str, dict[str, Any]] = {}
        self.requests: list[httpx.Request] = []
        self.stops: list[str] = []
        # (job id, "pause" | "resume" | "restart" | "scale role N"), in the order asked.
        self.controls: list[tuple[str, str]] = []
        self._scripts: dict[str, list[dict[str, Any]]] = {}
        self._next = 0
        self.transport = httpx.MockTransport(self._handle)

    # -- test set-up --------------------------------------------------------

    def add_job(self, **fields: Any) -> dict[str, Any]:
        """Stores a job document (the shape of ``GET /v1/jobs/{id}``), filling gaps."""
        self._next += 1
        job: dict[str, Any] = {
            "id": f"job-{self._next:04d}",
            "name": f"job{self._next}",
            "user": "admin",
            "state": "SUBMITTED",
            "reason": None,
            "dialect": "native",
            "submitted_at": _now(),
            "updated_at": _now(),
            "finished_at": None,
            "exit_code": None,
            "errors": [],
            "warnings": [],
            "queue_reasons": [],
            "attempt": 1,
            "spec": {},
            "tasks": [],
        }
        job.update(fields)
        self.jobs[job["id"]] = job
        return job

    def script(self, job_id: str, steps: Iterable[Mapping[str, Any]]) -> None:
        """Each later ``GET`` of the job applies the next step's fields to it."""
        self._scripts[job_id] = [dict(step) for step in steps]

    def set_logs(
        self,
        job_id: str,
        chunks: list[str],
        role: str = "main",
        index: int = 0,
        stream: str = "stdout",
    ) -> None:
        self.logs[(job_id, role, index, stream)] = chunks

    # -- the API --------------------------------------------------------------

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        caller = self._caller(request)
        if caller is None:
            return _error(401, "missing or unknown bearer token")
        user, admin = caller
        path, method = request.url.path, request.method

        if path == "/v1/tokens" and method == "POST":
            if not admin:
                return _error(403, "issuing tokens needs an admin token")
            body = _json(request)
            if not isinstance(body, dict) or not body.get("user"):
                return _error(400, 'body must be {"user": ..., "admin": bool}')
            token = f"tok-{body['user']}-{len(self.tokens)}"
            self.tokens[token] = (body["user"], bool(body.get("admin")))
            return httpx.Response(200, json={"user": body["user"], "token": token})

        if path == "/v1/jobs" and method == "POST":
            return self._submit(request, user)
        if path == "/v1/jobs" and method == "GET":
            return self._list(request, user, admin)
        if path == "/v1/placement/queue" and method == "GET":
            waiting = [j for j in self.jobs.values() if j["state"] == "QUEUED"]
            rows = [
                {"job_id": j["id"], "name": j.get("name"), "user": j["user"],
                 "queue": j.get("queue", "default"), "priority": j.get("priority", 5),
                 "position": n, "reasons": j.get("queue_reasons", [])}
                for n, j in enumerate(waiting, 1)
                if admin or j["user"] == user
            ]  # fmt: skip
            return httpx.Response(200, json={"jobs": rows})

        if (scale := SCALE_PATH.match(path)) and method == "POST":
            return self._scale(request, scale["id"], user, admin)
        match = JOB_PATH.match(path)
        if not match:
            return _error(404, "Not Found")
        job = self.jobs.get(match["id"])
        if job is None or not (admin or job["user"] == user):
            return _error(404, f"job {match['id']} not found")
        rest = match["rest"]
        if rest is None and method == "GET":
            steps = self._scripts.get(job["id"])
            if steps:
                job.update(steps.pop(0))
            return httpx.Response(200, json=job)
        if rest == "/events" and method == "GET":
            # A page at a time, as the status service answers.
            after = int(request.url.params.get("after_seq", 0))
            items = [e for e in self.events.get(job["id"], []) if e.get("seq", 0) > after]
            page = items[: self.events_page]
            more = page[-1]["seq"] if len(items) > len(page) else None
            return httpx.Response(200, json={"items": page, "next_after_seq": more})
        if rest == "/stop" and method == "POST":
            self.stops.append(job["id"])
            return httpx.Response(202, json={"id": job["id"], "stop": "requested"})
        if rest in ("/pause", "/resume", "/restart") and method == "POST":
            what = rest[1:]
            self.controls.append((job["id"], what))
            return httpx.Response(202, json={"id": job["id"], what: "requested"})
        if rest == "/logs" and method == "GET":
            return self._logs(request, job)
        return _error(405, "Method Not Allowed")

    def _scale(self, request: httpx.Request, job_id: str, user: str, admin: bool) -> httpx.Response:
        """Checked as placement checks it, against the job's ``spec.roles``."""
        job = self.jobs.get(job_id)
        if job is None or not (admin or job["user"] == user):
            return _error(404, f"no job {job_id}")
        body = _json(request)
        role, replicas = body.get("role"), body.get("replicas")
        found = next(
            (r for r in (job.get("spec") or {}).get("roles") or [] if r.get("name") == role), None
        )
        if found is None or found.get("min_replicas") is None:
            return _field_error("role", f"role: role {role!r} is not an elastic role of the job")
        if not found["min_replicas"] <= replicas <= found["max_replicas"]:
            return _field_error(
                "replicas",
                f"replicas: {replicas} is outside role {role!r}'s "
                f"bounds [{found['min_replicas']}, {found['max_replicas']}]",
            )
        self.controls.append((job_id, f"scale {role} {replicas}"))
        return httpx.Response(
            202, json={"id": job_id, "role": role, "replicas": replicas, "scale": "requested"}
        )

    def _caller(self, request: httpx.Request) -> tuple[str, bool] | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.tokens.get(token)

    def _submit(self, request: httpx.Request, user: str) -> httpx.Response:
        body = _json(request)
        if not isinstance(body, dict) or not body:
            return _error(400, "the body is not a job: expected a JSON object")
        dialect = request.url.params.get("dialect")
        if dialect is None:
            dialect = "openpai" if "taskRoles" in body or "protocolVersion" in body else "native"
        if dialect not in ("openpai", "native"):
            return _error(400, f"unknown dialect {dialect!r}")
        job = self.add_job(name=body.get("name") or body.get("jobName"), user=user, dialect=dialect)
        self.payloads[job["id"]] = body
        return httpx.Response(
            202, json={"id": job["id"], "state": "SUBMITTED", "dialect": dialect, "warnings": []}
        )

    def _list(self, request: httpx.Request, user: str, admin: bool) -> httpx.Response:
        params = request.url.params
        limit, offset = int(params.get("limit", 20)), int(params.get("offset", 0))
        jobs = [
            j
            for j in reversed(self.jobs.values())
            if (admin or j["user"] == user)
            and params.get("state") in (None, j["state"])
            and params.get("user") in (None, j["user"])
            and str(j["id"]).startswith(params.get("id_prefix", ""))
            and str(j.get("name") or "").startswith(params.get("name", ""))
        ]
        keys = ("id", "name", "user", "state", "dialect", "submitted_at", "updated_at", "reason")
        items = [{k: j.get(k) for k in keys} for j in jobs[offset : offset + limit]]
        return httpx.Response(
            200, json={"items": items, "total": len(jobs), "limit": limit, "offset": offset}
        )

    def _logs(self, request: httpx.Request, job: dict[str, Any]) -> httpx.Response:
        params = request.url.params
        tasks = job.get("tasks") or []
        role = params.get("role") or (tasks[0]["role"] if tasks else "main")
        index = int(params.get("index", 0))
        chunks = self.logs.get((job["id"], role, index, params.get("stream", "stdout")))
        if chunks is None:
            return _error(404, f"no log for task {role}[{index}] of job {job['id']}")
        if params.get("follow") == "true":
            # A generator body: the client sees the chunks one by one, as a stream.
            return httpx.Response(
                200,
                headers={"content-type": "text/plain; charset=utf-8"},
                content=(c.encode() for c in chunks),
            )
        return httpx.Response(200, text="".join(chunks))


def _json(request: httpx.Request) -> Any:
    try:
        return json.loads(request.content or b"null")
    except ValueError:
        return None


def _error(status: int, detail: Any) -> httpx.Response:
    return httpx.Response(status, json={"detail": detail})


def _field_error(path: str, message: str) -> httpx.Response:
    return _error(400, {"message": message, "errors": [{"path": path, "message": message}]})
