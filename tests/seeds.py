"""The seed documents' own examples, kept verbatim under examples/ (users submit them
too), shared by the tests that must accept them unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def seed_text(name: str) -> str:
    return (EXAMPLES / "openpai" / f"{name}.json").read_text()


def seed_job(name: str) -> dict[str, Any]:
    return json.loads(seed_text(name))
