"""Task preparation with real processes: the launcher's handlers over the in-memory store
and the real local backend. A git repository cloned at a branch and at a commit, a data
directory at its mount path, a wheel installed into the job's virtualenv (made once for
two tasks), a failing install, the run deadline (also after a restart) and isDebug."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from trainyard_common.events import (
    Event,
    JobFinished,
    JobPlaced,
    JobState,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.jobspec import CodeSource, DataSource, EnvVar, JobSpec, Resources, RoleSpec
from trainyard_launcher.adapters.local import LocalBackend
from trainyard_launcher.adapters.store import MemoryLauncherStore
from trainyard_launcher.handlers import Deps, adopt, check_deadlines, check_tasks, launch_job

from ..support.bus import RECEIVED

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local backend is Linux's")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """main: version one; feature: two, then three. Returns the path and the commits."""
    path = tmp_path_factory.mktemp("repo")
    git(path, "init", "--quiet", "--initial-branch", "main")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    (path / "version.txt").write_text("one\n")
    (path / "run.sh").write_text("echo script ran from $(pwd)\n")
    (path / "requirements.txt").write_text("tyreq\n")
    git(path, "add", ".")
    git(path, "commit", "--quiet", "-m", "one")
    git(path, "checkout", "--quiet", "-b", "feature")
    (path / "version.txt").write_text("two\n")
    git(path, "commit", "--quiet", "-am", "two")
    two = git(path, "rev-parse", "HEAD")
    (path / "version.txt").write_text("three\n")
    git(path, "commit", "--quiet", "-am", "three")
    git(path, "checkout", "--quiet", "main")
    return {"path": str(path), "two": two}


def write_wheel(directory: Path, name: str, body: str) -> Path:
    """A minimal pure-Python wheel: one module ``name`` with ``body``."""
    dist = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": body,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    path = directory / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for member, text in files.items():
            whl.writestr(member, text)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    write_wheel(directory, "tyhello", "GREETING = 'hello from a wheel'\n")
    write_wheel(directory, "tyreq", "FROM = 'requirements.txt'\n")
    return directory


class Harness:
    def __init__(self, root: Path, pip_args: tuple[str, ...] = (), minute_s: float = 60.0) -> None:
        self.published: list[Event] = []
        self.store = MemoryLauncherStore()
        self.backend = LocalBackend(root, pip_args=pip_args)
        self.deps = self.new_deps(minute_s)

    def new_deps(self, minute_s: float = 60.0) -> Deps:
        async def publish(event: Event) -> None:
            self.published.append(event)

        return Deps(self.store, self.backend, publish, kill_grace_s=1.0, minute_s=minute_s)

    async def run(self, spec: JobSpec, job_id: str | None = None) -> str:
        job_id = job_id or f"job-{uuid.uuid4().hex[:8]}"
        tasks = [
            TaskPlacement(role=r.name, index=i, node="n1", host_ip="127.0.0.1")
            for r in spec.roles
            for i in range(r.replicas)
        ]
        await launch_job(JobPlaced(job_id=job_id, spec=spec, tasks=tasks), RECEIVED, self.deps)
        return job_id

    async def finished(
        self, job_id: str, timeout: float = 120.0, deadlines: bool = False
    ) -> JobFinished:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            for event in self.published:
                if isinstance(event, JobFinished) and event.job_id == job_id:
                    return event
            await check_tasks(self.deps)
            if deadlines:
                await check_deadlines(self.deps)
            await asyncio.sleep(0.1)
        raise AssertionError(f"{job_id} did not finish in {timeout}s")

    def task_ends(self, job_id: str) -> list[TaskStateChanged]:
        return [
            e
            for e in self.published
            if isinstance(e, TaskStateChanged) and e.job_id == job_id and e.state.terminal
        ]

    def task_dir(self, job_id: str, role: str = "worker", index: int = 0) -> Path:
        return self.backend.root / "jobs" / job_id / "attempt-1" / f"{role}-{index}"

    def stdout(self, job_id: str, role: str = "worker", index: int = 0) -> str:
        return (self.task_dir(job_id, role, index) / "stdout.log").read_text()

    def stderr(self, job_id: str, role: str = "worker", index: int = 0) -> str:
        return (self.task_dir(job_id, role, index) / "stderr.log").read_text()


def job(command: str, replicas: int = 1, **fields: object) -> JobSpec:
    return JobSpec(
        name="prep",
        user="alice",
        roles=[RoleSpec(name="worker", replicas=replicas, command=command)],
        **fields,
    )


def fresh_path(base: str = "/opt") -> str:
    # A path that does not exist on the machine, so the test also proves it never does.
    return f"{base}/trainyard-test-{uuid.uuid4().hex[:8]}/code"


async def test_code_source_at_a_branch_is_seen_at_its_mount_path(
    tmp_path: Path, repo: dict[str, str]
) -> None:
    h = Harness(tmp_path)
    mount = fresh_path()
    spec = job(
        'cat "$TRAINYARD_CODE_DIR/version.txt"; echo "$TRAINYARD_CODE_DIR"; '
        f"cat {mount}/version.txt; bash {mount}/run.sh",
        code_source=CodeSource(repo=repo["path"], branch="feature", mount_path=mount),
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.SUCCEEDED, (done.reason, h.stderr(job_id))
    assert h.stdout(job_id) == (
        f"three\n{mount}\nthree\nscript ran from {h.task_dir(job_id) / 'work'}\n"
    )
    # The checkout lives in the task's directory; the machine's own tree is untouched.
    staged = h.task_dir(job_id) / "mounts" / mount.lstrip("/")
    assert (staged / "version.txt").read_text() == "three\n"
    assert not os.path.exists(os.path.dirname(mount))


async def test_code_source_at_a_commit(tmp_path: Path, repo: dict[str, str]) -> None:
    h = Harness(tmp_path)
    spec = job(
        "cat /opt/code-at-commit/version.txt",
        code_source=CodeSource(
            repo=f"file://{repo['path']}",
            branch="feature",
            commit=repo["two"],
            mount_path="/opt/code-at-commit",
        ),
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.SUCCEEDED, (done.reason, h.stderr(job_id))
    assert h.stdout(job_id) == "two\n"


async def test_an_unknown_branch_fails_the_task_with_the_git_reason(
    tmp_path: Path, repo: dict[str, str]
) -> None:
    h = Harness(tmp_path)
    spec = job(
        "echo never", code_source=CodeSource(repo=repo["path"], branch="nope", mount_path="/opt/x")
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.FAILED
    [end] = h.task_ends(job_id)
    assert end.reason is not None and end.reason.startswith(
        f"code source: git clone of {repo['path']} at branch nope failed:"
    ), end.reason
    assert end.exit_code is None
    assert h.stdout(job_id) == ""


async def test_data_sources_are_seen_at_their_mount_paths(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "rows.csv").write_text("a,b\n1,2\n")
    mount = fresh_path("/mnt")
    # /tmp exists: the mount covers one of its entries for this task only.
    existing = tmp_path / "already-here"
    existing.mkdir()
    (existing / "original").write_text("not for the task\n")
    spec = job(
        f"cat {mount}/rows.csv; ls {existing}; cat inputs/rows.csv",
        data_sources=[
            DataSource(source=f"file://{data}", mount_path=mount),
            DataSource(source=str(data), mount_path=str(existing)),
            DataSource(source=str(data), mount_path="inputs"),
        ],
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.SUCCEEDED, (done.reason, h.stderr(job_id))
    assert h.stdout(job_id) == "a,b\n1,2\nrows.csv\na,b\n1,2\n"
    assert not os.path.exists(os.path.dirname(mount))
    assert sorted(os.listdir(existing)) == ["original"]


async def test_a_covered_tmp_holds_no_more_than_the_tasks_memory(tmp_path: Path) -> None:
    # A mount path in /tmp covers /tmp with a tmpfs for the task: what it writes there
    # is memory no cgroup charges to it, bounded now by its role's memory.
    h = Harness(tmp_path)
    data = tmp_path / "dataset"
    data.mkdir()
    name = f"trainyard-test-{uuid.uuid4().hex[:8]}"
    fill = f"dd if=/dev/zero of=/tmp/{name}-big bs=1M count=64 2>&1; echo status=$?"
    spec = JobSpec(
        name="prep",
        user="alice",
        roles=[RoleSpec(name="worker", command=fill, resources=Resources(memory_mb=32))],
        data_sources=[DataSource(source=str(data), mount_path=f"/tmp/{name}")],
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.SUCCEEDED, (done.reason, h.stderr(job_id))
    assert "No space left on device" in h.stdout(job_id) and "status=1" in h.stdout(job_id)
    assert not os.path.exists(f"/tmp/{name}-big") and not os.path.exists(f"/tmp/{name}")


async def test_a_missing_data_path_fails_the_task(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    spec = job(
        "echo never",
        data_sources=[DataSource(source=str(tmp_path / "absent"), mount_path="/mnt/absent")],
    )
    job_id = await h.run(spec)
    await h.finished(job_id)
    [end] = h.task_ends(job_id)
    assert end.reason is not None and end.reason.startswith(
        f"data_sources[0]: {tmp_path / 'absent'} does not exist on "
    ), end.reason


async def test_an_unsupported_scheme_fails_the_task_without_starting_it(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    spec = job(
        "echo never", data_sources=[DataSource(source="oss://bucket/data/", mount_path="/mnt/data")]
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.FAILED
    [end] = h.task_ends(job_id)
    assert end.reason is not None and end.reason.startswith(
        "could not start: data_sources[0].source: data source 'oss://bucket/data/': "
    )
    assert end.reason.endswith("nothing is fetched from elsewhere (oss://)")
    assert not (h.task_dir(job_id) / "launched").exists()


async def test_two_tasks_share_one_virtualenv_made_once(
    tmp_path: Path, wheels: Path, repo: dict[str, str]
) -> None:
    h = Harness(tmp_path, pip_args=("--no-index", "--find-links", str(wheels)))
    spec = job(
        'python -c "import tyhello, tyreq, sys; print(tyhello.GREETING, tyreq.FROM, sys.prefix)"',
        replicas=2,
        pip_packages=["tyhello"],
        pip_requirements_dir="/opt/src",
        code_source=CodeSource(repo=repo["path"], mount_path="/opt/src"),
    )
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    venv = h.backend.root / "jobs" / job_id / "venv"
    assert done.state == JobState.SUCCEEDED, (
        done.reason,
        h.stderr(job_id),
        h.stderr(job_id, index=1),
    )
    for index in (0, 1):
        assert h.stdout(job_id, index=index) == f"hello from a wheel requirements.txt {venv}\n"
    made = [i for i in (0, 1) if "creating the job's virtualenv" in h.stderr(job_id, index=i)]
    assert len(made) == 1, [h.stderr(job_id, index=i) for i in (0, 1)]
    # Installed into the job's environment, not the interpreter's.
    probe = subprocess.run([sys.executable, "-c", "import tyhello"], capture_output=True)
    assert probe.returncode != 0


async def test_a_failed_install_fails_the_task_with_that_reason(
    tmp_path: Path, wheels: Path
) -> None:
    h = Harness(tmp_path, pip_args=("--no-index", "--find-links", str(wheels)))
    spec = job("echo never", replicas=2, pip_packages=["no-such-package-for-trainyard"])
    job_id = await h.run(spec)
    done = await h.finished(job_id)
    assert done.state == JobState.FAILED
    ends = h.task_ends(job_id)
    assert ends and all(e.state in (TaskState.FAILED, TaskState.STOPPED) for e in ends)
    failed = [e for e in ends if e.state == TaskState.FAILED]
    assert failed[0].reason is not None and failed[0].reason.startswith(
        "dependency install failed: pip install of no-such-package-for-trainyard exited with code 1"
    ), failed[0].reason
    assert "dependency install failed" in done.reason
    assert h.stdout(job_id) == ""


async def test_the_deadline_stops_a_job_even_after_a_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path, minute_s=1.0)
    job_id = await h.run(job("sleep 60", replicas=2, max_running_minutes=2))
    await check_deadlines(h.deps)  # learns the deadline: 2 s after the first start
    assert not any(isinstance(e, JobFinished) for e in h.published)
    # A new launcher (no cached deadline) adopts the running tasks and keeps the limit.
    h.deps = h.new_deps(minute_s=1.0)
    await adopt(h.deps)
    assert len(h.deps.watching) == 2
    started = asyncio.get_running_loop().time()
    done = await h.finished(job_id, timeout=30, deadlines=True)
    assert done.state == JobState.FAILED
    assert done.reason == "exceeded its maximum running time of 2 minutes"
    assert asyncio.get_running_loop().time() - started < 10
    ends = h.task_ends(job_id)
    assert sorted((e.index, e.state) for e in ends) == [
        (0, TaskState.STOPPED),
        (1, TaskState.STOPPED),
    ]


async def test_a_job_within_its_deadline_is_left_alone(tmp_path: Path) -> None:
    h = Harness(tmp_path, minute_s=1.0)
    job_id = await h.run(job("sleep 0.5", max_running_minutes=30))
    done = await h.finished(job_id, deadlines=True)
    assert done.state == JobState.SUCCEEDED


async def test_is_debug_keeps_the_environment_of_a_failed_task(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    spec = job(
        "exit 3",
        keep_failed_for_debug=True,
        env=[EnvVar(name="API_TOKEN", value="tok-123"), EnvVar(name="URL", value="x://s3cr3t@h")],
        secrets=[EnvVar(name="pw", value="s3cr3t")],
    )
    job_id = await h.run(spec)
    await h.finished(job_id)
    [end] = h.task_ends(job_id)
    task_dir = h.task_dir(job_id)
    assert end.reason == (
        f"exited with code 3; kept for debugging: task directory {task_dir}, "
        f"environment {task_dir / 'env'}"
    )
    text = (task_dir / "env").read_text()
    assert "export TRAINYARD_JOB_ID=" + job_id in text
    assert "export API_TOKEN='******'" in text and "tok-123" not in text
    assert "export URL='x://******@h'" in text and "s3cr3t" not in text
    assert (task_dir / "env").stat().st_mode & 0o077 == 0
    # Sourcing it gives the task's environment back, for a re-run by hand.
    shown = subprocess.run(
        ["bash", "-c", f"source {task_dir / 'env'}; echo $TRAINYARD_ROLE"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == "worker\n"


async def test_without_is_debug_no_environment_is_written(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    job_id = await h.run(job("exit 3"))
    await h.finished(job_id)
    [end] = h.task_ends(job_id)
    assert end.reason == "exited with code 3"
    assert not (h.task_dir(job_id) / "env").exists()


def test_without_a_mount_namespace_the_links_made_are_removed_when_one_cannot_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where no mount namespace can be made (tasks run as the launcher's user), mount
    # paths outside the task's directory are symlinks; when one cannot be made, those
    # already made are removed. That call lacked its user (a TypeError, the links left).
    import io

    from trainyard_launcher.adapters import prepare
    from trainyard_launcher.domain.prepare import Mount, PreparePlan

    monkeypatch.setattr(prepare, "namespace_problem", lambda: "none here (the test)")
    data = tmp_path / "data"
    data.mkdir()
    made = tmp_path / "made"
    plan = PreparePlan(
        task_dir=str(tmp_path / "task"),
        mounts=(
            Mount(view=str(made), host=str(data), what="data_sources[0]"),
            Mount(
                view=str(tmp_path / "no" / "such" / "dir"), host=str(data), what="data_sources[1]"
            ),
        ),
    )
    with pytest.raises(prepare.PrepareFailed, match=r"data_sources\[1\]"):
        prepare.run_preparation(plan, tmp_path / "plan.json", ["true"], io.StringIO())
    assert not os.path.lexists(made)
