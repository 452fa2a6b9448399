"""Metrics: what each event adds to status's job metrics, the scheduler's figures, and
the HTTP middleware's labels (pure logic and an in-process app; the services' real
/metrics are checked in tests/e2e/test_metrics.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import (
    FailureClass,
    InterruptCause,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobQueued,
    JobRejected,
    JobRetrying,
    JobState,
    JobSubmitted,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_common.runtime import health_app
from trainyard_placement.domain import Allocation, QueuedJob, SchedulerState
from trainyard_placement.domain.usage import gpus_held, node_gpus, waiting_by_queue
from trainyard_status.domain.metrics import Observation, dialect_label, observations
from trainyard_status.domain.projection import job_rank

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def spec(queue: str = "default", gpus: int = 0) -> JobSpec:
    return JobSpec(
        name="m",
        user="alice",
        queue=queue,
        roles=[RoleSpec(name="w", command="true", resources=Resources(gpu=gpus))],
    )


# --- status: events to observations ------------------------------------------------------


def test_each_event_adds_what_it_means() -> None:
    job = {"dialect": "openpai", "submitted_at": T0}
    s = spec("gpu")
    cases = [
        (JobSubmitted(job_id="j", spec=s, dialect="kubeflow"), None, ("submitted", ("kubeflow",))),
        (JobAccepted(job_id="j", spec=s), job, ("accepted", ("openpai",))),
        (JobRejected(job_id="j", errors=[]), job, ("rejected", ("openpai",))),
        (
            JobFinished(job_id="j", state=JobState.FAILED, reason="x"),
            job,
            ("finished", ("openpai", "failed")),
        ),
        (
            TaskStateChanged(
                job_id="j", role="w", index=0, state=TaskState.FAILED, seq=2,
                failure_class=FailureClass.USER,
            ),
            None,
            ("task_exits", ("failed", "user")),
        ),
        (
            TaskStateChanged(job_id="j", role="w", index=0, state=TaskState.SUCCEEDED, seq=2),
            None,
            ("task_exits", ("succeeded", "none")),
        ),
        (
            JobRetrying(
                job_id="j", attempt=2, previous_attempt=1, reason="x",
                failure_class=FailureClass.PLATFORM, not_before=T0,
            ),
            None,
            ("retries", ("platform",)),
        ),
        (
            JobInterrupted(job_id="j", attempt=1, cause=InterruptCause.PREEMPTED, reason="x"),
            None,
            ("interruptions", ("preempted",)),
        ),
    ]  # fmt: skip
    for event, before, (metric, labels) in cases:
        assert observations(event, before) == [Observation(metric, labels)], event


def test_the_first_placement_observes_the_wait_from_submission_per_queue() -> None:
    placed = JobPlaced(
        job_id="j", spec=spec("gpu"), tasks=[], occurred_at=T0 + timedelta(seconds=2.5)
    )
    wait = [Observation("first_wait", ("gpu",), 2.5)]
    # The view before it: submitted and accepted (their spec ranked at their steps).
    accepted = {"submitted_at": T0, "spec_rank": job_rank(JobState.ACCEPTED, 1)}
    assert observations(placed, accepted) == wait
    # A job paused while it waited (or submitted paused) is first placed as a later
    # attempt: that is its first wait (only attempt 1's was observed).
    again = placed.model_copy(update={"attempt": 2})
    assert observations(again, accepted) == wait
    # Once a placement of any attempt was projected, no other is a first wait: a retry
    # or a resume after running, or an earlier attempt's placement projected late.
    for before in (1, 2):
        placed_view = {**accepted, "spec_rank": job_rank(JobState.PLACED, before)}
        assert observations(again.model_copy(update={"attempt": 3}), placed_view) == []
        assert observations(placed, placed_view) == []
    # A view from before the ranked groups: its first attempt's placement, as before.
    assert observations(placed, {"submitted_at": T0}) == wait
    assert observations(again, {"submitted_at": T0}) == []
    # Nor is there a wait without the submission.
    assert observations(placed, None) == []
    assert observations(placed, {"spec_rank": job_rank(JobState.ACCEPTED, 1)}) == []


def test_events_that_change_no_figure_add_nothing_and_labels_stay_bounded() -> None:
    running = TaskStateChanged(job_id="j", role="w", index=0, state=TaskState.RUNNING, seq=1)
    assert observations(running, None) == []
    assert observations(JobQueued(job_id="j"), None) == []
    # A dialect no platform has (an old or hand-written document) is "other", never itself.
    assert dialect_label("openpai") == "openpai"
    assert dialect_label("native") == "native"
    assert dialect_label("<script>") == "other"
    assert dialect_label(None) == "other"


# --- placement: the scheduler's figures --------------------------------------------------


def test_gpus_held_by_node_and_queue_and_the_waiting_per_queue() -> None:
    cluster = ClusterSpec(
        nodes=[NodeSpec(name="a", cpu=8, memory_mb=8192, gpus=4), NodeSpec(name="b", cpu=8, memory_mb=8192)],
        queues=["default", "gpu", "idle"],
    )  # fmt: skip
    state = SchedulerState(cluster)

    def task(node: str, gpus: list[int], milli: int | None = None) -> TaskPlacement:
        return TaskPlacement(
            role="w", index=0, node=node, host_ip="10.0.0.1", gpu_indices=gpus, gpu_milli=milli
        )

    state.commit(Allocation("j1", spec("gpu", 2), (task("a", [0, 1]),)))
    state.commit(Allocation("j2", spec("default"), (task("a", [2], milli=250), task("b", []))))
    state.commit(Allocation("j3", spec("gpu", 1), (task("a", [3]),)))
    assert gpus_held(state) == {("a", "gpu"): 3.0, ("a", "default"): 0.25}
    assert node_gpus(state) == {"a": 4, "b": 0}

    state.enqueue(QueuedJob("q1", spec("gpu"), 1))
    state.enqueue(QueuedJob("q2", spec("gpu"), 2))
    backoff = [QueuedJob("r1", spec("default"), 3)]
    assert waiting_by_queue(state, backoff) == {"default": 1, "gpu": 2, "idle": 0}


# --- HTTP: requests counted by their route's template ------------------------------------


async def test_http_requests_are_counted_by_route_template_method_and_code() -> None:
    app = health_app("probe")

    @app.get("/v1/things/{thing_id}")
    async def thing(thing_id: str) -> dict[str, str]:
        if thing_id == "missing":
            from fastapi import HTTPException

            raise HTTPException(404, "no such thing")
        return {"id": thing_id}

    def count(route: str, code: str) -> float:
        value = REGISTRY.get_sample_value(
            "trainyard_http_requests_total", {"route": route, "method": "GET", "code": code}
        )
        return value or 0.0

    before_ok = count("/v1/things/{thing_id}", "200")
    before_missing = count("/v1/things/{thing_id}", "404")
    before_unmatched = count("<unmatched>", "404")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
        for name in ("a", "b", "c"):
            assert (await http.get(f"/v1/things/{name}")).status_code == 200
        assert (await http.get("/v1/things/missing")).status_code == 404
        assert (await http.get("/nowhere/at/all")).status_code == 404
        scraped = await http.get("/metrics")
    # Three paths, one series: the template, never the id.
    assert count("/v1/things/{thing_id}", "200") == before_ok + 3
    assert count("/v1/things/{thing_id}", "404") == before_missing + 1
    assert count("<unmatched>", "404") == before_unmatched + 1
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    duration = families["trainyard_http_request_duration_seconds"]
    assert any(
        s.name.endswith("_count") and s.labels.get("route") == "/v1/things/{thing_id}"
        for s in duration.samples
    )
    assert not any("/v1/things/a" in str(s.labels) for f in families.values() for s in f.samples)


async def test_a_streamed_answers_latency_is_to_its_start_a_whole_ones_to_its_end() -> None:
    """An SSE watch or a followed log lasts as long as its reader stays: timed to its
    end, every one of them fell past the histogram's last bucket (10 s) and the p99 of
    its route (the gateway's one route too) said nothing. A stream is timed to its
    start; an answer in one piece, however slow, to its end."""
    import asyncio

    from fastapi.responses import StreamingResponse

    app = health_app("probe")

    @app.get("/v1/stream")
    async def stream() -> StreamingResponse:
        async def body():  # type: ignore[no-untyped-def]
            yield b"retry: 2000\n\n"
            await asyncio.sleep(0.4)  # a watch held open
            yield b": keep-alive\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.get("/v1/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(0.3)
        return {"answer": "late"}

    def observed(route: str) -> tuple[float, float]:
        labels = {"route": route, "method": "GET"}
        total = REGISTRY.get_sample_value("trainyard_http_request_duration_seconds_sum", labels)
        count = REGISTRY.get_sample_value("trainyard_http_request_duration_seconds_count", labels)
        return total or 0.0, count or 0.0

    streams, slows = observed("/v1/stream"), observed("/v1/slow")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as http:
        answer = await http.get("/v1/stream")
        assert answer.status_code == 200 and answer.text.endswith("keep-alive\n\n")
        assert (await http.get("/v1/slow")).status_code == 200
    total, count = observed("/v1/stream")
    assert count == streams[1] + 1 and total - streams[0] < 0.2
    total, count = observed("/v1/slow")
    assert count == slows[1] + 1 and total - slows[0] >= 0.3
    labels = {"route": "/v1/stream", "method": "GET", "code": "200"}
    assert REGISTRY.get_sample_value("trainyard_http_requests_total", labels) == 1


async def test_ended_jobs_are_recounted_at_most_a_thousandth_of_the_time() -> None:
    # Every finished job ever was counted every 10 s, the event loop held meanwhile
    # (~70 ms at a million jobs on SQLite); the jobs still running or waiting are few.
    from trainyard_status.adapters import metrics

    now, cost = 0.0, 0.05  # a count of every ended job takes 50 ms
    asked: list[set[str]] = []

    class Views:
        async def count_states(self, where: dict, states: object) -> dict[str, int]:
            nonlocal now
            names = {s.value for s in states}  # type: ignore[attr-defined]
            asked.append(names)
            if "SUCCEEDED" in names:
                now += cost
            return {"RUNNING": 3, "SUCCEEDED": 7}

    def clock() -> float:
        return now

    async def turns(start: float, count: int, due: float) -> list[int]:
        nonlocal now
        asked.clear()
        for turn in range(count):  # a turn every 10 s
            now = start + turn * 10.0
            due = await metrics.count_turn(Views(), due, clock=clock)  # type: ignore[arg-type]
        return [i for i, names in enumerate(asked) if "SUCCEEDED" in names]

    assert await turns(0.0, 12, 0.0) == [0, 5, 10]  # once every 50 s
    live = {s.value for s in metrics.LIVE_STATES}
    assert all(names == live for names in asked if "SUCCEEDED" not in names)
    assert {"RUNNING", "QUEUED", "PAUSED"} <= live and not live & {"SUCCEEDED", "FAILED"}
    assert REGISTRY.get_sample_value("trainyard_jobs", {"state": "RUNNING"}) == 3
    assert REGISTRY.get_sample_value("trainyard_jobs", {"state": "SUCCEEDED"}) == 7
    cost = 0.005  # a smaller store's: every turn
    assert await turns(1000.0, 4, 0.0) == [0, 1, 2, 3]


def test_placements_decisions_are_exported_at_zero_from_the_start() -> None:
    # A series none was counted in yet does not exist: TrainyardJobsStuck (an increase
    # of "placed" that is 0) could not fire before placement had placed one job.
    import subprocess
    import sys

    script = (
        "from prometheus_client import REGISTRY\n"
        "import trainyard_placement.adapters.metrics\n"
        "print([REGISTRY.get_sample_value('trainyard_placement_decisions_total', "
        "{'decision': d}) for d in ('placed', 'tasks_placed', 'preempted')])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[0.0, 0.0, 0.0]", out.stdout + out.stderr
