"""The `yard` CLI against the real platform, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainyard_stack.platform import Platform

from .conftest import Api, yard

pytestmark = pytest.mark.e2e


def test_submit_yaml_wait_get_events_logs(platform: Platform, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "jobName": "cli-job",
                "image": "x",
                "taskRoles": [
                    {
                        "name": "main",
                        "taskNumber": 1,
                        "cpuNumber": 1,
                        "memoryMB": 128,
                        "gpuNumber": 0,
                        "command": "echo hello from $PAI_JOB_NAME",
                    }
                ],
            }
        )
    )
    job_id = yard(platform, "submit", str(job), "--wait").stdout.strip().splitlines()[0]
    view = json.loads(yard(platform, "get", job_id, "-o", "json").stdout)
    assert view["id"] == job_id and view["state"] == "SUCCEEDED"
    table = yard(platform, "get", job_id).stdout
    assert "SUCCEEDED" in table and "main" in table
    assert f"\n{job_id[:8]}\t" in yard(platform, "ls").stdout  # short ids in tables
    assert job_id in yard(platform, "ls", "-o", "wide").stdout
    events = yard(platform, "events", job_id).stdout
    assert "JobSubmitted" in events and "JobFinished" in events
    assert (
        yard(platform, "logs", job_id, "--role", "main", "--index", "0").stdout.strip()
        == "hello from cli-job"
    )


def test_stop_from_the_cli_and_follow_logs_to_the_end(platform: Platform, tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "jobName": "cli-stop",
                "image": "x",
                "taskRoles": [
                    {
                        "name": "main",
                        "taskNumber": 1,
                        "cpuNumber": 1,
                        "memoryMB": 128,
                        "gpuNumber": 0,
                        "command": "echo started; sleep 300",
                    }
                ],
            }
        )
    )
    job_id = yard(platform, "submit", str(job)).stdout.strip()
    env = {**os.environ, "YARD_URL": platform.url, "YARD_TOKEN": platform.token}
    follower = subprocess.Popen(
        [sys.executable, "-m", "trainyard_sdk", "logs", job_id, "-f"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    assert follower.stdout.readline().strip() == "started"  # streamed live, before the end
    yard(platform, "stop", job_id)
    follower.wait(timeout=30)  # the followed log ends with the task
    # The log ends when the task does; the job's state follows once the status service
    # has the launcher's event (eventually consistent, as OpenPAI's STOPPING → STOPPED).
    Api(platform.url, platform.token).wait(job_id, timeout=30)
    assert json.loads(yard(platform, "get", job_id, "-o", "json").stdout)["state"] == "STOPPED"
    failed = yard(platform, "get", "no-such-job", check=False)
    assert failed.returncode == 1 and "no job" in failed.stderr.lower()


def test_validate_from_the_cli(platform: Platform, tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "jobName": "cli-validate",
                "image": "x",
                "taskRoles": [
                    {
                        "name": "main",
                        "taskNumber": 1,
                        "cpuNumber": 1,
                        "memoryMB": 50,
                        "gpuNumber": 0,
                        "command": "true",
                    }
                ],
            }
        )
    )
    done = yard(platform, "validate", str(job), check=False)
    assert done.returncode == 1 and "$.taskRoles[0].memoryMB" in done.stdout
    job.write_text(job.read_text().replace('"memoryMB": 50', '"memoryMB": 500'))
    assert "valid openpai job" in yard(platform, "validate", str(job)).stdout


def test_get_and_ls_watch_follow_changes_as_they_happen(platform: Platform) -> None:
    import time
    import uuid

    from .conftest import Api

    api = Api(platform.url, platform.token)
    env = {**os.environ, "YARD_URL": platform.url, "YARD_TOKEN": platform.token}
    lister = subprocess.Popen(
        [sys.executable, "-m", "trainyard_sdk", "ls", "-w", "-n", "3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(2)  # the list printed, the watch connected
        name = f"watched-{uuid.uuid4().hex[:8]}"
        job = api.submit(
            {
                "name": name,
                "roles": [
                    {"name": "w", "command": "sleep 2", "resources": {"cpu": 1, "memory_mb": 128}}
                ],
            }
        )
        got = yard(platform, "get", "-w", job)
        # The job first, then a line per change, the last one its end.
        assert f"{job}" in got.stdout
        lines = [line for line in got.stdout.splitlines() if line.strip()]
        assert "SUCCEEDED" in lines[-1], got.stdout
        assert any("RUNNING" in line for line in lines), got.stdout
    finally:
        time.sleep(1.5)
        lister.terminate()
        out, _ = lister.communicate(timeout=10)
    changes = [line for line in out.splitlines() if job in line]
    assert any("SUCCEEDED" in line for line in changes), out
    assert any(name in line for line in changes), out


def test_short_ids_names_why_and_queue_against_the_platform(platform: Platform) -> None:
    import uuid

    from .conftest import Api

    api = Api(platform.url, platform.token)
    name = f"named-{uuid.uuid4().hex[:8]}"
    job = api.submit(
        {
            "name": name,
            "roles": [
                {"name": "w", "command": "exit 4", "resources": {"cpu": 1, "memory_mb": 128}}
            ],
        }
    )
    api.wait(job)
    by_short = json.loads(yard(platform, "get", job[:8], "-o", "json").stdout)
    assert by_short["id"] == job
    why = yard(platform, "why", name).stdout
    assert f"{name} is FAILED" in why and "exit code 4" in why
    listed = yard(platform, "ls", "-n", "50").stdout.splitlines()
    assert any(line.startswith(job[:8] + "\t") and name in line for line in listed)
    assert yard(platform, "queue").returncode == 0
    assert yard(platform, "--version").stdout.startswith("yard ")
