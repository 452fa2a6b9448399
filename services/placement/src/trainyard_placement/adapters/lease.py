"""Leadership among placement replicas: a lease, one key in a JetStream key-value bucket.

The key holds the holder's replica id. Every write is compare-and-set on the key's
revision (``trainyard_common.bus.KvBucket``), so of two replicas racing for the lease
exactly one wins. No clock is compared across machines:

- the holder renews every ``ttl/3`` (an update naming the revision it wrote last) and
  counts itself leader only until ``ttl * HOLD_SHARE`` after it *sent* its last
  successful renewal; a renewal that fails for that long ends its leadership;
- a follower notes the revision it sees and *when it first saw it*, by its own clock;
  when that revision has not changed for a whole ``ttl``, the holder is taken for dead
  and the follower writes over exactly that revision (create when the key is absent).

The holder's last write happened after it sent it and before the follower saw it, so
the holder gives up at least ``ttl * (1 - HOLD_SHARE)`` before any follower may take
over; that margin absorbs clocks that run at slightly different rates and the time the
old holder needs to stop. A holder that stops cleanly deletes the key (at its revision)
so a follower takes over at its next look.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Protocol

from trainyard_common.bus import KvEntry, RevisionMismatch

log = logging.getLogger("trainyard.placement.lease")

# The share of the ttl a holder counts on after sending a renewal that succeeded.
HOLD_SHARE = 0.8


class Kv(Protocol):
    async def get(self, key: str) -> KvEntry | None: ...

    async def create(self, key: str, value: bytes) -> int: ...

    async def update(self, key: str, value: bytes, revision: int) -> int: ...

    async def delete(self, key: str, revision: int) -> None: ...


class LeaseLost(Exception):
    """This replica no longer holds the lease: it must stop acting as the leader."""


def holder_of(entry: KvEntry | None) -> str | None:
    if entry is None:
        return None
    try:
        return str(json.loads(entry.value)["replica"])
    except (ValueError, KeyError, TypeError):
        return None


class Lease:
    def __init__(
        self,
        kv: Kv,
        key: str,
        replica: str,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")
        self.kv, self.key, self.replica, self.ttl_s = kv, key, replica, ttl_s
        self.renew_every_s = ttl_s / 3
        self._clock = clock
        self._value = json.dumps({"replica": replica}).encode()
        self._revision: int | None = None  # what we wrote last, while we hold it
        self._valid_until = 0.0
        self._seen: tuple[int, float] | None = None  # another holder's revision, first seen

    @property
    def held(self) -> bool:
        return self._revision is not None and self._clock() < self._valid_until

    @property
    def revision(self) -> int | None:
        return self._revision if self.held else None

    async def holder(self) -> str | None:
        """Who holds the lease now, as the bucket says."""
        return holder_of(await self.kv.get(self.key))

    async def try_acquire(self) -> bool:
        """One look: take the lease when it is free, ours, or unrenewed for a whole ttl."""
        if self.held:
            return True
        entry = await self.kv.get(self.key)
        seen_at = self._clock()  # after the answer: the value was written before now
        if entry is not None and holder_of(entry) != self.replica:
            if self._seen is None or self._seen[0] != entry.revision:
                self._seen = (entry.revision, seen_at)
                return False
            if seen_at - self._seen[1] < self.ttl_s:
                return False
            log.warning(
                "lease %s: %s did not renew for %.1fs; taking over",
                self.key,
                holder_of(entry),
                seen_at - self._seen[1],
            )
        sent = self._clock()
        try:
            if entry is None:
                revision = await self.kv.create(self.key, self._value)
            else:
                # Ours (a restart that kept the replica id, or a reply lost on the way
                # back) or expired: either way, replace exactly what we looked at.
                revision = await self.kv.update(self.key, self._value, entry.revision)
        except RevisionMismatch:
            self._seen = None  # someone else wrote first; watch their revision anew
            return False
        self._took(revision, sent)
        self._seen = None
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica holds the lease (True), or ``stop`` is set (False)."""
        while not stop.is_set():
            try:
                if await self.try_acquire():
                    return True
            except Exception:  # noqa: BLE001 - the bus may be away for a moment; look again
                log.exception("lease %s: looking at the lease failed", self.key)
            await _wait(stop, self.renew_every_s)
        return False

    async def renew(self) -> None:
        """Renew once; raises :class:`LeaseLost` when someone else holds the lease now.
        Other errors (the bus unreachable) propagate: :meth:`keep` tries again."""
        if self._revision is None:
            raise LeaseLost(f"lease {self.key} is not held by {self.replica}")
        sent = self._clock()
        try:
            revision = await self.kv.update(self.key, self._value, self._revision)
        except RevisionMismatch:
            # Our previous renewal may have landed with its reply lost: still ours if
            # the bucket says so, and then the current revision is renewed once more.
            entry = await self.kv.get(self.key)
            if entry is None or holder_of(entry) != self.replica:
                self._lose()
                raise LeaseLost(f"lease {self.key} is held by {holder_of(entry)} now") from None
            revision = await self.kv.update(self.key, self._value, entry.revision)
        if self._revision is None:
            raise LeaseLost(f"lease {self.key} was given up while renewing")
        self._took(revision, sent)

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew every ttl/3 until ``stop`` (returns) or the lease is lost (raises
        :class:`LeaseLost`, at the latest when the held time runs out)."""
        while not stop.is_set():
            remaining = self._valid_until - self._clock()
            if self._revision is None or remaining <= 0:
                self._lose()
                raise LeaseLost(f"lease {self.key}: no renewal succeeded in time")
            try:
                await asyncio.wait_for(self.renew(), timeout=remaining)
            except LeaseLost:
                raise
            except Exception as exc:  # noqa: BLE001 - retried until the held time runs out
                log.warning(
                    "lease %s: renewal failed (%r); %.1fs left",
                    self.key,
                    exc,
                    self._valid_until - self._clock(),
                )
                await _wait(stop, min(self.renew_every_s / 3, max(remaining, 0.01)))
                continue
            await _wait(stop, self.renew_every_s)

    async def release(self) -> None:
        """Give the lease up (a clean stop): a follower takes over at its next look."""
        revision, self._revision = self._revision, None
        self._valid_until = 0.0
        if revision is None:
            return
        try:
            await self.kv.delete(self.key, revision)
        except RevisionMismatch:
            pass  # someone else holds it already

    def _took(self, revision: int, sent: float) -> None:
        self._revision = revision
        self._valid_until = sent + self.ttl_s * HOLD_SHARE

    def _lose(self) -> None:
        self._revision = None
        self._valid_until = 0.0


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
