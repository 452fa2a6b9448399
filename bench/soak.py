"""A soak: mixed work for a long while, and whether memory and latency stay flat.

    .venv/bin/python bench/soak.py [--minutes 60] [--rate 4]

Starts the platform (every service its own process, the embedded SQLite store) and, for
``--minutes``, offers ``--rate`` jobs per second of a mix: one-task jobs that succeed,
jobs that fail and are retried once, jobs that run a while and are paused then resumed,
jobs stopped while running; in between it queries lists, job pages and histories. Every
minute it records each service's resident memory and the p50/p99 of the queries and of
submissions in that minute, and how long after its 202 a submitted job's page shows it
(one submission in ten is followed). A job's page is queried only once it is five
seconds old. Answers that are not 2xx are counted, not fatal. At the end every job must
have ended as its kind says.

Prints JSON: the per-minute series, and per series the change from the first third of
the run to the last (a leak or a cost that grows with history shows there).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from trainyard_stack.platform import Platform, PlatformConfig

KINDS = {  # kind: (share, command, retries, expected end)
    "ok": (0.6, "true", 0, "SUCCEEDED"),
    "retried": (0.15, 'test "$TRAINYARD_ATTEMPT" -gt 1 || exit 3', 1, None),
    "paused": (0.15, "sleep 4", 0, "SUCCEEDED"),
    "stopped": (0.1, "sleep 60", 0, "STOPPED"),
}


def job(kind: str) -> dict[str, Any]:
    _, command, retries, _ = KINDS[kind]
    return {
        "name": f"soak-{kind}-{uuid.uuid4().hex[:8]}",
        "retry_limit": retries,
        "roles": [
            {
                "name": "w",
                "command": command,
                "resources": {"cpu": 1, "memory_mb": 128},
                # A user's failure is retried only where the role asks for it.
                "restart_policy": "OnFailure" if retries else "Never",
            }
        ],
    }


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 1)


# A job's page is queried only once its submission is this old: the native API answers
# 202 when the bus has stored the job, and the status view follows a moment later (the
# visibility lag is measured on its own, below).
QUERY_AFTER_S = 5.0
# One submission in this many is followed until its page shows it.
TRACK_EVERY = 10


async def soak(
    platform: Platform, minutes: float, rate: float, progress: Path | None = None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {platform.token}"}
    rng = random.Random(1)
    jobs: dict[str, str] = {}
    submitted_at: list[tuple[float, str]] = []
    series: list[dict[str, Any]] = []
    # Answers that were not 2xx, by call and status (an hour's run is not thrown away for
    # one; the count is the figure), and the first of each.
    errors: collections.Counter[str] = collections.Counter()
    first_errors: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=platform.url, headers=headers, timeout=60) as http:
        submit_times: list[float] = []
        query_times: list[float] = []
        visible_times: list[float] = []

        async def timed(bucket: list[float], what: str, call: Any) -> httpx.Response | None:
            t0 = time.perf_counter()
            try:
                answer = await call
            except httpx.HTTPError as exc:
                key = f"{what} {type(exc).__name__}"
                errors[key] += 1
                first_errors.setdefault(key, str(exc))
                return None
            bucket.append(time.perf_counter() - t0)
            if answer.status_code >= 400:
                key = f"{what} {answer.status_code}"
                errors[key] += 1
                first_errors.setdefault(key, f"{answer.request.url}: {answer.text[:300]}")
                return None
            return answer

        async def visible(job_id: str, since: float) -> None:
            """How long after its 202 the job's page shows it."""
            while time.perf_counter() - since < 60:
                answer = await http.get(f"/v1/jobs/{job_id}")
                if answer.status_code == 200:
                    visible_times.append(time.perf_counter() - since)
                    return
                await asyncio.sleep(0.02)
            errors["job page never showed a submitted job"] += 1
            first_errors.setdefault("job page never showed a submitted job", job_id)

        async def one(kind: str, track: bool) -> None:
            answer = await timed(submit_times, "submit", http.post("/v1/jobs", json=job(kind)))
            if answer is None:
                return
            answered = time.perf_counter()
            job_id = answer.json()["id"]
            jobs[job_id] = kind
            submitted_at.append((time.monotonic(), job_id))
            if track:
                await visible(job_id, answered)
            if kind in ("paused", "stopped"):
                await asyncio.sleep(1.5)
                verb = "pause" if kind == "paused" else "stop"
                await timed([], verb, http.post(f"/v1/jobs/{job_id}/{verb}"))
                if kind == "paused":
                    await asyncio.sleep(1.0)
                    await timed([], "resume", http.post(f"/v1/jobs/{job_id}/resume"))

        async def queries() -> None:
            await timed(query_times, "list", http.get("/v1/jobs", params={"limit": 50}))
            await timed(query_times, "list", http.get("/v1/jobs", params={"state": "RUNNING"}))
            cutoff = time.monotonic() - QUERY_AFTER_S
            old = bisect.bisect_right(submitted_at, (cutoff, "~"))
            if old:
                job_id = submitted_at[rng.randrange(old)][1]
                await timed(query_times, "job page", http.get(f"/v1/jobs/{job_id}"))
                await timed(query_times, "history", http.get(f"/v1/jobs/{job_id}/events"))

        start = time.monotonic()
        minute_end = start + 60
        tasks: list[asyncio.Task[None]] = []
        n = 0
        kinds = list(KINDS)
        weights = [KINDS[k][0] for k in kinds]
        while time.monotonic() - start < minutes * 60:
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
            kind = rng.choices(kinds, weights)[0]
            tasks.append(asyncio.create_task(one(kind, n % TRACK_EVERY == 0)))
            n += 1
            if n % 4 == 0:
                tasks.append(asyncio.create_task(queries()))
            if time.monotonic() >= minute_end:
                minute_end += 60
                series.append(
                    {
                        "minute": len(series) + 1,
                        "jobs": len(jobs),
                        "rss_mb": {k: round(rss_mb(p.pid)) for k, p in platform.procs.items()},
                        "submit_p50_ms": pct(submit_times, 0.5),
                        "submit_p99_ms": pct(submit_times, 0.99),
                        "query_p50_ms": pct(query_times, 0.5),
                        "query_p99_ms": pct(query_times, 0.99),
                        "visible_p50_ms": pct(visible_times, 0.5),
                        "visible_p99_ms": pct(visible_times, 0.99),
                        "errors": sum(errors.values()),
                    }
                )
                if progress is not None:  # a run cut short still leaves its minutes
                    with progress.open("a") as out:
                        out.write(json.dumps(series[-1]) + "\n")
                submit_times.clear()
                query_times.clear()
                visible_times.clear()
                for t in tasks:
                    if t.done():
                        t.result()  # a bug in the soak itself stops it
                tasks = [t for t in tasks if not t.done()]
        await asyncio.gather(*tasks)
        ends = await settle(http, jobs)
    wrong = collections.Counter(
        f"{jobs[i]} ended {s}" for i, s in ends.items() if not expected(jobs[i], s)
    )
    example = next((i for i, s in ends.items() if not expected(jobs[i], s)), None)
    return {
        "minutes": minutes,
        "rate": rate,
        "jobs": len(jobs),
        "series": series,
        "errors": dict(errors),
        "first_errors": first_errors,
        "wrong_ends": dict(wrong),
        "a_wrong_job": example and (await http_view(platform, example)),
    }


async def http_view(platform: Platform, job_id: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {platform.token}"}
    async with httpx.AsyncClient(base_url=platform.url, headers=headers) as http:
        view = (await http.get(f"/v1/jobs/{job_id}")).json()
    return {k: view.get(k) for k in ("id", "name", "state", "reason", "errors")}


def expected(kind: str, state: str) -> bool:
    want = KINDS[kind][3]
    if kind == "retried":  # fails once, then its second attempt succeeds
        return state == "SUCCEEDED"
    return state == want


async def settle(http: httpx.AsyncClient, jobs: dict[str, str]) -> dict[str, str]:
    ends: dict[str, str] = {}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for job_id in [j for j in jobs if j not in ends]:
            state = (await http.get(f"/v1/jobs/{job_id}")).json().get("state")
            if state in ("SUCCEEDED", "FAILED", "STOPPED", "REJECTED"):
                ends[job_id] = state
        if len(ends) == len(jobs):
            break
        await asyncio.sleep(2)
    return {j: ends.get(j, "NOT ENDED") for j in jobs}


def trend(series: list[dict[str, Any]], key: str) -> dict[str, float]:
    """The mean over the first third against the last third of the run."""
    third = max(1, len(series) // 3)
    first = [float(m[key]) for m in series[:third]]
    last = [float(m[key]) for m in series[-third:]]
    return {"first": round(statistics.mean(first), 1), "last": round(statistics.mean(last), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument(
        "--progress", type=Path, help="append each minute's figures to this file as they come"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o711)  # the tasks' uids pass through to their directories
        cluster = Path(tmp) / "cluster.yaml"
        cluster.write_text(
            yaml.safe_dump(
                {"nodes": [{"name": f"n{i}", "cpu": 64, "memory_mb": 262144} for i in range(4)]}
            )
        )
        config = PlatformConfig.with_free_ports(
            Path(tmp) / "data", cluster_file=cluster, log_level="WARNING"
        )
        with Platform(config) as platform:
            result = asyncio.run(soak(platform, args.minutes, args.rate, args.progress))
    series = result["series"]
    if series:
        result["trends"] = {
            key: trend(series, key)
            for key in (
                "submit_p99_ms",
                "query_p99_ms",
                "visible_p99_ms",
                "submit_p50_ms",
                "query_p50_ms",
                "visible_p50_ms",
            )
        }
        result["rss_trends"] = {
            name: trend([{"v": m["rss_mb"][name]} for m in series], "v")
            for name in series[0]["rss_mb"]
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
