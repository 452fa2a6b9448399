"""Real NATS JetStream and FerretDB processes: start, persist across restarts, constraints."""

from __future__ import annotations

from pathlib import Path

import nats
import pymongo
import pytest
from nats.js.api import StreamConfig
from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError

from trainyard_stack.components import (
    ExternalService,
    FerretDB,
    NatsServer,
    _ephemeral_range,
    free_port,
    mongo_for,
    nats_for,
    nats_server_binary,
    repo_root,
)


def test_helpers() -> None:
    assert (repo_root() / "tools" / "ferretdb" / "build.sh").exists()
    assert nats_server_binary().name == "nats-server"
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # never the same port twice before a child binds it
    low, _ = _ephemeral_range()
    # Outside the range outgoing connections take their ports from, and below the
    # nodes' task ports.
    assert all(0 < port < min(low, 20000) for port in ports)


async def _publish(url: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="JOBS", subjects=["jobs.>"]))
        for p in payloads:
            ack = await js.publish("jobs.created", p)
            assert ack.stream == "JOBS"
    finally:
        await nc.close()


async def _read_all(url: str) -> list[bytes]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("JOBS")
        return [
            (await js.get_msg("JOBS", seq)).data or b""
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]
    finally:
        await nc.close()


async def test_nats_jetstream_persists_across_restart(tmp_path: Path) -> None:
    store = tmp_path / "nats"
    server = NatsServer(store)
    with server:
        assert server.url == f"nats://127.0.0.1:{server.port}"
        assert server.running
        await _publish(server.url, [b"one", b"two"])
        assert await _read_all(server.url) == [b"one", b"two"]
    assert not server.running
    assert (tmp_path / "logs" / "nats.log").exists()

    # Same store dir, new process: the stream and its messages must be there.
    with NatsServer(store) as again:
        assert await _read_all(again.url) == [b"one", b"two"]


async def test_nats_survives_kill(tmp_path: Path) -> None:
    # A crash (SIGKILL) must not lose acknowledged messages, since JetStream
    # file storage is what the platform relies on for at-least-once delivery.
    server = NatsServer(tmp_path / "nats").start()
    try:
        await _publish(server.url, [b"acked"])
    finally:
        server.kill()
    with NatsServer(tmp_path / "nats", port=server.port) as again:
        assert again.url == server.url
        assert await _read_all(again.url) == [b"acked"]


async def test_ferretdb_persists_across_restart(tmp_path: Path) -> None:
    sqlite_dir = tmp_path / "ferretdb"
    with FerretDB(sqlite_dir) as db:
        assert db.url == f"mongodb://127.0.0.1:{db.port}/"
        client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(db.url)
        try:
            await client.trainyard.jobs.insert_one({"_id": "job-1", "state": "queued"})
        finally:
            await client.close()
    assert (tmp_path / "logs" / "ferretdb.log").exists()

    with FerretDB(sqlite_dir) as db:
        client = AsyncMongoClient(db.url)
        try:
            doc = await client.trainyard.jobs.find_one({"_id": "job-1"})
        finally:
            await client.close()
    assert doc == {"_id": "job-1", "state": "queued"}


async def test_ferretdb_unique_index_rejects_duplicates(tmp_path: Path) -> None:
    with FerretDB(tmp_path / "ferretdb") as db:
        client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(db.url)
        try:
            coll = client.trainyard.events
            await coll.create_index([("event_id", pymongo.ASCENDING)], unique=True)
            await coll.insert_one({"event_id": "e-1", "n": 1})
            with pytest.raises(DuplicateKeyError):
                await coll.insert_one({"event_id": "e-1", "n": 2})
            # Duplicate _id too: the other idempotency path we rely on.
            await coll.insert_one({"_id": "fixed", "event_id": "e-2"})
            with pytest.raises(DuplicateKeyError):
                await coll.insert_one({"_id": "fixed", "event_id": "e-3"})
            assert await coll.count_documents({}) == 2
        finally:
            await client.close()


async def test_mongo_for_and_nats_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONGO_URL", raising=False)
    monkeypatch.delenv("NATS_URL", raising=False)
    mongo = mongo_for(tmp_path)
    bus = nats_for(tmp_path)
    try:
        assert isinstance(mongo, FerretDB)
        assert isinstance(bus, NatsServer)
        assert (tmp_path / "ferretdb").is_dir()
        assert (tmp_path / "nats").is_dir()

        # With the env vars set, the existing servers are reused, not started.
        monkeypatch.setenv("MONGO_URL", mongo.url)
        monkeypatch.setenv("NATS_URL", bus.url)
        ext_mongo = mongo_for(tmp_path / "unused")
        ext_bus = nats_for(tmp_path / "unused")
        assert isinstance(ext_mongo, ExternalService)
        assert isinstance(ext_bus, ExternalService)
        assert (ext_mongo.url, ext_bus.url) == (mongo.url, bus.url)
        assert not (tmp_path / "unused").exists()
        ext_mongo.stop()
        ext_bus.stop()

        client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(ext_mongo.url)
        try:
            assert (await client.admin.command("ping"))["ok"] == 1.0
        finally:
            await client.close()
        await _publish(ext_bus.url, [b"via-env"])
        assert await _read_all(bus.url) == [b"via-env"]
    finally:
        mongo.stop()
        bus.stop()
