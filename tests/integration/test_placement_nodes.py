"""Node administration on a real placement process (NATS JetStream, FerretDB), driven
through the ``yard nodes`` commands: add, drain, a SIGKILL and a restart that rebuilds
the same nodes, remove with its InterruptJob; and the node store's contract on both
the in-memory fake and FerretDB."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.bus import Bus
from trainyard_common.cluster import NodeSpec
from trainyard_common.events import InterruptCause, InterruptJob, JobAccepted, decode, derived_id
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import STREAM
from trainyard_placement.adapters.nodes import (
    DocNodeStore,
    MemoryNodeStore,
    NodeRecord,
    NodeStore,
)
from trainyard_sdk.cli import make_app
from trainyard_sdk.client import Client

from ..support.stores import REAL_STORES, store_client
from .placement_replicas import (
    ADMIN_TOKEN,
    Replica,
    spec,
    wait_placed,
)

# ------------------------------------------------------------------------ store contract


@pytest.fixture(params=["memory", *REAL_STORES])
async def store(request: pytest.FixtureRequest, db_prefix: str) -> AsyncIterator[NodeStore]:
    if request.param == "memory":
        yield MemoryNodeStore()
        return
    async with store_client(request, request.param, db_prefix) as client:
        yield DocNodeStore(client[f"{db_prefix}_placement"]["nodes"])


async def test_node_store_keeps_the_latest_state_per_node_in_a_fixed_order(
    store: NodeStore,
) -> None:
    early = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    late = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    added = NodeSpec(
        name="b-added",
        cpu=2,
        memory_mb=512,
        gpus=1,
        gpu_type="A100",
        labels=[{"name": "zone", "value": "x"}],
    )
    await store.put(
        NodeRecord("z-added", "ready", NodeSpec(name="z-added", cpu=1, memory_mb=1), early)
    )
    await store.put(NodeRecord("b-added", "ready", added, late))
    await store.put(NodeRecord("n1", "drained"))
    await store.put(NodeRecord("b-added", "drained", added, late))
    records = await store.all()
    # Configured nodes' changes first, then the added ones by when they were added.
    assert [(r.name, r.state) for r in records] == [
        ("n1", "drained"),
        ("z-added", "ready"),
        ("b-added", "drained"),
    ]
    assert records[2].spec == added and records[2].added_at == late
    assert await store.get("n1") == NodeRecord("n1", "drained")
    assert await store.get("nope") is None


# ---------------------------------------------------------------------------- the service


def yard(replica: Replica, *args: str, token: str = ADMIN_TOKEN) -> Any:
    def connect(url: str | None, token_: str | None) -> Client:
        return Client(replica.url, token_)

    result = CliRunner().invoke(
        make_app(connect), ["--token", token, *args], env={"COLUMNS": "200", "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.output
    return result.output


def nodes(replica: Replica) -> dict[str, dict[str, Any]]:
    return {node["name"]: node for node in json.loads(yard(replica, "nodes", "-o", "json"))}


async def interrupts(stream: Bus, job_id: str) -> list[InterruptJob]:
    info = await stream.js.stream_info(STREAM)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await stream.js.get_msg(STREAM, seq)
        if msg.subject == "yard.cmd.interrupt":
            event = decode(msg.data or b"")
            assert isinstance(event, InterruptJob)
            if event.job_id == job_id:
                found.append(event)
    return found


async def test_nodes_added_drained_and_removed_survive_a_crash(
    replica_env: dict[str, str], bus: Bus, mongo_url: str, db_prefix: str, tmp_path: Path
) -> None:
    client = mongo_client(mongo_url)
    bob = await TokenStore(tokens_collection(client, db_prefix), None).issue("bob")
    await client.close()
    first = Replica(replica_env, tmp_path / "first.log").start()
    second: Replica | None = None
    try:
        await first.wait_leading()
        assert list(nodes(first)) == ["n1"]
        assert (
            first.http.get(
                "/v1/placement/nodes", headers={"Authorization": f"Bearer {bob}"}
            ).status_code
            == 403
        )
        out = yard(
            first,
            "nodes",
            "add",
            "--name",
            "n2",
            "--cpu",
            "4",
            "--memory-mb",
            "8000",
            "--gpus",
            "2",
            "--gpu-type",
            "V100",
            "--label",
            "zone=b",
        )
        assert "node n2 added" in out
        assert "node n1 drained" in yard(first, "nodes", "drain", "n1")
        a = "a" + uuid.uuid4().hex[:8]
        await bus.publish(JobAccepted(job_id=a, spec=spec("a")))
        assert (await wait_placed(bus, a)).tasks[0].node == "n2"  # n1 is drained
        table = yard(first, "nodes")
        assert "drained" in table and "zone=b" in table and "1/2" in table

        before = nodes(first)
        first.kill()
        second = Replica(replica_env, tmp_path / "second.log").start()
        await second.wait_leading()
        assert nodes(second) == before
        assert before["n2"]["jobs"] == [a] and before["n2"]["labels"] == {"zone": "b"}
        assert (before["n1"]["state"], before["n2"]["state"]) == ("drained", "ready")

        out = yard(second, "nodes", "remove", "n2")
        assert f"node n2 removed; interrupted 1 job(s): {a}" in out
        (interrupt,) = await interrupts(bus, a)
        assert (interrupt.attempt, interrupt.cause) == (1, InterruptCause.NODE_REMOVED)
        assert interrupt.event_id == derived_id(a, 1, "interrupt", "node_removed")
        assert "node n1 ready" in yard(second, "nodes", "undrain", "n1")
        assert {n: v["state"] for n, v in nodes(second).items()} == {"n1": "ready"}
        answer = second.http.post("/v1/placement/nodes/n9/drain")
        assert answer.status_code == 404 and "no node n9" in answer.text
        answer = second.http.post(
            "/v1/placement/nodes", json={"name": "n1", "cpu": 1, "memory_mb": 1}
        )
        assert answer.status_code == 409, answer.text
        answer = second.http.post("/v1/placement/nodes", json={"name": "x", "cpu": "lots"})
        assert answer.status_code == 422
    finally:
        for replica in (first, second):
            if replica is not None:
                replica.kill()
