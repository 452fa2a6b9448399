"""Session fixtures: a real nats-server and a real MongoDB-wire server (MONGO_URL, else
the embedded FerretDB the project builds), shared by the integration and e2e tests.
Each test keeps to itself through its own database prefix and job ids."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from trainyard_common.cluster import NodeSpec
from trainyard_common.storage import Client
from trainyard_stack.components import FerretDB, NatsServer, ensure_ferretdb_binary
from trainyard_stack.kube import KubeCluster

from .support.stores import REAL_STORES, store_client


@pytest.fixture(scope="session", autouse=True)
def tasks_reach_test_directories(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A platform run as root runs each user's tasks under the user's own uid, and they
    must reach their directories under a test's data directory, as they reach them
    under a real one: every test directory is traversable (never listable) by others."""
    base = tmp_path_factory.getbasetemp()
    for directory in (base.parent, base):  # pytest-of-<user>/pytest-<n>
        os.chmod(directory, 0o711)
    original = pytest.TempPathFactory.mktemp

    def mktemp(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
        path = original(self, basename, numbered)
        os.chmod(path, 0o711)
        return path

    pytest.TempPathFactory.mktemp = mktemp  # type: ignore[method-assign]
    yield
    pytest.TempPathFactory.mktemp = original  # type: ignore[method-assign]


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


@pytest.fixture(params=REAL_STORES)
async def doc_client(request: pytest.FixtureRequest, db_prefix: str) -> AsyncIterator[Client]:
    """Each real store in turn (tests.support.stores)."""
    async with store_client(request, request.param, db_prefix) as client:
        yield client


@pytest.fixture
def db_prefix() -> str:
    """A database prefix of this test's own, so tests never see each other's data."""
    return "t" + uuid.uuid4().hex[:10]


# A cluster file's nodes, for the Kubernetes test cluster: one node with GPUs, one without.
KUBE_NODES = [
    NodeSpec(name="kwok-gpu-0", cpu=16, memory_mb=65536, gpus=4, gpu_type="A100",
             port_range=(31000, 31999)),
    NodeSpec(name="kwok-gpu-1", cpu=16, memory_mb=65536, gpus=2, gpu_type="TITANX",
             port_range=(31000, 31999)),
    NodeSpec(name="kwok-cpu-0", cpu=16, memory_mb=65536, port_range=(32000, 32999)),
]  # fmt: skip


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A real control plane (the project's build of Kubernetes) with KWOK nodes, started
    once for the tests that ask for it."""
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), nodes=list(KUBE_NODES)).start()
    yield cluster
    cluster.stop()
