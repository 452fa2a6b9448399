"""The whole platform on one machine: NATS, the store, and every service as its own
process, all keeping their data under one data directory (so a restart keeps history).

Used by ``make run`` / ``make up`` and by the end-to-end tests, which also kill and
restart single services through it to prove that no job is lost or doubled.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from trainyard_common import streams
from trainyard_common.auth import new_token
from trainyard_common.bus_access import (
    GRANTS,
    producer_grant,
    producer_identity,
    server_permissions,
)
from trainyard_common.config import DEFAULT_PORTS, admin_token_path
from trainyard_common.limits import digits
from trainyard_common.secrets_box import SECRETS_KEY_ENV, new_key
from trainyard_common.storage import Client, open_store

from .components import (
    BusUser,
    ComponentError,
    ExternalService,
    FerretDB,
    NatsServer,
    free_port,
)
from .tls import TlsFiles, ensure_tls

# Consumers first, front door last: by the time intake answers, every consumer is up.
SERVICES = ("validation", "placement", "launcher", "status", "intake", "gateway")


STORES = ("sqlite", "ferretdb")
# Services that may run as several processes (YARD_REPLICAS="status=2,intake=2"): each
# replica consumes the same durable (JetStream hands each message to one of them) and
# answers HTTP behind the gateway in turn; placement's replicas elect one leader. Not the
# launcher: its local tasks are this machine's processes, watched by the one that started
# them; nor the gateway, the one front door.
REPLICABLE = ("intake", "validation", "placement", "status")
MAX_REPLICAS = 8


def service_of(instance: str) -> str:
    """The service a process runs: ``status-2`` -> ``status``."""
    return instance.split("-", 1)[0]


def parse_replicas(text: str) -> dict[str, int]:
    """``"status=2,intake=3"`` -> {"status": 2, "intake": 3}; a clear error otherwise."""
    counts: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, number = part.partition("=")
        if name not in REPLICABLE:
            raise ValueError(
                f"YARD_REPLICAS: {name!r} cannot run as replicas here "
                f"(only {', '.join(REPLICABLE)})"
            )
        if not digits(number) or not 1 <= int(number) <= MAX_REPLICAS:
            raise ValueError(f"YARD_REPLICAS: {part!r}: the count must be 1 to {MAX_REPLICAS}")
        counts[name] = int(number)
    return counts


# Where the gateway serves the Kubernetes API (HTTPS), as a Kubernetes API server does.
KUBE_API_PORT = 6443


@dataclass
class PlatformConfig:
    data_dir: Path
    cluster_file: Path | None = None
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    db_prefix: str = "trainyard"
    log_level: str = "INFO"
    extra_env: dict[str, str] = field(default_factory=dict)
    # "sqlite": the embedded store, files under <data>/store (nothing to start);
    # "ferretdb": the MongoDB adapters on the embedded FerretDB. MONGO_URL wins over both.
    store: str = field(default_factory=lambda: os.environ.get("YARD_STORE") or "sqlite")
    replicas: dict[str, int] = field(
        default_factory=lambda: parse_replicas(os.environ.get("YARD_REPLICAS", ""))
    )
    # The gateway's Kubernetes API, over HTTPS with the platform's own CA (tls.py).
    kube_api_port: int = field(
        default_factory=lambda: int(os.environ.get("YARD_KUBE_API_PORT") or KUBE_API_PORT)
    )

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ValueError(f"YARD_STORE={self.store!r}: must be one of {', '.join(STORES)}")
        parse_replicas(",".join(f"{k}={v}" for k, v in self.replicas.items()))

    def instances(self) -> list[str]:
        """Every process to run, in start order: a service, then its other replicas
        (``status``, ``status-2``, ...)."""
        return [
            name if i == 1 else f"{name}-{i}"
            for name in SERVICES
            for i in range(1, self.replicas.get(name, 1) + 1)
        ]

    @classmethod
    def with_free_ports(cls, data_dir: Path, **kwargs: object) -> PlatformConfig:
        ports = {name: free_port() for name in DEFAULT_PORTS}
        return cls(data_dir, ports=ports, kube_api_port=free_port(), **kwargs)  # type: ignore[arg-type]


def ensure_admin_token(data_dir: Path) -> str:
    """``YARD_TOKEN`` if set, else the token stored under the data directory, created once
    (mode 600) where the CLI looks for it."""
    if token := os.environ.get("YARD_TOKEN"):
        return token
    path = admin_token_path(data_dir)
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


PLATFORM_IDENTITY = "platform"
# Intake seals job secrets, the launcher opens them; DLC signatures are verified by
# intake, status and the launcher from sealed AccessKey secrets (secrets_box.py).
SECRET_HOLDERS = frozenset({"intake", "launcher", "status"})


def ensure_secrets_key(data_dir: Path) -> str:
    """The platform's secrets key: ``YARD_SECRETS_KEY``, else made once under the data
    directory (mode 600): a restart must open what was sealed before it."""
    if key := os.environ.get(SECRETS_KEY_ENV):
        return key
    path = data_dir / "secrets.key"
    if path.exists():
        return path.read_text().strip()
    key = new_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key


def stop_tasks(url: str, token: str, timeout: float = 60.0) -> tuple[int, int]:
    """End every running task through the platform itself: placement places nothing
    more and interrupts each running job (cause ``shutdown``), the launcher stops their
    tasks; waits until none runs. Returns (jobs interrupted, tasks still running)."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        answer = httpx.post(f"{url}/v1/placement/shutdown", headers=headers, timeout=30)
        jobs = len(answer.json().get("interrupted", [])) if answer.status_code == 200 else 0
    except (httpx.HTTPError, ValueError):
        return 0, -1  # the platform is not answering: nothing to ask
    deadline = time.monotonic() + timeout
    running = -1
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/v1/admin/tasks", headers=headers, timeout=5)
            running = int(answer.json()["running"]) if answer.status_code == 200 else -1
        except (httpx.HTTPError, ValueError, KeyError):
            running = -1
        if running == 0:
            break
        time.sleep(0.2)
    return jobs, running


async def ensure_streams(url: str) -> None:
    await streams.make(url)


def producers() -> list[str]:
    """The users whose systems publish submissions onto the bus (YARD_PRODUCERS)."""
    return [name for name in os.environ.get("YARD_PRODUCERS", "").split(",") if name.strip()]


def bus_users(data_dir: Path, producer_names: list[str]) -> dict[str, BusUser]:
    """Every identity of the bus: each service within its grant, a fresh password per
    start; the platform's own (the stack, for the streams); and each producer, whose
    credentials persist under ``<data>/producers/<user>.json`` (mode 600) for its
    operator to hand over (docs/security.md)."""
    users = {
        name: BusUser(secrets.token_urlsafe(24), server_permissions(name, grant))
        for name, grant in GRANTS.items()
    }
    users[PLATFORM_IDENTITY] = BusUser(secrets.token_urlsafe(24))
    for user in producer_names:
        identity = producer_identity(user)
        users[identity] = BusUser(
            producer_password(data_dir, user),
            server_permissions(identity, producer_grant(user)),
        )
    return users


def producer_password(data_dir: Path, user: str) -> str:
    path = data_dir / "producers" / f"{user}.json"
    if path.exists():
        return str(json.loads(path.read_text())["password"])
    path.parent.mkdir(mode=0o700, exist_ok=True)
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        identity = producer_identity(user)
        json.dump({"user": identity, "password": password, "inbox_prefix": f"_INBOX_{identity}",
                   "subject": f"yard.submit.{user}.<submission id>"}, out, indent=1)  # fmt: skip
    return password


# What may be under the data directory besides the launcher's task root, each private
# to the services' user (docs/security.md): tasks pass through the data directory to
# their own directories and see nothing else of it.
PRIVATE_ENTRIES = ("nats", "store", "ferretdb", "logs", "run", "kube", "producers")


def protect_data_dir(data_dir: Path) -> None:
    """The data directory traversable (not readable) by others, its entries private."""
    os.chmod(data_dir, 0o711)
    for name in PRIVATE_ENTRIES:
        path = data_dir / name
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)


class Platform:
    def __init__(self, config: PlatformConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.token = ""
        self.secrets_key = ""
        self.nats: NatsServer | ExternalService | None = None
        self.mongo: FerretDB | ExternalService | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # The ports of the replicas beyond each service's first.
        self.replica_ports = {
            name: free_port() for name in config.instances() if name not in config.ports
        }
        self._logs: dict[str, IO[bytes]] = {}
        self.tls: TlsFiles | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.ports['gateway']}"

    @property
    def kube_url(self) -> str:
        """The Kubernetes API (kubectl, client-go, the Kubernetes SDKs), over HTTPS."""
        return f"https://127.0.0.1:{self.config.kube_api_port}"

    @property
    def ca_file(self) -> Path:
        return self.data_dir / "tls" / "ca.crt"

    def service_url(self, name: str) -> str:
        """Where a service (or one replica of it, ``status-2``) answers."""
        port = self.config.ports.get(name) or self.replica_ports[name]
        return f"http://127.0.0.1:{port}"

    # -- start / stop ---------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> Platform:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        protect_data_dir(self.data_dir)
        self.token = ensure_admin_token(self.data_dir)
        self.secrets_key = ensure_secrets_key(self.data_dir)
        self.tls = ensure_tls(self.data_dir)
        if url := os.environ.get("NATS_URL"):
            self.nats = ExternalService(url)
        else:
            self.nats = NatsServer(
                self.data_dir / "nats",
                log_path=self.logs / "nats.log",
                users=bus_users(self.data_dir, producers()),
            ).start()
        if url := os.environ.get("MONGO_URL"):
            self.mongo = ExternalService(url)
        elif self.config.store == "ferretdb":
            store = self.data_dir / "ferretdb"
            self.mongo = FerretDB(
                store, log_path=self.logs / "ferretdb.log", unix_socket=store / "ferretdb.sock"
            ).start()
        # The streams are the platform's to make: a service may only look at them.
        asyncio.run(ensure_streams(self.bus_url()))
        for name in self.config.instances():
            self.start_service(name)
        self.wait_healthy(timeout)
        self._write_state()
        return self

    def bus_url(self, identity: str = PLATFORM_IDENTITY) -> str:
        """The URL ``identity`` connects to the bus with (the platform's own: every
        right, for the stack and its tests)."""
        assert self.nats is not None
        if isinstance(self.nats, NatsServer) and self.nats.users is not None:
            return self.nats.url_for(identity)
        return self.nats.url

    def service_env(self, name: str) -> dict[str, str]:
        assert self.nats is not None
        env = {
            **os.environ,
            "YARD_NATS_URL": self.bus_url(name) if name in GRANTS else "",
            # Only those that open what it seals hold the platform's secrets key.
            SECRETS_KEY_ENV: self.secrets_key if name in SECRET_HOLDERS else "",
            # Empty: each service opens its own SQLite file under <data>/store.
            "YARD_MONGO_URL": self.mongo.url if self.mongo else "",
            "YARD_DATA_DIR": str(self.data_dir),
            "YARD_DB_PREFIX": self.config.db_prefix,
            "YARD_TOKEN": self.token,
            "YARD_LOG_LEVEL": self.config.log_level,
            "PYTHONUNBUFFERED": "1",
            **{f"YARD_{name.upper()}_PORT": str(port) for name, port in self.config.ports.items()},
            # Where the gateway finds each service: every replica, in turn.
            **{
                f"YARD_{service.upper()}_URL": ",".join(
                    self.service_url(i) for i in self.config.instances() if service_of(i) == service
                )
                for service in self.config.replicas
            },
            **self.config.extra_env,
        }
        if name == "gateway":
            assert self.tls is not None
            env.update(
                YARD_KUBE_API_PORT=str(self.config.kube_api_port),
                YARD_TLS_CERT=str(self.tls.cert),
                YARD_TLS_KEY=str(self.tls.key),
            )
        if self.config.cluster_file:
            env["YARD_CLUSTER"] = str(Path(self.config.cluster_file).resolve())
        if env.get("YARD_LAUNCHER") == "kubernetes" and not env.get("KUBECONFIG"):
            # The test cluster `make kube-up` starts beside the platform's data.
            env["KUBECONFIG"] = str(self.data_dir / "kube" / "kubeconfig")
        return env

    def start_service(self, name: str) -> None:
        """Start a service, or one replica of it (``status-2``: its own port and log)."""
        service = service_of(name)
        env = self.service_env(service)
        env[f"YARD_{service.upper()}_PORT"] = self.service_url(name).rsplit(":", 1)[1]
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives with the child
        self._logs[name] = log
        # Own session: Ctrl-C in a terminal reaches the supervisor only, which then stops
        # the services in order instead of all dying at once mid-write.
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", f"trainyard_{service}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill_service(self, name: str) -> None:
        """SIGKILL one service, as a crash would."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def restart_service(self, name: str, timeout: float = 30.0) -> None:
        self.start_service(name)
        self.wait_healthy(timeout, only=[name])

    def store_client(self) -> Client:
        """A client of the platform's store (the services' databases), for tools and tests."""
        return open_store(self.mongo.url if self.mongo else None, self.data_dir / "store")

    def server(self, name: str) -> NatsServer | FerretDB:
        """The bus ("nats") or the store ("store", when it is a server: FerretDB) this
        platform started itself."""
        server = {"nats": self.nats, "store": self.mongo}[name]
        if not isinstance(server, NatsServer | FerretDB):
            raise ComponentError(f"{name} is not run by this platform ({server!r})")
        return server

    def kill_server(self, name: str) -> None:
        """SIGKILL the bus or the store, as a crash (or an OOM kill) would."""
        self.server(name).kill()

    def restart_server(self, name: str, timeout: float = 30.0) -> None:
        """Start it again where it was: same address, same data."""
        self.server(name).start(timeout)

    def wait_healthy(self, timeout: float = 60.0, only: list[str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        pending = list(only or self.config.instances())
        while pending:
            name = pending[0]
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ComponentError(
                    f"{name} exited with code {proc.returncode} during start; "
                    f"log {self.logs / (name + '.log')}:\n{self.log_tail(name)}"
                )
            try:
                if httpx.get(f"{self.service_url(name)}/healthz", timeout=1.0).status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ComponentError(
                    f"{name} not healthy after {timeout:.0f}s:\n{self.log_tail(name)}"
                )
            time.sleep(0.1)

    def log_tail(self, name: str, max_bytes: int = 4000) -> str:
        try:
            return (self.logs / f"{name}.log").read_bytes()[-max_bytes:].decode(errors="replace")
        except OSError:
            return "<no log>"

    def stop(self, timeout: float = 10.0, keep_tasks: bool = False) -> None:
        """Stop everything: first the jobs' tasks (their jobs run again at the next
        start), unless ``keep_tasks`` leaves them running for that start to adopt."""
        if not keep_tasks and self.procs:
            stop_tasks(self.url, self.token)
        for name in reversed(self.config.instances()):
            proc = self.procs.get(name)
            if proc and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()
        if self.mongo:
            self.mongo.stop()
        if self.nats:
            self.nats.stop()
        state = self.data_dir / "run" / "platform.json"
        state.unlink(missing_ok=True)

    def __enter__(self) -> Platform:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_state(self) -> None:
        run = self.data_dir / "run"
        run.mkdir(parents=True, exist_ok=True)
        assert self.nats is not None
        (run / "platform.json").write_text(
            json.dumps(
                {
                    "supervisor_pid": os.getpid(),
                    "url": self.url,
                    "nats_url": self.nats.url,
                    "mongo_url": self.mongo.url if self.mongo else None,
                    "store": str(self.data_dir / "store") if self.mongo is None else None,
                    "services": {name: proc.pid for name, proc in self.procs.items()},
                    # Where each process answers (its /metrics: `make metrics`).
                    "urls": {name: self.service_url(name) for name in self.procs},
                    # `yard kubeconfig` reads these.
                    "kubernetes": {"server": self.kube_url, "ca": str(self.ca_file)},
                },
                indent=2,
            )
        )
