"""Typed reads of a payload's fields: a value of the wrong type reads as empty, and the
type checker knows what each read gives (``x.get(k) if isinstance(x.get(k), dict)``
tells it nothing). The translators report wrong types themselves, with the field's path."""

from __future__ import annotations

from typing import Any


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, dict) else {}


def sequence(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def text(value: Any, default: str = "") -> str:
    """``value`` if it is a string, else ``default``."""
    return value if isinstance(value, str) else default


# YAML 1.1's words for booleans, which js-yaml (OpenPAI's reader) leaves as words.
_YAML11_BOOLEAN_WORDS = frozenset({"yes", "no", "on", "off", "y", "n"})


def boolean_hint(value: Any) -> str:
    """For a field OpenPAI wants a boolean in: why a string like ``no`` is not one."""
    if isinstance(value, str) and value.lower() in _YAML11_BOOLEAN_WORDS:
        return (
            f" ({value!r}: OpenPAI's YAML reads yes, no, on and off as words; write true or false)"
        )
    return ""
