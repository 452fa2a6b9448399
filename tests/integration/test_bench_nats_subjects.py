"""bench/nats_subjects.py against real nats-servers: the two subject forms it compares
are the platform's and the earlier one, and it counts what the stream holds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    path = ROOT / "bench" / "nats_subjects.py"
    spec = importlib.util.spec_from_file_location("nats_subjects", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_bench_fills_both_forms_and_counts_their_subjects() -> None:
    bench = load()
    report = await bench.main(jobs=20, every=10, msg_ids=True)
    examples = {type(e): e for e in bench.example_events()}
    kinds = {bench.subject_for(e) for e in bench.life_of(examples, "j1")}
    messages = 20 * report["messages_per_job"]
    assert report["by_kind"]["messages"] == report["earlier_by_job"]["messages"] == messages
    # One subject per kind of message, against one per kind and job.
    assert report["by_kind"]["subjects"] == len(kinds)
    assert report["earlier_by_job"]["subjects"] == 20 * len(kinds)
    assert set(report["by_kind"]["rss_mb"]) == {"0", "10", "20"}
