"""Trainyard's placement policy against FGD on every workload mix of a suite.

    .venv/bin/python bench/mixes.py --suite /tmp/mixes
    .venv/bin/python bench/placement_mixes.py /tmp/mixes [--seeds 42-51] [--policy NAME]

For each pod list under the suite's ``develop`` and ``held_out`` directories (mixes.py
writes them), the protocol of placement_quality.py (shuffle, inflate to 130 % of the
cluster's GPUs, place one by one, the allocation rate at 100 % and 130 % arrived) run
for the policy and FGD with the same seeds. Prints one JSON object: per mix, each
policy's mean and standard deviation over the seeds, and the policy's lead over FGD
(mean of the per-seed differences, and on how many seeds it was ahead, level or
behind), with the develop and held-out mixes apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from placement_quality import (
    DEFAULT_NODES,
    evaluate,
    load_nodes,
    load_pods,
    paired,
    parse_seeds,
)

PARTS = ("develop", "held_out")


def compare(results: dict[str, dict[str, object]], policy: str, key: str) -> dict[str, object]:
    mine = results[policy][key]["per_seed"]  # type: ignore[index]
    fgd = results["fgd"][key]["per_seed"]  # type: ignore[index]
    seeds = [s for s in mine if mine[s] is not None and fgd[s] is not None]
    against = paired(mine, fgd)

    def spread(per_seed: dict[str, float]) -> dict[str, float]:
        values = [per_seed[s] for s in seeds]
        return {
            "mean": round(statistics.fmean(values), 2),
            "stdev": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
        }

    return {
        policy: spread(mine),
        "fgd": spread(fgd),
        "lead": against["lead"],
        "ahead_level_behind": against["ahead_level_behind"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", type=Path, help="a directory with develop/ and held_out/")
    parser.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    parser.add_argument("--seeds", type=parse_seeds, default=list(range(42, 52)))
    parser.add_argument("--inflate", type=float, default=1.3)
    parser.add_argument("--policy", default="trainyard")
    args = parser.parse_args(argv)
    nodes = load_nodes(args.nodes)
    top = f"alloc_rate_at_{round(100 * args.inflate)}"
    started = time.perf_counter()
    report: dict[str, object] = {"seeds": args.seeds, "inflate": args.inflate}
    for part in PARTS:
        mixes: dict[str, object] = {}
        for path in sorted((args.suite / part).glob("*.csv")):
            results = evaluate(nodes, load_pods(path), [args.policy, "fgd"], args.seeds,
                               args.inflate)  # fmt: skip
            mixes[path.stem] = {
                "alloc_rate_at_100": compare(results, args.policy, "alloc_rate_at_100"),
                top: compare(results, args.policy, top),
            }
        report[part] = mixes
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs"
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
