"""Failed attempts through the whole platform: a job that fails is retried as a whole
new attempt (re-placed, a new TRAINYARD_ATTEMPT) while its budget lasts and its failure
may be retried; every task end is classified and the classes are in the views."""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Api, start_platform

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def retry_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    platform = start_platform(
        tmp_path_factory.mktemp("retry-platform"), extra_env={"YARD_RETRY_BACKOFF_S": "0.2"}
    )
    yield Api(platform.url, platform.token)
    platform.stop()


def openpai(name: str, command: str, retries: int, tasks: int = 1) -> dict[str, Any]:
    return {
        "jobName": name,
        "image": "x",
        "retryCount": retries,
        "taskRoles": [
            {
                "name": "w",
                "taskNumber": tasks,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": command,
            }
        ],
    }


def types(api: Api, job_id: str) -> collections.Counter[str]:
    return collections.Counter(h["type"] for h in api.events(job_id))


def test_an_openpai_job_failing_twice_succeeds_on_its_third_attempt(retry_api: Api) -> None:
    job_id = retry_api.submit(openpai("retry-thrice", 'test "$TRAINYARD_ATTEMPT" = 3', 2, tasks=2))
    view = retry_api.wait(job_id, timeout=90)
    assert view["state"] == "SUCCEEDED", view
    assert (view["attempt"], view["retries"]) == (3, 2), view
    assert [(a["attempt"], a["state"], a["failure_class"]) for a in view["attempts"]] == [
        (1, "FAILED", "user"),
        (2, "FAILED", "user"),
        (3, "SUCCEEDED", None),
    ], view["attempts"]
    assert view["attempts"][0]["retried_as"] == 2
    # Every attempt's tasks stay, each classified.
    ends = collections.defaultdict(set)
    for task in view["tasks"]:
        ends[task["attempt"]].add((task["state"], task["failure_class"]))
    # The other task of a failed attempt either failed too or was stopped by the end.
    for failed in (1, 2):
        assert ("FAILED", "user") in ends[failed], ends
        assert ends[failed] <= {("FAILED", "user"), ("STOPPED", None)}, ends
    assert ends[3] == {("SUCCEEDED", None)}, ends
    assert len(view["tasks"]) == 6
    history = retry_api.events(job_id)
    retrying = [h["event"] for h in history if h["type"] == "JobRetrying"]
    assert [(r["previous_attempt"], r["attempt"], r["failure_class"]) for r in retrying] == [
        (1, 2, "user"),
        (2, 3, "user"),
    ], retrying
    assert "retrying as attempt 2 of at most 3 after 0.2s" in retrying[0]["reason"]
    counts = types(retry_api, job_id)
    assert counts["JobPlaced"] == 3 and counts["JobFinished"] == 1, counts
    placed = [h["event"]["attempt"] for h in history if h["type"] == "JobPlaced"]
    assert placed == [1, 2, 3]
    # The attempt's own log: TRAINYARD_ATTEMPT of each attempt's task.
    logs = retry_api.http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 2})
    assert logs.status_code == 200, logs.text


def test_a_command_not_found_is_not_retried(retry_api: Api) -> None:
    job_id = retry_api.submit(openpai("no-such-command", "trainyard-no-such-command-xyz", 1))
    view = retry_api.wait(job_id, timeout=60)
    assert view["state"] == "FAILED", view
    assert view["attempt"] == 1 and view["failure_class"] == "user", view
    assert view["reason"].endswith(
        "; not retried after attempt 1: a user failure that a new attempt would repeat is "
        "not retried (exit code 127: command not found)"
    ), view["reason"]
    assert view["tasks"][0]["failure_class"] == "user"
    assert types(retry_api, job_id)["JobRetrying"] == 0


def test_a_user_failure_is_not_retried_where_the_restart_policy_is_never(retry_api: Api) -> None:
    spec = {
        "name": "native-exit-3",
        "retry_limit": 2,
        "roles": [{"name": "t", "command": "exit 3", "resources": {"cpu": 1, "memory_mb": 128}}],
    }
    view = retry_api.wait(retry_api.submit(spec), timeout=60)
    assert view["state"] == "FAILED" and view["attempt"] == 1, view
    assert (
        "not retried after attempt 1: user failures are not retried with restart policy Never"
        in view["reason"]
    ), view["reason"]


def test_a_platform_failure_is_retried_whatever_the_restart_policy(
    retry_api: Api, out_dir: Path
) -> None:
    # Attempt 1's wrapper is killed from outside (the task itself runs as its user and
    # may not signal it): the task is lost (no exit record), the platform's failure,
    # retried although the role's policy is Never.
    wrapper = out_dir / "wrapper-pid"
    command = f'test "$TRAINYARD_ATTEMPT" = 2 || {{ echo $PPID > {wrapper}; sleep 30; }}'
    spec = {
        "name": "lost-once",
        "retry_limit": 1,
        "roles": [{"name": "t", "command": command, "resources": {"cpu": 1, "memory_mb": 128}}],
    }
    job_id = retry_api.submit(spec)
    deadline = time.monotonic() + 30
    while not wrapper.exists() or not wrapper.read_text().strip():
        assert time.monotonic() < deadline, "attempt 1 never started"
        time.sleep(0.1)
    os.kill(int(wrapper.read_text()), signal.SIGKILL)
    view = retry_api.wait(job_id, timeout=60)
    assert view["state"] == "SUCCEEDED" and view["attempt"] == 2, view
    first = view["tasks"][0]
    assert (first["attempt"], first["state"], first["failure_class"]) == (
        1,
        "FAILED",
        "platform",
    ), first
    assert first["reason"].startswith("lost"), first
    retrying = [h["event"] for h in retry_api.events(job_id) if h["type"] == "JobRetrying"]
    assert [r["failure_class"] for r in retrying] == ["platform"]


def test_a_job_whose_budget_runs_out_fails_naming_its_attempts(
    retry_api: Api, tmp_path: Path
) -> None:
    job_id = retry_api.submit(openpai("always-fails", "exit 1", 1))
    view = retry_api.wait(job_id, timeout=60)
    assert view["state"] == "FAILED", view
    assert view["attempt"] == 2 and view["retries"] == 1, view
    assert view["reason"].endswith(
        "; gave up after 2 attempt(s): the retry limit of 1 is used up"
    ), view
    assert [(a["attempt"], a["state"]) for a in view["attempts"]] == [(1, "FAILED"), (2, "FAILED")]
    counts = types(retry_api, job_id)
    assert counts["JobRetrying"] == 1 and counts["JobFinished"] == 1 and counts["JobPlaced"] == 2, (
        counts
    )


def test_retry_count_minus_two_runs_a_job_again_after_each_success_until_stopped(
    retry_api: Api,
) -> None:
    # OpenPAI v1 retryCount -2: the framework is restarted after every end (a service).
    job_id = retry_api.submit(openpai("runs-again", "true", -2))
    deadline = time.monotonic() + 60
    view = retry_api.seen(job_id)  # the native API's 202 comes before status projects it
    while view["attempt"] < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
        view = retry_api.job(job_id)
    assert view["attempt"] >= 3, view
    retry_api.stop(job_id)
    view = retry_api.wait(job_id, timeout=60)
    assert view["state"] == "STOPPED", view
    ended = [a for a in view["attempts"] if a["attempt"] < 3]
    assert [(a["state"], a["failure_class"]) for a in ended] == [("SUCCEEDED", None)] * 2, view
    assert all(a["reason"].startswith(f"attempt {a['attempt']} succeeded") for a in ended)
    assert types(retry_api, job_id)["JobFinished"] == 1
