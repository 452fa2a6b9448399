"""Bounds on what a request may ask for, shared by every API: a number past these is
refused (422, naming the parameter) rather than handed to a store that cannot hold it
(an offset of 10**30 overflows every index)."""

MAX_OFFSET = 1_000_000_000
MAX_PAGE = 1_000_000
MAX_PAGE_SIZE = 5000
MAX_INDEX = 1_000_000


def digits(text: str) -> bool:
    """Whether ``text`` is ASCII digits only: ``str.isdigit`` also takes "²" and other
    digits that ``int`` refuses (a 500 where a 4xx belongs)."""
    return text.isascii() and text.isdigit()
