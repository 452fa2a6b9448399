"""`yard admin rebuild`: the job views read again from the stream equal the live ones;
a view damaged behind the platform's back is found, and repaired with --apply."""

from __future__ import annotations

import asyncio
import json

from trainyard_stack.platform import Platform

from .conftest import Api, unique, yard


def job(command: str) -> dict:
    return {
        "name": unique("rebuilt"),
        "roles": [{"name": "w", "command": command, "resources": {"cpu": 1, "memory_mb": 128}}],
    }


def damage(platform: Platform, job_id: str) -> None:
    """What a bad upgrade or a hand edit could leave: a wrong state, a lost task."""

    async def run() -> None:
        client = platform.store_client()
        try:
            db = client[f"{platform.config.db_prefix}_status"]
            result = await db["jobs"].update_one({"_id": job_id}, {"$set": {"state": "RUNNING"}})
            assert result.modified_count == 1
            task = await db["tasks"].find_one({"job_id": job_id})
            assert task is not None
            assert (await db["tasks"].delete_one({"_id": task["_id"]})).deleted_count == 1
        finally:
            await client.close()

    asyncio.run(run())


def test_the_views_rebuilt_from_the_stream_equal_the_live_ones_and_repair_them(
    platform: Platform, api: Api
) -> None:
    ok, failed = api.submit(job("true")), api.submit(job("exit 3"))
    assert api.wait(ok)["state"] == "SUCCEEDED" and api.wait(failed)["state"] == "FAILED"
    before = api.job(failed)

    check = yard(platform, "admin", "rebuild")
    assert "the live views are what the stream says" in check.stdout, check.stdout
    assert "job(s)" in check.stdout

    damage(platform, failed)
    assert api.job(failed)["state"] == "RUNNING"
    found = yard(platform, "admin", "rebuild", "-o", "json", check=False)
    assert found.returncode == 1
    report = json.loads(found.stdout)
    assert report["different"] == 2, report
    assert {(d["collection"], d["difference"]) for d in report["differences"]} == {
        ("jobs", "differs"),
        ("tasks", "missing"),
    }
    repaired = yard(platform, "admin", "rebuild", "--apply")
    assert "2 document(s) repaired" in repaired.stdout
    after = api.job(failed)
    assert after["state"] == "FAILED" and after["tasks"] == before["tasks"]
    assert "the live views are what the stream says" in yard(platform, "admin", "rebuild").stdout
