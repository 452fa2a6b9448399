"""How long one scheduling cycle takes with a long queue, as the service runs it: a cycle
after every event.

    .venv/bin/python bench/placement_cycle.py [--nodes NODES.csv] [--pods PODS.csv]
        [--synthetic-nodes 5000] [--waiting 500] [--events 400] [--policy NAME]
        [--seed 42] [--quick]

A cycle is one ``SchedulerState.cycle`` (the whole pass: deriving what it needs from
the placed and queued jobs, ordering the queue, trying every waiting job, preemption and
backfill), then committing its placements (``commit``) as the service does. Each case
first fills the cluster until ``--waiting`` jobs wait (a few cycles, not measured), then
sends ``--events`` events, a cycle after each: while fewer than ``--waiting`` jobs wait
a new job arrives, otherwise a placed job (a seeded draw) ends, which frees capacity
for some of the waiting ones. Then ``--events`` / 4 arrivals come in a row, a cycle after
each (reported apart, as ``burst``). The cases:

- ``openb``: the trace's 1,213 GPU nodes; every job a one-task pod drawn (seeded, with
  replacement) from the default pod list.
- ``synthetic``: ``--synthetic-nodes`` nodes of 8 GPUs; jobs of 1 to 8 tasks of the
  shapes of placement_speed.py (shares, 1, 2, 4 and 8 GPUs per task).
- ``alike``: four nodes of 8 CPUs and a burst of one-task one-CPU jobs, all of one
  shape (what bench/pipeline.py submits): a long queue behind one head.

Prints one JSON object: per case the cycle time (ms) p50 / p99 / mean / max, the same
with the commits, the cycle time after each kind of event, the waiting and placed jobs
and the placements made; see bench/README.md.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openb import (  # noqa: E402
    DEFAULT_NODES,
    DEFAULT_PODS,
    job,
    load_cluster,
    load_pods,
    parse_policy,
    resources,
)
from placement_speed import SHAPES, latency_ms, synthetic_cluster  # noqa: E402

from trainyard_common.cluster import ClusterSpec, NodeSpec  # noqa: E402
from trainyard_common.jobspec import JobSpec, Resources  # noqa: E402
from trainyard_placement.domain.gpu_share import MILLI, gpu_request  # noqa: E402
from trainyard_placement.domain.policies import DEFAULT_POLICY, scorer_named  # noqa: E402
from trainyard_placement.domain.queue import Placed, Preempt, QueuedJob  # noqa: E402
from trainyard_placement.domain.state import SchedulerState  # noqa: E402

WAITING = 500
EVENTS = 400
MAX_GANG = 8


class Driver:
    """A SchedulerState fed as the service feeds it, counting the time of each cycle."""

    def __init__(self, cluster: ClusterSpec, policy: str, jobs: Callable[[int], JobSpec],
                 seed: int) -> None:  # fmt: skip
        self.state = SchedulerState(cluster, scorer=scorer_named(policy))
        self.jobs = jobs
        self.rng = random.Random(f"events:{seed}")
        self.seq = 0
        self.clock = 0.0
        self.placements = 0
        self.cycle_s: list[float] = []
        self.with_commit_s: list[float] = []
        self.by_event: dict[str, list[float]] = {"arrival": [], "departure": [], "burst": []}

    def arrive(self) -> None:
        spec = self.jobs(self.seq)
        self.state.enqueue(QueuedJob(f"{spec.name}-{self.seq:06}", spec, self.seq))
        self.seq += 1

    def depart(self) -> None:
        if self.state.placed:
            victim = self.rng.choice(sorted(self.state.placed))
            self.state.release(victim)

    def cycle(self) -> tuple[float, float, int]:
        """One cycle and its commits: (seconds of the cycle, with the commits, placed)."""
        self.clock += 1.0
        t0 = time.perf_counter()
        decisions = self.state.cycle(now=self.clock)
        t1 = time.perf_counter()
        placed = 0
        for decision in decisions:
            if isinstance(decision, Placed):
                self.state.commit(decision.allocation, placed_at=self.clock)
                placed += 1
            elif isinstance(decision, Preempt):
                # The launcher would end the victims; here they end at once and queue again.
                for victim in decision.victims:
                    self.state.preempting(victim, decision.job_id)
                    released = self.state.release(victim)
                    if released is not None:
                        self.state.enqueue(QueuedJob(victim, released.spec, self.seq))
                        self.seq += 1
        return t1 - t0, time.perf_counter() - t0, placed

    def fill(self, waiting: int) -> None:
        """Arrivals until the asked GPUs pass the cluster's, then cycles with more
        arrivals until ``waiting`` jobs wait after a cycle."""
        capacity = sum(n.gpus for n in self.state.cluster.nodes) * MILLI
        asked = 0
        while asked < capacity:
            self.arrive()
            asked += gpu_milli(self.jobs(self.seq - 1))
        self.cycle()
        while len(self.state.queued) < waiting:
            while len(self.state.queued) < waiting:
                self.arrive()
            self.cycle()

    def run(self, events: int, waiting: int) -> None:
        gc.collect()
        for _ in range(events):
            if len(self.state.queued) < waiting:
                self.arrive()
                event = "arrival"
            else:
                self.depart()
                event = "departure"
            seconds, with_commits, placed = self.cycle()
            self.cycle_s.append(seconds)
            self.with_commit_s.append(with_commits)
            self.by_event[event].append(seconds)
            self.placements += placed

    def burst(self, arrivals: int) -> None:
        """Arrivals one after another, a cycle after each, no departures: most find no
        room, so a cycle often starts on the cluster as the previous one left it."""
        for _ in range(arrivals):
            self.arrive()
            self.by_event["burst"].append(self.cycle()[0])


def gpu_milli(spec: JobSpec) -> int:
    total = 0
    for role in spec.roles:
        count, milli = gpu_request(role.resources.gpu)
        total += role.replicas * count * milli
    return total


def openb_jobs(pods_path: Path, seed: int) -> Callable[[int], JobSpec]:
    pods = load_pods(pods_path)
    rng = random.Random(f"pods:{seed}")
    drawn: list[JobSpec] = []

    def jobs(i: int) -> JobSpec:
        while len(drawn) <= i:
            drawn.append(rng.choice(pods).spec)
        return drawn[i]

    return jobs


def synthetic_jobs(seed: int) -> Callable[[int], JobSpec]:
    rng = random.Random(f"gangs:{seed}")
    weights = [s[0] for s in SHAPES]
    drawn: list[JobSpec] = []

    def jobs(i: int) -> JobSpec:
        while len(drawn) <= i:
            _, cpu, memory, gpus, milli = rng.choices(SHAPES, weights)[0]
            size = rng.randint(1, MAX_GANG)
            drawn.append(job(f"gang-{len(drawn):06}", resources(cpu, memory, gpus, milli), size))
        return drawn[i]

    return jobs


def alike_jobs() -> Callable[[int], JobSpec]:
    spec = job("alike", Resources(cpu=1, memory_mb=256))
    return lambda i: spec


def alike_cluster() -> ClusterSpec:
    return ClusterSpec(nodes=[NodeSpec(name=f"node-{i}", cpu=8, memory_mb=32768)
                              for i in range(4)])  # fmt: skip


def run_case(cluster: ClusterSpec, jobs: Callable[[int], JobSpec],
             args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    driver = Driver(cluster, args.policy, jobs, args.seed)
    started = time.perf_counter()
    driver.fill(args.waiting)
    filled = time.perf_counter() - started
    state = driver.state
    at_start = {"waiting": len(state.queued), "placed": len(state.placed)}
    driver.run(args.events, args.waiting)
    driver.burst(args.events // 4)
    return {
        "cluster": {"nodes": len(cluster.nodes), "gpus": sum(n.gpus for n in cluster.nodes)},
        "at_start": at_start,
        "at_end": {"waiting": len(state.queued), "placed": len(state.placed)},
        "placed_tasks_at_end": sum(len(a.tasks) for a in state.placed.values()),
        "events": args.events,
        "placements": driver.placements,
        "cycle_ms": summary(driver.cycle_s),
        "cycle_with_commits_ms": summary(driver.with_commit_s),
        # Of the cycles above, those after an arrival and after a departure; then
        # ``events`` / 4 arrivals in a row ("burst", not in the figures above).
        "cycle_by_event_ms": {
            event: summary(samples) if samples else None
            for event, samples in driver.by_event.items()
        },
        "fill_seconds": round(filled, 1),
    }


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {**latency_ms(samples), "mean_ms": round(1000 * sum(samples) / len(samples), 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=DEFAULT_NODES, help="the trace's node list")
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS, help="the trace's pod list")
    parser.add_argument("--synthetic-nodes", type=int, default=None, help="default 5000")
    parser.add_argument("--waiting", type=int, default=None, help=f"default {WAITING}")
    parser.add_argument("--events", type=int, default=None, help=f"default {EVENTS}")
    parser.add_argument("--policy", type=parse_policy, default=DEFAULT_POLICY)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 100 synthetic nodes, 50 waiting, 40 events",
    )
    args = parser.parse_args(argv)
    args.synthetic_nodes = args.synthetic_nodes or (100 if args.quick else 5_000)
    args.waiting = args.waiting or (50 if args.quick else WAITING)
    args.events = args.events or (40 if args.quick else EVENTS)
    for name in ("synthetic_nodes", "waiting", "events"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: must be above 0")

    started = time.perf_counter()
    report: dict[str, Any] = {
        "policy": args.policy,
        "waiting": args.waiting,
        "openb": run_case(load_cluster(args.nodes), openb_jobs(args.pods, args.seed), args),
        "synthetic": run_case(
            synthetic_cluster(args.synthetic_nodes), synthetic_jobs(args.seed), args
        ),  # fmt: skip
        "alike": run_case(alike_cluster(), alike_jobs(), args),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f} at the end"
        ),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
