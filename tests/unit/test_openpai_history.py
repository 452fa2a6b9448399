"""OpenPAI's job history, task, events and virtual-cluster shapes rendered from the
canonical views (pure): attempts counted from 0, an earlier attempt shown as it ended,
events filtered by type and newest first, queues as virtual clusters with capacities."""

from __future__ import annotations

from typing import Any

from trainyard_common.dialects import openpai


def view() -> dict[str, Any]:
    return {
        "id": "j1",
        "name": "train",
        "user": "alice",
        "state": "RUNNING",
        "attempt": 2,
        "queue": "default",
        "submitted_at": "2026-11-26T07:00:00+00:00",
        "spec": {"roles": [{"name": "worker", "replicas": 2, "resources": {"gpu": 1}}]},
        "attempts": [
            {"attempt": 1, "state": "FAILED", "reason": "exit 3", "exit_code": 3,
             "ended_at": "2026-11-26T07:01:00+00:00", "retried_as": 2},
        ],
        "tasks": [
            {"role": "worker", "index": 0, "attempt": 1, "state": "FAILED", "exit_code": 3},
            {"role": "worker", "index": 1, "attempt": 1, "state": "SUCCEEDED", "exit_code": 0},
            {"role": "worker", "index": 0, "attempt": 2, "state": "RUNNING",
             "started_at": "2026-11-26T07:02:00+00:00", "host_ip": "10.0.0.1"},
        ],
    }  # fmt: skip


def test_attempts_count_from_zero_and_an_earlier_one_shows_how_it_ended() -> None:
    assert openpai.attempt_numbers(view()) == [1, 2]
    first = openpai.render_job_attempt(view(), 1)
    assert (first["attemptIndex"], first["state"], first["exitCode"]) == (0, "FAILED", 3)
    assert first["isLatest"] is False and first["totalGpuNumber"] == 2
    states = [t["taskState"] for t in first["taskRoles"]["worker"]["taskStatuses"]]
    assert states == ["FAILED", "SUCCEEDED"]
    latest = openpai.render_job_attempt(view(), 2)
    assert (latest["attemptIndex"], latest["state"], latest["isLatest"]) == (1, "RUNNING", True)
    old = openpai.render_status(view(), 1)
    assert old["jobStatus"]["attemptId"] == 0 and old["jobStatus"]["state"] == "FAILED"


def test_a_task_has_one_attempt_of_its_own_and_says_where_its_logs_are() -> None:
    task = openpai.render_task(view(), 2, "worker", 0)
    assert task is not None and task["taskState"] == "RUNNING"
    assert task["attempts"][0]["containerIp"] == "10.0.0.1"
    assert task["attempts"][0]["containerLog"] == (
        "/api/v2/jobs/alice~train/attempts/1/taskRoles/worker/taskIndex/0/attempts/0/logs"
    )
    assert openpai.render_task(view(), 2, "worker", 2) is None
    assert openpai.render_task(view(), 2, "ps", 0) is None


def test_events_come_from_the_history_newest_first_and_filter_by_type() -> None:
    history = [
        {"type": "JobQueued", "event_id": "e1", "occurred_at": "t1",
         "event": {"reasons": ["queue default: 2 of 2 GPUs in use"]}},
        {"type": "JobPlaced", "event_id": "e2", "occurred_at": "t2", "event": {}},
        {"type": "TaskStateChanged", "event_id": "e3", "occurred_at": "t3",
         "event": {"role": "worker", "index": 0, "state": "FAILED", "reason": "exit 3"}},
        {"type": "TaskStateChanged", "event_id": "e4", "occurred_at": "t4",
         "event": {"role": "worker", "index": 0, "state": "STARTING"}},
    ]  # fmt: skip
    events = openpai.render_events(view(), history, None)
    assert [e["reason"] for e in events["data"]] == ["Failed", "Scheduled", "FailedScheduling"]
    assert events["data"][2]["message"] == "queue default: 2 of 2 GPUs in use"
    assert events["data"][0]["taskName"] == "train-worker-0"
    warnings = openpai.render_events(view(), history, "Warning")
    assert warnings["totalCount"] == 2


def test_queues_are_virtual_clusters_with_their_share_of_the_gpus() -> None:
    cluster = {
        "nodes": [
            {"gpu_type": "V100", "capacity": {"cpu": 32, "memory_mb": 262144, "gpus": 8}},
            {"gpu_type": None, "capacity": {"cpu": 16, "memory_mb": 65536, "gpus": 0}},
        ],
        "queues": [
            {"name": "a", "quota": {"gpus": 2, "cpu": 8}, "used": {"gpus": 1, "cpu": 4},
             "borrowing": False, "waiting": 3},
            {"name": "default", "quota": {}, "used": {}, "waiting": 0},
        ],
    }  # fmt: skip
    vcs = openpai.render_virtual_clusters(cluster)
    assert (vcs["a"]["capacity"], vcs["a"]["usedCapacity"], vcs["a"]["maxCapacity"]) == (
        25.0,
        12.5,
        25.0,
    )
    assert vcs["a"]["resourcesTotal"] == {
        "cpu": 48,
        "vCores": 48,
        "memory": 327680,
        "gpu": 8,
        "GPUs": 8,
    }
    assert vcs["default"]["maxCapacity"] == 100.0 and vcs["default"]["capacity"] == 0.0
    skus = openpai.render_sku_types(cluster)
    assert skus == {
        "V100": {"cpu": 4.0, "memory": 32768, "gpu": 1},
        "cpu": {"cpu": 16.0, "memory": 65536, "gpu": 0},
    }
