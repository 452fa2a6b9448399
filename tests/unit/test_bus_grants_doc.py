"""docs/security.md's table of what each bus identity may do is the allow list
(trainyard_common.bus_access.GRANTS) as people read it: it had drifted (intake's
JobResourceChanged, JobTagged and SetPriority, placement's TasksPlaced, status's rebuild
durable and every key-value bucket were missing)."""

from __future__ import annotations

import re
from pathlib import Path

from trainyard_common.bus_access import GRANTS
from trainyard_common.events import COMMAND_TYPES, EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
NAMES = {
    f"{'yard.cmd' if issubclass(t, COMMAND_TYPES) else 'yard.job'}.{t.subject_suffix}": t.__name__
    for t in EVENT_TYPES
}


def rows() -> dict[str, list[str]]:
    text = DOC.read_text()
    start = text.index("| identity | publishes | consumes (durable) | key-value buckets |")
    table = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table[cells[0]] = cells[1:]
    return table


def ticked(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def test_the_documented_grants_are_the_enforced_ones() -> None:
    table = rows()
    assert set(GRANTS) <= set(table)
    for identity, grant in GRANTS.items():
        publishes, consumes, buckets = table[identity]
        assert {n for n in ticked(publishes) if n[0].isupper()} == {
            NAMES[subject] for subject in grant.publish
        }, identity
        assert {n for n in ticked(consumes) if n.islower()} == set(grant.durables), identity
        assert ticked(buckets) == set(grant.buckets), identity
