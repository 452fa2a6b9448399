"""Debug mode and `yard exec` through the whole platform: a debug job's tasks are made
ready but run no command; commands run in them (and in a normal running task) with the
task's environment; nothing of the job outlives its stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainyard_launcher.adapters.procfs import session_members
from trainyard_stack.platform import Platform

from .conftest import Api

pytestmark = pytest.mark.e2e


def yard(platform: Platform, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "YARD_URL": platform.url, "YARD_TOKEN": platform.token}
    return subprocess.run(
        [sys.executable, "-m", "trainyard_sdk", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_tasks_running(api: Api, job_id: str, count: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    view: dict = {}
    while time.monotonic() < deadline:
        answer = api.http.get(f"/v1/jobs/{job_id}")
        if answer.status_code == 404:  # status has not seen the submission yet
            time.sleep(0.2)
            continue
        assert answer.status_code == 200, answer.text
        view = answer.json()
        running = [t for t in view.get("tasks") or [] if t["state"] == "RUNNING"]
        if len(running) == count:
            return view
        assert view["state"] not in ("FAILED", "SUCCEEDED", "STOPPED"), view
        time.sleep(0.2)
    raise AssertionError(f"tasks of {job_id} not running: {view}")


def wrapper_pids(platform: Platform, job_id: str) -> list[int]:
    attempt = platform.data_dir / "launcher" / "jobs" / job_id / "attempt-1"
    return [int((task / "pid").read_text().split()[0]) for task in sorted(attempt.iterdir())]


def exec_(api: Api, job_id: str, role: str, index: int, command: object) -> tuple[int, dict]:
    answer = api.http.post(
        f"/v1/jobs/{job_id}/tasks/{role}/{index}/exec", json={"command": command, "timeout_s": 30}
    )
    return answer.status_code, answer.json()


def test_a_debug_job_is_ready_but_runs_no_command_and_exec_runs_in_it(
    platform: Platform, api: Api, out_dir: Path
) -> None:
    spec = {
        "name": "debug-me",
        "run_mode": "debug",
        "env": [{"name": "OUT", "value": str(out_dir)}, {"name": "MODEL", "value": "tiny"}],
        "roles": [
            {
                "name": "w",
                "replicas": 2,
                "command": 'echo ran > "$OUT/ran-$TRAINYARD_INDEX"',
                "resources": {"cpu": 1, "memory_mb": 256},
            }
        ],
    }
    job_id = api.submit(spec)
    view = wait_tasks_running(api, job_id, 2)
    assert view["state"] == "RUNNING"
    assert all(t["reason"].startswith("debug mode: command not run") for t in view["tasks"]), view
    time.sleep(1)
    assert list(out_dir.iterdir()) == []  # the command never ran

    done = yard(
        platform,
        "exec",
        job_id,
        "w",
        "1",
        "--",
        "bash",
        "-c",
        'echo "$MODEL $TRAINYARD_INDEX $PAI_JOB_NAME $(basename $PWD)"; exit 3',
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "tiny 1 debug-me work\n"
    # The same command, by hand: the task's own command runs when a person says so.
    status, answer = exec_(api, job_id, "w", 0, "bash $PWD/../command.sh && cat $OUT/ran-0")
    assert (status, answer["exit_code"], answer["stdout"]) == (200, 0, "ran\n"), answer

    assert exec_(api, job_id, "w", 5, ["true"])[0] == 404
    bob = api.http.post("/v1/tokens", json={"user": "bob-debug"}).json()["token"]
    assert (
        api.as_token(bob)
        .http.post(f"/v1/jobs/{job_id}/tasks/w/0/exec", json={"command": ["true"]})
        .status_code
        == 404
    )

    pids = wrapper_pids(platform, job_id)
    api.stop(job_id)
    assert api.wait(job_id)["state"] == "STOPPED"
    assert all(session_members(pid) == [] for pid in pids)  # keep-alives included
    status, answer = exec_(api, job_id, "w", 0, ["true"])
    assert status == 409 and "not RUNNING" in answer["detail"], answer


def test_exec_in_a_running_normal_task(platform: Platform, api: Api) -> None:
    job_id = api.submit(
        {
            "jobName": "exec-normal",
            "image": "x",
            "taskRoles": [
                {
                    "name": "main",
                    "taskNumber": 1,
                    "cpuNumber": 1,
                    "memoryMB": 128,
                    "gpuNumber": 0,
                    "command": "echo started > here; sleep 300",
                }
            ],
        }
    )
    wait_tasks_running(api, job_id, 1)
    deadline = time.monotonic() + 30
    while True:
        done = yard(platform, "exec", job_id, "main", "0", "--", "cat", "here")
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (done.returncode, done.stdout) == (0, "started\n"), done.stderr
    missing = yard(platform, "exec", job_id, "main", "0", "--", "no-such-command-here")
    assert missing.returncode == 127
    api.stop(job_id)
    view = api.wait(job_id)
    assert view["state"] == "STOPPED"
    assert json.loads(yard(platform, "get", job_id, "-o", "json").stdout)["state"] == "STOPPED"
