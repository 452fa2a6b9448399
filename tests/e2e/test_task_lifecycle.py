"""A task's life beyond its command, through the whole platform: the start deadline,
clean-up policies, capped logs followed live, and a memory limit that holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_stack.platform import Platform

from .conftest import Api, start_platform

pytestmark = pytest.mark.e2e

START_DEADLINE_S = 5
LOG_MAX_BYTES = 4096


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, Api]]:
    platform = start_platform(
        tmp_path_factory.mktemp("lifecycle-platform"),
        extra_env={
            "YARD_START_DEADLINE_S": str(START_DEADLINE_S),
            "YARD_LOG_MAX_BYTES": str(LOG_MAX_BYTES),
        },
    )
    yield platform, Api(platform.url, platform.token)
    platform.stop()


def role(command: str, memory_mb: int = 256) -> dict:
    return {
        "name": "w",
        "replicas": 1,
        "command": command,
        "resources": {"cpu": 1, "memory_mb": memory_mb},
    }


def test_a_task_still_preparing_past_the_start_deadline_fails_the_attempt(
    lifecycle: tuple[Platform, Api], tmp_path: Path
) -> None:
    _, api = lifecycle
    # A package index that accepts the connection and never answers: pip hangs.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        (tmp_path / "requirements.txt").write_text(
            f"--index-url http://127.0.0.1:{port}/simple\ntrainyard-never-there\n"
        )
        job_id = api.submit(
            {
                "name": "slow-start",
                "pip_requirements_dir": str(tmp_path),
                "roles": [role("echo never")],
            }
        )
        view = api.wait(job_id, timeout=90)
    assert view["state"] == "FAILED", view
    assert view["failure_class"] == "platform", view
    assert view["reason"].startswith(
        f"not all tasks started within {START_DEADLINE_S}s: w[0] still preparing ("
    ), view
    [task] = view["tasks"]
    assert task["state"] == "FAILED" and task["failure_class"] == "platform", task


def test_clean_up_all_removes_the_task_files_but_keeps_the_logs(
    lifecycle: tuple[Platform, Api],
) -> None:
    platform, api = lifecycle
    job_id = api.submit(
        {
            "name": "tidy",
            "cleanup_policy": "All",
            "roles": [role("echo kept; head -c 100000 /dev/zero > big")],
        }
    )
    view = api.wait(job_id, timeout=60)
    assert view["state"] == "SUCCEEDED", view
    task_dir = platform.data_dir / "launcher" / "jobs" / job_id / "attempt-1" / "w-0"
    deadline = time.monotonic() + 10  # the clean-up follows the JobFinished
    while (task_dir / "work").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(os.listdir(task_dir)) == [
        "exit.json",
        "launched",
        "pid",
        "started",
        "stderr.log",
        "stdout.log",
    ]
    assert api.http.get(f"/v1/jobs/{job_id}/logs").text == "kept\n"


def test_logs_are_followed_live_and_capped(lifecycle: tuple[Platform, Api]) -> None:
    platform, api = lifecycle
    # Python's print, not flushed by the program: the platform makes its output unbuffered.
    command = (
        'python3 -c \'import time\nfor i in range(15):\n    print("tick", i)\n'
        '    time.sleep(0.2)\n\' && head -c 20000 /dev/zero | tr "\\0" x | fold -w 99 '
        "&& echo last line"
    )
    job_id = api.submit({"name": "chatty", "roles": [role(command)]})
    env = {**os.environ, "YARD_URL": platform.url, "YARD_TOKEN": platform.token}
    follower = subprocess.Popen(
        [sys.executable, "-m", "trainyard_sdk", "logs", job_id, "-f"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    try:
        first = [follower.stdout.readline() for _ in range(3)]
        assert first == ["tick 0\n", "tick 1\n", "tick 2\n"]
        # Three lines arrived while the task still had two seconds of ticks to go.
        assert api.job(job_id)["state"] == "RUNNING"
        rest = follower.stdout.read()
        assert follower.wait(timeout=60) == 0
    finally:
        follower.kill()
    assert rest.endswith("last line\n")
    assert api.wait(job_id)["state"] == "SUCCEEDED"
    kept = api.http.get(f"/v1/jobs/{job_id}/logs").text
    assert len(kept.encode()) <= LOG_MAX_BYTES and kept.endswith("xxlast line\n")
    assert "tick 0" not in kept  # the oldest output went first


def test_a_task_past_its_memory_limit_fails_as_out_of_memory(
    lifecycle: tuple[Platform, Api],
) -> None:
    _, api = lifecycle
    job_id = api.submit(
        {
            "name": "greedy",
            "roles": [role("python3 -c 'block = bytearray(1024 * 1024 * 1024)'", memory_mb=128)],
        }
    )
    view = api.wait(job_id, timeout=60)
    assert view["state"] == "FAILED", view
    [task] = view["tasks"]
    assert task["failure_class"] == "user", task
    assert "out of memory: the task's limit of 128 MiB was reached" in task["reason"], task
