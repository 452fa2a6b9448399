"""Everything lives under one data directory: stop the whole platform, start it again on
the same directory, and the history is still there and new jobs still run."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard_stack.platform import Platform

from .conftest import Api, platform_config

pytestmark = pytest.mark.e2e


def small_job(name: str) -> dict:
    return {
        "jobName": name,
        "image": "x",
        "taskRoles": [
            {
                "name": "t",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": "echo $PAI_JOB_NAME",
            }
        ],
    }


def test_a_restart_keeps_history(tmp_path: Path) -> None:
    config = platform_config(tmp_path)
    with Platform(config) as first:
        api = Api(first.url, first.token)
        before = api.submit(small_job("before-restart"))
        assert api.wait(before)["state"] == "SUCCEEDED"
        history = api.events(before)
    token_file = (tmp_path / "data" / "admin-token").read_text().strip()
    with Platform(config) as second:
        assert second.token == token_file == first.token  # the CLI's token still works
        api = Api(second.url, second.token)
        assert api.job(before)["state"] == "SUCCEEDED"
        assert api.events(before) == history
        logs = api.http.get(f"/v1/jobs/{before}/logs")
        assert logs.text.strip() == "before-restart"
        after = api.submit(small_job("after-restart"))
        assert api.wait(after)["state"] == "SUCCEEDED"
        # OpenPAI: a name is unique per user, across restarts too (answered at once).
        again = api.http.post("/v1/jobs", json=small_job("before-restart"))
        assert again.status_code == 409 and before in again.json()["detail"]
