"""How fast the gang placer decides, on the Alibaba trace's cluster and a synthetic large one.

    .venv/bin/python bench/placement_speed.py [--nodes NODES.csv] [--pods PODS.csv]
        [--policy NAME] [--quick]

A decision is one ``place_gang`` on the current snapshot plus its commit
(``Snapshot.with_allocation``), as the scheduling cycle makes it; a refusal (the gang
fits nowhere, with its explanation) is a decision too. Every figure is measured for the
policy (default: Trainyard's) and for first-fit, the placer's old behaviour, in the same
run, and the JSON gives their ratio.

(a) openb: the trace's GPU nodes (1,213 nodes, 6,212 GPUs) and its pod list in arrival
    order (creation time), each pod a one-task job, no departures: the cluster fills to
    about 98 %, so the late decisions see the most fragmented states.
(b) synthetic: ``--synthetic-nodes`` nodes of 8 GPUs, and ``--synthetic-pods`` tasks in
    gangs of 2 to 64 tasks (seeded shapes: shares, 1, 2, 4 and 8 GPUs per task); then
    the latency of one 64-task gang (1 GPU per task) on the empty cluster and on the
    cluster the gangs left, placed without commit.

The target workload of the fragmentation-aware policies is the pod list's (the generated
tasks' for (b)), fixed for the run, as placement_quality.py takes it. Goals (one core):
>= 1,000 decisions/s and p99 < 5 ms on openb, a 64-task gang on 5,000 nodes < 20 ms.
Prints one JSON object; see bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openb import (  # noqa: E402
    DEFAULT_NODES,
    DEFAULT_PODS,
    context_for,
    job,
    load_cluster,
    load_pods,
    parse_policy,
    resources,
)

from trainyard_common.cluster import ClusterSpec, NodeSpec  # noqa: E402
from trainyard_common.jobspec import JobSpec  # noqa: E402
from trainyard_placement.domain.capacity import Allocation, Snapshot  # noqa: E402
from trainyard_placement.domain.gang import Unschedulable, place_gang  # noqa: E402
from trainyard_placement.domain.policies import DEFAULT_POLICY, scorer_named  # noqa: E402
from trainyard_placement.domain.scoring import ClusterContext  # noqa: E402

BASELINE = "first-fit"
GOAL_DECISIONS_PER_S = 1_000
GOAL_P99_MS = 5.0
GOAL_GANG_MS = 20.0
GANG_TASKS = 64
GANG_REPEATS = 20
# Task shapes of the synthetic gangs: (weight, milli-CPU, MiB, GPUs, milli-GPU per GPU).
SHAPES = (
    (2, 4_000, 16_384, 1, 500),
    (5, 8_000, 32_768, 1, 1_000),
    (2, 16_000, 65_536, 2, 1_000),
    (1, 32_000, 131_072, 4, 1_000),
    (1, 64_000, 262_144, 8, 1_000),
)
SYNTHETIC_NODE = {"cpu": 96.0, "memory_mb": 393_216, "gpus": 8, "gpu_type": "G2"}


def run_stream(
    cluster: ClusterSpec,
    jobs: Sequence[JobSpec],
    policy: str,
    ctx: ClusterContext,
) -> tuple[dict[str, Any], list[Allocation]]:
    """Place ``jobs`` one after another, committing each plan; per-decision latency."""
    scorer = scorer_named(policy)
    snapshot = Snapshot.of(cluster)
    latencies: list[float] = []
    allocations: list[Allocation] = []
    refused = 0
    gc.collect()
    clock = time.perf_counter
    started, cpu_started = clock(), time.process_time()
    for spec in jobs:
        t0 = clock()
        outcome = place_gang(spec, snapshot, job_id=spec.name, scorer=scorer, context=ctx)
        if isinstance(outcome, Unschedulable):
            refused += 1
        else:
            allocation = Allocation(spec.name, spec, outcome.tasks)
            snapshot = snapshot.with_allocation(allocation)
            allocations.append(allocation)
        latencies.append(clock() - t0)
    seconds, cpu_seconds = clock() - started, time.process_time() - cpu_started
    return {
        "decisions": len(jobs),
        "placed": len(allocations),
        "refused": refused,
        "seconds": round(seconds, 3),
        # Beside the wall clock: on a shared machine the difference is time spent waiting
        # for a core.
        "cpu_seconds": round(cpu_seconds, 3),
        "decisions_per_s": round(len(jobs) / seconds, 1) if seconds else None,
        **latency_ms(latencies),
    }, allocations


def latency_ms(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(1000 * quantile(ordered, 0.50), 3),
        "p99_ms": round(1000 * quantile(ordered, 0.99), 3),
        "max_ms": round(1000 * ordered[-1], 3),
    }


def quantile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted samples."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def gang_latency(
    cluster: ClusterSpec,
    allocations: Sequence[Allocation],
    spec: JobSpec,
    policy: str,
    ctx: ClusterContext,
    repeats: int,
) -> dict[str, Any]:
    """One gang placed (not committed) ``repeats`` times, each with a fresh scorer (no
    memo carries over from the previous try): on a snapshot that has placed before
    (``p50_ms``), and on one just derived from the allocations, as each scheduling cycle
    derives its own (``first_in_cycle_p50_ms``: the placer then also groups the nodes)."""
    warm = Snapshot.of(cluster, allocations)
    samples, fresh = [], []
    placed = False
    for i in range(repeats + 1):
        snapshot = Snapshot.of(cluster, allocations)
        for snap, into in ((snapshot, fresh), (warm, samples)):
            scorer = scorer_named(policy)
            t0 = time.perf_counter()
            outcome = place_gang(spec, snap, job_id=spec.name, scorer=scorer, context=ctx)
            if i:  # the first round only builds the warm snapshot's grouping
                into.append(time.perf_counter() - t0)
            placed = not isinstance(outcome, Unschedulable)
    ordered, fresh = sorted(samples), sorted(fresh)
    return {
        "placed": placed,
        "p50_ms": round(1000 * quantile(ordered, 0.5), 3),
        "max_ms": round(1000 * ordered[-1], 3),
        "first_in_cycle_p50_ms": round(1000 * quantile(fresh, 0.5), 3),
    }


def synthetic_cluster(nodes: int) -> ClusterSpec:
    return ClusterSpec(
        nodes=[NodeSpec(name=f"node-{i:05}", **SYNTHETIC_NODE) for i in range(nodes)]
    )


def synthetic_gangs(tasks: int, seed: int) -> list[JobSpec]:
    """Gangs of 2 to 64 tasks of one shape each, until ``tasks`` tasks (the last gang
    takes what is left)."""
    rng = random.Random(seed)
    weights = [s[0] for s in SHAPES]
    jobs: list[JobSpec] = []
    left = tasks
    while left > 0:
        size = min(rng.randint(2, GANG_TASKS), left)
        _, cpu, memory, gpus, milli = rng.choices(SHAPES, weights)[0]
        jobs.append(job(f"gang-{len(jobs):05}", resources(cpu, memory, gpus, milli), size))
        left -= size
    return jobs


def goal(value: float | None, target: float, *, at_least: bool) -> dict[str, Any]:
    met = value is not None and (value >= target if at_least else value < target)
    return {"value": value, "goal": f"{'>=' if at_least else '<'} {target:g}", "met": met}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def compare(results: dict[str, dict[str, Any]], policy: str) -> dict[str, Any]:
    """The policy's figures over first-fit's, measured in the same run."""
    mine, base = results[policy], results[BASELINE]
    return {
        "decisions_per_s": ratio(mine["decisions_per_s"], base["decisions_per_s"]),
        "p99_ms": ratio(mine["p99_ms"], base["p99_ms"]),
    }


def policies_for(policy: str) -> list[str]:
    return [policy] if policy == BASELINE else [policy, BASELINE]


def bench_openb(args: argparse.Namespace) -> dict[str, Any]:
    cluster = load_cluster(args.nodes, cpu_nodes=args.cpu_nodes)
    pods = load_pods(args.pods)
    # Arrival order where the list has creation times; file order otherwise.
    pods.sort(key=lambda p: p.creation if p.creation is not None else 0)
    if args.openb_pods:
        pods = pods[: args.openb_pods]
    jobs = [p.spec for p in pods]
    ctx = context_for(cluster, [p.spec for p in load_pods(args.pods)])
    results = {name: run_stream(cluster, jobs, name, ctx)[0] for name in policies_for(args.policy)}
    mine = results[args.policy]
    return {
        "nodes": str(args.nodes),
        "pods": str(args.pods),
        "cluster": {"nodes": len(cluster.nodes), "gpus": sum(n.gpus for n in cluster.nodes)},
        "policies": results,
        f"{args.policy}_vs_{BASELINE}": compare(results, args.policy),
        "goals": {
            "decisions_per_s": goal(mine["decisions_per_s"], GOAL_DECISIONS_PER_S, at_least=True),
            "p99_ms": goal(mine["p99_ms"], GOAL_P99_MS, at_least=False),
        },
    }


def bench_synthetic(args: argparse.Namespace) -> dict[str, Any]:
    cluster = synthetic_cluster(args.synthetic_nodes)
    jobs = synthetic_gangs(args.synthetic_pods, args.seed)
    ctx = context_for(cluster, jobs)
    gang = job("gang-64", resources(8_000, 32_768, 1), GANG_TASKS)
    results: dict[str, dict[str, Any]] = {}
    gangs: dict[str, dict[str, Any]] = {}
    for name in policies_for(args.policy):
        results[name], placed = run_stream(cluster, jobs, name, ctx)
        gangs[name] = {
            "empty_cluster": gang_latency(cluster, [], gang, name, ctx, args.gang_repeats),
            "after_the_gangs": gang_latency(cluster, placed, gang, name, ctx, args.gang_repeats),
        }
    # The slowest median: either cluster, on a snapshot that has placed before or on the
    # first decision of a cycle (which also groups the nodes).
    worst = max(
        gangs[args.policy][cluster_state][figure]
        for cluster_state in ("empty_cluster", "after_the_gangs")
        for figure in ("p50_ms", "first_in_cycle_p50_ms")
    )
    return {
        "cluster": {"nodes": args.synthetic_nodes, "gpus": 8 * args.synthetic_nodes},
        "tasks": args.synthetic_pods,
        "gangs": len(jobs),
        "seed": args.seed,
        "policies": results,
        f"{args.policy}_vs_{BASELINE}": compare(results, args.policy),
        "gang_64_tasks": {
            "tasks": GANG_TASKS,
            "per_task": "8 CPU, 32 GiB, 1 GPU",
            "repeats": args.gang_repeats,
            **gangs,
            f"{args.policy}_vs_{BASELINE}": {
                state: ratio(gangs[args.policy][state]["p50_ms"], gangs[BASELINE][state]["p50_ms"])
                for state in ("empty_cluster", "after_the_gangs")
            },
        },
        "goals": {
            "gang_64_ms": goal(worst, GOAL_GANG_MS, at_least=False),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=DEFAULT_NODES, help="the trace's node list")
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS, help="the trace's pod list")
    parser.add_argument("--policy", type=parse_policy, default=DEFAULT_POLICY)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 300 trace pods, 200 synthetic nodes, 600 tasks",
    )
    parser.add_argument("--openb-pods", type=int, default=None, help="only the first N pods")
    parser.add_argument("--synthetic-nodes", type=int, default=None, help="default 5000")
    parser.add_argument("--synthetic-pods", type=int, default=None, help="default 10000")
    parser.add_argument("--gang-repeats", type=int, default=None, help=f"default {GANG_REPEATS}")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--cpu-nodes", action="store_true", help="keep the trace's nodes without GPUs"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.openb_pods = args.openb_pods or 300
    args.synthetic_nodes = args.synthetic_nodes or (200 if args.quick else 5_000)
    args.synthetic_pods = args.synthetic_pods or (600 if args.quick else 10_000)
    args.gang_repeats = args.gang_repeats or (3 if args.quick else GANG_REPEATS)

    started = time.perf_counter()
    report: dict[str, Any] = {
        "policy": args.policy,
        "baseline": BASELINE,
        "openb": bench_openb(args),
        "synthetic": bench_synthetic(args),
    }
    report["goals"] = {
        **report["openb"]["goals"],
        **report["synthetic"]["goals"],
    }
    report["all_goals_met"] = all(g["met"] for g in report["goals"].values())
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
