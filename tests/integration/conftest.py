"""Fixtures shared by the integration tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from trainyard_common.bus import Bus
from trainyard_stack.components import NatsServer

from .placement_replicas import ADMIN_TOKEN, CLUSTER, TTL_S


@pytest.fixture
def private_nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    # Its own server: the durable "placement" consumer replays the whole stream, and the
    # shared one holds other tests' JobAccepted events.
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
def private_nats(private_nats_server: NatsServer) -> str:
    return private_nats_server.url


@pytest.fixture
def replica_env(
    private_nats: str, mongo_url: str, db_prefix: str, tmp_path: Path
) -> dict[str, str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    env = {k: v for k, v in os.environ.items() if k not in ("YARD_TOKEN", "NATS_URL", "MONGO_URL")}
    env.update(
        YARD_NATS_URL=private_nats, YARD_MONGO_URL=mongo_url, YARD_DB_PREFIX=db_prefix,
        YARD_CLUSTER=str(cluster), YARD_DATA_DIR=str(tmp_path / "data"),
        YARD_LOG_LEVEL="INFO", YARD_TOKEN=ADMIN_TOKEN, YARD_PLACEMENT_LEASE_TTL_S=str(TTL_S),
    )  # fmt: skip
    return env


@pytest.fixture
async def bus(private_nats: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(private_nats, name="test-placement-leader")
    yield bus
    await bus.close()
