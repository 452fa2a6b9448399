"""The live feed of job changes behind ``GET /v1/watch/jobs`` (server-sent events): one
walk of the store per status process, every ``interval_s`` while anyone listens, over
the jobs whose view changed since the last walk (``feed_seq``, the stream sequence of
the event that last changed each), fanned out to every listener.

Read from the store, not from this process's own projection, so a listener sees every
change whichever status replica projected it. Replicas may apply events a little out of
order: each walk looks back ``overlap`` sequence numbers before its watermark and sends
only what it has not sent yet, so a late write of an earlier sequence is not missed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from .views import JobViews

log = logging.getLogger("trainyard.status")

RESET = {"reset": True}


class JobFeed:
    def __init__(
        self,
        views: JobViews,
        interval_s: float = 0.5,
        overlap: int = 512,
        queue_size: int = 2000,
    ) -> None:
        self.views = views
        self.interval_s = interval_s
        self.overlap = overlap
        self.queue_size = queue_size
        self.listeners: set[asyncio.Queue[dict[str, Any]]] = set()
        self.watermark: int | None = None
        self._sent: OrderedDict[tuple[str, int], None] = OrderedDict()

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        """A queue of changed job summaries; ``RESET`` when this listener fell behind
        (it should read the list again)."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self.queue_size)
        self.listeners.add(queue)
        try:
            yield queue
        finally:
            self.listeners.discard(queue)

    async def walk(self) -> int:
        """One look at the store; returns how many changes went out."""
        if self.watermark is None:
            # Start at now: a listener wants what changes from its arrival on.
            self.watermark = await self.views.last_change()
            return 0
        changes = await self.views.changed_since(
            max(self.watermark - self.overlap, 0), limit=self.overlap + 1000
        )
        sent = 0
        for change in changes:
            key = (change["id"], change["feed_seq"])
            if key in self._sent:
                continue
            self._sent[key] = None
            sent += 1
            for queue in list(self.listeners):
                try:
                    queue.put_nowait(change)
                except asyncio.QueueFull:
                    # Too slow to follow: told to read the list again, then dropped.
                    with contextlib.suppress(asyncio.QueueEmpty):
                        queue.get_nowait()
                    queue.put_nowait(RESET)
                    self.listeners.discard(queue)
        if changes:
            self.watermark = max(self.watermark, changes[-1]["feed_seq"])
        while len(self._sent) > 4 * self.overlap + 1000:
            self._sent.popitem(last=False)
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if self.listeners:
                    await self.walk()
                else:
                    self.watermark = None  # the next listener starts from its own now
            except Exception:  # noqa: BLE001 - the next walk tries again
                log.exception("walking the job feed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
