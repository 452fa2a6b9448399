"""The Kubernetes backend: every task a Pod bound to the node placement chose.

Per job a headless Service (the tasks' DNS names); per attempt an owner ConfigMap
(with the MPI hostfile) that each of the attempt's pods names as its owner, so deleting
it deletes them; per task a Pod (domain/pods.py builds them). A job of one task (no
MPI, no secrets) has neither Service nor owner: its pod is the whole attempt. One watch of
every namespace with our label selector keeps a cache of our pods (one connection however
many namespaces jobs use), resumed from the last resourceVersion after a disconnect and
relisted when that version is gone (410); a
watch of the Nodes marks the tasks of a node that disappears as lost with it. Anything
the watches see wakes the launcher's watcher (``changes``).

Adoption: ``start`` lists every pod of ours before the launcher adopts, and
``inventory`` hands them over, so a pod the store does not know as running is deleted
and none is created twice (a pod's name is its task's: a second create answers 409).

Logs come from ``pods/log`` (stdout and stderr together, as Kubernetes keeps them),
followed live on request; ``exec`` uses the exec subresource where the cluster allows.
Settings (``YARD_K8S_*``) are the operator's: the namespace, which namespaces jobs may
name and which are kept to some users (a team's namespace, its claims its own), the
pods' service account and security context (never the platform's own), image pull
secrets, the git image, whether node paths may be mounted. docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from trainyard_common.errors import TransientError
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec
from trainyard_common.sources import HOST_PATHS_ENV, read_host_paths

from ..domain.failure import EndKind
from ..domain.frameworks import FrameworkContext, mpi_layout, rendezvous_task, uses_hydra
from ..domain.pods import (
    CONTAINER,
    HOSTFILE_KEY,
    INSTALLATION_LABEL,
    MANAGED_BY,
    MANAGER,
    MPI_DIR,
    PodProblem,
    PodSettings,
    PodState,
    cached_pod,
    command_secret,
    command_secret_name,
    exec_command,
    hides_command,
    is_lone,
    label_value,
    mpi_hostfile,
    needs_owner,
    needs_service,
    never_within_quota,
    owner_manifest,
    owner_name,
    pod_manifest,
    pod_name,
    pod_state,
    pod_task,
    service_manifest,
    service_name,
    task_address,
)
from .backend import (
    AlreadyLaunched,
    AttemptEnd,
    AttemptSpec,
    ExecResult,
    ExecUnavailable,
    Launched,
    LaunchError,
    LaunchRefused,
    LogChunk,
    Progress,
    Stream,
    Tail,
    TaskHandle,
    TaskLaunch,
    TaskRef,
    TaskStatus,
    Usage,
)

log = logging.getLogger("trainyard.launcher.kubernetes")

SELECTOR = f"{MANAGED_BY}={MANAGER}"
WATCH_TIMEOUT_S = 240
# How often a followed log asks whether its follower should stop (ended()).
FOLLOW_CHECK_S = 5.0


@dataclass(frozen=True)
class KubeSettings:
    namespace: str = "trainyard"
    # Namespaces a job may name (T9k, Kubeflow); "*": any. Others run in ``namespace``.
    allowed_namespaces: frozenset[str] = frozenset()
    # Namespaces kept to some users, in the operator's order: only they may run there
    # (and mount its claims), and a listed user's jobs that name none run in the first
    # that lists them. Unlisted namespaces are as ``allowed_namespaces`` says.
    namespace_users: tuple[tuple[str, frozenset[str]], ...] = ()
    kubeconfig: str | None = None
    pods: PodSettings = field(default_factory=PodSettings)
    # Which Trainyard made a pod (its label INSTALLATION_LABEL): several may share a
    # cluster, even a namespace, and none may take another's pods for strays. Default:
    # the installation's own namespace.
    installation: str = "trainyard"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KubeSettings:
        env = dict(os.environ if env is None else env)
        context = env.get("YARD_K8S_SECURITY_CONTEXT")
        namespace = env.get("YARD_K8S_NAMESPACE") or "trainyard"
        return cls(
            namespace=namespace,
            installation=env.get("YARD_K8S_INSTALLATION") or namespace,
            allowed_namespaces=frozenset(
                n.strip() for n in env.get("YARD_K8S_NAMESPACES", "").split(",") if n.strip()
            ),
            namespace_users=namespace_users(env.get("YARD_K8S_NAMESPACE_USERS") or "{}"),
            kubeconfig=env.get("KUBECONFIG") or None,
            pods=PodSettings(
                service_account=env.get("YARD_K8S_SERVICE_ACCOUNT") or "default",
                security_context=json.loads(context) if context else None,
                container_security_context=json_object(env, "YARD_K8S_CONTAINER_SECURITY_CONTEXT"),
                mpi_container_security_context=json_object(
                    env, "YARD_K8S_MPI_CONTAINER_SECURITY_CONTEXT"
                ),
                image_pull_secrets=tuple(
                    s.strip() for s in env.get("YARD_K8S_IMAGE_PULL_SECRETS", "").split(",")
                    if s.strip()
                ),
                git_image=env.get("YARD_K8S_GIT_IMAGE") or PodSettings.git_image,
                host_paths=read_host_paths(env.get(HOST_PATHS_ENV, "")),
                annotations=tuple(
                    sorted(json.loads(env.get("YARD_K8S_POD_ANNOTATIONS") or "{}").items())
                ),
            ),
        )  # fmt: skip

    def namespace_for(self, wanted: str | None, user: str = "") -> str:
        """Where ``user``'s job that names ``wanted`` runs: there if it may, else in the
        user's own (``home``)."""
        if wanted and self._allows(wanted, user) and _DNS_LABEL.fullmatch(wanted):
            return wanted
        return self.home(user)

    def home(self, user: str) -> str:
        """The first namespace kept to ``user``, else the default one."""
        return next((n for n, users in self.namespace_users if user in users), self.namespace)

    def kept_to(self, namespace: str, user: str) -> bool:
        """Whether ``namespace`` is kept to users ``user`` is one of (its claims are
        their team's to write)."""
        kept = self._kept(namespace)
        return kept is not None and user in kept

    def _kept(self, namespace: str) -> frozenset[str] | None:
        return next((users for n, users in self.namespace_users if n == namespace), None)

    def _allows(self, wanted: str, user: str) -> bool:
        kept = self._kept(wanted)
        if kept is not None:
            return user in kept
        return "*" in self.allowed_namespaces or wanted in self.allowed_namespaces

    def check_namespace(self, wanted: str | None, user: str = "") -> None:
        """LaunchRefused for a namespace allowed here that cannot be one (the API server
        would refuse it, 422, on every try), for one kept to other users, and where the
        job would fall back to a default namespace kept to other users."""
        if wanted and self._allows(wanted, user) and not _DNS_LABEL.fullmatch(wanted):
            raise LaunchRefused(
                f"namespace: {wanted[:80]!r} is not a Kubernetes namespace name (a DNS "
                "label: at most 63 lowercase letters, digits and '-', starting and ending "
                "with a letter or digit)"
            )
        if wanted and not self._allows(wanted, user) and self._kept(wanted) is not None:
            raise LaunchRefused(
                f"namespace: {wanted!r} is kept to other users than {user!r} by the "
                "operator (YARD_K8S_NAMESPACE_USERS)"
            )
        home = self.home(user)
        kept = self._kept(home)
        falls_back = not (wanted and self._allows(wanted, user))
        if falls_back and kept is not None and user not in kept:
            raise LaunchRefused(
                f"namespace: the default namespace {home!r} is kept to other users than "
                f"{user!r} and none is kept to them (YARD_K8S_NAMESPACE_USERS): name one "
                "they may use"
            )


def json_object(env: dict[str, str], name: str) -> dict[str, Any] | None:
    """The JSON object in ``env[name]`` (a securityContext); None where it is unset,
    empty or ``null``. ValueError naming the variable for anything else: the launcher does not
    start on a setting it cannot honour (a context left off is rights not taken)."""
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from None
    if given is None:
        return None  # null: unset, as helm renders a value set to null to drop a default
    if not isinstance(given, dict):
        raise ValueError(f"{name}: a JSON object (a securityContext), not {type(given).__name__}")
    return given


def namespace_users(text: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """``YARD_K8S_NAMESPACE_USERS``: a JSON object, each namespace to the users it is
    kept to (``{"team-a": ["alice", "bob"]}``), or the same as a list of
    ``{"namespace": ..., "users": [...]}`` (the Helm chart's form: a values map has no
    order, and a user's first namespace is their jobs' default). ValueError naming the
    variable for anything else: the launcher does not start on a setting it cannot
    honour."""
    where = "YARD_K8S_NAMESPACE_USERS"
    try:
        given = json.loads(text, object_pairs_hook=_no_repeated_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    except ValueError as exc:  # a key repeated
        raise ValueError(f"{where}: {exc}") from None
    if isinstance(given, list) and all(
        isinstance(e, dict) and set(e) == {"namespace", "users"} and isinstance(e["namespace"], str)
        for e in given
    ):
        pairs = [(e["namespace"], e["users"]) for e in given]
    elif isinstance(given, dict):
        pairs = list(given.items())
    else:
        raise ValueError(
            f'{where}: a JSON object of namespace to users, e.g. {{"team-a": ["alice"]}}, '
            'or a list of {"namespace": "team-a", "users": ["alice"]}'
        )
    kept: list[tuple[str, frozenset[str]]] = []
    for namespace, users in pairs:
        if not _DNS_LABEL.fullmatch(namespace):
            raise ValueError(f"{where}: {namespace[:80]!r} is not a Kubernetes namespace name")
        if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users):
            raise ValueError(f"{where}: {namespace!r}: a list of user names")
        if any(namespace == n for n, _ in kept):
            raise ValueError(f"{where}: {namespace!r} is listed twice")
        kept.append((namespace, frozenset(users)))
    return tuple(kept)


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"{twice[:80]!r} is listed twice")
    return dict(pairs)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass
class _Pod:
    namespace: str
    name: str
    uid: str
    node: str | None
    body: dict[str, Any]  # what cached_pod keeps of it


def _namespace_of(body: dict[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("namespace") or "")


class _RawWatch(watch.Watch):
    """A watch whose events keep the API server's JSON as it came: the client's models
    cost the launcher a fifth of its CPU per pod (their datetimes parsed on every event)
    and this adapter reads only the raw object."""

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        return super().unmarshal_event(data, None)


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, settings: KubeSettings | None = None) -> None:
        self.settings = settings or KubeSettings.from_env()
        self.api: client.ApiClient | None = None
        self._pods: dict[TaskRef, _Pod] = {}
        # Tasks of nodes that disappeared (their pods may linger until collected).
        self._lost_nodes: set[str] = set()
        self._node_of_lost: dict[TaskRef, str] = {}
        self._pod_watch: asyncio.Task[None] | None = None
        # Namespaces this launcher has seen exist; forgotten when a create in one of them
        # answers 404, so the next try makes it again.
        self._present: set[str] = set()
        # Each open attempt's job's namespace (forgotten when the attempt closes: one
        # entry per job ever run would grow with history; a closed job's pods are known
        # by the pod watch, with their namespace).
        # (attempt, namespace) by job: a late close of an earlier attempt leaves it.
        self._job_namespace: dict[str, tuple[int, str]] = {}
        # Each open attempt's owner ConfigMap uid (None: a lone task's, which has none).
        self._owner_uids: dict[tuple[str, int], str | None] = {}
        self._changed = asyncio.Event()
        self._node_watch: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        if self.settings.kubeconfig or os.environ.get("KUBECONFIG"):
            await config.load_kube_config(config_file=self.settings.kubeconfig)
        else:
            config.load_incluster_config()
        self.api = client.ApiClient()
        # Every pod of ours, in any namespace, listed before adoption reads them.
        version = await self._relist()
        self._pod_watch = asyncio.create_task(self._watch_pods(version), name="pod watch")
        await self._ensure_namespace(self.settings.namespace)
        self._node_watch = asyncio.create_task(self._watch_nodes(), name="node watch")

    async def close(self) -> None:
        tasks = [t for t in (self._pod_watch, self._node_watch) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.api is not None:
            await self.api.close()

    @property
    def core(self) -> client.CoreV1Api:
        assert self.api is not None, "start() first"
        return client.CoreV1Api(self.api)

    async def _raw(self, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """``call``'s answer as the API server's JSON, not the client's model objects
        (building and reading those back was most of this adapter's CPU per pod)."""
        response = await call(*args, _preload_content=False, **kwargs)
        try:
            data = await response.read()
        finally:
            response.release()
        if not 200 <= response.status <= 299:
            failed = ApiException(status=response.status, reason=response.reason)
            failed.body = data.decode("utf-8", "replace")
            raise failed
        return json.loads(data) if data else {}

    async def _ensure_namespace(self, namespace: str) -> None:
        if namespace in self._present:
            return
        try:
            await self._raw(self.core.read_namespace, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                await self.core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
                )
            except ApiException as again:
                if again.status != 409:
                    raise LaunchError(f"namespace {namespace}: {again.reason}") from again
        self._present.add(namespace)

    # --- the watches ----------------------------------------------------------------

    async def _relist(self) -> str:
        listed = await self._raw(self.core.list_pod_for_all_namespaces, label_selector=SELECTOR)
        seen = set()
        for body in listed.get("items") or ():
            ref = self._remember(_namespace_of(body), body)
            if ref is not None:
                seen.add(ref)
        for ref in [r for r in self._pods if r not in seen]:
            self._forget(ref)
        self._changed.set()
        return str(listed["metadata"]["resourceVersion"])

    def _remember(
        self, namespace: str, body: dict[str, Any], *, unless_seen: bool = False
    ) -> TaskRef | None:
        """Keep a pod's latest state. ``unless_seen``: ``body`` is a create's or a read's
        answer, which the pod watch may already have overtaken while it was
        awaited (a pod that ran and ended at once): the watch's state of the same pod
        is then newer and is kept; written over, the task would look running forever."""
        task = pod_task(body)
        if task is None:
            return None
        ref = TaskRef(task.job_id, task.attempt, task.role, task.index)
        meta = body.get("metadata") or {}
        if unless_seen and (seen := self._pods.get(ref)) is not None:
            if seen.uid == meta.get("uid"):
                return ref
        node = (body.get("spec") or {}).get("nodeName")
        self._pods[ref] = _Pod(
            namespace, meta.get("name", ""), meta.get("uid", ""), node, cached_pod(body)
        )
        if node in self._lost_nodes:
            self._node_of_lost[ref] = node
        return ref

    def _forget(self, ref: TaskRef) -> None:
        self._pods.pop(ref, None)
        # A lost node's task whose pod is gone: its end (NODE_LOST) stays known while its
        # attempt is open here; after that nothing asks, and an entry per such task ever
        # seen would grow with history. So every entry is an open attempt's task's or a
        # cached pod's. (An attempt adopted after a restart is not "open here": its
        # tasks' ends are read at the node's loss, long before the pods are collected.)
        known = self._job_namespace.get(ref.job_id)
        if ref in self._node_of_lost and (known is None or known[0] != ref.attempt):
            del self._node_of_lost[ref]

    async def _watch_pods(self, version: str | None) -> None:
        while True:
            try:
                if version is None:
                    version = await self._relist()
                stream = _RawWatch().stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=SELECTOR,
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    allow_watch_bookmarks=True,
                )
                async for event in stream:
                    kind = event["type"]
                    body = event["raw_object"]
                    version = (body.get("metadata") or {}).get("resourceVersion") or version
                    if kind == "BOOKMARK":
                        continue
                    if kind == "ERROR":
                        if body.get("code") == 410:
                            version = None  # too old: list again
                        break
                    ref = self._remember(_namespace_of(body), body)
                    if kind == "DELETED" and ref is not None:
                        self._forget(ref)
                    self._changed.set()
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                else:
                    log.warning("pod watch: %s; resuming", exc.reason)
                    await asyncio.sleep(1.0)
            except Exception as exc:  # noqa: BLE001 - a dropped connection: resume
                log.warning("pod watch: %r; resuming", exc)
                await asyncio.sleep(1.0)

    async def _watch_nodes(self) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    nodes = await self._raw(self.core.list_node)
                    names = {n["metadata"]["name"] for n in nodes.get("items") or ()}
                    for node in {p.node for p in self._pods.values() if p.node} - names:
                        self._lost(node)
                    version = str(nodes["metadata"]["resourceVersion"])
                async for event in _RawWatch().stream(
                    self.core.list_node, resource_version=version, timeout_seconds=WATCH_TIMEOUT_S
                ):
                    body = event["raw_object"]
                    version = (body.get("metadata") or {}).get("resourceVersion") or version
                    if event["type"] == "ERROR":
                        version = None
                        break
                    name = (body.get("metadata") or {}).get("name")
                    if event["type"] == "DELETED" and name:
                        self._lost(name)
                    elif event["type"] == "ADDED" and name:
                        self._lost_nodes.discard(name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - resume
                log.warning("node watch: %r; resuming", exc)
                version = None
                await asyncio.sleep(1.0)

    def _lost(self, node: str) -> None:
        self._lost_nodes.add(node)
        for ref, pod in self._pods.items():
            if pod.node == node:
                self._node_of_lost[ref] = node
        self._changed.set()

    async def changes(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        self._changed.clear()

    # --- where things are -------------------------------------------------------------

    def namespace_of(self, job_id: str, spec: JobSpec | None = None) -> str:
        if (known := self._known_namespace(job_id)) is not None:
            return known
        if spec is None:
            return self.settings.namespace
        return self.settings.namespace_for(spec.namespace, spec.user)

    def _known_namespace(self, job_id: str) -> str | None:
        """The namespace of the job's open attempt, if one is open here."""
        known = self._job_namespace.get(job_id)
        return known[1] if known is not None else None

    def location(self, ref: TaskRef, spec: JobSpec | None = None) -> str:
        namespace = self.namespace_of(ref.job_id, spec)
        return f"{namespace}/{pod_name(ref.job_id, ref.attempt, ref.role, ref.index)}"

    def addressed(self, attempt: AttemptSpec) -> tuple[TaskPlacement, ...]:
        namespace = self.namespace_of(attempt.job_id, attempt.spec)
        lone = is_lone(attempt.spec)
        return tuple(
            t.model_copy(
                update={
                    "host_ip": task_address(
                        attempt.job_id, attempt.attempt, t.role, t.index, namespace, lone=lone
                    )
                }
            )
            for t in attempt.tasks
        )

    def framework_context(self, ref: TaskRef, attempt: AttemptSpec) -> FrameworkContext:
        # No helper runs next to a pod's command: the framework gets its variables, and
        # MPI its hostfile from the attempt's ConfigMap. A rendezvous task that declared
        # no port meets its peers on the framework's default (29500, as torchrun's).
        port = None
        if rendezvous_task(attempt.spec, list(attempt.tasks)) is not None:
            port = 29500
        return FrameworkContext(MPI_DIR, None, port)

    # --- an attempt ---------------------------------------------------------------------

    async def open_attempt(self, attempt: AttemptSpec) -> None:
        self.settings.check_namespace(attempt.spec.namespace, attempt.spec.user)
        namespace = self.settings.namespace_for(attempt.spec.namespace, attempt.spec.user)
        self._job_namespace[attempt.job_id] = (attempt.attempt, namespace)
        await self._ensure_namespace(namespace)
        if needs_service(attempt.spec):
            await self._create(self.core.create_namespaced_service, namespace,
                               service_manifest(attempt.job_id, namespace))  # fmt: skip
        hostfile = self._hostfile(attempt, namespace)
        if not needs_owner(attempt.spec, hostfile):
            self._owner_uids[(attempt.job_id, attempt.attempt)] = None
            return
        owner = owner_manifest(attempt.job_id, attempt.attempt, namespace, hostfile)
        made = await self._create(self.core.create_namespaced_config_map, namespace, owner)
        if made is None:  # there already, from an earlier try of this attempt
            made = await self._raw(self.core.read_namespaced_config_map,
                                   owner_name(attempt.job_id, attempt.attempt), namespace)  # fmt: skip
        uid = made["metadata"]["uid"]
        self._owner_uids[(attempt.job_id, attempt.attempt)] = uid
        if hostfile is not None:
            await self._create(self.core.create_namespaced_secret, namespace,
                               ssh_secret(attempt, namespace, uid))  # fmt: skip

    def _hostfile(self, attempt: AttemptSpec, namespace: str) -> str | None:
        layout = mpi_layout(attempt.spec, list(attempt.tasks))
        if layout is None:
            return None
        lone = is_lone(attempt.spec)
        return mpi_hostfile(
            [
                (
                    task_address(
                        attempt.job_id, attempt.attempt, role, index, namespace, lone=lone
                    ),
                    slots,
                )
                for role, index, slots in layout.hosts
            ],
            hydra=uses_hydra(attempt.spec),
        )

    async def _create(
        self, call: Callable[..., Awaitable[Any]], namespace: str, body: dict
    ) -> dict[str, Any] | None:
        """The object made, or None where it was there already."""
        try:
            made: dict[str, Any] = await self._raw(call, namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return None
            if exc.status == 404:
                self._present.discard(namespace)  # deleted under us: made again next try
            raise LaunchError(
                f"{body['kind']} {body['metadata']['name']} in {namespace}: {_why(exc)}"
            ) from exc
        return made

    async def close_attempt(self, attempt: AttemptSpec, end: AttemptEnd) -> None:
        namespace = self.namespace_of(attempt.job_id, attempt.spec)
        # Opened by this launcher: it knows what it made (no Service for a lone task, no
        # owner without a hostfile or several pods), and deletes only that; an attempt
        # it adopted may have either, from a launcher before it, and is cleared of both.
        key = (attempt.job_id, attempt.attempt)
        opened_here = key in self._owner_uids
        owner_made = self._owner_uids.pop(key, None) is not None or not opened_here
        service_made = needs_service(attempt.spec) or not opened_here
        known = self._job_namespace.get(attempt.job_id)
        if known is not None and known[0] == attempt.attempt:
            del self._job_namespace[attempt.job_id]  # the next attempt's open sets it
        # Its tasks' ends on a lost node are known by now (an entry comes back while a
        # pod of it is still cached, and goes with the pod: _forget).
        for ref in [r for r in self._node_of_lost if (r.job_id, r.attempt) == (
            attempt.job_id, attempt.attempt)]:  # fmt: skip
            del self._node_of_lost[ref]
        if end in (AttemptEnd.STOPPED, AttemptEnd.INTERRUPTED):
            # Its owner goes, and every pod and the hostfile and keys with it.
            if owner_made:
                await self._delete(
                    self.core.delete_namespaced_config_map,
                    owner_name(attempt.job_id, attempt.attempt),
                    namespace,
                )
            for task in attempt.tasks if is_lone(attempt.spec) else ():
                # A lone task's pod has no owner: it goes itself.
                await self._delete(
                    self.core.delete_namespaced_pod,
                    pod_name(attempt.job_id, attempt.attempt, task.role, task.index),
                    namespace,
                )
        # A lone job has no Service: one request per job less for the API server.
        if end in (AttemptEnd.STOPPED, AttemptEnd.FINISHED) and service_made:
            await self._delete(
                self.core.delete_namespaced_service, service_name(attempt.job_id), namespace
            )

    async def _delete(
        self,
        call: Callable[..., Awaitable[Any]],
        name: str,
        namespace: str,
        grace: int | None = None,
    ) -> None:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            await self._raw(call, name, namespace, body=body)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- a task -----------------------------------------------------------------------

    async def was_launched(self, ref: TaskRef) -> bool:
        namespace = self._known_namespace(ref.job_id)
        if namespace in self._present:
            # The pod watch has listed that namespace's pods and follows them, and a pod this
            # launcher makes is remembered as it is made: no read per task. (A pod another
            # replica made a moment ago answers the create with 409: AlreadyLaunched.)
            return ref in self._pods
        return await self._read(ref) is not None

    async def _read(self, ref: TaskRef) -> _Pod | None:
        if (cached := self._pods.get(ref)) is not None:
            return cached
        namespace = self._known_namespace(ref.job_id) or self.settings.namespace
        try:
            pod = await self._raw(self.core.read_namespaced_pod,
                                  pod_name(ref.job_id, ref.attempt, ref.role, ref.index),
                                  namespace)  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        self._remember(namespace, pod, unless_seen=True)
        return self._pods.get(ref)

    async def launch(self, task: TaskLaunch) -> Launched:
        ref = task.ref
        spec = task.spec
        namespace = self.namespace_of(ref.job_id, spec)
        key = (ref.job_id, ref.attempt)
        if key not in self._owner_uids:
            await self.open_attempt(task.attempt)
        owner = self._owner_uids[key]
        mpi = mpi_layout(spec, list(task.attempt.tasks)) is not None
        try:
            body = pod_manifest(
                spec=spec, job_id=ref.job_id, attempt=ref.attempt, placement=task.placement,
                env=task.env, command=task.command, namespace=namespace, owner_uid=owner,
                settings=self.settings.pods, mpi=mpi, carries_secrets=task.carries_secrets,
                writable_claims=self.settings.kept_to(namespace, spec.user),
                debug=task.options.debug,
            )  # fmt: skip
        except PodProblem as exc:
            raise LaunchRefused(str(exc)) from exc
        body["metadata"]["labels"][INSTALLATION_LABEL] = label_value(self.settings.installation)
        hidden = hides_command(spec.role(ref.role), task.carries_secrets) and not task.options.debug
        if hidden:
            # Before the pod, which the kubelet starts once it can mount it; owned by
            # the attempt's owner (needs_owner) until the pod is made, then by the pod.
            assert owner is not None, "a job with secrets has an owner (needs_owner)"
            await self._command_secret(task, namespace, owner)
        try:
            try:
                made = await self._raw(self.core.create_namespaced_pod, namespace, as_given(body))
            except ApiException as exc:
                if exc.status != 404 or owner is not None:
                    raise
                # The namespace was deleted under us, and a lone task's attempt made
                # nothing in it before its pod to find that out: make it again, once.
                self._present.discard(namespace)
                await self._ensure_namespace(namespace)
                made = await self._raw(self.core.create_namespaced_pod, namespace, as_given(body))
        except ApiException as exc:
            if exc.status == 409:
                if hidden:  # an earlier try may have stopped before the hand-over
                    await self._earlier_secret_to_pod(ref, namespace)
                raise AlreadyLaunched(f"pod {body['metadata']['name']} exists") from exc
            if exc.status == 404:
                self._present.discard(namespace)  # deleted under us: made again next try
            if _not_now(exc):
                # The API server's, for now: the message comes again (a create that went
                # through after all, a 504's, is then found by its name: 409).
                raise TransientError(f"the pod could not be created now: {_why(exc)}") from exc
            if exc.status in (400, 403, 413, 422) or _too_large(exc):
                # The job's own (a pod too large for the API server or etcd: its
                # command, its variables): refused, as on every try.
                raise LaunchRefused(f"the cluster refused the pod: {_why(exc)}") from exc
            raise LaunchError(f"the pod could not be created: {_why(exc)}") from exc
        self._remember(namespace, made, unless_seen=True)
        meta = made["metadata"]
        if hidden:
            await self._secret_to_pod(ref, namespace, meta["name"], meta["uid"])
        note = f"pod {namespace}/{meta['name']} on node {task.placement.node}"
        return Launched(TaskHandle(uid=meta["uid"]), note)

    async def _earlier_secret_to_pod(self, ref: TaskRef, namespace: str) -> None:
        try:
            earlier = await self._read(ref)
        except Exception as exc:  # noqa: BLE001 - the pod is there: said, not raised
            log.warning("pod %s not read to hand its Secret over: %s", ref.key,
                        _why(exc) if isinstance(exc, ApiException) else type(exc).__name__)  # fmt: skip
            return
        if earlier is not None:
            await self._secret_to_pod(ref, namespace, earlier.name, earlier.uid)

    async def _secret_to_pod(self, ref: TaskRef, namespace: str, pod: str, uid: str) -> None:
        """The command's Secret owned by its pod alone from now on, so it goes with the
        pod (a finished attempt's owner stays, with its kept pods, and a clean-up policy
        deletes a pod, not its Secret). Best effort: the pod runs either way, and where
        this fails the Secret goes with the attempt's owner."""
        name = command_secret_name(ref.job_id, ref.attempt, ref.role, ref.index)
        owned = [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}]
        patch = [{"op": "replace", "path": "/metadata/ownerReferences", "value": owned}]
        try:
            await self._raw(self.core.patch_namespaced_secret, name, namespace, patch)
        except Exception as exc:  # noqa: BLE001 - the pod runs: said, not raised
            log.warning("the command Secret %s/%s stays the attempt's: %s", namespace, name,
                        _why(exc) if isinstance(exc, ApiException) else type(exc).__name__)  # fmt: skip

    async def _command_secret(self, task: TaskLaunch, namespace: str, owner_uid: str) -> None:
        """The Secret a task's command line is in (``hides_command``). There already
        (an earlier try): left as it is. One the API server refuses (past a Secret's
        1 MiB) is the job's own, refused on every try."""
        ref = task.ref
        body = command_secret(
            spec=task.spec, job_id=ref.job_id, attempt=ref.attempt, placement=task.placement,
            env=task.env, command=task.command, namespace=namespace, owner_uid=owner_uid,
        )  # fmt: skip
        try:
            await self._raw(self.core.create_namespaced_secret, namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return
            if _not_now(exc):
                # A namespace's count of Secrets used up for now, throttling, the
                # server's own trouble: the message comes again, as for a pod.
                raise TransientError(
                    f"the command's Secret could not be created now: {_why(exc)}"
                ) from exc
            if exc.status in (400, 403, 413, 422) or _too_large(exc):
                raise LaunchRefused(
                    f"the cluster refused the command's Secret: {_why(exc)}"
                ) from exc
            if exc.status == 404:
                self._present.discard(namespace)  # deleted under us: made again next try
            raise LaunchError(f"the command's Secret could not be created: {_why(exc)}") from exc

    async def wait_started(self, ref: TaskRef, timeout_s: float) -> Launched | None:
        deadline = time.monotonic() + timeout_s
        while True:
            if (pod := await self._read(ref)) is not None:
                return Launched(TaskHandle(uid=pod.uid))
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)

    def _status(self, ref: TaskRef, handle: TaskHandle) -> TaskStatus:
        pod = self._pods.get(ref)
        if pod is not None and handle.uid and pod.uid != handle.uid:
            pod = None  # a pod of the same name made later is another pod
        if ref in self._node_of_lost:
            node = self._node_of_lost[ref]
            state = pod_state(pod.body) if pod is not None else None
            if state is None or state.running:
                return TaskStatus(
                    running=False,
                    reason=f"node {node} disappeared from the cluster",
                    end_kind=EndKind.NODE_LOST.value,
                    ended_at=time.time(),
                )
        if pod is None:
            return TaskStatus(running=False, lost=True, ended_at=time.time())
        state = pod_state(pod.body)
        return _task_status(state)

    async def poll(self, ref: TaskRef, handle: TaskHandle) -> TaskStatus:
        return self._status(ref, handle)

    async def usage(self, ref: TaskRef, handle: TaskHandle) -> Usage | None:
        """Not measured here: the nodes' kubelets measure pods (metrics-server)."""
        return None

    async def progress(self, ref: TaskRef, handle: TaskHandle) -> Progress:
        pod = self._pods.get(ref)
        if pod is None:
            return Progress(False, "no pod yet")
        state = pod_state(pod.body)
        return Progress(state.started or not state.running, state.step)

    async def kill(self, ref: TaskRef, handle: TaskHandle, grace_s: float) -> TaskStatus:
        before = self._status(ref, handle)
        pod = self._pods.get(ref) or await self._read(ref)
        if pod is None:
            return before
        # At least a second: 0 is the API's "delete now" (kubectl's --force), the pod
        # object gone while its container may still run; rounded up, never cut short.
        await self._delete(self.core.delete_namespaced_pod, pod.name, pod.namespace,
                           grace=max(math.ceil(grace_s), 1))  # fmt: skip
        deadline = time.monotonic() + grace_s + 30
        while ref in self._pods and self._pods[ref].uid == pod.uid and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if before.ended and not before.lost:
            return before
        # Ended by us: as a process sent SIGTERM would read.
        return TaskStatus(running=False, exit_code=143, signal=15, ended_at=time.time())

    async def clean_task(self, ref: TaskRef) -> list[str]:
        """The clean-up policy removes the task's pod (its logs go with it)."""
        pod = self._pods.get(ref)
        if pod is None:
            return []
        await self._delete(self.core.delete_namespaced_pod, pod.name, pod.namespace)
        return [f"pod {pod.namespace}/{pod.name}"]

    async def clean_job(self, job_id: str) -> bool:
        return False  # nothing of a job outlives its attempts' objects

    def task_env(self, task: TaskLaunch) -> dict[str, str]:
        return dict(task.env)

    async def write_debug_env(self, ref: TaskRef, text: str) -> str:
        # OpenPAI's isDebug: the failed task's pod is kept; its environment is the pod's.
        pod = self._pods.get(ref)
        return f"{pod.namespace}/{pod.name}" if pod is not None else self.location(ref)

    # --- logs and exec ----------------------------------------------------------------

    async def read_log(self, ref: TaskRef, stream: Stream, offset: int) -> LogChunk:
        pod = self._pods.get(ref) or await self._read(ref)
        if pod is None or stream == "stderr":
            # Kubernetes keeps one log per container: stderr is in stdout's.
            return LogChunk(b"", offset)
        try:
            text = await self.core.read_namespaced_pod_log(
                pod.name, pod.namespace, container=CONTAINER
            )
        except ApiException as exc:
            if exc.status in (400, 404):
                return LogChunk(b"", offset)  # not started yet, or gone
            if isinstance(exc.status, int) and exc.status >= 500:
                # The API server could not reach the node's kubelet (none on KWOK): no
                # log to show now, as for a pod not started; said in the launcher's log.
                log.warning("log of pod %s/%s not readable: %s %s",
                            pod.namespace, pod.name, exc.status, exc.reason)  # fmt: skip
                return LogChunk(b"", offset)
            raise
        data = (text or "").encode()
        return LogChunk(data[offset:], max(len(data), offset))

    async def open_log(self, ref: TaskRef, stream: Stream) -> list[BinaryIO]:
        # The API answers the whole of the container's current log file (the kubelet
        # rotates it at containerLogMaxSize, 10 MiB by default); its tailLines counts
        # the runtime's log entries (a long line is several), not lines as read here.
        return [io.BytesIO((await self.read_log(ref, stream, 0)).data)]

    def follow_log(
        self, ref: TaskRef, stream: Stream, offset: int, ended: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]:
        return self._follow(ref, stream, offset, ended)

    async def _follow(
        self, ref: TaskRef, stream: Stream, offset: int, ended: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]:
        if stream == "stderr":
            return
        pod = self._pods.get(ref) or await self._read(ref)
        while pod is not None and not pod_state(pod.body).started and not await ended():
            await asyncio.sleep(0.5)
            pod = self._pods.get(ref)
        if pod is None:
            return
        try:
            response = as_given(await self.core.read_namespaced_pod_log(
                pod.name, pod.namespace, container=CONTAINER, follow=True,
                _preload_content=False,
            ))  # fmt: skip
        except ApiException:
            return
        skipped = 0
        async with response:
            chunks = aiter(response.content.iter_any())
            checked = time.monotonic()
            closing = False
            pending: asyncio.Future[bytes] | None = None
            try:
                while True:
                    if pending is None:
                        pending = asyncio.ensure_future(anext(chunks))
                    await asyncio.wait({pending}, timeout=1.0 if closing else FOLLOW_CHECK_S)
                    if closing and not pending.done():
                        return  # what the kubelet still had is sent; nothing more comes
                    if not closing and time.monotonic() - checked >= FOLLOW_CHECK_S:
                        # The follower may be done (its token revoked, or the task ended
                        # while the kubelet holds the stream open): asked every so often,
                        # not per chunk (a store read each); what is on its way is still
                        # sent.
                        checked = time.monotonic()
                        closing = await ended()
                    if not pending.done():
                        continue
                    try:
                        chunk = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = None
                    if skipped < offset:
                        cut = min(offset - skipped, len(chunk))
                        skipped += cut
                        chunk = chunk[cut:]
                    if chunk:
                        yield chunk
            finally:
                if pending is not None and not pending.done():
                    pending.cancel()

    async def exec(
        self,
        ref: TaskRef,
        handle: TaskHandle,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
    ) -> ExecResult:
        pod = self._pods.get(ref) or await self._read(ref)
        if pod is None:
            raise ExecUnavailable("the task has no pod")
        ws = WsApiClient()
        api = client.CoreV1Api(api_client=ws)
        out, err = Tail(), Tail()
        code: int | None = None
        try:
            async with asyncio.timeout(timeout_s):
                argv = exec_command(pod.body, env, command)
                context = as_given(await api.connect_get_namespaced_pod_exec(
                    pod.name, pod.namespace, container=CONTAINER, command=as_given(argv),
                    stderr=True, stdout=True, stdin=False, tty=False, _preload_content=False,
                ))  # fmt: skip
                async with context as socket:
                    async for message in socket:
                        data = message.data
                        raw = data if isinstance(data, bytes) else str(data).encode()
                        if len(raw) < 1:
                            continue
                        channel, body = raw[0], raw[1:]
                        if channel == 1:
                            out.add(body)
                        elif channel == 2:
                            err.add(body)
                        elif channel == 3 and body:
                            code = WsApiClient.parse_error_data(body.decode(errors="replace"))
        except TimeoutError:
            return ExecResult(None, out.text(), err.text(), timed_out=True)
        except Exception as exc:  # noqa: BLE001 - the cluster does not exec (no kubelet)
            # Not the exception's text either: it shows the request, token included.
            log.warning("exec in pod %s/%s failed: %s", pod.namespace, pod.name,
                        exec_failure(exc))  # fmt: skip
            raise ExecUnavailable(
                f"the cluster cannot exec in pod {pod.name}: {exec_failure(exc)}"
            ) from exc
        finally:
            await ws.close()
        return ExecResult(code if code is not None else 0, out.text(), err.text())

    async def inventory(self) -> dict[TaskRef, TaskHandle] | None:
        """The pods that run (or wait to) of this installation (and those made before
        pods named theirs): an ended pod runs nothing (it keeps its task's logs, for
        the clean-up policy to remove), and another installation's are its own."""
        ours = label_value(self.settings.installation)
        return {
            ref: TaskHandle(uid=pod.uid)
            for ref, pod in self._pods.items()
            if pod_state(pod.body).running
            and (pod.body.get("metadata") or {}).get("labels", {}).get(INSTALLATION_LABEL, ours)
            == ours
        }


def exec_failure(exc: BaseException) -> str:
    """What the user is told of an exec that failed: the API server's status and its
    reason phrase, never the exception's text, which shows the request made (its
    headers carry the launcher's own token for the API server)."""
    status = getattr(exc, "status", None)
    if not isinstance(status, int):
        return f"the API server could not be reached ({type(exc).__name__})"
    phrase = getattr(exc, "reason", None) or getattr(exc, "message", None)
    if isinstance(phrase, str) and phrase.isprintable() and len(phrase) <= 100:
        return f"the API server answered {status} {phrase}"
    return f"the API server answered {status}"


def _task_status(state: PodState) -> TaskStatus:
    if state.running:
        return TaskStatus(running=True)
    return TaskStatus(
        running=False,
        exit_code=state.exit_code,
        signal=state.signal,
        reason=state.reason,
        end_kind=state.end_kind,
        ended_at=state.ended_at or time.time(),
    )


def as_given(value: object) -> Any:
    """A value as kubernetes-asyncio really takes or gives it, which its annotations do
    not say: they name only its models, yet it sends a plain dict (a manifest built by
    domain/pods.py) as it is and takes an exec command as a list; and with
    ``_preload_content=False`` a call returns the raw response (a stream to read, or
    the exec websocket), not the model."""
    return value


def _not_now(exc: ApiException) -> bool:
    """An answer that says "not now" rather than "never": throttled (429), the server's
    own trouble (5xx; a 504 may come of a create that was made), a namespace's quota
    used up for now or the namespace being deleted (both 403s, as an RBAC refusal is).
    A pod that alone asks more than its quota's hard limit never will be made."""
    status = exc.status or 0  # None: no answer's status at all
    if status == 429 or (status >= 500 and not _too_large(exc)):
        return True
    why = _why(exc)
    if status != 403:
        return False
    return ("exceeded quota" in why and not never_within_quota(why)) or "is being terminated" in why


def _too_large(exc: ApiException) -> bool:
    """etcd's refusal of an object past its size limit, which the API server passes on
    as a 500 ("etcdserver: request is too large")."""
    return exc.status == 500 and "request is too large" in _why(exc)


def _why(exc: ApiException) -> str:
    if not exc.body:
        return str(exc.reason)
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


def ssh_secret(attempt: AttemptSpec, namespace: str, owner_uid: str) -> dict[str, Any]:
    """The keys mpirun's ssh uses between the attempt's pods, as Kubeflow's MPI
    operator gives them: one key pair, authorized everywhere, owned by the attempt."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    name = owner_name(attempt.job_id, attempt.attempt)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{name}-ssh",
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": owner_uid}
            ],
        },
        "type": "Opaque",
        "stringData": {
            "id_ed25519": private,
            "id_ed25519.pub": public,
            "authorized_keys": public,
            "config": "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n",
        },
    }


HOSTFILE_PATH = f"{MPI_DIR}/{HOSTFILE_KEY}"
