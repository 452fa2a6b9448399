"""The cycle benchmark (bench/placement_cycle.py) runs on tiny trace files and reports
what it promises. No timing is asserted: speed goals live in bench/, not in tests."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_cycle_bench_keeps_the_queue_full_and_times_every_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                        "n0,32000,65536,2,T4\nn1,16000,32768,1,T4\n")  # fmt: skip
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "p0,4000,8192,1,1000\np1,2000,4096,1,500\np2,8000,16384,2,1000\n"
    )
    spec = importlib.util.spec_from_file_location(
        "placement_cycle", ROOT / "bench" / "placement_cycle.py"
    )
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)

    assert bench.main(["--nodes", str(tmp_path / "nodes.csv"), "--pods",
                       str(tmp_path / "pods.csv"), "--synthetic-nodes", "4", "--waiting", "6",
                       "--events", "12"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)

    assert report["policy"] == "trainyard" and report["waiting"] == 6
    assert report["openb"]["cluster"] == {"nodes": 2, "gpus": 3}
    assert report["synthetic"]["cluster"] == {"nodes": 4, "gpus": 32}
    for case in (report["openb"], report["synthetic"]):
        assert case["at_start"]["waiting"] >= 6  # the cluster is full, jobs wait
        assert case["at_start"]["placed"] > 0
        assert case["events"] == 12
        cycle = case["cycle_ms"]
        assert 0 < cycle["p50_ms"] <= cycle["p99_ms"] <= cycle["max_ms"]
        assert case["cycle_with_commits_ms"]["p50_ms"] >= cycle["p50_ms"]
        by_event = case["cycle_by_event_ms"]
        assert set(by_event) == {"arrival", "departure", "burst"}
        # A departure frees capacity, which some waiting job takes at once.
        assert by_event["departure"] is not None and case["placements"] > 0
        assert by_event["burst"] is not None
