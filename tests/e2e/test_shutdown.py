"""Stopping the platform leaves nothing running: its jobs' tasks stop with it and run
again at the next start (no retry spent), or, when asked, they are left running and the
next start adopts them, one process per task."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trainyard_launcher.adapters.procfs import is_alive
from trainyard_stack.platform import Platform

from .conftest import Api, platform_config

pytestmark = pytest.mark.e2e


def sleeper(name: str) -> dict:
    return {"name": name, "roles": [{"name": "w", "command": "sleep 300"}]}


def task_pid(platform: Platform, job_id: str, attempt: int) -> int:
    task = platform.data_dir / "launcher" / "jobs" / job_id / f"attempt-{attempt}" / "w-0"
    deadline = time.monotonic() + 20
    while not (task / "pid").exists():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.1)
    return int((task / "pid").read_text().split()[0])


def wait_running(api: Api, job_id: str, attempt: int) -> dict:
    deadline = time.monotonic() + 60
    view: dict = {}
    while True:
        answer = api.http.get(f"/v1/jobs/{job_id}")  # a fresh job may not be in view yet
        if answer.status_code == 200:
            view = answer.json()
            if view["state"] == "RUNNING" and view["attempt"] == attempt:
                return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


def test_stopping_the_platform_stops_the_tasks_or_keeps_them_for_adoption(
    tmp_path: Path,
) -> None:
    config = platform_config(tmp_path)
    first = Platform(config).start()
    try:
        api = Api(first.url, first.token)
        job_id = api.submit(sleeper("outlives-nothing"))
        wait_running(api, job_id, 1)
        pid = task_pid(first, job_id, 1)
    finally:
        first.stop()
    assert not is_alive(pid, None), "the task outlived the platform"

    second = Platform(config).start()
    try:
        api = Api(second.url, second.token)
        # Back, it runs again as its next attempt: a shutdown spent no retry.
        view = wait_running(api, job_id, 2)
        assert view["retries"] == 0, view
        assert [a["state"] for a in view["attempts"]][:1] != ["FAILED"], view
        kept = task_pid(second, job_id, 2)
    finally:
        second.stop(keep_tasks=True)
    assert is_alive(kept, None), "asked to keep the task, the platform stopped it"

    third = Platform(config).start()
    try:
        api = Api(third.url, third.token)
        view = wait_running(api, job_id, 2)  # the same attempt, adopted
        assert task_pid(third, job_id, 2) == kept
        time.sleep(1.0)
        running = [p for p in os.listdir("/proc") if p.isdigit() and _in_task(p, job_id)]
        assert len({_session(p) for p in running}) == 1  # one task, one process tree
        api.stop(job_id)
        assert api.wait(job_id)["state"] == "STOPPED"
    finally:
        third.stop()
    assert not is_alive(kept, None)


def _in_task(pid: str, job_id: str) -> bool:
    try:
        return job_id in os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False


def _session(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    return int(raw[raw.rfind(")") + 2 :].split()[3])
