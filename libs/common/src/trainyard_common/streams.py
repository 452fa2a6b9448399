"""``python -m trainyard_common.streams``: make the bus's streams (the events and the dead
letters) with the identity in ``YARD_NATS_URL``, one that may: the platform's own. The
services' identities may only look at them (bus_access.GRANTS), so a service finding
none stops, saying so. The stack makes them at each start; the Helm chart runs this
before each install and upgrade (its bus Secret's key ``platform``)."""

from __future__ import annotations

import asyncio
import os
import sys

from .bus import Bus


async def make(url: str) -> None:
    bus = await Bus.connect(url, name="trainyard-streams")
    await bus.close()


def main() -> None:
    url = os.environ.get("YARD_NATS_URL")
    if not url:
        sys.exit("YARD_NATS_URL: the URL of an identity that may make the streams")
    asyncio.run(make(url))
    print("the bus's streams are there")


if __name__ == "__main__":
    main()
