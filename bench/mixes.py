"""Workload mixes of the GPU trace's family, resampled from its default pod list.

    .venv/bin/python bench/mixes.py --family share --level 0.6 --seed 1 --out mix.csv
    .venv/bin/python bench/mixes.py --suite DIR [--seed 1]

The FGD paper varies its default list (openb_pod_list_default) along four classes of
pods; what each variant of its published lists holds shows how (bench/README.md,
"mixes.py"), and this builds variants the same ways, at any level:

- ``share`` L: tasks of part of a GPU (gpu_milli < 1000) ask for a share L of the GPU
  demand; the GPU pods are drawn again, with replacement, from the default list's sharing
  and whole-GPU pods, as many as it has, each draw a sharing pod while their share of the
  demand so far is at most L; CPU-only pods are kept (the paper's gpushare40/60/80 put
  0.401/0.600/0.800 of the demand on shares with the default list's 7,064 GPU pods;
  gpushare100: every GPU pod shares one).
- ``multi`` L: pods asking for two or more GPUs make up a share L of the GPU demand;
  multi-GPU pods are drawn from the default list's and added (or removed, below its
  7 %) until they do (multigpu20: 247 such pods where the default has 75).
- ``spec`` L: a share L of the GPU pods name GPU models they may use (``gpu_spec``),
  drawn from the model constraints the trace's own pods name (gpuspec10's), each pod
  otherwise unchanged (gpuspec10: 10.4 %).
- ``cpu`` L: CPU-only pods make up a share L of all the pods, drawn with replacement
  from the default list's, the GPU pods unchanged (cpu250: 25 %, the default 13.3 %).

Two families at once: ``--family share --level 0.05 --then spec 0.3`` varies the mix
again (the second family drawn from the first's result, with the same random source).

``--suite DIR`` writes the mixes the placement work develops against and, apart, the
ones kept aside for validation (``SUITE``, and ``COMBINED`` for two families at once):
the levels of a family are split so that neither set holds every level of it.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

DATA_DIR = Path(os.environ.get("YARD_OPENB_DIR", "/work/shared/data/openb"))

DEFAULT_PODS = DATA_DIR / "openb_pod_list_default.csv"
SPEC_SOURCE = DATA_DIR / "openb_pod_list_gpuspec10.csv"
COLUMNS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
).split(",")
FAMILIES = ("share", "multi", "spec", "cpu")
# (family, level) -> development or held out. Every family has levels on both sides.
# The share and cpu families follow the paper's definitions (share of the GPU demand, of
# the pods) since 2026-11-26; before, they drew a share of the GPU pods by count and a
# multiple of the CPU-only pods, and the levels were chosen again then. Multi 0.25, 0.3
# and 0.42 were added later that day: no develop mix lay between 0.15 and 0.35, where
# the policy changes its measure, and only one above it. Share 0 and 0.05 were added on
# 2026-11-27: without sharing tasks the paper's typical workload held no multi-GPU shape
# (docs/placement.md, "Shapes by GPUs"), and no mix had fewer sharing tasks than 0.2.
SUITE: dict[str, list[tuple[str, float]]] = {
    "develop": [
        ("share", 0.0), ("share", 0.2), ("share", 0.5), ("share", 0.75),
        ("multi", 0.03), ("multi", 0.15), ("multi", 0.25), ("multi", 0.3), ("multi", 0.35),
        ("multi", 0.42),
        ("spec", 0.05), ("spec", 0.25),
        ("cpu", 0.06), ("cpu", 0.22),
    ],
    "held_out": [
        ("share", 0.05), ("share", 0.4), ("share", 0.6), ("share", 0.85), ("share", 1.0),
        ("multi", 0.2), ("multi", 0.5),
        ("spec", 0.1), ("spec", 0.33),
        ("cpu", 0.12), ("cpu", 0.3),
    ],
}  # fmt: skip
# Few sharing tasks among many GPU-model constraints, where the policy chooses between
# its two measures by the sharing tasks' share of the GPU demand (added 2026-11-27, after
# draws of them put the policy of the day before 0.6-3.5 behind FGD; docs/placement.md,
# "Constrained tasks among few sharing ones").
COMBINED: dict[str, list[tuple[tuple[str, float], ...]]] = {
    "develop": [(("share", 0.0), ("spec", 0.2)), (("share", 0.05), ("spec", 0.3)),
                (("share", 0.25), ("spec", 0.2))],
    "held_out": [(("share", 0.02), ("spec", 0.15)), (("share", 0.15), ("spec", 0.3)),
                 (("share", 0.33), ("spec", 0.3))],
}  # fmt: skip

Row = dict[str, str]


def load(path: Path) -> list[Row]:
    with path.open(newline="") as f:
        return [{c: row.get(c, "") or "" for c in COLUMNS} for row in csv.DictReader(f)]


def gpu_of(row: Row) -> int:
    return int(row["num_gpu"] or 0)


def is_sharing(row: Row) -> bool:
    return gpu_of(row) == 1 and int(row["gpu_milli"] or 0) < 1000


def demand(row: Row) -> int:
    return gpu_of(row) * int(row["gpu_milli"] or 0)


def mix(
    pods: list[Row], family: str, level: float, rng: random.Random, specs: Sequence[str] = ()
) -> list[Row]:
    """The default list ``pods`` varied along ``family`` to ``level`` (the docstring's
    rules). Pure but for ``rng``."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}")
    # Every level is a share. Multi-GPU or CPU-only pods cannot be all of it (more are
    # added until they are: a level of 1 or more would never be reached).
    whole_allowed = family in ("share", "spec")
    if not 0 <= level <= 1 or (level == 1 and not whole_allowed):
        top = "1]" if whole_allowed else "1)"
        raise ValueError(f"{family}: the level is a share, in [0, {top}, not {level:g}")
    cpu = [p for p in pods if gpu_of(p) == 0]
    gpu = [p for p in pods if gpu_of(p) > 0]
    if family == "share":
        sharing = [p for p in gpu if is_sharing(p)]
        whole = [p for p in gpu if not is_sharing(p)]
        drawn: list[Row] = []
        held = total = 0
        for _ in gpu:
            pick = level >= 1 or (level > 0 and held <= level * total)
            pod = rng.choice(sharing if pick else whole)
            drawn.append(pod)
            total += demand(pod)
            held += demand(pod) if is_sharing(pod) else 0
        out = cpu + drawn
    elif family == "multi":
        multi = [p for p in gpu if gpu_of(p) >= 2]
        out = list(pods)
        total = sum(demand(p) for p in out)
        held = sum(demand(p) for p in out if gpu_of(p) >= 2)
        if held < level * total:  # more: multi-GPU pods drawn again and added
            while held < level * total:
                pod = rng.choice(multi)
                out.append(pod)
                total, held = total + demand(pod), held + demand(pod)
        else:  # fewer (below the default list's share): multi-GPU pods left out
            while held > level * total:
                victim = rng.choice([i for i, p in enumerate(out) if gpu_of(p) >= 2])
                total, held = total - demand(out[victim]), held - demand(out[victim])
                out.pop(victim)
    elif family == "spec":
        if not specs:
            raise ValueError("spec: no GPU model constraints to draw from")
        chosen = set(rng.sample(range(len(gpu)), round(level * len(gpu))))
        gpu = [{**p, "gpu_spec": rng.choice(specs) if i in chosen else ""}
               for i, p in enumerate(gpu)]  # fmt: skip
        out = cpu + gpu
    else:  # cpu
        out = rng.choices(cpu, k=round(level * len(gpu) / (1 - level))) + gpu
    rng.shuffle(out)
    return [{**p, "name": f"mix-pod-{i:05d}"} for i, p in enumerate(out)]


def mix_in_turn(
    pods: list[Row],
    steps: Sequence[tuple[str, float]],
    rng: random.Random,
    specs: Sequence[str] = (),
) -> list[Row]:
    """``pods`` varied along each (family, level) of ``steps`` in turn, each drawing from
    the mix before it."""
    for family, level in steps:
        pods = mix(pods, family, level, rng, specs)
    return pods


def write(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def name_of(*steps: tuple[str, float]) -> str:
    return "mix_" + "_".join(f"{family}{round(level * 100):03d}" for family, level in steps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    parser.add_argument("--specs", type=Path, default=SPEC_SOURCE,
                        help="a pod list whose gpu_spec values are drawn for 'spec' mixes")  # fmt: skip
    parser.add_argument("--family", choices=FAMILIES)
    parser.add_argument("--level", type=float)
    parser.add_argument("--then", nargs=2, metavar=("FAMILY", "LEVEL"),
                        help="vary the mix again along a second family")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--suite", type=Path, help="write every SUITE mix under this directory")
    args = parser.parse_args(argv)
    pods = load(args.pods)
    specs = [r["gpu_spec"] for r in load(args.specs) if r["gpu_spec"]] if args.specs else []
    if args.suite:
        for part, items in SUITE.items():
            (args.suite / part).mkdir(parents=True, exist_ok=True)
            for steps in [((family, level),) for family, level in items] + COMBINED[part]:
                rows = mix_in_turn(pods, steps, random.Random(args.seed), specs)
                write(rows, args.suite / part / f"{name_of(*steps)}.csv")
        return 0
    if args.family is None or args.level is None or args.out is None:
        parser.error("--family, --level and --out (or --suite)")
    steps = [(args.family, args.level)]
    if args.then:
        if args.then[0] not in FAMILIES:
            parser.error(f"--then: the family must be one of {', '.join(FAMILIES)}")
        try:
            steps.append((args.then[0], float(args.then[1])))
        except ValueError:
            parser.error(f"--then: the level must be a number, not {args.then[1]!r}")
    try:
        rows = mix_in_turn(pods, steps, random.Random(args.seed), specs)
    except ValueError as error:
        parser.error(str(error))
    write(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
