"""NATS's memory as the stream's history grows: the subjects as they are
(``yard.job.<event>``, one per kind of message) against the earlier form that named the
job (``yard.job.<job_id>.<event>``), each on a fresh nats-server in the same run.

    .venv/bin/python bench/nats_subjects.py [--jobs 40000] [--every 10000] [--no-msg-ids]

Each job is a one-task job's life as the platform publishes it (JobSubmitted,
JobAccepted, JobPlaced, TasksPlaced, two TaskStateChanged, JobFinished: the project's
example events with the job's id), published with acks, 64 in flight, into the
platform's own stream (``Bus.ensure_streams``: file storage, the 10-minute duplicate
window). Every ``--every`` jobs: the server's resident memory. With ``--no-msg-ids`` the
messages carry no ``Nats-Msg-Id``, so the duplicate window holds nothing and what is
left is the stream's own. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard_common.bus import Bus
from trainyard_common.contracts import example_events
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobSubmitted,
    TasksPlaced,
    TaskStateChanged,
    encode,
)
from trainyard_common.subjects import earlier_subject_for, subject_for
from trainyard_stack.components import NatsServer

LIFE = (
    JobSubmitted,
    JobAccepted,
    JobPlaced,
    TasksPlaced,
    TaskStateChanged,
    TaskStateChanged,
    JobFinished,
)
IN_FLIGHT = 64


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def life_of(examples: dict[type[Event], Event], job_id: str) -> list[Event]:
    return [
        examples[kind].model_copy(update={"job_id": job_id, "event_id": uuid.uuid4().hex})
        for kind in LIFE
    ]


async def fill(
    subject: Callable[[Event], str], jobs: int, every: int, msg_ids: bool, root: Path
) -> dict[str, Any]:
    server = NatsServer(root / "nats").start()
    try:
        assert server.pid is not None
        pid = server.pid
        bus = await Bus.connect(server.url, name="bench")
        examples = {type(e): e for e in example_events()}
        memory = {"0": rss_mb(pid)}
        pending: list[asyncio.Future[Any]] = []
        started = time.perf_counter()
        for n in range(1, jobs + 1):
            for event in life_of(examples, uuid.uuid4().hex):
                headers = {"Nats-Msg-Id": event.event_id} if msg_ids else None
                pending.append(
                    await bus.js.publish_async(subject(event), encode(event), headers=headers)
                )
                if len(pending) >= IN_FLIGHT:
                    await asyncio.gather(*pending)
                    pending.clear()
            if n % every == 0:
                await asyncio.gather(*pending)
                pending.clear()
                memory[str(n)] = rss_mb(pid)
        await asyncio.gather(*pending)
        seconds = time.perf_counter() - started
        answer = await bus.nc.request("$JS.API.STREAM.INFO.YARD", b"", timeout=10)
        state = json.loads(answer.data)["state"]
        await bus.close()
        return {
            "rss_mb": memory,
            "messages": state["messages"],
            "subjects": state["num_subjects"],
            "publishes_per_s": round(state["messages"] / seconds),
            "kb_per_job_after_first_chunk": round(
                (memory[str(jobs)] - memory[str(every)]) * 1024 / max(jobs - every, 1), 2
            ),
        }
    finally:
        server.stop()


async def main(jobs: int, every: int, msg_ids: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"jobs": jobs, "messages_per_job": len(LIFE), "msg_ids": msg_ids}
    with tempfile.TemporaryDirectory() as tmp:
        report["by_kind"] = await fill(subject_for, jobs, every, msg_ids, Path(tmp) / "kind")
        report["earlier_by_job"] = await fill(
            earlier_subject_for, jobs, every, msg_ids, Path(tmp) / "job"
        )
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40000)
    parser.add_argument("--every", type=int, default=10000)
    parser.add_argument("--no-msg-ids", action="store_true")
    args = parser.parse_args()
    if args.jobs < args.every or args.every < 1:
        parser.error("--jobs must be at least --every, and --every at least 1")
    print(json.dumps(asyncio.run(main(args.jobs, args.every, not args.no_msg_ids)), indent=2))
