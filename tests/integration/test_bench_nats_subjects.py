"""bench/nats_subjects.py against real nats-servers: the two subject forms it compares
are the platform's and the earlier one, and it counts what the stream holds."""

from __future__ import annotations

from ..support.bench import load_bench


async def test_the_bench_fills_both_forms_and_counts_their_subjects() -> None:
    bench = load_bench("nats_subjects")
    report = await bench.main(jobs=20, every=10, msg_ids=True)
    examples = {type(e): e for e in bench.example_events()}
    kinds = {bench.subject_for(e) for e in bench.life_of(examples, "j1")}
    messages = 20 * report["messages_per_job"]
    assert report["by_kind"]["messages"] == report["earlier_by_job"]["messages"] == messages
    # One subject per kind of message, against one per kind and job.
    assert report["by_kind"]["subjects"] == len(kinds)
    assert report["earlier_by_job"]["subjects"] == 20 * len(kinds)
    assert set(report["by_kind"]["rss_mb"]) == {"0", "10", "20"}
