"""SIGKILL each service in turn while jobs are in flight, restart it, and every job still
ends exactly once: no duplicate task launch, no duplicate history row."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_stack.platform import SERVICES, Platform

from .conftest import Api, start_platform

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def crash_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(tmp_path_factory.mktemp("crash"))
    yield platform
    platform.stop()


def job(name: str, out_dir: Path, seconds: float) -> dict:
    launch = f'echo launched >> "{out_dir}/$TRAINYARD_JOB_ID-$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"'
    return {
        "jobName": name,
        "image": "x",
        "taskRoles": [
            {
                "name": "w",
                "taskNumber": 2,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": f"{launch} && sleep {seconds}",
            }
        ],
    }


def test_every_job_ends_exactly_once_through_service_crashes(
    crash_platform: Platform, out_dir: Path
) -> None:
    api = Api(crash_platform.url, crash_platform.token)
    jobs: list[str] = []
    counter = 0

    def submit(n: int) -> None:
        nonlocal counter
        for _ in range(n):
            counter += 1
            jobs.append(api.submit(job(f"crash-{counter}", out_dir, 1.5)))

    submit(4)
    for name in SERVICES:
        if name in ("intake", "gateway"):
            # The front door: while it is down nothing can be submitted; jobs already in
            # flight go on behind it.
            crash_platform.kill_service(name)
            time.sleep(0.5)
            crash_platform.restart_service(name)
            submit(2)
            continue
        submit(2)
        time.sleep(0.4)  # let those jobs get into this service's hands
        crash_platform.kill_service(name)
        submit(2)  # published while the service is down: it must catch up
        time.sleep(1.0)
        crash_platform.restart_service(name)

    for job_id in jobs:
        view = api.wait(job_id, timeout=120)
        assert view["state"] == "SUCCEEDED", view

    for job_id in jobs:
        for index in (0, 1):
            launches = (out_dir / f"{job_id}-w-{index}").read_text().splitlines()
            assert launches == ["launched"], f"{job_id} task {index} launched {len(launches)} times"
        history = settled_history(api, job_id)
        counts = collections.Counter(h["type"] for h in history)
        assert counts["JobSubmitted"] == counts["JobAccepted"] == counts["JobPlaced"] == 1, counts
        assert counts["JobFinished"] == 1, counts
        transitions = [
            (h["event"]["role"], h["event"]["index"], h["event"]["seq"])
            for h in history
            if h["type"] == "TaskStateChanged"
        ]
        assert len(transitions) == len(set(transitions)) == 6, transitions
        assert len({h["event_id"] for h in history}) == len(history)


def settled_history(
    api: Api, job_id: str, transitions: int = 6, timeout: float = 90.0
) -> list[dict]:
    """The job's history once every event has reached status. Messages a killed
    consumer had fetched but not acked come back only after JetStream's ack wait
    (30 s), so the job view can be final while a few history rows are still on their
    way: wait for them (and fail if more than expected ever arrive)."""
    deadline = time.monotonic() + timeout
    history = api.events(job_id)
    while time.monotonic() < deadline and (
        sum(h["type"] == "TaskStateChanged" for h in history) < transitions
        or not any(h["type"] == "JobFinished" for h in history)
    ):
        time.sleep(0.5)
        history = api.events(job_id)
    return history
