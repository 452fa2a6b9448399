"""Trace replay: the Alibaba pod list through the real scheduling cycle, with arrivals and
departures on a simulated clock.

    .venv/bin/python bench/placement_replay.py [--nodes NODES.csv] [--pods PODS.csv]
        [--speedup 50] [--node-fraction 0.05] [--policy NAME] [--seed 42] [--quick]

The openb pod lists carry each pod's ``creation_time``, ``scheduled_time`` and
``deletion_time`` (seconds from the trace's start). A pod arrives at its creation time ÷
``--speedup`` and, once placed, runs for what it ran in the trace (deletion − scheduled
time; deletion − creation for the pods the trace never scheduled), then leaves. Every pod
is a one-task job of its CPU, memory and GPU request, all of one priority.

At the trace's own times the cluster is never busy: at most 65.6 GPUs of its 6,212 are
asked for at once, so every pod starts on arrival under any policy. The replay therefore
compresses the arrivals (``--speedup``, durations unchanged) and, to keep the run short,
uses a seeded sample of the GPU nodes (``--node-fraction``). The defaults, 5 % of the
nodes (61 nodes, 323 GPUs) and 50x, ask for about 270 GPUs on average while most pods
arrive and for over 500 at the peaks: the queue grows and drains.

Each simulated instant, the departures are released (``SchedulerState.release``), the
arrivals queued (``enqueue``), and, while anything waits, one cycle runs
(``SchedulerState.cycle``, which derives the snapshot and the target workload as the
service does); its placements are committed and their departures scheduled. Two
schedulers run on the same arrivals: Trainyard's (its policy with the default rules:
priority order, conservative backfill, preemption) and a baseline of strict FIFO
first-fit (no backfill, no preemption).

Prints one JSON object: wait (placement time − arrival, simulated seconds) mean / p50 /
p99 / max over the placed pods, the allocation (allocated ÷ total milli-GPU) over the
arrivals' window (``window``) and its time-weighted mean, pods never placed, cycles run
and the run's seconds.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openb import DEFAULT_NODES, DEFAULT_PODS, TracePod, load_cluster, load_pods, parse_policy  # noqa: E402

from trainyard_common.cluster import ClusterSpec  # noqa: E402
from trainyard_placement.domain.capacity import Allocation, task_gpus  # noqa: E402
from trainyard_placement.domain.gpu_share import MILLI  # noqa: E402
from trainyard_placement.domain.plugins import Fifo, Rules  # noqa: E402
from trainyard_placement.domain.policies import DEFAULT_POLICY, scorer_named  # noqa: E402
from trainyard_placement.domain.queue import Placed, Preempt, QueuedJob  # noqa: E402
from trainyard_placement.domain.state import SchedulerState  # noqa: E402

SAMPLES = 48  # points of the allocation-over-time series
BASELINE = "fifo-first-fit"
# Event kinds at one instant: departures first, so their capacity is free for arrivals.
DEPART, ARRIVE = 0, 1


@dataclass(frozen=True)
class Job:
    pod: TracePod
    arrival: float
    duration: float
    gpu_milli: int


def jobs_of(pods: Sequence[TracePod], speedup: float) -> list[Job]:
    """The pods with a creation and a deletion time, in arrival order."""
    jobs = []
    for pod in pods:
        if pod.creation is None or pod.deletion is None:
            continue
        started = pod.scheduled if pod.scheduled is not None else pod.creation
        res = pod.spec.roles[0].resources
        milli = round(res.gpu * MILLI) if res.gpu < 1 else round(res.gpu) * MILLI
        jobs.append(Job(pod, pod.creation / speedup, max(pod.deletion - started, 0), milli))
    jobs.sort(key=lambda j: (j.arrival, j.pod.name))
    return jobs


def sample_cluster(cluster: ClusterSpec, fraction: float, seed: int) -> ClusterSpec:
    if fraction >= 1:
        return cluster
    count = max(1, round(len(cluster.nodes) * fraction))
    picked = sorted(random.Random(seed).sample(range(len(cluster.nodes)), count))
    return ClusterSpec(nodes=[cluster.nodes[i] for i in picked])


def scheduler(name: str, cluster: ClusterSpec) -> SchedulerState:
    if name == BASELINE:
        return SchedulerState(
            cluster,
            scorer=scorer_named("first-fit"),
            rules=Rules(order=Fifo(), victims=None, backfill=False),
        )
    return SchedulerState(cluster, scorer=scorer_named(name), rules=Rules())


def replay(cluster: ClusterSpec, jobs: Sequence[Job], name: str) -> dict[str, Any]:
    state = scheduler(name, cluster)
    capacity = sum(n.gpus for n in cluster.nodes) * MILLI
    by_id = {job.pod.name: job for job in jobs}
    events: list[tuple[float, int, int, str]] = [
        (job.arrival, ARRIVE, i, job.pod.name) for i, job in enumerate(jobs)
    ]
    heapq.heapify(events)
    seq = len(jobs)
    waits: list[float] = []
    attempts: dict[str, int] = {}
    arrived_at: dict[str, float] = {}
    allocated = 0  # milli-GPU held by placed jobs
    series: list[tuple[float, float, int]] = []  # (time, allocation %, queued jobs)
    start, end = window(jobs)
    area = 0.0
    last = jobs[0].arrival if jobs else 0.0
    cycles = preempted = 0
    started = time.perf_counter()
    while events:
        now = events[0][0]
        area += allocated * max(min(now, end) - max(last, start), 0)
        last = now
        while events and events[0][0] == now:
            _, kind, _, job_id = heapq.heappop(events)
            if kind == DEPART:
                released = state.release(job_id)
                if released is not None:
                    allocated -= sum(m for t in released.tasks for _, m in task_gpus(t))
            else:
                arrived_at.setdefault(job_id, now)
                attempt = attempts.get(job_id, 0) + 1
                attempts[job_id] = attempt
                state.enqueue(QueuedJob(job_id, by_id[job_id].pod.spec, seq, attempt))
                seq += 1
        if state.queued:
            cycles += 1
            for decision in state.cycle(now=now):
                if isinstance(decision, Placed):
                    allocation: Allocation = decision.allocation
                    state.commit(allocation, placed_at=now)
                    allocated += sum(m for t in allocation.tasks for _, m in task_gpus(t))
                    waits.append(now - arrived_at[decision.job_id])
                    job = by_id[decision.job_id]
                    seq += 1
                    heapq.heappush(events, (now + job.duration, DEPART, seq, decision.job_id))
                elif isinstance(decision, Preempt):
                    # The launcher would end the victims; here they end at once and queue
                    # again, to run their whole duration anew.
                    for victim in decision.victims:
                        state.preempting(victim, decision.job_id)
                        released = state.release(victim)
                        if released is not None:
                            allocated -= sum(m for t in released.tasks for _, m in task_gpus(t))
                            preempted += 1
                            seq += 1
                            heapq.heappush(events, (now, ARRIVE, seq, victim))
        series.append((now, 100 * allocated / capacity if capacity else 0.0, len(state.queued)))
    seconds = time.perf_counter() - started
    span = end - start
    return {
        "placed": len(waits),
        "never_placed": len(state.queued),
        "preempted": preempted,
        "wait_s": wait_summary(waits),
        "allocation_mean_pct": round(100 * area / capacity / span, 2) if capacity and span else 0.0,
        "allocation_over_time": thin(series, start, end),
        "end_s": round(last, 1),
        "cycles": cycles,
        "seconds": round(seconds, 1),
    }


def window(jobs: Sequence[Job]) -> tuple[float, float]:
    """Where the allocation is reported: from the arrival of the first percentile of the
    pods to the last arrival. The trace's first few dozen pods arrive over its first 115
    days and the rest within its last 34; after the last arrival only its longest pods
    remain, for months."""
    if not jobs:
        return 0.0, 0.0
    return jobs[len(jobs) // 100].arrival, jobs[-1].arrival


def wait_summary(waits: Sequence[float]) -> dict[str, float | None]:
    if not waits:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    ordered = sorted(waits)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 1)

    return {
        "mean": round(sum(ordered) / len(ordered), 1),
        "p50": at(0.5),
        "p99": at(0.99),
        "max": round(ordered[-1], 1),
        "waited": sum(1 for w in ordered if w > 0),
    }


def thin(
    series: Sequence[tuple[float, float, int]], start: float, end: float
) -> list[dict[str, float]]:
    """The state at SAMPLES evenly spaced instants (the last event at or before each)."""
    if not series or end <= start:
        return []
    out = []
    i = 0
    for k in range(SAMPLES + 1):
        t = start + (end - start) * k / SAMPLES
        while i + 1 < len(series) and series[i + 1][0] <= t:
            i += 1
        out.append({"t": round(t, 1), "alloc_pct": round(series[i][1], 2), "queued": series[i][2]})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    parser.add_argument(
        "--speedup",
        type=float,
        default=50.0,
        help="arrival times divided by this (1: the trace's own times)",
    )
    parser.add_argument(
        "--node-fraction",
        type=float,
        default=0.05,
        help="seeded sample of the GPU nodes (1: all of them)",
    )
    parser.add_argument("--policy", type=parse_policy, default=DEFAULT_POLICY)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, default=None, help="only the first N pods")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: the first 300 pods on 1 %% of the nodes, 300x",
    )
    parser.add_argument(
        "--cpu-nodes", action="store_true", help="keep the trace's nodes without GPUs"
    )
    args = parser.parse_args(argv)
    if args.speedup <= 0:
        parser.error("--speedup: must be above 0")
    if not 0 < args.node_fraction <= 1:
        parser.error("--node-fraction: must be in (0, 1]")
    if args.quick:
        args.limit = args.limit or 300
        args.node_fraction = min(args.node_fraction, 0.01)
        args.speedup = max(args.speedup, 300.0)

    cluster = sample_cluster(
        load_cluster(args.nodes, cpu_nodes=args.cpu_nodes), args.node_fraction, args.seed
    )
    pods = load_pods(args.pods)
    if not any(p.creation is not None and p.deletion is not None for p in pods):
        parser.error(f"--pods: {args.pods} has no creation_time/deletion_time columns")
    jobs = jobs_of(pods, args.speedup)
    if args.limit:
        jobs = jobs[: args.limit]
    started = time.perf_counter()
    results = {name: replay(cluster, jobs, name) for name in (args.policy, BASELINE)}
    mine, base = results[args.policy], results[BASELINE]
    report: dict[str, Any] = {
        "nodes": str(args.nodes),
        "pods": str(args.pods),
        "cluster": {"nodes": len(cluster.nodes), "gpus": sum(n.gpus for n in cluster.nodes)},
        "node_fraction": args.node_fraction,
        "seed": args.seed,
        "speedup": args.speedup,
        "pod_count": len(jobs),
        "offered": offered(jobs),
        "policy": args.policy,
        "baseline": BASELINE,
        "schedulers": results,
        "comparison": {
            "mean_wait_ratio": ratio(mine["wait_s"]["mean"], base["wait_s"]["mean"]),
            "p99_wait_ratio": ratio(mine["wait_s"]["p99"], base["wait_s"]["p99"]),
            "allocation_mean_pct_diff": round(
                mine["allocation_mean_pct"] - base["allocation_mean_pct"], 2
            ),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f} at the end"
        ),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


def offered(jobs: Sequence[Job]) -> dict[str, float]:
    """GPUs asked for if every pod started on arrival: the load the arrivals put on any
    cluster, its mean over the window the allocation is reported on and its peak."""
    if not jobs:
        return {"mean_gpus": 0.0, "peak_gpus": 0.0}
    start, end = window(jobs)
    changes = sorted(
        [(j.arrival, j.gpu_milli) for j in jobs]
        + [(j.arrival + j.duration, -j.gpu_milli) for j in jobs]
    )
    level = peak = 0
    area = 0.0
    last = changes[0][0]
    for t, delta in changes:
        area += level * max(min(t, end) - max(last, start), 0)
        last = t
        level += delta
        peak = max(peak, level)
    mean = area / (end - start) / MILLI if end > start else 0.0
    return {"mean_gpus": round(mean, 1), "peak_gpus": round(peak / MILLI, 1)}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


if __name__ == "__main__":
    raise SystemExit(main())
