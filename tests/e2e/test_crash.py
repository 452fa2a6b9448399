"""SIGKILL each service, the bus and the store in turn while hundreds of jobs flow,
restart it, and every job still ends exactly once: none lost, no task launched twice, no
duplicate history row, no task process left behind, and placement leading truly."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trainyard_stack.platform import SERVICES, Platform

from .conftest import TERMINAL, Api, start_platform

pytestmark = pytest.mark.e2e

JOBS = 240
# Answers after which a client sends the same request again (with the same
# Idempotency-Key, so a submission that did land is not made twice).
RETRY_STATUS = {502, 503, 504}


@pytest.fixture(scope="module")
def crash_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(tmp_path_factory.mktemp("crash"))
    yield platform
    platform.stop()


def job(name: str, out_dir: Path, seconds: float, tasks: int) -> dict:
    launch = f'echo launched >> "{out_dir}/$TRAINYARD_JOB_ID-$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"'
    return {
        "jobName": name,
        "image": "x",
        "taskRoles": [
            {
                "name": "w",
                "taskNumber": tasks,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": f"{launch} && sleep {seconds}",
            }
        ],
    }


class Submitter(threading.Thread):
    """A client submitting jobs at a steady pace, as a CI pipeline would: a request that
    meets a dead front door is sent again, with the same Idempotency-Key."""

    def __init__(self, api: Api, out_dir: Path, count: int, pace: float) -> None:
        super().__init__(daemon=True)
        self.api, self.out_dir, self.count, self.pace = api, out_dir, count, pace
        self.ids: list[str] = []
        self.tasks: dict[str, int] = {}
        self.retries = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.count):
                tasks = 2 if i % 4 == 0 else 1
                self.submit(f"crash-{i}", job(f"crash-{i}", self.out_dir, 1.0, tasks), tasks)
                time.sleep(self.pace)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def submit(self, key: str, payload: dict, tasks: int) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = self.api.http.post(
                    "/v1/jobs", json=payload, headers={"Idempotency-Key": key}
                )
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code not in RETRY_STATUS:
                assert answer.status_code == 202, answer.text
                job_id = answer.json()["id"]
                self.ids.append(job_id)
                self.tasks[job_id] = tasks
                return
            assert time.monotonic() < deadline, f"{key}: no answer but {answer and answer.text}"
            self.retries += 1
            time.sleep(0.2)


@pytest.mark.timeout(900)
def test_hundreds_of_jobs_end_exactly_once_through_crashes_of_everything(
    crash_platform: Platform, out_dir: Path
) -> None:
    api = Api(crash_platform.url, crash_platform.token)
    submitter = Submitter(api, out_dir, JOBS, pace=0.08)
    submitter.start()
    # Every service, then the bus and the store, killed while jobs are submitted,
    # queued, placed and running; each is down long enough for work to pile up for it.
    # The embedded store lives in each service's process (killed with it); a store
    # server (FerretDB, YARD_STORE=ferretdb) is killed on its own too.
    servers = ("nats", "store") if crash_platform.mongo is not None else ("nats",)
    for victim in (*SERVICES, *servers):
        time.sleep(1.5)
        if victim in SERVICES:
            crash_platform.kill_service(victim)
            time.sleep(1.0)
            crash_platform.restart_service(victim)
        else:
            crash_platform.kill_server(victim)
            time.sleep(1.0)
            crash_platform.restart_server(victim)
    submitter.join(timeout=180)
    assert not submitter.is_alive() and submitter.error is None, submitter.error
    jobs = submitter.ids
    assert len(jobs) == len(set(jobs)) == JOBS  # none lost at the door, none made twice

    views = wait_all(api, jobs, timeout=420)
    assert all(view["state"] == "SUCCEEDED" for view in views.values()), [
        (view["name"], view["state"], view.get("reason"),
         [(t.get("state"), t.get("reason"), t.get("failure_class")) for t in view["tasks"]])
        for view in views.values() if view["state"] != "SUCCEEDED"
    ]  # fmt: skip

    for job_id in jobs:
        tasks = submitter.tasks[job_id]
        for index in range(tasks):
            launches = (out_dir / f"{job_id}-w-{index}").read_text().splitlines()
            assert launches == ["launched"], f"{job_id} task {index} launched {len(launches)} times"
        history = settled_history(api, job_id, transitions=3 * tasks)
        counts = collections.Counter(h["type"] for h in history)
        assert counts["JobSubmitted"] == counts["JobAccepted"] == counts["JobPlaced"] == 1, counts
        assert counts["JobFinished"] == 1, counts
        transitions = [
            (h["event"]["role"], h["event"]["index"], h["event"]["seq"])
            for h in history
            if h["type"] == "TaskStateChanged"
        ]
        assert len(transitions) == len(set(transitions)) == 3 * tasks, transitions
        assert len({h["event_id"] for h in history}) == len(history)

    assert task_processes(set(jobs)) == []  # no task outlived its job

    # Placement leads, and says so truly, after the bus it holds its lease on came back.
    lease = api.http.get("/v1/placement/leader").json()
    assert lease["leading"] is True and lease["leader"] == lease["replica"], lease
    assert api.http.get("/v1/placement/queue").status_code == 200


def wait_all(api: Api, jobs: list[str], timeout: float) -> dict[str, dict]:
    """Every job's view once all are final; on a timeout, which were not and where."""
    views: dict[str, dict] = {}
    pending = list(jobs)
    deadline = time.monotonic() + timeout
    while pending:
        answer = api.http.get(f"/v1/jobs/{pending[0]}")
        if answer.status_code == 200 and answer.json()["state"] in TERMINAL:
            views[pending.pop(0)] = answer.json()
            continue
        if time.monotonic() > deadline:
            states = {job_id: api.job(job_id)["state"] for job_id in pending}
            stuck = {job_id: state for job_id, state in states.items() if state not in TERMINAL}
            raise AssertionError(f"{len(stuck)} jobs not final after {timeout}s: {stuck}")
        time.sleep(0.5)
    return views


def task_processes(job_ids: set[str]) -> list[int]:
    """Processes on this machine that belong to one of ``job_ids``: by the job id in
    their environment, which every task's command inherits, or by a working directory
    in one of the jobs' directories (the wrappers: forked by the launcher's spawner,
    their /proc environ is the spawner's)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes().split(b"\0")
            cwd = os.readlink(Path(entry.path, "cwd"))
        except OSError:  # gone, or a kernel thread
            continue
        ours = any(f"/jobs/{job_id}/" in cwd for job_id in job_ids) or any(
            var.startswith(b"TRAINYARD_JOB_ID=") and var[17:].decode() in job_ids for var in environ
        )
        if ours:
            found.append(int(entry.name))
    return found


# What every job's history holds once, whatever crashed on its way.
EVERY_JOB_EVENT = {"JobSubmitted", "JobAccepted", "JobPlaced", "JobFinished"}


def settled_history(
    api: Api, job_id: str, transitions: int = 6, timeout: float = 180.0
) -> list[dict]:
    """The job's history once every event has reached status. Messages a killed
    consumer had fetched but not acked come back only after JetStream's ack wait
    (30 s), so the job view can be final while a few history rows, of any type (a
    JobPlaced as well as a late transition), are still on their way: wait for them
    (and fail if more than expected ever arrive)."""
    deadline = time.monotonic() + timeout
    history = api.events(job_id)
    while time.monotonic() < deadline and (
        sum(h["type"] == "TaskStateChanged" for h in history) < transitions
        or not EVERY_JOB_EVENT <= {h["type"] for h in history}
    ):
        time.sleep(0.5)
        history = api.events(job_id)
    return history
