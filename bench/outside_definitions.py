"""How the dialects take job definitions written elsewhere, as their authors wrote them.

    .venv/bin/python bench/outside_definitions.py DIR [--cluster cluster.yaml]

Reads every ``.yaml``/``.yml``/``.json`` file under DIR (kept outside this repository:
the point is definitions the platform was not written against), takes each job document
in it (a YAML file may hold several; Kubernetes objects other than jobs are passed
over), detects its dialect and translates it as a submission would. With ``--cluster``
each translated job is also checked against that cluster as intake checks it (a job that
can never fit is refused at submission). Prints one JSON object: per platform directory
(DIR's first level, or "." for files at its top) how many documents were taken, how many
translate without errors, the error and warning codes with their counts, and each
refused document with its first errors. Files that are not valid JSON or YAML, and
files with no job document, are counted as such.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from trainyard_common.cluster import ClusterSpec, load_cluster
from trainyard_common.dialects import detect, translate
from trainyard_common.fit import check_against_cluster

SUFFIXES = {".yaml", ".yml", ".json"}


def documents(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".json":
        return [json.loads(text)]
    return list(yaml.safe_load_all(text))


def is_job(doc: Any) -> bool:
    """A job document of some dialect (not a Service, ConfigMap, ...)."""
    if not isinstance(doc, dict):
        return False
    kind = doc.get("kind")
    if isinstance(kind, str):
        return kind.endswith("Job")
    try:
        return detect(doc) is not None
    except Exception:  # noqa: BLE001 - detection of arbitrary input; counted as not a job
        return False


def measure(root: Path, cluster: ClusterSpec | None) -> dict[str, Any]:
    report: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        relative = path.relative_to(root)
        group = relative.parts[0] if len(relative.parts) > 1 else "."
        entry = report.setdefault(
            group,
            {"files": 0, "unreadable": 0, "no_job": 0, "documents": 0, "translated": 0,
             "errors": collections.Counter(), "warnings": collections.Counter(),
             "refused": []},
        )  # fmt: skip
        entry["files"] += 1
        try:
            docs = [d for d in documents(path) if is_job(d)]
        except (ValueError, yaml.YAMLError):
            entry["unreadable"] += 1
            continue
        if not docs:
            entry["no_job"] += 1
            continue
        for doc in docs:
            entry["documents"] += 1
            result = translate(doc, user="outside")
            errors = list(result.errors)
            if not errors and cluster is not None:
                errors = check_against_cluster(result.spec, cluster, lambda role, field: "$")
            entry["warnings"].update(w.code for w in result.warnings)
            if errors:
                entry["errors"].update(e.code for e in errors)
                entry["refused"].append(
                    {"file": str(relative), "dialect": result.dialect,
                     "errors": [f"{e.path}: {e.message}" for e in errors[:3]]}
                )  # fmt: skip
            else:
                entry["translated"] += 1
    for entry in report.values():
        entry["errors"] = dict(entry["errors"].most_common())
        entry["warnings"] = dict(entry["warnings"].most_common())
    return {"root": str(root), "cluster": cluster is not None, "platforms": report}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a directory of job definitions")
    parser.add_argument("--cluster", type=Path, help="check each job against this cluster file")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")
    cluster = load_cluster(args.cluster) if args.cluster else None
    json.dump(measure(args.root, cluster), sys.stdout, indent=2, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
