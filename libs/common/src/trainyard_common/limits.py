"""Bounds on what a request may ask for, shared by every API: a number past these is
refused (422, naming the parameter) rather than handed to a store that cannot hold it
(an offset of 10**30 overflows every index)."""

MAX_OFFSET = 1_000_000_000
MAX_PAGE = 1_000_000
MAX_PAGE_SIZE = 5000
MAX_INDEX = 1_000_000
# The most characters a job's commands may grow to when their references are rendered
# (OpenPAI's <% $parameters.x %> at intake, <% $secrets.x %> at launch): what a body may
# hold. A small body naming a large value many times would otherwise cost gigabytes.
MAX_RENDERED = 4 * 1024 * 1024


MAX_DIGITS = 18  # every number read here fits (10**18 > any index, sequence or count)


def digits(text: str) -> bool:
    """Whether ``text`` is a whole number ``int`` takes: ASCII digits only (``str.isdigit``
    also takes "²" and other digits that ``int`` refuses), and at most ``MAX_DIGITS`` of
    them (``int`` refuses more than 4300; a 500 where a 4xx belongs, either way)."""
    return len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()
