"""The status service's projection: each write on its own against each fetched batch
stored at once (``Bus.consume(atomic=...)``: one SQLite transaction, or on MongoDB a unit
of work sent as bounded bulk writes), same run.

    .venv/bin/python bench/status_projection.py [--jobs 1000] [--rounds 2] [--store mongo]
        [--consumers 1]

``--store mongo``: the MongoDB wire, at ``MONGO_URL`` when set, else the embedded
FerretDB build (which scans its table for every ``_id`` operation: keep ``--jobs``
small there, a few hundred). ``--consumers``: that many consumers of the one durable
(status replicas), sharing the documents; each batch that could not be stored whole and
was handled one message at a time is counted.

Starts a real NATS server, publishes every event of ``--jobs`` one-task jobs (submitted,
accepted, queued, placed, the task's three transitions, finished: eight each) once, then
projects the whole stream into a fresh store with the status service's own consumer and
handler, once per way and round (the ways alternate), each with its own durable and a
fresh database. Measures events projected per second and this process's CPU time per
event (the projection runs in the benchmark's process, as in the service's). Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

from prometheus_client import REGISTRY
from pymongo import AsyncMongoClient, monitoring

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
from trainyard_common.storage import Client, batch_writes, batching, reads_ahead
from trainyard_common.subjects import ALL_COMMANDS, ALL_EVENTS
from trainyard_stack.components import FerretDB, NatsServer
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


class Commands(monitoring.CommandListener):
    """Commands the MongoDB client sent (each a round trip to the server)."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def project(
    bus: Bus,
    client: Client,
    name: str,
    durable: str,
    batched: bool,
    until: int,
    consumers: int = 1,
) -> dict:
    commands = COMMANDS.count
    db = batching(client[name]) if batched else client[name]
    views = JobViews(db)
    await views.ensure_indexes()
    stop = asyncio.Event()
    cpu, wall = time.process_time(), time.perf_counter()
    # Several consumers of one durable: status replicas, sharing the store's documents.
    tasks = [
        asyncio.create_task(
            bus.consume(
                durable,
                [ALL_EVENTS, ALL_COMMANDS],
                partial(project_event, views=views),
                stop=stop,
                atomic=batch_writes(db) if batched else None,
                before_batch=views.preload if batched and reads_ahead(db) else None,
            )  # fmt: skip
        )
        for _ in range(consumers)
    ]
    while not await bus.consumed(durable, until, timeout_s=5.0):
        for task in tasks:
            if task.done():
                task.result()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    commands = COMMANDS.count - commands
    stop.set()
    await asyncio.gather(*tasks)
    jobs = await views.jobs.count_documents({"state": "SUCCEEDED"})
    await client.drop_database(name)
    splits = REGISTRY.get_sample_value("trainyard_bus_batches_split_total", {"durable": durable})
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "jobs_succeeded": jobs,
        "commands": commands,
        "batches_split": int(splits or 0),
    }


COMMANDS = Commands()


def counted_client(url: str) -> AsyncMongoClient[dict]:
    return AsyncMongoClient(url, tz_aware=True, event_listeners=[COMMANDS])


async def run(jobs: int, rounds: int, store: str, consumers: int = 1) -> dict:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        server = NatsServer(Path(tmp) / "nats").start()
        stack.callback(server.stop)
        client: Client
        if store == "sqlite":
            client = SqliteClient(Path(tmp) / "store")
        elif os.environ.get("MONGO_URL"):
            client = counted_client(os.environ["MONGO_URL"])
        else:
            ferretdb = FerretDB(Path(tmp) / "ferretdb").start()
            stack.callback(ferretdb.stop)
            client = counted_client(ferretdb.url)
        bus = await Bus.connect(server.url, name="bench")
        events = [e for _ in range(jobs) for e in job_events(uuid.uuid4().hex)]
        for start in range(0, len(events), 500):
            await bus.publish_all(events[start : start + 500])
        until = await bus.last_seq()
        results: dict[str, list[dict]] = {way: [] for way in WAYS}
        prefix = "bench" + uuid.uuid4().hex[:8]
        for r in range(rounds):
            for i, way in enumerate(WAYS):
                name, durable = f"{prefix}_{r}_{i}", f"bench-{r}-{i}"
                results[way].append(
                    await project(bus, client, name, durable, way == "per batch", until, consumers)
                )
        await bus.close()
        await client.close()
    report: dict = {
        "store": store,
        "jobs": jobs,
        "events": len(events),
        "rounds": rounds,
        "consumers": consumers,
    }
    for way, runs in results.items():
        assert all(run["jobs_succeeded"] == jobs for run in runs), runs
        report[way] = {
            "events_per_s": round(statistics.fmean(len(events) / run["wall_s"] for run in runs)),
            "cpu_us_per_event": round(
                statistics.fmean(1e6 * run["cpu_s"] / len(events) for run in runs)
            ),
            "runs_events_per_s": [round(len(events) / run["wall_s"]) for run in runs],
        }
        if store == "mongo":  # round trips to the server, the consumer's reads and writes
            report[way]["commands_per_event"] = round(
                statistics.fmean(run["commands"] / len(events) for run in runs), 2
            )
            report[way]["batches_split"] = [run["batches_split"] for run in runs]
    report["speedup"] = round(
        report["per batch"]["events_per_s"] / report["per write"]["events_per_s"], 2
    )
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}"
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--store", choices=("sqlite", "mongo"), default="sqlite")
    parser.add_argument(
        "--consumers", type=int, default=1, help="consumers of one durable (MongoDB only)"
    )
    args = parser.parse_args()
    if args.consumers > 1 and args.store != "mongo":
        parser.error("--consumers > 1 needs --store mongo (one SQLite connection here)")
    report = asyncio.run(run(args.jobs, args.rounds, args.store, args.consumers))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
