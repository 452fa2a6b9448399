"""The pure preparation plan: mounts, checkout, the job's virtualenv, unsupported
sources, the run deadline and the debug environment dump."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainyard_common.jobspec import CodeSource, DataSource, JobSpec, RoleSpec
from trainyard_launcher.domain.prepare import (
    Checkout,
    Mount,
    PipInstall,
    PlanProblem,
    PreparePlan,
    deadline_reason,
    debug_env_text,
    debug_reason,
    local_path,
    needs_preparation,
    plan_preparation,
    prepared_env,
    run_deadline,
)

TASK = "/data/launcher/jobs/j1/attempt-1/worker-0"
JOB = "/data/launcher/jobs/j1"


def spec(**fields: object) -> JobSpec:
    return JobSpec(name="j", roles=[RoleSpec(name="worker", command="true")], **fields)


def plan(**fields: object) -> PreparePlan:
    result = plan_preparation(spec(**fields), TASK, JOB, attempt=2, pip_args=("--no-index",))
    assert isinstance(result, PreparePlan), result
    return result


def test_nothing_to_prepare() -> None:
    assert not needs_preparation(spec())
    assert plan_preparation(spec(), TASK, JOB) is None


def test_code_source_is_cloned_into_the_task_and_shown_at_its_mount_path() -> None:
    p = plan(
        code_source=CodeSource(
            repo="https://git/x.git", branch="dev", commit="abc", mount_path="/root/code/"
        )
    )
    dest = f"{TASK}/mounts/root/code"
    assert p.checkout == Checkout(repo="https://git/x.git", dest=dest, branch="dev", commit="abc")
    assert p.mounts == (Mount("/root/code", dest, "code source"),)
    assert p.outside_mounts == p.mounts
    assert dict(p.env) == {"TRAINYARD_CODE_DIR": "/root/code"}
    assert p.pip is None


def test_a_relative_mount_path_is_in_the_working_directory_and_needs_no_namespace() -> None:
    p = plan(
        code_source=CodeSource(repo="/src/repo", mount_path="code"),
        data_sources=[DataSource(source="/datasets/a", mount_path="./in/../data")],
    )
    assert p.checkout is not None and p.checkout.dest == f"{TASK}/work/code"
    assert p.mounts == (
        Mount(f"{TASK}/work/code", f"{TASK}/work/code", "code source"),
        Mount(f"{TASK}/work/data", "/datasets/a", "data_sources[0]"),
    )
    assert p.outside_mounts == ()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/datasets/mnist/", "/datasets/mnist"),
        ("file:///datasets/mnist", "/datasets/mnist"),
        ("file://localhost/datasets/a/../b", "/datasets/b"),
    ],
)
def test_local_data_sources(source: str, expected: str) -> None:
    assert local_path(source) == expected
    p = plan(data_sources=[DataSource(source=source, mount_path="/mnt/data")])
    assert p.mounts == (Mount("/mnt/data", expected, "data_sources[0]"),)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("oss://bucket/path/", "nothing is fetched from elsewhere (oss://)"),
        ("nas://fs-1/dir", "nothing is fetched from elsewhere (nas://)"),
        ("S3://bucket/key", "nothing is fetched from elsewhere (s3://)"),
        ("file://otherhost/data", "otherhost is another machine"),
        ("d-abc123", "not a path (a relative path or a data source's id)"),
        ("pvc://claim", "a PersistentVolumeClaim is mounted on Kubernetes only"),
    ],
)
def test_sources_the_local_backend_cannot_reach(source: str, reason: str) -> None:
    result = plan_preparation(
        spec(
            data_sources=[
                DataSource(source="/ok", mount_path="/a"),
                DataSource(source=source, mount_path="/b"),
            ]
        ),
        TASK,
        JOB,
    )
    assert isinstance(result, PlanProblem)
    assert result.reason.startswith(f"data_sources[1].source: data source {source!r}: ")
    assert reason in result.reason


@pytest.mark.parametrize("covering", ["/", "/data/launcher/jobs", "TASK"])
def test_a_mount_path_that_would_cover_the_tasks_own_directory_is_refused(covering: str) -> None:
    # Over an ancestor of the task's directory, the user's files would stand where the
    # view's builder (root) writes the task's records.
    where = TASK if covering == "TASK" else covering
    result = plan_preparation(
        spec(data_sources=[DataSource(source="/d", mount_path=where)]), TASK, JOB
    )
    assert result == PlanProblem(
        f"data_sources[0]: the mount path {where} would cover the task's own directory {TASK}"
    )


def test_two_sources_at_one_mount_path() -> None:
    result = plan_preparation(
        spec(
            code_source=CodeSource(repo="/r", mount_path="/work/x/"),
            data_sources=[DataSource(source="/d", mount_path="/work/x")],
        ),
        TASK,
        JOB,
    )
    assert result == PlanProblem(
        "two sources are mounted at /work/x (data_sources[0] and code source)"
    )


def test_pip_packages_go_into_the_jobs_virtualenv() -> None:
    p = plan(pip_packages=["numpy==1.26", "tqdm"])
    assert p.pip == PipInstall(
        venv=f"{JOB}/venv",
        lock=f"{JOB}/venv.lock",
        packages=("numpy==1.26", "tqdm"),
        pip_args=("--no-index",),
        attempt=2,
    )
    assert dict(p.env) == {"VIRTUAL_ENV": f"{JOB}/venv"}
    other = plan(pip_packages=["numpy==1.26"])
    assert p.pip is not None and other.pip is not None and p.pip.digest != other.pip.digest


def test_requirements_inside_the_code_mount_are_read_from_the_checkout() -> None:
    p = plan(
        code_source=CodeSource(repo="/r", mount_path="/root/code"),
        pip_requirements_dir="/root/code/deps",
    )
    assert p.pip is not None
    assert p.pip.requirements == f"{TASK}/mounts/root/code/deps/requirements.txt"
    outside = plan(pip_requirements_dir="/opt/reqs/")
    assert outside.pip is not None and outside.pip.requirements == "/opt/reqs/requirements.txt"


def test_the_plan_survives_its_file() -> None:
    p = plan(
        code_source=CodeSource(repo="/r", branch="b", mount_path="/c"),
        data_sources=[DataSource(source="/d", mount_path="/m")],
        pip_packages=["x"],
    )
    assert PreparePlan.from_json(p.to_json()) == p


def test_prepared_env_puts_the_virtualenv_first_on_path() -> None:
    p = plan(pip_packages=["x"], code_source=CodeSource(repo="/r", mount_path="/c"))
    env = prepared_env({"PATH": "/usr/bin:/bin", "HOME": "/root"}, p)
    assert env == {
        "PATH": f"{JOB}/venv/bin:/usr/bin:/bin",
        "HOME": "/root",
        "VIRTUAL_ENV": f"{JOB}/venv",
        "TRAINYARD_CODE_DIR": "/c",
    }
    assert prepared_env({"PATH": "/bin"}, None) == {"PATH": "/bin"}


def test_run_deadline() -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    assert run_deadline(None, start) is None
    assert run_deadline(0, start) is None
    assert run_deadline(5, None) is None
    assert run_deadline(5, start) == start + timedelta(minutes=5)
    assert run_deadline(5, start, minute_s=0.5) == start + timedelta(seconds=2.5)
    assert deadline_reason(5) == "exceeded its maximum running time of 5 minutes"
    assert deadline_reason(1) == "exceeded its maximum running time of 1 minute"


def test_debug_env_masks_secrets_and_can_be_sourced() -> None:
    text = debug_env_text(
        {
            "B": "it's",
            "DB_PASSWORD": "hunter2",
            "AWS_SECRET_ACCESS_KEY": "k",
            "URL": "u:pw1@h",
            "MONKEY": "banana",
            "SSH_KEY_PATH": "/k",
        },
        ["pw1", ""],
    )
    assert text.splitlines() == [
        "# The environment of a failed task (secrets masked); `source` it to re-run.",
        "export AWS_SECRET_ACCESS_KEY='******'",
        "export B='it'\"'\"'s'",
        "export DB_PASSWORD='******'",
        "export MONKEY=banana",
        "export SSH_KEY_PATH='******'",
        "export URL='u:******@h'",
    ]


def test_debug_reason() -> None:
    assert debug_reason("exited with code 3", "/t", "/t/env") == (
        "exited with code 3; kept for debugging: task directory /t, environment /t/env"
    )
    assert (
        debug_reason(None, "/t", "/t/env")
        == "kept for debugging: task directory /t, environment /t/env"
    )
