"""``python -m trainyard_launcher``: bootstrap. Settings, clients, the backend, adoption of
running tasks, then the consumer, the watcher and the HTTP app."""

from __future__ import annotations

import asyncio
import logging
import os

from trainyard_common.aliyun_auth import NONCE_TTL_S
from trainyard_common.auth import (
    TokenStore,
    tokens_collection,
)
from trainyard_common.bus import Bus, Delivery, KvNonces
from trainyard_common.config import Settings
from trainyard_common.events import Event
from trainyard_common.runtime import run_service, serve, setup_logging
from trainyard_common.secrets_box import SecretBox
from trainyard_common.storage import Database, open_store
from trainyard_common.telemetry import setup_telemetry

from .adapters.backend import TaskBackend
from .adapters.limits import find_mechanisms
from .adapters.local import IsolationError, LocalBackend
from .adapters.store import DocLauncherStore
from .adapters.uids import DocTaskUids
from .app import create_app
from .handlers import SUBJECTS, Deps, adopt, dispatch, watch_tasks
from .settings import LauncherSettings

log = logging.getLogger("trainyard.launcher")


DURABLE = "launcher"


def make_backend(settings: Settings, launcher: LauncherSettings, db: Database) -> TaskBackend:
    """The backend YARD_LAUNCHER names: ``local`` (the default) or ``kubernetes``."""
    if launcher.backend == "kubernetes":
        # Imported only here: the Kubernetes client is half of the launcher's start and
        # some 65 MB of its memory, which the local backend has no use for.
        from .adapters.kubernetes import KubernetesBackend, KubeSettings

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


def task_uids(launcher: LauncherSettings, db: Database) -> DocTaskUids | None:
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
    return DocTaskUids(db, base=launcher.task_uid_base)


async def main() -> None:
    settings = Settings.from_env("launcher")
    launcher = LauncherSettings.from_env()
    setup_logging("launcher")
    setup_telemetry("launcher")
    bus = await Bus.connect(settings.nats_url, name="launcher")
    client = open_store(settings.mongo_url, settings.store_dir)
    try:
        store = DocLauncherStore(client[settings.db_name()])
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


if __name__ == "__main__":
    run_service(main)
