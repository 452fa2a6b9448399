"""Session fixtures: a real nats-server and a real MongoDB-wire server (MONGO_URL, else
the embedded FerretDB the project builds), shared by the integration and e2e tests.
Each test keeps to itself through its own database prefix and job ids."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_stack.components import FerretDB, NatsServer, ensure_ferretdb_binary


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def nats_server(servers_dir: Path) -> Iterator[NatsServer | None]:
    if os.environ.get("NATS_URL"):
        yield None
        return
    server = NatsServer(servers_dir / "nats").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer | None) -> str:
    return nats_server.url if nats_server else os.environ["NATS_URL"]


@pytest.fixture(scope="session")
def mongo_url(servers_dir: Path) -> Iterator[str]:
    if os.environ.get("MONGO_URL"):
        yield os.environ["MONGO_URL"]
        return
    ensure_ferretdb_binary()
    server = FerretDB(servers_dir / "ferretdb").start()
    yield server.url
    server.stop()


@pytest.fixture
def db_prefix() -> str:
    """A database prefix of this test's own, so tests never see each other's data."""
    return "t" + uuid.uuid4().hex[:10]
