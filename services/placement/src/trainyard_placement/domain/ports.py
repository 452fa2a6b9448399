"""Choosing dynamic ports on one node.

Ports are spread at random (an RNG seeded from the job id, so a placement is
reproducible) rather than taken lowest-first: a stale process of an earlier job that
still holds a port after its job ended then rarely collides with the next job's task.
"""

from __future__ import annotations

import random
from collections.abc import Set as AbstractSet

# Random draws before falling back to a scan; beyond this the range is nearly full.
RANDOM_TRIES_PER_PORT = 8


def pick_ports(
    port_range: tuple[int, int], count: int, taken: AbstractSet[int], rng: random.Random
) -> list[int] | None:
    """``count`` distinct ports from the inclusive ``port_range`` that are not in
    ``taken``, or None when the range has fewer free ports than that."""
    lo, hi = port_range
    size = hi - lo + 1
    if count <= 0:
        return []
    if size - sum(1 for p in taken if lo <= p <= hi) < count:
        return None
    chosen: list[int] = []
    seen: set[int] = set()
    for _ in range(RANDOM_TRIES_PER_PORT * count):
        port = rng.randint(lo, hi)
        if port not in taken and port not in seen:
            chosen.append(port)
            seen.add(port)
            if len(chosen) == count:
                return sorted(chosen)
    start = rng.randrange(size)
    for step in range(size):
        port = lo + (start + step) % size
        if port not in taken and port not in seen:
            chosen.append(port)
            seen.add(port)
            if len(chosen) == count:
                return sorted(chosen)
    return None
