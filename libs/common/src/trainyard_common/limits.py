"""Bounds on what a request may ask for, shared by every API: a number past these is
refused (422, naming the parameter) rather than handed to a store that cannot hold it
(an offset of 10**30 overflows every index)."""

import re
from collections.abc import Callable
from datetime import UTC, datetime

MAX_OFFSET = 1_000_000_000
MAX_PAGE = 1_000_000
MAX_PAGE_SIZE = 5000
MAX_INDEX = 1_000_000
# The most characters a job's commands may grow to when their references are rendered
# (OpenPAI's <% $parameters.x %> at intake, <% $secrets.x %> at launch): what a body may
# hold. A small body naming a large value many times would otherwise cost gigabytes.
MAX_RENDERED = 4 * 1024 * 1024


class TooLong(ValueError):
    """A text whose references, rendered, would pass its bound."""


def bounded_sub(
    pattern: re.Pattern[str],
    text: str,
    replace: Callable[[re.Match[str]], str],
    limit: int = MAX_RENDERED,
) -> str:
    """``pattern.sub(replace, text)``, raising TooLong the moment the result would pass
    ``limit`` characters: counted as it renders, before it is built."""
    size = len(text)
    if size > limit:
        raise TooLong(f"more than {limit} characters")

    def counted(match: re.Match[str]) -> str:
        nonlocal size
        out = replace(match)
        size += len(out) - len(match.group(0))
        if size > limit:
            raise TooLong(f"more than {limit} characters")
        return out

    return pattern.sub(counted, text)


MAX_DIGITS = 18  # every number read here fits (10**18 > any index, sequence or count)


def digits(text: str) -> bool:
    """Whether ``text`` is a whole number ``int`` takes: ASCII digits only (``str.isdigit``
    also takes "²" and other digits that ``int`` refuses), and at most ``MAX_DIGITS`` of
    them (``int`` refuses more than 4300; a 500 where a 4xx belongs, either way)."""
    return len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def in_utc(moment: datetime) -> datetime:
    """``moment`` in UTC (a naive one is UTC already); ValueError for one that has no
    time in UTC: ``0001-01-01T00:00:00+23:59`` is before year 1 there, and every store
    converts to UTC to compare (Python raises OverflowError, a 500 if let through)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"{moment.isoformat()} is out of range in UTC") from exc
