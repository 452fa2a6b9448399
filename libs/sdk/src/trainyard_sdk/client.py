"""A small synchronous client for the Trainyard HTTP API (the gateway).

Sync on purpose: its users are the ``yard`` CLI and scripts, where one request at a
time is the natural shape. Every failure surfaces as a :class:`TrainyardError`, so a
caller needs one ``except`` to report it.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from trainyard_common.config import admin_token_path, default_data_dir

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_POLL_S = 0.5

Job = dict[str, Any]
Items = list[dict[str, Any]]


class TrainyardError(Exception):
    """Anything that went wrong talking to the platform."""


class ApiError(TrainyardError):
    """The server answered with an error status."""

    def __init__(self, status: int, detail: str, hint: str | None = None) -> None:
        self.status = status
        self.detail = detail
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.detail} (HTTP {self.status})"
        return f"{text}\nhint: {self.hint}" if self.hint else text


class JobRefError(TrainyardError):
    """A job named by a short id or a name that is no job's, or several jobs'."""


class UnreachableError(TrainyardError):
    """No answer at all: nothing listens at the URL, DNS failed, or it timed out."""

    def __init__(self, url: str, cause: Exception) -> None:
        self.url = url
        self.cause = cause
        what = f"{type(cause).__name__}: {cause or 'no detail'}"
        if isinstance(cause, httpx.TimeoutException):
            # It listens but is slow or stuck: `make up` would be the wrong advice.
            super().__init__(f"Trainyard at {url} did not answer in time ({what})")
            return
        super().__init__(
            f"cannot reach Trainyard at {url} ({what}).\n"
            "hint: is the platform running? Start it with `make up`, "
            "or point YARD_URL at a running gateway."
        )


class WaitTimeout(TrainyardError):
    def __init__(self, job: Job, timeout: float) -> None:
        self.job = job
        super().__init__(f"job {job.get('id')} still {job.get('state')} after {timeout:g}s")


# Job ids are 32 hex digits (uuid4().hex): one is used as it is, without a lookup.
FULL_ID = re.compile(r"[0-9a-f]{32}")


def is_terminal(state: str | None) -> bool:
    # Imported here: the shared models pull in pydantic, which a CLI call that never
    # waits should not pay for at start-up.
    from trainyard_common.events import TERMINAL_JOB_STATES

    return state in TERMINAL_JOB_STATES


def _has_started(state: str | None) -> bool:
    return state == "RUNNING" or is_terminal(state)


def discover_token() -> tuple[str | None, str]:
    """The token to use and where it came from (for error hints): ``YARD_TOKEN``
    first, then the bootstrap admin token the platform writes into its data dir."""
    env = os.environ.get("YARD_TOKEN")
    if env:
        return env.strip(), "YARD_TOKEN"
    path = admin_token_path(default_data_dir())
    try:
        token = path.read_text().strip()
    except OSError:
        return None, f"none (YARD_TOKEN unset and {path} unreadable)"
    return (token or None), str(path)


def format_detail(body: Any) -> str:
    """Turns a FastAPI-style ``detail`` (a string, a list of validation errors, or a
    dict with field errors) into one readable text."""
    if isinstance(body, str):
        return body
    if isinstance(body, list):
        return "; ".join(_format_issue(item) for item in body) or "error"
    if isinstance(body, dict):
        if isinstance(body.get("errors"), list):
            head = body.get("message") or body.get("detail") or "invalid job"
            issues = "\n".join(f"  - {_format_issue(e)}" for e in body["errors"])
            return f"{head}\n{issues}" if issues else str(head)
        if "message" in body:
            return str(body["message"])
    return json.dumps(body)


def _format_issue(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = item.get("path")
    if where is None and isinstance(item.get("loc"), list | tuple):
        where = ".".join(str(p) for p in item["loc"])
    message = item.get("message") or item.get("msg") or json.dumps(item)
    return f"{where}: {message}" if where else str(message)


class Client:
    """One gateway, one identity. Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        transport: httpx.BaseTransport | None = None,
        poll_interval: float = DEFAULT_POLL_S,
        visibility_grace_s: float = 10.0,
    ) -> None:
        self.base_url = (base_url or os.environ.get("YARD_URL") or DEFAULT_URL).rstrip("/")
        if token:
            self._token_source = "the token given"
        else:
            token, self._token_source = discover_token()
        self.token = token
        self.poll_interval = poll_interval
        self.visibility_grace_s = visibility_grace_s
        headers = {"User-Agent": "trainyard-sdk/0.1", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- jobs -----------------------------------------------------------------

    def submit(self, payload: Mapping[str, Any] | Any, dialect: str | None = None) -> Job:
        """Submits a job (OpenPAI v1 JSON, a native JobSpec dict, or a JobSpec model);
        returns ``{"id", "state", "dialect", "warnings"}``."""
        if hasattr(payload, "model_dump"):
            payload = payload.model_dump(mode="json", exclude_none=True)
        params = {"dialect": dialect} if dialect else None
        return self._request("POST", "/v1/jobs", json=dict(payload), params=params)

    def validate(self, payload: Mapping[str, Any] | Any, dialect: str | None = None) -> Job:
        """A dry run: ``{"valid", "dialect", "spec", "errors", "warnings"}``, nothing submitted."""
        if hasattr(payload, "model_dump"):
            payload = payload.model_dump(mode="json", exclude_none=True)
        params = {"dialect": dialect} if dialect else None
        return self._request("POST", "/v1/jobs:validate", json=dict(payload), params=params)

    def get(self, job_id: str) -> Job:
        return self._request("GET", f"/v1/jobs/{_seg(job_id)}", check=_job)

    def list(
        self,
        state: str | None = None,
        user: str | None = None,
        limit: int = 20,
        offset: int = 0,
        **filters: Any,
    ) -> dict[str, Any]:
        """A page of job summaries, newest first: ``{"items", "total", "limit", "offset"}``;
        ``filters``: the list's other ones (``name`` prefix, ``id_prefix``, ``queue``,
        ``dialect``, ``kind``, ...)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if state:
            params["state"] = state
        if user:
            params["user"] = user
        params.update({k: v for k, v in filters.items() if v})
        return self._request("GET", "/v1/jobs", params=params, check=_each("items", _job))

    def resolve(self, ref: str) -> str:
        """The job ``ref`` names: a full id as it is, else the one job whose id starts
        with it (a short id, as tables show), else the one job of that exact name."""
        if FULL_ID.fullmatch(ref):
            return ref
        by_id = self.list(limit=2, id_prefix=ref)["items"]
        if len(by_id) == 1:
            return str(by_id[0]["id"])
        if by_id:
            raise JobRefError(f"{ref!r} starts more than one job's id: give more of it")
        named = [j for j in self.list(limit=50, name=ref)["items"] if j.get("name") == ref]
        if len(named) == 1:
            return str(named[0]["id"])
        if named:
            which = ", ".join(f"{j['id'][:8]} ({j.get('user')})" for j in named)
            raise JobRefError(f"several jobs are named {ref!r}: {which}; give an id")
        raise JobRefError(f"no job whose id starts with, or whose name is, {ref!r}")

    def watch(self, job_id: str | None = None) -> Iterator[dict[str, Any]]:
        """Each change of a job's summary as it happens (server-sent events of ``GET
        /v1/watch/jobs``; only ``job_id``'s, or every job the caller may see), until the
        caller stops iterating. ``{"connected": True}`` comes first, once the server
        follows changes for the caller (read the state then: nothing after it is
        missed); ``{"reset": True}`` means changes were missed: read again."""
        params = {"job_id": job_id} if job_id else None
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        try:
            with self._http.stream(
                "GET", "/v1/watch/jobs", params=params, timeout=timeout,
                headers={"Accept": "text/event-stream"},
            ) as answer:  # fmt: skip
                if answer.status_code >= 400:
                    answer.read()
                    raise self._api_error(answer)
                kind, data = "message", []
                for line in answer.iter_lines():
                    if line == ": connected":
                        yield {"connected": True}
                    elif line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line:
                        if kind == "reset":
                            yield {"reset": True}
                        elif data and kind == "job":
                            yield self._change(answer, "\n".join(data))
                        kind, data = "message", []
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url, exc) from exc

    def rebuild(self, apply: bool = False) -> dict[str, Any]:
        """Rebuild the job views from the stream and compare (``apply``: repair)."""
        params = {"apply": "true"} if apply else None
        return self._request("POST", "/v1/admin/rebuild", params=params, timeout=600)

    def queue(self) -> Items:
        """The waiting jobs in placement order, each with its position and reasons."""
        return self._request("GET", "/v1/placement/queue", check=_each("jobs"))["jobs"]

    def events(self, job_id: str) -> Items:
        """The job's whole history, oldest first: the service answers it a page at a
        time (``next_after_seq``), read here to the end."""
        path = f"/v1/jobs/{_seg(job_id)}/events"
        items: Items = []
        after = 0
        while True:
            params = {"after_seq": after} if after else None
            page = self._request("GET", path, params=params, check=_each("items"))
            items += page["items"]
            more = page.get("next_after_seq")
            if not isinstance(more, int) or more <= after:
                return items
            after = more

    def stop(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{_seg(job_id)}/stop")

    def pause(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """Gives the job's capacity back and keeps the rest; it waits PAUSED for
        :meth:`resume` (a running attempt ends; no retry is spent)."""
        body = {"reason": reason} if reason else None
        return self._request("POST", f"/v1/jobs/{_seg(job_id)}/pause", json=body)

    def resume(self, job_id: str) -> dict[str, Any]:
        """Queues a paused job again, as its next attempt."""
        return self._request("POST", f"/v1/jobs/{_seg(job_id)}/resume")

    def restart(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """Runs the job again from the start as its next attempt, spending no retry: a
        running attempt ends first; a paused job is resumed; a queued one stays queued."""
        body = {"reason": reason} if reason else None
        return self._request("POST", f"/v1/jobs/{_seg(job_id)}/restart", json=body)

    def scale(self, job_id: str, role: str, replicas: int) -> dict[str, Any]:
        """Sets an elastic role's replicas (within its min/max); a running job restarts
        at the new size as its next attempt."""
        return self._request(
            "POST",
            f"/v1/placement/jobs/{_seg(job_id)}/scale",
            json={"role": role, "replicas": replicas},
        )

    def logs(
        self,
        job_id: str,
        role: str | None = None,
        index: int | None = None,
        stream: str = "stdout",
        follow: bool = False,
    ) -> Iterator[str]:
        """Yields the task's log text in chunks as it arrives. With ``follow`` the
        server keeps the response open until the task ends."""
        params: dict[str, Any] = {"stream": stream}
        if role is not None:
            params["role"] = role
        if index is not None:
            params["index"] = index
        if follow:
            params["follow"] = "true"
        # A followed log may be silent for a long time; only the connect is bounded.
        timeout = httpx.Timeout(self._http.timeout.connect, read=None) if follow else None
        url = f"/v1/jobs/{_seg(job_id)}/logs"
        kwargs: dict[str, Any] = {"params": params}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            with self._http.stream("GET", url, **kwargs) as response:
                if response.is_error:
                    response.read()
                    raise self._api_error(response)
                yield from response.iter_text()
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url, exc) from exc

    def exec(
        self,
        job_id: str,
        role: str,
        index: int,
        command: builtins.list[str] | str,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Runs ``command`` (argv, or a string for bash) in a running task, with the
        task's environment and working directory: ``{"exit_code", "stdout", "stderr",
        "timed_out"}``. The task must be RUNNING (409 otherwise), e.g. in debug mode."""
        path = f"/v1/jobs/{_seg(job_id)}/tasks/{_seg(role)}/{int(index)}/exec"
        return self._request(
            "POST",
            path,
            json={"command": command, "timeout_s": timeout},
            # The answer comes once the command ended: wait for it a little longer.
            timeout=httpx.Timeout(self._http.timeout.connect, read=timeout + 30),
        )

    def wait(
        self,
        job_id: str,
        until_terminal: bool = True,
        timeout: float | None = None,
        on_change: Callable[[Job], None] | None = None,
    ) -> Job:
        """Polls the job until it ends (or, with ``until_terminal=False``, until it
        runs or ends) and returns it. ``on_change`` sees the job whenever its state or
        any task's state changes. Raises :class:`WaitTimeout` after ``timeout`` s."""
        done = is_terminal if until_terminal else _has_started
        deadline = None if timeout is None else time.monotonic() + timeout
        # The status view follows the bus: right after a 202 it may not know the job yet.
        visible_by = time.monotonic() + self.visibility_grace_s
        seen: tuple[Any, ...] | None = None
        while True:
            try:
                job = self.get(job_id)
            except ApiError as exc:
                if exc.status != 404 or time.monotonic() >= visible_by:
                    raise
                time.sleep(self.poll_interval)
                continue
            snapshot = _progress(job)
            if snapshot != seen:
                seen = snapshot
                if on_change is not None:
                    on_change(job)
            if done(job.get("state")):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job, timeout or 0)
            pause = self.poll_interval
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)

    # -- nodes (admin) --------------------------------------------------------

    def nodes(self) -> Items:
        """Every node placement schedules onto: capacity, allocated, free, state
        (ready or drained), labels and the jobs on it."""
        return self._request("GET", "/v1/placement/nodes", check=_each("nodes"))["nodes"]

    def add_node(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Adds a node (``name``, ``cpu``, ``memory_mb``, ``gpus``, ``gpu_type``,
        ``host_ip``, ``port_range``, ``labels`` as ``[{"name", "value"}]``)."""
        return self._request("POST", "/v1/placement/nodes", json=dict(spec))

    def drain_node(self, name: str) -> dict[str, Any]:
        """No new task goes to the node; what runs there keeps running."""
        return self._request("POST", f"/v1/placement/nodes/{_seg(name, 'node name')}/drain")

    def undrain_node(self, name: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/placement/nodes/{_seg(name, 'node name')}/undrain")

    def remove_node(self, name: str) -> dict[str, Any]:
        """Removes the node; the jobs running on it are interrupted and queued again."""
        return self._request("DELETE", f"/v1/placement/nodes/{_seg(name, 'node name')}")

    # -- tokens ---------------------------------------------------------------

    def create_token(self, user: str, admin: bool = False) -> dict[str, Any]:
        """Issues a bearer token for ``user`` (needs an admin token): ``{"user", "token"}``."""
        return self._request("POST", "/v1/tokens", json={"user": user, "admin": admin})

    def revoke_user(self, user: str) -> dict[str, Any]:
        """Revokes every token and stored AccessKey of ``user`` (needs an admin token):
        ``{"user", "tokens", "access_keys"}``, how many of each."""
        return self._request("DELETE", f"/v1/users/{quote(user, safe='')}/credentials")

    # -- plumbing -------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, check: Callable[[Any], None] | None = None, **kwargs: Any
    ) -> Any:
        """The answer's JSON object; ``check`` raises (TypeError, KeyError, ...) where the
        object is not what the caller reads from it."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise UnreachableError(self.base_url, exc) from exc
        if response.is_error:
            raise self._api_error(response)
        if not response.content:
            body: Any = {}
        else:
            try:
                body = response.json()
            except (ValueError, RecursionError) as exc:
                raise ApiError(
                    response.status_code, f"the server answered something that is not JSON: {exc}"
                ) from exc
        return self._checked(response, body, check)

    def _change(self, response: httpx.Response, data: str) -> Job:
        """A ``job`` event of the watch stream: a job summary."""
        try:
            change = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise self._unexpected(response, f"an event that is not JSON: {exc}") from None
        return self._checked(response, change, _job)

    def _checked(
        self, response: httpx.Response, body: Any, check: Callable[[Any], None] | None
    ) -> Any:
        try:
            if not isinstance(body, dict):
                raise TypeError(f"{_kind(body)}, not an object")
            if check is not None:
                check(body)
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            what = f"no {exc.args[0]!r} in it" if isinstance(exc, KeyError) else str(exc)
            raise self._unexpected(response, what) from None
        return body

    def _unexpected(self, response: httpx.Response, what: str) -> ApiError:
        """A reply that is not what this client reads: the server, or whatever answers
        at its URL, is not the API this client speaks."""
        url = response.request.url.copy_with(query=None)
        return ApiError(response.status_code, f"unexpected reply from {url}: {what}")

    def _api_error(self, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
            detail = format_detail(body.get("detail", body) if isinstance(body, dict) else body)
        except ValueError:
            detail = response.text.strip()[:500] or response.reason_phrase
        return ApiError(response.status_code, detail, self._hint(response.status_code))

    def _hint(self, status: int) -> str | None:
        if status == 401:
            if self.token is None:
                return (
                    f"no token was sent: {self._token_source}. Set YARD_TOKEN, or "
                    "YARD_DATA_DIR to the platform's data directory."
                )
            return f"the token from {self._token_source} was not accepted."
        if status == 403:
            return f"the token from {self._token_source} lacks the rights for this."
        return None


def _seg(value: str, what: str = "job id") -> str:
    """A job id as one path segment: an id pasted with a slash must not walk the API."""
    if not value or "/" in value or value in (".", ".."):
        raise TrainyardError(f"not a {what}: {value!r}")
    return quote(value, safe="")


def _kind(value: Any) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kinds.get(type(value), "a number")


def _job(job: Any, where: str = "the job") -> None:
    """A job or a job summary as the CLI reads one: an object with an id, its state a
    string or null."""
    if not isinstance(job, dict):
        raise TypeError(f"{where} is {_kind(job)}, not an object")
    if not isinstance(job.get("id"), str) or not job["id"]:
        raise TypeError(f"{where} has no job id")
    if not isinstance(job.get("state"), str | None):
        raise TypeError(f"{where}'s state is {_kind(job['state'])}, not a string")


def _each(key: str, check: Callable[[Any, str], None] | None = None) -> Callable[[Any], None]:
    """A check that ``body[key]`` is a list of objects, each passing ``check``."""

    def checked(body: Any) -> None:
        items = body[key]
        if not isinstance(items, list):
            raise TypeError(f"{key} is {_kind(items)}, not a list")
        for n, item in enumerate(items):
            if not isinstance(item, dict):
                raise TypeError(f"{key}[{n}] is {_kind(item)}, not an object")
            if check is not None:
                check(item, f"{key}[{n}]")

    return checked


def _progress(job: Job) -> tuple[Any, ...]:
    tasks = tuple(
        (t.get("role"), t.get("index"), t.get("attempt"), t.get("state"))
        for t in job.get("tasks") or ()
    )
    return (job.get("state"), job.get("attempt"), tasks)


def load_payload(path: Path | str, text: str | None = None) -> dict[str, Any]:
    """Reads a job file as JSON or YAML: by extension where it says, else by content. Its
    YAML is read as the platform reads it (``parse_job_yaml``: OpenPAI's as js-yaml)."""
    from trainyard_common.dialects import parse_job_yaml
    from trainyard_common.parsing import BodyError, parse_json

    name = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise TrainyardError(f"{name}: not UTF-8 text (byte {exc.start})") from exc
        except OSError as exc:
            raise TrainyardError(f"{name}: {exc.strerror or exc}") from exc
    suffix = Path(name).suffix.lower()
    as_json = suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip()[:1] in "{[")
    try:
        # Bounded as the platform reads a job: no nesting that overflows the stack, no
        # NaN, no number past int()'s digits, each refused here with what is wrong.
        data = parse_json(text) if as_json else parse_job_yaml(text)
    except BodyError as exc:
        raise TrainyardError(f"{name}: {exc}") from exc
    if not isinstance(data, dict):
        raise TrainyardError(f"{name}: a job must be a JSON/YAML object, not {type(data).__name__}")
    return data
