"""The checked-in contracts, and the bus table of docs/architecture.md, are what the
models, the bus grants and the handler tables generate today (run `make contracts`)."""

from pathlib import Path

import pytest
import yaml

from trainyard_common.contracts import example_events
from trainyard_common.events import EVENT_TYPES, decode, encode
from trainyard_common.jobspec import Resources, RoleSpec
from trainyard_stack import bus_map

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "contracts"


def render() -> dict[str, str]:
    return bus_map.contracts()


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


def test_the_architecture_documents_bus_table_is_current() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert bus_map.with_table(doc) == doc, "docs/architecture.md is stale: run `make contracts`"


def test_every_event_is_sent_and_received_and_the_asyncapi_says_by_whom() -> None:
    operations = yaml.safe_load(render()["asyncapi.yaml"])["operations"]
    for kind in EVENT_TYPES:
        actions = {
            op["action"]
            for op in operations.values()
            if op["channel"]["$ref"].endswith(kind.__name__[0].lower() + kind.__name__[1:])
        }
        assert actions == {"send", "receive"}, kind
    # Two services end a job; only placement releases what it held.
    assert operations["launcher.sendJobFinished"]["x-service"] == "launcher"
    assert "placement.sendJobFinished" in operations
    assert "placement.receiveJobFinished" in operations
    assert "launcher.receiveJobFinished" not in operations
    assert "launcher.receiveJobPlaced" in operations and "status.receiveJobPlaced" in operations


def test_every_event_type_has_an_example_that_round_trips() -> None:
    examples = example_events()
    assert {type(e) for e in examples} == set(EVENT_TYPES)
    for event in examples:
        assert decode(encode(event)) == event


def test_every_event_carries_the_common_fields() -> None:
    for model in EVENT_TYPES:
        fields = set(model.model_fields)
        assert {"event_id", "job_id", "occurred_at", "schema_version"} <= fields, model


def test_uncapped_is_written_only_where_a_job_has_it() -> None:
    """A job that caps everything is written as before ``Resources.uncapped`` existed,
    so a service of the version before reads it during an upgrade; one that has it
    keeps it through the bus."""
    assert "uncapped" not in Resources().model_dump_json()
    role = RoleSpec(name="w", command="x", resources=Resources(uncapped=["memory"]))
    assert RoleSpec.model_validate_json(role.model_dump_json()).resources.uncapped == ["memory"]
