"""How fast jobs cross the whole pipeline, against the bus floor measured in the same run.

Starts the platform (every service its own process, real NATS; the embedded SQLite store,
then FerretDB as the baseline), submits N
one-task jobs whose command is `true`, and measures submissions per second (202s, each
after JetStream's ack) and jobs per second from the first submission to the last job
seen SUCCEEDED. In the same run it measures the floor the design budget names (DESIGN
§9): JetStream publish with ack one at a time, and pipelined.

    .venv/bin/python bench/pipeline.py [--jobs 200] [--concurrency 16] [--stores sqlite,ferretdb]
    .venv/bin/python bench/pipeline.py --rate 20 --jobs 600 --stores sqlite
    .venv/bin/python bench/pipeline.py --held --jobs 3000 --stores sqlite --client aiohttp
    .venv/bin/python bench/pipeline.py --jobs 2000 --history 100000 --stores sqlite

With ``--rate`` the jobs are offered at that rate and each one's time from submission to
its task running is measured (p50, p99). With ``--held`` every node is drained first:
every job is accepted and waits in its queue, so the submissions are measured with every
service at work but no task's process (what spawning costs on a small machine is then
out of the submission figure); the run ends when the status views show every job
queued. ``--client aiohttp``: the submitters use aiohttp (they share the machine with
the platform, and httpx costs them twice the CPU). ``--history N``: ``--jobs`` measured
on the fresh platform, N more run to the end, then ``--jobs`` again on the same platform
(whether any stage's cost grows with the jobs it has seen).

Prints one JSON object. The ratios say what share of the raw bus rate the platform
keeps: every job crosses at least seven hops (submitted, accepted, placed, 3 task
transitions, finished) and starts a process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import nats
import yaml

from trainyard_common.cluster import NodeSpec
from trainyard_stack.components import NatsServer
from trainyard_stack.kube import RUN_DURATION, KubeCluster
from trainyard_stack.platform import Platform, PlatformConfig


async def bus_floor(messages: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await js.add_stream(name="FLOOR", subjects=["floor.>"])
            payload = b"x" * 600  # about the size of a JobSubmitted
            start = time.perf_counter()
            for i in range(messages):
                await js.publish(f"floor.{i}", payload, headers={"Nats-Msg-Id": uuid.uuid4().hex})
            one_by_one = messages / (time.perf_counter() - start)
            start = time.perf_counter()
            futures = [await js.publish_async(f"floor.{i}", payload) for i in range(messages)]
            await asyncio.gather(*futures)
            pipelined = messages / (time.perf_counter() - start)
            await nc.close()
        finally:
            server.stop()
    return {"publish_ack_per_s": round(one_by_one), "publish_pipelined_per_s": round(pipelined)}


def job(i: int) -> dict:
    return {
        "jobName": f"bench-{i}-{uuid.uuid4().hex[:6]}",
        "image": "x",
        "taskRoles": [
            {
                "name": "t",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 100,
                "gpuNumber": 0,
                "command": "true",
            }
        ],
    }


NODES = 4  # of the local backend's cluster, n0 .. n3


async def run_jobs(
    platform: Platform, jobs: int, concurrency: int, held: bool = False, client: str = "httpx"
) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {platform.token}"}
    async with (
        httpx.AsyncClient(base_url=platform.url, headers=headers, timeout=60) as http,
        aiohttp.ClientSession(platform.url, headers=headers) as session,
    ):
        state = "QUEUED" if held else "SUCCEEDED"
        # Jobs of earlier runs on this platform (--history) are in that state already.
        before = (await http.get("/v1/jobs", params={"state": state, "limit": 1})).json()["total"]
        gate = asyncio.Semaphore(concurrency)
        latencies: list[float] = []

        async def submit(i: int) -> str:
            async with gate:
                t0 = time.perf_counter()
                if client == "aiohttp":
                    async with session.post("/v1/jobs", json=job(i)) as response:
                        response.raise_for_status()
                        made = await response.json()
                else:
                    answer = await http.post("/v1/jobs", json=job(i))
                    answer.raise_for_status()
                    made = answer.json()
                latencies.append(time.perf_counter() - t0)
                return str(made["id"])

        for i in range(NODES if held else 0):
            (await http.post(f"/v1/placement/nodes/n{i}/drain")).raise_for_status()
        start = time.perf_counter()
        ids = await asyncio.gather(*(submit(i) for i in range(jobs)))
        submitted = time.perf_counter() - start
        await wait_in_state(http, before + len(set(ids)), state)
        total = time.perf_counter() - start
    latencies.sort()
    return {
        "jobs": jobs,
        "submit_per_s": round(jobs / submitted, 1),
        "submit_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "submit_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
        ("jobs_queued_per_s" if held else "jobs_end_to_end_per_s"): round(jobs / total, 1),
    }


async def offered_load(platform: Platform, jobs: int, rate: float) -> dict[str, float]:
    """Submit ``jobs`` at ``rate`` per second (not as fast as possible) and measure, per
    job, the time from its submission to its task running (the RUNNING transition's
    time in its history; one clock, one machine)."""
    headers = {"Authorization": f"Bearer {platform.token}"}
    async with httpx.AsyncClient(base_url=platform.url, headers=headers, timeout=60) as http:
        sent: dict[str, float] = {}

        async def submit(i: int) -> None:
            at = time.time()
            answer = await http.post("/v1/jobs", json=job(i))
            answer.raise_for_status()
            sent[answer.json()["id"]] = at

        start = time.perf_counter()
        pending = []
        for i in range(jobs):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            pending.append(asyncio.create_task(submit(i)))
        await asyncio.gather(*pending)
        await wait_succeeded(http, set(sent))
        total = time.perf_counter() - start
        waits = []
        for job_id, at in sent.items():
            history = (await http.get(f"/v1/jobs/{job_id}/events")).json()["items"]
            running = [
                datetime.fromisoformat(h["occurred_at"]).timestamp()
                for h in history
                if h["type"] == "TaskStateChanged" and h["event"]["state"] == "RUNNING"
            ]
            waits.append(min(running) - at)
    waits.sort()
    return {
        "jobs": jobs,
        "offered_per_s": rate,
        "jobs_end_to_end_per_s": round(jobs / total, 1),
        "submit_to_running_p50_ms": round(waits[len(waits) // 2] * 1000),
        "submit_to_running_p99_ms": round(waits[int(len(waits) * 0.99) - 1] * 1000),
    }


async def wait_succeeded(http: httpx.AsyncClient, ids: set[str], timeout: float = 900) -> None:
    """Until every job of this run (the platform's only jobs) has succeeded."""
    await wait_in_state(http, len(ids), "SUCCEEDED", timeout)


async def wait_in_state(
    http: httpx.AsyncClient, count: int, state: str, timeout: float = 900
) -> None:
    """Until ``count`` jobs (this run's and the earlier runs' on this platform) are in
    ``state``."""
    deadline = time.monotonic() + timeout
    while True:
        page = await http.get("/v1/jobs", params={"state": state, "limit": 1})
        if page.json()["total"] >= count:
            return
        failed = await http.get("/v1/jobs", params={"state": "FAILED", "limit": 10})
        if failed.json()["total"]:
            raise RuntimeError(f"a bench job failed: {failed.json()['items'][0]}")
        if time.monotonic() > deadline:
            left = (await http.get("/v1/jobs", params={"limit": 3})).json()["items"]
            raise RuntimeError(f"jobs still not done after {timeout:.0f} s, e.g. {left}")
        await asyncio.sleep(0.2)


def api_server_floor(kube: KubeCluster, pods: int) -> dict[str, float]:
    """The API server and KWOK alone: bare pods created at once (16 at a time) on the
    cluster's nodes, until every one has completed: what Trainyard's pods can reach."""
    namespace = f"floor-{uuid.uuid4().hex[:6]}"
    with kube.client(timeout=60) as http:
        http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).raise_for_status()

        def pod(i: int) -> dict:
            return {
                "metadata": {"name": f"p{i}", "annotations": {RUN_DURATION: "100ms"}},
                "spec": {
                    "nodeName": kube.nodes[i % len(kube.nodes)].name,
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "x", "command": ["true"]}],
                },
            }

        start = time.perf_counter()
        for first in range(0, pods, 16):
            for i in range(first, min(first + 16, pods)):
                http.post(f"/api/v1/namespaces/{namespace}/pods", json=pod(i)).raise_for_status()
        while True:
            items = http.get(f"/api/v1/namespaces/{namespace}/pods").json()["items"]
            if sum(p["status"].get("phase") == "Succeeded" for p in items) >= pods:
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - start
        http.delete(f"/api/v1/namespaces/{namespace}")
        # Gone before Trainyard's run: the namespace controller deleting its pods
        # meanwhile (a DELETE and watch events for each) took from that run's control
        # plane.
        deadline = time.monotonic() + 120
        while http.get(f"/api/v1/namespaces/{namespace}").status_code != 404:
            if time.monotonic() > deadline:
                raise RuntimeError(f"namespace {namespace} still there after 120 s")
            time.sleep(0.2)
    return {"pods": pods, "pods_per_s": round(pods / elapsed, 1)}


def run_on_kube(jobs: int, concurrency: int) -> dict[str, object]:
    """The same jobs as pods on the project's Kubernetes with KWOK nodes, against the
    API server's own rate for bare pods measured in the same run."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o711)
        nodes = [NodeSpec(name=f"kwok-{i}", cpu=64, memory_mb=262144) for i in range(4)]
        kube = KubeCluster(Path(tmp) / "kube", nodes=nodes).start()
        try:
            floor = api_server_floor(kube, jobs)
            cluster = Path(tmp) / "cluster.yaml"
            cluster.write_text(yaml.safe_dump({"nodes": [], "queues": ["default"]}))
            config = PlatformConfig.with_free_ports(
                Path(tmp) / "data",
                cluster_file=cluster,
                log_level="WARNING",
                extra_env={
                    "YARD_LAUNCHER": "kubernetes",
                    "KUBECONFIG": str(kube.kubeconfig),
                    "YARD_K8S_NAMESPACE": "trainyard",
                    "YARD_K8S_NAMESPACES": "*",
                    "YARD_K8S_POD_ANNOTATIONS": json.dumps({RUN_DURATION: "100ms"}),
                },
            )
            with Platform(config) as platform:
                measured = with_cpu(
                    platform, jobs, run_jobs(platform, jobs, concurrency), kube=kube
                )
        finally:
            kube.stop()
    measured["api_server_floor"] = floor
    return measured


def run_platform(
    store: str,
    jobs: int,
    concurrency: int,
    rate: float | None = None,
    held: bool = False,
    history: int = 0,
    client: str = "httpx",
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        # Run as root, each user's tasks run under their own uid and must reach their
        # directories under the data directory: traversable (not listable) by others.
        os.chmod(tmp, 0o711)
        cluster = Path(tmp) / "cluster.yaml"
        nodes = [{"name": f"n{i}", "cpu": 64, "memory_mb": 262144} for i in range(NODES)]
        cluster.write_text(yaml.safe_dump({"nodes": nodes}))
        config = PlatformConfig.with_free_ports(
            Path(tmp) / "data", cluster_file=cluster, log_level="WARNING", store=store
        )
        with Platform(config) as platform:
            if rate:
                return dict(asyncio.run(offered_load(platform, jobs, rate)))
            if not history:
                return with_cpu(platform, jobs, run_jobs(platform, jobs, concurrency, held, client))
            return asyncio.run(with_history(platform, jobs, concurrency, history, client))


def with_cpu(
    platform: Platform,
    jobs: int,
    run: Coroutine[Any, Any, dict[str, float]],
    kube: KubeCluster | None = None,
) -> dict[str, object]:
    """``run``'s figures, and each process's CPU per job over it (the bench's own
    clients as "bench"; a local task's processes, the launcher's children, are counted
    only in the whole machine's, "machine")."""
    before = cpu_seconds(platform, kube)
    measured: dict[str, object] = dict(asyncio.run(run))
    measured["cpu_ms_per_job"] = cpu_per_job(before, cpu_seconds(platform, kube), jobs)
    return measured


def cpu_per_job(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    return {
        name: round((after[name] - before[name]) * 1000 / jobs, 2)
        for name in after
        if name in before
    }


HISTORY_CHUNK = 10_000


def platform_pids(platform: Platform) -> dict[str, int]:
    """Each service's process, and NATS's."""
    pids = {name: proc.pid for name, proc in platform.procs.items()}
    nats_proc = getattr(platform.nats, "_proc", None)
    if nats_proc is not None:
        pids["nats"] = nats_proc.pid
    return pids


def cpu_seconds(platform: Platform, kube: KubeCluster | None = None) -> dict[str, float]:
    """Each service's (and NATS's, and the Kubernetes processes') CPU time so far, user
    and system, in seconds; the bench's own; the whole machine's ("machine")."""
    pids = platform_pids(platform)
    for each in kube._procs if kube is not None else ():
        pids[each.name] = each.proc.pid
    tick = os.sysconf("SC_CLK_TCK")
    spent = {}
    for name, pid in sorted(pids.items()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
        spent[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    spent["bench"] = sum(os.times()[:2])
    # The whole machine's busy time, the tasks' processes and the kernel's own threads
    # included: what the processes above do not account for is the difference. And the
    # time the hypervisor gave this machine's CPUs to others ("steal"), which slows
    # everything here without being anyone's CPU time.
    busy = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, busy[:8])
    spent["machine"] = (user + nice + system + irq + softirq) / tick
    spent["steal"] = steal / tick
    return spent


def footprint(platform: Platform, data_dir: bool = True) -> dict[str, object]:
    """Each service's and NATS's resident memory (MB) and, with ``data_dir``, the data
    directory's size (MB) now (a walk of every file: 7-11 s after 60,000 jobs)."""
    pids = platform_pids(platform)
    rss = {}
    for name, pid in sorted(pids.items()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        rss[name] = round(kb / 1024, 1)
    if not data_dir:
        return {"rss_mb": rss}
    size = sum(p.stat().st_size for p in platform.data_dir.rglob("*") if p.is_file())
    return {"rss_mb": rss, "data_dir_mb": round(size / 2**20, 1)}


async def with_history(
    platform: Platform, jobs: int, concurrency: int, history: int, client: str
) -> dict[str, object]:
    """``jobs`` measured on the fresh platform, then ``history`` more run to the end (in
    chunks, each counted), then ``jobs`` measured again on the same platform: whether any
    stage's cost grows with the jobs it has seen."""

    async def measured(count: int, data_dir: bool = True) -> dict[str, object]:
        """One run of ``count`` jobs, each process's CPU a job over it, and the memory
        after it: which stage's cost grows, if any. (The data directory is measured
        only before and after the history: its walk would leave the platform idle
        between chunks.)"""
        before = cpu_seconds(platform)
        figures: dict[str, object] = dict(
            await run_jobs(platform, count, concurrency, client=client)
        )
        figures["cpu_ms_per_job"] = cpu_per_job(before, cpu_seconds(platform), count)
        return {**figures, **footprint(platform, data_dir)}

    first = await measured(jobs)
    chunks = []
    started = time.perf_counter()
    for done in range(0, history, HISTORY_CHUNK):
        count = min(HISTORY_CHUNK, history - done)
        chunk = await measured(count, data_dir=False)
        chunks.append(chunk)
        print(f"history: {done + count} jobs, {chunk}", file=sys.stderr, flush=True)
    fill = time.perf_counter() - started
    return {
        "fresh": first,
        "history_jobs": history,
        "history_chunks": chunks,
        "history_seconds": round(fill),
        "after_history": await measured(jobs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="offer this many jobs per second instead of submitting as fast as possible, "
        "and measure submission to running",
    )
    parser.add_argument(
        "--kube",
        action="store_true",
        help="run the jobs as pods on the project's Kubernetes with KWOK nodes (SQLite "
        "store), against bare pods through the API server in the same run",
    )
    parser.add_argument(
        "--held",
        action="store_true",
        help="every node drained first: the jobs wait in their queue, and the submissions "
        "are measured without the tasks' processes",
    )
    parser.add_argument(
        "--client",
        choices=["httpx", "aiohttp"],
        default="httpx",
        help="the HTTP client the 16 submitters use (they share the machine with the "
        "platform: aiohttp costs them less CPU per request)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="measure --jobs on the fresh platform, run this many more jobs to the end, "
        "then measure --jobs again on the same platform",
    )
    parser.add_argument(
        "--stores",
        default="sqlite,ferretdb",
        help="the platform's stores to run on, in turn (the first is the one measured; "
        "the others are its baseline in the same run)",
    )
    args = parser.parse_args()
    floor = asyncio.run(bus_floor(5000))
    result: dict[str, object] = {"bus_floor": floor}
    if args.kube:
        result["kubernetes"] = run_on_kube(args.jobs, args.concurrency)
        print(json.dumps(result, indent=2))
        return
    for store in args.stores.split(","):
        measured = run_platform(
            store, args.jobs, args.concurrency, args.rate, args.held, args.history, args.client
        )
        if isinstance(rate := measured.get("submit_per_s"), float):
            measured["submit_vs_publish_ack"] = round(rate / floor["publish_ack_per_s"], 3)
        result[store] = measured
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
