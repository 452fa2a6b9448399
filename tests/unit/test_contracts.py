"""The checked-in contracts are what the models generate today (run `make contracts`)."""

from pathlib import Path

import pytest

from trainyard_common.contracts import example_events, render
from trainyard_common.events import EVENT_TYPES, decode, encode

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"


@pytest.mark.parametrize("relative,text", sorted(render().items()))
def test_checked_in_contract_is_current(relative: str, text: str) -> None:
    path = CONTRACTS / relative
    assert path.exists(), f"{relative} missing: run `make contracts`"
    assert path.read_text() == text, f"{relative} is stale: run `make contracts`"


def test_no_stale_extra_contract_files() -> None:
    generated = set(render())
    on_disk = {
        str(p.relative_to(CONTRACTS))
        for p in CONTRACTS.rglob("*")
        if p.is_file() and p.suffix in {".json", ".yaml"}
    }
    assert on_disk <= generated, f"files no model generates: {sorted(on_disk - generated)}"


def test_every_event_type_has_an_example_that_round_trips() -> None:
    examples = example_events()
    assert {type(e) for e in examples} == set(EVENT_TYPES)
    for event in examples:
        assert decode(encode(event)) == event


def test_every_event_carries_the_common_fields() -> None:
    for model in EVENT_TYPES:
        fields = set(model.model_fields)
        assert {"event_id", "job_id", "occurred_at", "schema_version"} <= fields, model
