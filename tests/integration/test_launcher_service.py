"""``python -m trainyard_launcher`` as its own process on real NATS JetStream and
FerretDB: a 2-role job with the OpenPAI environment, a stop, the task-log API, and a
launcher SIGKILLed while its tasks run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from trainyard_common.auth import TokenStore, tokens_collection
from trainyard_common.bus import Bus
from trainyard_common.events import (
    Event,
    JobFinished,
    JobPlaced,
    JobState,
    PortAssignment,
    StopJob,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
    decode,
    derived_id,
)
from trainyard_common.jobspec import EnvVar, JobSpec, PortSpec, Resources, RoleSpec
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import STREAM
from trainyard_launcher.adapters.procfs import is_alive, session_members
from trainyard_stack.components import NatsServer, free_port

ADMIN_TOKEN = "launcher-test-admin-token-0123456789"
T = TypeVar("T")


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    # A server of this test's own: the durable "launcher" consumer delivers the whole
    # stream, and other tests' JobPlaced events must not start tasks here.
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats.url, name="launcher-test")
    yield bus
    await bus.close()


class LauncherProcess:
    def __init__(self, tmp_path: Path, nats_url: str, mongo_url: str, db_prefix: str) -> None:
        self.port = free_port()
        self.data_dir = tmp_path / "data"
        self.log_path = tmp_path / "launcher.log"
        self.env = {
            **os.environ,
            "YARD_NATS_URL": nats_url,
            "YARD_MONGO_URL": mongo_url,
            "YARD_DATA_DIR": str(self.data_dir),
            "YARD_DB_PREFIX": db_prefix,
            "YARD_LAUNCHER_PORT": str(self.port),
            "YARD_TOKEN": ADMIN_TOKEN,
            "YARD_LAUNCHER_KILL_GRACE_S": "3",
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainyard_launcher"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.log_path.read_text()
                try:
                    if (await client.get(f"{self.url}/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"launcher did not start:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def task_dir(self, job_id: str, role: str, index: int) -> Path:
        return self.data_dir / "launcher" / "jobs" / job_id / "attempt-1" / f"{role}-{index}"


@pytest.fixture
async def launcher(
    tmp_path: Path, nats: NatsServer, mongo_url: str, db_prefix: str
) -> AsyncIterator[LauncherProcess]:
    process = LauncherProcess(tmp_path, nats.url, mongo_url, db_prefix)
    await process.start()
    yield process
    process.stop()
    client = mongo_client(mongo_url)
    await client.drop_database(f"{db_prefix}_launcher")
    await client.drop_database(f"{db_prefix}_auth")
    await client.close()


async def stream_events(bus: Bus, job_id: str) -> list[Event]:
    info = await bus.js.stream_info(STREAM)
    events = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.js.get_msg(STREAM, seq)
        if msg.data:
            event = decode(msg.data)
            if event.job_id == job_id:
                events.append(event)
    return events


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await probe():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached in time")


async def job_finished(bus: Bus, job_id: str, timeout: float = 30.0) -> list[Event]:
    async def probe() -> list[Event] | None:
        events = await stream_events(bus, job_id)
        return events if any(isinstance(e, JobFinished) for e in events) else None

    return await eventually(probe, timeout)


def task_history(events: list[Event]) -> dict[tuple[str, int], list[tuple[TaskState, int]]]:
    history: dict[tuple[str, int], list[tuple[TaskState, int]]] = {}
    for event in events:
        if isinstance(event, TaskStateChanged):
            history.setdefault((event.role, event.index), []).append((event.state, event.seq))
    return history


def read_env(path: Path) -> dict[str, str]:
    lines = path.read_bytes().split(b"\0")
    return dict(line.decode().split("=", 1) for line in lines if b"=" in line)


def placement(role: str, index: int, ports: dict[str, list[int]] | None = None) -> TaskPlacement:
    return TaskPlacement(
        role=role,
        index=index,
        node="local",
        host_ip="127.0.0.1",
        ports=[PortAssignment(label=k, ports=v) for k, v in (ports or {}).items()],
    )


async def test_two_role_job_runs_with_the_openpai_environment(
    launcher: LauncherProcess, bus: Bus, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the tasks run as their user and write here
    http_port, ssh_port = free_port(), free_port()
    command = (
        f'env -0 > "{out}/$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX.env"; '
        'echo "hello from $TRAINYARD_ROLE $TRAINYARD_INDEX"; echo "to stderr" >&2'
    )
    spec = JobSpec(
        name="pai-env",
        user="alice",
        env=[EnvVar(name="PAI_JOB_NAME", value="forged")],
        roles=[
            RoleSpec(
                name="master",
                replicas=1,
                command=command,
                resources=Resources(gpu=0, cpu=1, memory_mb=8192, shm_mb=64),
                ports=[PortSpec(label="http"), PortSpec(label="ssh")],
                min_succeeded=None,
            ),
            RoleSpec(name="worker", replicas=2, command=command, min_failed=None),
        ],
    )
    tasks = [
        placement("master", 0, {"http": [http_port], "ssh": [ssh_port]}),
        placement("worker", 0),
        placement("worker", 1),
    ]
    await bus.publish(JobPlaced(job_id="envjob", spec=spec, tasks=tasks))

    events = await job_finished(bus, "envjob")
    await asyncio.sleep(0.5)  # anything published late would show up now
    events = await stream_events(bus, "envjob")
    finished = [e for e in events if isinstance(e, JobFinished)]
    assert len(finished) == 1
    assert finished[0].state == JobState.SUCCEEDED
    assert finished[0].event_id == derived_id("envjob", 1, "finished")
    assert task_history(events) == {
        key: [(TaskState.STARTING, 1), (TaskState.RUNNING, 2), (TaskState.SUCCEEDED, 3)]
        for key in [("master", 0), ("worker", 0), ("worker", 1)]
    }
    for event in events:
        if isinstance(event, TaskStateChanged):
            assert event.event_id == derived_id("envjob", 1, event.role, event.index, event.seq)

    master = read_env(out / "master-0.env")
    worker = read_env(out / "worker-1.env")
    for env in (master, worker):
        assert env["PAI_JOB_NAME"] == "pai-env"
        assert env["PAI_USER_NAME"] == "alice"
        assert env["PAI_TASK_ROLE_COUNT"] == "2"
        assert env["PAI_TASK_ROLE_LIST"] == "master,worker"
        assert env["PAI_TASK_ROLE_TASK_COUNT_worker"] == "2"
        assert env["PAI_HOST_IP_master_0"] == "127.0.0.1"
        assert env["PAI_HOST_IP_worker_1"] == "127.0.0.1"
        assert env["PAI_PORT_LIST_master_0_http"] == str(http_port)
        assert env["PAI_PORT_LIST_master_0_ssh"] == str(ssh_port)
        assert env["PAI_RESOURCE_master"] == "0,1,8192,64"
        assert env["PAI_MIN_FAILED_TASK_COUNT_master"] == "1"
        assert env["PAI_MIN_FAILED_TASK_COUNT_worker"] == ""
        assert env["PAI_MIN_SUCCEEDED_TASK_COUNT_master"] == ""
        assert env["TRAINYARD_JOB_ID"] == "envjob"
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert "YARD_TOKEN" not in env
    assert master["PAI_CURRENT_TASK_ROLE_NAME"] == "master"
    assert master["PAI_CONTAINER_HOST_http_PORT_LIST"] == str(http_port)
    assert (
        worker["PAI_CURRENT_TASK_ROLE_NAME"],
        worker["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"],
    ) == ("worker", "1")
    assert "PAI_CONTAINER_HOST_http_PORT_LIST" not in worker

    # The task-log API: admin any job, a user only their own.
    client = mongo_client(mongo_url)
    tokens = TokenStore(tokens_collection(client, db_prefix), None)
    alice, bob = await tokens.issue("alice"), await tokens.issue("bob")
    await client.close()
    url = f"{launcher.url}/v1/jobs/envjob/logs"
    async with httpx.AsyncClient() as http:
        assert (await http.get(url)).status_code == 401
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        reply = await http.get(url, headers=admin)
        assert (reply.status_code, reply.text) == (200, "hello from master 0\n")
        assert reply.headers["content-type"].startswith("text/plain")
        assert reply.headers["x-log-offset"] == str(len("hello from master 0\n"))
        reply = await http.get(
            url,
            params={"role": "worker", "index": 1, "offset": 6},
            headers={"Authorization": f"Bearer {alice}"},
        )
        assert (reply.status_code, reply.text) == (200, "from worker 1\n")
        reply = await http.get(
            url,
            params={"role": "worker", "index": 0, "stream": "stderr", "follow": "true"},
            headers=admin,
        )
        assert (reply.status_code, reply.text) == (200, "to stderr\n")
        assert (await http.get(url, headers={"Authorization": f"Bearer {bob}"})).status_code == 404
        missing = await http.get(f"{launcher.url}/v1/jobs/nojob/logs", headers=admin)
        assert missing.status_code == 404 and "nojob" in missing.json()["detail"]
        missing = await http.get(url, params={"role": "worker", "index": 5}, headers=admin)
        assert missing.status_code == 404 and "worker[5]" in missing.json()["detail"]


async def test_stop_job_ends_a_sleeping_task_with_no_process_left(
    launcher: LauncherProcess, bus: Bus, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the tasks run as their user and write here
    spec = JobSpec(
        name="sleeper",
        user="alice",
        roles=[
            RoleSpec(
                name="worker",
                replicas=1,
                command=f'echo $$ > "{out}/shell.pid"; echo started; sleep 60; echo never',
            ),
        ],
    )
    await bus.publish(JobPlaced(job_id="stopjob", spec=spec, tasks=[placement("worker", 0)]))

    async def running() -> bool:
        return (TaskState.RUNNING, 2) in task_history(await stream_events(bus, "stopjob")).get(
            ("worker", 0), []
        )

    await eventually(running)
    await eventually(lambda: asyncio.sleep(0, (out / "shell.pid").exists()))
    shell_pid = int((out / "shell.pid").read_text())
    wrapper_pid = int((launcher.task_dir("stopjob", "worker", 0) / "pid").read_text().split()[0])

    async with httpx.AsyncClient(timeout=30) as http:
        async with http.stream(
            "GET",
            f"{launcher.url}/v1/jobs/stopjob/logs",
            params={"follow": "true"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as followed:
            chunks = followed.aiter_text()
            assert "started" in await anext(chunks)
            await bus.publish(
                StopJob(job_id="stopjob", requested_by="alice", reason="user asked to stop")
            )
            # The followed stream ends by itself once the task has ended.
            rest = [chunk async for chunk in chunks]
            assert "never" not in "".join(rest)

    events = await job_finished(bus, "stopjob")
    [finished] = [e for e in events if isinstance(e, JobFinished)]
    assert (finished.state, finished.reason) == (JobState.STOPPED, "user asked to stop")
    assert task_history(events)[("worker", 0)] == [
        (TaskState.STARTING, 1),
        (TaskState.RUNNING, 2),
        (TaskState.STOPPED, 3),
    ]
    assert not is_alive(shell_pid, None)
    assert session_members(wrapper_pid) == []


async def test_a_stop_before_placement_means_the_job_never_starts(
    launcher: LauncherProcess, bus: Bus
) -> None:
    await bus.publish(StopJob(job_id="early", requested_by="alice"))
    spec = JobSpec(name="early", roles=[RoleSpec(name="worker", command="echo ran")])
    await bus.publish(JobPlaced(job_id="early", spec=spec, tasks=[placement("worker", 0)]))
    events = await job_finished(bus, "early")
    [finished] = [e for e in events if isinstance(e, JobFinished)]
    assert (finished.state, finished.reason) == (JobState.STOPPED, "stopped before it started")
    assert task_history(events) == {}
    assert not launcher.task_dir("early", "worker", 0).exists()


async def test_sigkilled_launcher_adopts_its_tasks_and_ends_the_job_once(
    launcher: LauncherProcess, bus: Bus, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the tasks run as their user and write here
    index = "$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"
    command = (
        f'echo $$ >> "{out}/runs-{index}"; '
        f'while [ ! -f "{out}/go-{index}" ]; do sleep 0.1; done; echo done'
    )
    spec = JobSpec(name="survivor", roles=[RoleSpec(name="worker", replicas=2, command=command)])
    await bus.publish(
        JobPlaced(job_id="adopt", spec=spec, tasks=[placement("worker", 0), placement("worker", 1)])
    )

    async def both_running() -> bool:
        history = task_history(await stream_events(bus, "adopt"))
        return all((TaskState.RUNNING, 2) in history.get(("worker", i), []) for i in (0, 1))

    await eventually(both_running)

    launcher.kill()
    # worker 0 ends while no launcher is there; worker 1 is still running at the restart.
    (out / "go-0").touch()
    await eventually(
        lambda: asyncio.sleep(0, (launcher.task_dir("adopt", "worker", 0) / "exit.json").exists())
    )
    await launcher.start()
    await asyncio.sleep(1.0)
    assert not any(isinstance(e, JobFinished) for e in await stream_events(bus, "adopt"))
    (out / "go-1").touch()

    events = await job_finished(bus, "adopt")
    await asyncio.sleep(1.0)
    events = await stream_events(bus, "adopt")
    finished = [e for e in events if isinstance(e, JobFinished)]
    assert len(finished) == 1 and finished[0].state == JobState.SUCCEEDED
    assert task_history(events) == {
        ("worker", i): [(TaskState.STARTING, 1), (TaskState.RUNNING, 2), (TaskState.SUCCEEDED, 3)]
        for i in (0, 1)
    }
    # One launch per task: each shell ran once.
    for i in (0, 1):
        assert len((out / f"runs-{i}").read_text().split()) == 1
