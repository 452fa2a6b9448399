"""Job preparation through the whole platform: a native JobSpec with a code source (a
local git repository), a data source (a local directory) and a pip package (a local
wheel, installed offline through YARD_PIP_ARGS) runs a script from its checkout that
imports the package and reads the data; a job past max_running_minutes is stopped."""

from __future__ import annotations

import os
import subprocess
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Api, start_platform

pytestmark = pytest.mark.e2e


def write_wheel(directory: Path, name: str, body: str) -> None:
    dist = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": body,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{name}-0.1-py3-none-any.whl", "w") as whl:
        for member, text in files.items():
            whl.writestr(member, text)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    os.chmod(directory, 0o755)  # a package index: the tasks' users list it
    write_wheel(directory, "tyyard_e2e", "def greet(who):\n    return f'hello {who}'\n")
    return directory


@pytest.fixture(scope="module")
def prep_api(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[Api]:
    platform = start_platform(
        tmp_path_factory.mktemp("prep-platform"),
        extra_env={
            "YARD_PIP_ARGS": f"--no-index --find-links {wheels}",
            "YARD_LAUNCHER_MINUTE_S": "1",
        },
    )
    yield Api(platform.url, platform.token)
    platform.stop()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "--quiet", "--initial-branch", "main")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (path / "train.py").write_text(
        "import os, sys, tyyard_e2e\n"
        "rows = open(os.path.join(sys.argv[1], 'rows.csv')).read().split()\n"
        "print(tyyard_e2e.greet('trainyard'), len(rows), 'rows', os.environ['TRAINYARD_CODE_DIR'])\n"
    )
    git("add", ".")
    git("commit", "--quiet", "-m", "train")
    git("branch", "release")
    return path


def test_a_job_with_code_data_and_packages_runs(prep_api: Api, repo: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.csv").write_text("a\nb\nc\n")
    code_at = f"/opt/trainyard-e2e-{uuid.uuid4().hex[:8]}/code"
    spec = {
        "name": "prepared",
        "kind": "generic",
        "code_source": {"repo": str(repo), "branch": "release", "mount_path": code_at},
        "data_sources": [{"source": f"file://{data}", "mount_path": "/mnt/trainyard-e2e-data"}],
        "pip_packages": ["tyyard_e2e"],
        "roles": [
            {
                "name": "trainer",
                "replicas": 1,
                "command": f"python {code_at}/train.py /mnt/trainyard-e2e-data",
                "resources": {"cpu": 1, "memory_mb": 256},
            }
        ],
    }
    job_id = prep_api.submit(spec)
    view = prep_api.wait(job_id, timeout=120)
    stderr = prep_api.http.get(f"/v1/jobs/{job_id}/logs", params={"stream": "stderr"}).text
    assert view["state"] == "SUCCEEDED", (view, stderr)
    logs = prep_api.http.get(f"/v1/jobs/{job_id}/logs").text
    assert logs == f"hello trainyard 3 rows {code_at}\n"
    assert "trainyard prepare: $ git clone" in stderr


def test_a_job_past_its_maximum_running_time_fails(prep_api: Api) -> None:
    spec = {
        "name": "too-long",
        "max_running_minutes": 2,
        "roles": [
            {
                "name": "sleeper",
                "replicas": 2,
                "command": "sleep 300",
                "resources": {"cpu": 1, "memory_mb": 128},
            }
        ],
    }
    job_id = prep_api.submit(spec)
    # Two "minutes" of one second each (YARD_LAUNCHER_MINUTE_S).
    view = prep_api.wait(job_id, timeout=60)
    assert view["state"] == "FAILED", view
    assert view["reason"] == "exceeded its maximum running time of 2 minutes", view


def test_an_unreachable_data_source_is_refused_at_its_field(prep_api: Api) -> None:
    # It was accepted and every task failed at its start: refused on submission now.
    spec = {
        "name": "oss-data",
        "data_sources": [{"source": "oss://bucket/x/", "mount_path": "/mnt/x"}],
        "roles": [{"name": "t", "command": "true", "resources": {"cpu": 1, "memory_mb": 128}}],
    }
    answer = prep_api.http.post("/v1/jobs", json=spec)
    assert answer.status_code == 202, answer.text
    assert answer.json()["state"] == "REJECTED"
    [error] = answer.json()["errors"]
    assert (error["path"], error["code"]) == ("$.data_sources[0]", "unsupported_source")
    assert "'oss://bucket/x/'" in error["message"]
    view = prep_api.wait(answer.json()["id"], timeout=60)
    assert view["state"] == "REJECTED" and "oss://bucket/x/" in view["reason"], view


def test_a_dlc_job_from_the_official_sdk_gets_its_code_data_and_libs(
    prep_api: Api, repo: Path, tmp_path: Path
) -> None:
    """The DLC seed's pattern end to end: a code source and a data source registered
    first, CreateJob naming them by id with ThirdpartyLibs, and the UserCommand running
    the checked-out script against the mounted data with the library installed."""
    from alibabacloud_pai_dlc20201203 import models as dlc
    from alibabacloud_pai_dlc20201203.client import Client
    from alibabacloud_tea_openapi.utils_models import Config

    from .test_dialect_dlc import call, wait_for

    key = prep_api.http.post("/v1/access-keys", json={"user": "dlc-prep"}).json()
    client = Client(
        Config(
            access_key_id=key["AccessKeyId"],
            access_key_secret=key["AccessKeySecret"],
            endpoint=prep_api.url.split("://", 1)[1],
            protocol="http",
        )
    )
    data = tmp_path / "nas1"
    data.mkdir()
    (data / "rows.csv").write_text("1\n2\n")
    suffix = uuid.uuid4().hex[:8]
    ds = call(
        client,
        "CreateDataSource",
        "POST",
        "/api/v1/datasources",
        {
            "DataSourceType": "local",
            "DisplayName": "nas1",
            "Path": str(data),
            "MountPath": f"/root/data/nas1-{suffix}",
        },
    )
    cs = call(
        client,
        "CreateCodeSource",
        "POST",
        "/api/v1/codesources",
        {
            "DisplayName": "train",
            "CodeRepo": str(repo),
            "CodeBranch": "release",
            "MountPath": f"/root/code/train-{suffix}",
        },
    )
    created = client.create_job(
        dlc.CreateJobRequest(
            display_name="dlc-prepared",
            job_type="PyTorchJob",
            job_specs=[
                dlc.JobSpec(
                    type="Worker",
                    image="python:3.11",
                    pod_count=1,
                    resource_config=dlc.ResourceConfig(cpu="1", memory="1Gi"),
                )
            ],
            user_command=f"python /root/code/train-{suffix}/train.py /root/data/nas1-{suffix}",
            data_sources=[dlc.CreateJobRequestDataSources(data_source_id=ds["DataSourceId"])],
            code_source=dlc.CreateJobRequestCodeSource(code_source_id=cs["CodeSourceId"]),
            thirdparty_libs=["tyyard_e2e"],
        )
    ).body
    job = wait_for(
        client,
        created.job_id,
        lambda b: b.status in {"Succeeded", "Failed", "Stopped"},
        timeout=120,
    )
    pod = job.pods[0].pod_id
    logs = client.get_pod_logs(created.job_id, pod, dlc.GetPodLogsRequest()).body.logs
    assert job.status == "Succeeded", (job.reason_message, logs)
    assert any(f"hello trainyard 2 rows /root/code/train-{suffix}" in line for line in logs), logs
