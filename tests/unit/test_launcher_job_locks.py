"""The launcher's per-job locks: one holder at a time, and nothing kept for a job once
no one holds or waits for its lock (a lock per job ever seen was a slow leak)."""

from __future__ import annotations

import asyncio

import pytest

from trainyard_launcher.handlers.common import JobLock, JobLocks


class Registry:
    """What ``Deps`` holds: the locks, and ``lock(job_id)`` to take one."""

    def __init__(self) -> None:
        self.locks = JobLocks()

    def lock(self, job_id: str) -> JobLock:
        return JobLock(self.locks, job_id)


async def test_one_holder_at_a_time_and_nothing_kept_after() -> None:
    d = Registry()
    order: list[str] = []

    async def work(name: str) -> None:
        async with d.lock("job-1"):
            order.append(f"{name} in")
            await asyncio.sleep(0.01)
            order.append(f"{name} out")

    first = asyncio.create_task(work("a"))
    await asyncio.sleep(0)
    assert d.lock("job-1").locked() and not d.lock("job-2").locked()
    second = asyncio.create_task(work("b"))
    await asyncio.sleep(0)
    # Released by a, granted to b but not yet running: still held, still kept.
    await first
    assert len(d.locks) == 1
    await second
    assert order == ["a in", "a out", "b in", "b out"]
    assert len(d.locks) == 0 and not d.lock("job-1").locked()


async def test_a_waiter_cancelled_leaves_nothing_behind() -> None:
    d = Registry()
    release = asyncio.Event()

    async def hold() -> None:
        async with d.lock("job-1"):
            await release.wait()

    async def wait() -> None:
        async with d.lock("job-1"):
            raise AssertionError("never granted")

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await holder
    assert len(d.locks) == 0


async def test_a_failure_inside_releases_the_lock() -> None:
    d = Registry()
    with pytest.raises(RuntimeError):
        async with d.lock("job-1"):
            raise RuntimeError("boom")
    assert len(d.locks) == 0
    async with d.lock("job-1"):  # and can be taken again
        assert d.lock("job-1").locked()
