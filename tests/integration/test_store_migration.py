"""An earlier version's data moves from the MongoDB wire (its embedded FerretDB) into the
embedded SQLite store whole, and the services' adapters read it there as they wrote it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.contracts import example_events
from trainyard_common.docstore import SqliteClient
from trainyard_common.storage import mongo_client
from trainyard_intake.adapters.owners import DocOwnerRegistry
from trainyard_stack.cli import main as stack_main
from trainyard_stack.migrate import copy_databases
from trainyard_status.adapters.views import JobViews
from trainyard_status.domain.projection import project

from ..support.stores import store_client


async def test_every_database_of_the_prefix_is_copied_once(
    request: pytest.FixtureRequest, db_prefix: str, tmp_path: Path
) -> None:
    async with store_client(request, "mongo", db_prefix) as old:
        owners = DocOwnerRegistry(old[f"{db_prefix}_intake"]["owners"])
        await owners.record("job-1", "alice", "alice~train")
        token = await TokenStore(tokens_collection(old, db_prefix), None).issue("alice")
        views = JobViews(old[f"{db_prefix}_status"])
        events = example_events()
        for seq, event in enumerate(events, 1):
            await views.record(event, seq, None)
            await views.apply(project(event))
        job_id = events[0].job_id
        before = (await views.get_job(job_id), await views.job_tasks(job_id))
        history = await views.history(job_id)
        await old["other_db"]["x"].insert_one({"_id": "not ours"})

        new = SqliteClient(tmp_path / "store")
        report = await copy_databases(old, new, db_prefix)  # type: ignore[arg-type]
        again = await copy_databases(old, new, db_prefix)  # type: ignore[arg-type]
        await old.drop_database("other_db")

    assert report[f"{db_prefix}_intake.owners"] == (1, 1)
    assert report[f"{db_prefix}_status.events"] == (len(events), len(events))
    assert all(written == 0 for _, written in again.values()), again
    assert not any(name.startswith("other_db") for name in report)
    assert await DocOwnerRegistry(new[f"{db_prefix}_intake"]["owners"]).owner("job-1") == "alice"
    assert await TokenStore(tokens_collection(new, db_prefix), None).resolve(token) is not None
    moved = JobViews(new[f"{db_prefix}_status"])  # type: ignore[arg-type]
    await moved.ensure_indexes()
    assert (await moved.get_job(job_id), await moved.job_tasks(job_id)) == before
    assert await moved.history(job_id) == history
    await new.close()


def test_the_command_refuses_a_running_platform_and_a_missing_source(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "platform.json").write_text("{}")
    assert stack_main(["migrate-store", "--data-dir", str(tmp_path)]) == 1
    (tmp_path / "run" / "platform.json").unlink()
    assert stack_main(["migrate-store", "--data-dir", str(tmp_path)]) == 1


def test_the_command_copies_from_a_url(db_prefix: str, tmp_path: Path, mongo_url: str) -> None:
    async def write() -> None:
        old = mongo_client(mongo_url)
        await DocOwnerRegistry(old[f"{db_prefix}_intake"]["owners"]).record("j9", "bob")
        await old.close()

    async def read() -> str | None:
        new = SqliteClient(tmp_path / "store")
        try:
            return await DocOwnerRegistry(new[f"{db_prefix}_intake"]["owners"]).owner("j9")
        finally:
            await new.close()
            old = mongo_client(mongo_url)
            await old.drop_database(f"{db_prefix}_intake")
            await old.close()

    asyncio.run(write())
    args = ["migrate-store", "--data-dir", str(tmp_path), "--from", mongo_url]
    assert stack_main([*args, "--db-prefix", db_prefix]) == 0
    assert asyncio.run(read()) == "bob"
