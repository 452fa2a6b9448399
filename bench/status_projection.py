"""The status service's projection on the embedded store: each write its own commit
against each fetched batch one transaction (``Bus.consume(atomic=...)``), same run.

    .venv/bin/python bench/status_projection.py [--jobs 1000] [--rounds 2]

Starts a real NATS server, publishes every event of ``--jobs`` one-task jobs (submitted,
accepted, queued, placed, the task's three transitions, finished: eight each) once, then
projects the whole stream into a fresh SQLite store with the status service's own
consumer and handler, once per way and round (the ways alternate), each with its own
durable. Measures events projected per second and this process's CPU time per event
(the projection runs in the benchmark's process, as in the service's). Prints one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

from trainyard_common.bus import Bus
from trainyard_common.docstore import SqliteClient
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobState,
    JobSubmitted,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_common.subjects import ALL_COMMANDS, ALL_EVENTS
from trainyard_stack.components import NatsServer
from trainyard_status.adapters.views import JobViews
from trainyard_status.handlers import project_event

WAYS = ("per write", "per batch")


def job_events(job_id: str) -> list[Event]:
    spec = JobSpec(name=f"bench-{job_id[:8]}", roles=[RoleSpec(name="main", command="true")])
    placement = TaskPlacement(role="main", index=0, node="n0", host_ip="127.0.0.1")
    states = (TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED)
    return [
        JobSubmitted(job_id=job_id, spec=spec),
        JobAccepted(job_id=job_id, spec=spec),
        JobQueued(job_id=job_id),
        JobPlaced(job_id=job_id, spec=spec, tasks=[placement]),
        *(
            TaskStateChanged(
                job_id=job_id,
                role="main",
                index=0,
                state=state,
                seq=seq,
                node="n0",
                exit_code=0 if state == TaskState.SUCCEEDED else None,
            )
            for seq, state in enumerate(states, 1)
        ),  # fmt: skip
        JobFinished(job_id=job_id, state=JobState.SUCCEEDED, reason="succeeded", exit_code=0),
    ]


async def project(bus: Bus, store: Path, durable: str, batched: bool, until: int) -> dict:
    client = SqliteClient(store)
    db = client["status"]
    views = JobViews(db)
    await views.ensure_indexes()
    stop = asyncio.Event()
    cpu, wall = time.process_time(), time.perf_counter()
    task = asyncio.create_task(
        bus.consume(
            durable,
            [ALL_EVENTS, ALL_COMMANDS],
            partial(project_event, views=views),
            stop=stop,
            atomic=db if batched else None,
        )  # fmt: skip
    )
    while not await bus.consumed(durable, until, timeout_s=5.0):
        if task.done():
            task.result()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stop.set()
    await task
    jobs = await views.jobs.count_documents({"state": "SUCCEEDED"})
    await client.close()
    return {"wall_s": wall, "cpu_s": cpu, "jobs_succeeded": jobs}


async def run(jobs: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            bus = await Bus.connect(server.url, name="bench")
            events = [e for _ in range(jobs) for e in job_events(uuid.uuid4().hex)]
            for start in range(0, len(events), 500):
                await bus.publish_all(events[start : start + 500])
            until = await bus.last_seq()
            results: dict[str, list[dict]] = {way: [] for way in WAYS}
            for r in range(rounds):
                for i, way in enumerate(WAYS):
                    store = Path(tmp) / f"store-{r}-{i}"
                    results[way].append(
                        await project(bus, store, f"bench-{r}-{i}", way == "per batch", until)
                    )
            await bus.close()
        finally:
            server.stop()
    report: dict = {"jobs": jobs, "events": len(events), "rounds": rounds}
    for way, runs in results.items():
        assert all(run["jobs_succeeded"] == jobs for run in runs), runs
        report[way] = {
            "events_per_s": round(statistics.fmean(len(events) / run["wall_s"] for run in runs)),
            "cpu_us_per_event": round(
                statistics.fmean(1e6 * run["cpu_s"] / len(events) for run in runs)
            ),
            "runs_events_per_s": [round(len(events) / run["wall_s"]) for run in runs],
        }
    report["speedup"] = round(
        report["per batch"]["events_per_s"] / report["per write"]["events_per_s"], 2
    )
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}"
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.jobs, args.rounds)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
