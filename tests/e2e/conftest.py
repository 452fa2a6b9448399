"""The whole platform, every service as its own process, on real NATS and FerretDB."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from trainyard_stack.platform import Platform, PlatformConfig

TERMINAL = {"REJECTED", "SUCCEEDED", "FAILED", "STOPPED"}

# Two simulated nodes: one with two TITANX GPUs (the seed's helloworld asks for one),
# one CPU-only. The local backend runs every task on this machine either way.
CLUSTER = {
    "nodes": [
        {
            "name": "node-gpu",
            "cpu": 8,
            "memory_mb": 32768,
            "gpus": 2,
            "gpu_type": "TITANX",
            "port_range": [31000, 31999],
        },
        {"name": "node-cpu", "cpu": 8, "memory_mb": 32768, "port_range": [32000, 32999]},
    ],
    # team-a: a PAI-DLC dedicated quota's id maps to it (ResourceId).
    "queues": ["default", {"name": "team-a", "aliases": ["quota1ci8g793pgm"]}],
}


class Api:
    """A thin test client of the public API (the SDK has its own tests)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def as_token(self, token: str) -> Api:
        return Api(self.url, token)

    def submit(self, payload: dict[str, Any], **params: str) -> str:
        answer = self.http.post("/v1/jobs", json=payload, params=params)
        assert answer.status_code == 202, answer.text
        return answer.json()["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def seen(self, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The job's view once status has it: the projection trails the answer to a
        submission (under load, by more than the next request of a test)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.http.get(f"/v1/jobs/{job_id}")
            if answer.status_code != 404 or time.monotonic() > deadline:
                assert answer.status_code == 200, answer.text
                return answer.json()
            time.sleep(0.1)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        answer = self.http.get(f"/v1/jobs/{job_id}/events")
        assert answer.status_code == 200, answer.text
        return answer.json()["items"]

    def wait(
        self, job_id: str, states: set[str] = TERMINAL, timeout: float = 60.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        view: dict[str, Any] = {}
        while time.monotonic() < deadline:
            answer = self.http.get(f"/v1/jobs/{job_id}")
            if answer.status_code == 200:
                view = answer.json()
                if view["state"] in states:
                    return view
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {states} after {timeout}s: {view}")

    def stop(self, job_id: str) -> None:
        answer = self.http.post(f"/v1/jobs/{job_id}/stop")
        assert answer.status_code == 202, answer.text


def platform_config(
    root: Path, cluster: dict[str, Any] | None = None, extra_env: dict[str, str] | None = None
) -> PlatformConfig:
    """A whole platform's configuration under ``root``: its cluster file (``CLUSTER`` by
    default), free ports, and ``extra_env`` for every service."""
    cluster_file = root / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(CLUSTER if cluster is None else cluster))
    return PlatformConfig.with_free_ports(
        root / "data", cluster_file=cluster_file, log_level="WARNING", extra_env=extra_env or {}
    )


def start_platform(
    root: Path, cluster: dict[str, Any] | None = None, extra_env: dict[str, str] | None = None
) -> Platform:
    return Platform(platform_config(root, cluster, extra_env)).start()


def unique(prefix: str) -> str:
    """A new name: names stay claimed after a job ends (unique per user), and a platform
    lives for a whole module or session."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def yard(platform: Platform, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The ``yard`` CLI as a user runs it, against ``platform`` as its admin."""
    env = {**os.environ, "YARD_URL": platform.url, "YARD_TOKEN": platform.token}
    done = subprocess.run(
        [sys.executable, "-m", "trainyard_sdk", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    # The platform starts its own servers; an outer NATS_URL/MONGO_URL is honoured.
    platform = start_platform(tmp_path_factory.mktemp("platform"))
    yield platform
    platform.stop()


@pytest.fixture(scope="session")
def api(platform: Platform) -> Api:
    return Api(platform.url, platform.token)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o777)
    return tmp_path
