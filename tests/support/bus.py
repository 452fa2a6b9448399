"""What the bus would hand a handler with an event, for tests that call handlers directly."""

from __future__ import annotations

from trainyard_common.bus import Delivery

# A first delivery of a message (handlers must treat a repeat the same way).
RECEIVED = Delivery(stream_seq=1, num_delivered=1, subject="yard.test")
