"""The scheduler's pure core: capacity snapshots, gang placement and the queue cycle.
No I/O here (docs/design/0001)."""

from .capacity import Allocation, NodeFree, Snapshot, gpu_count
from .gang import Plan, Unschedulable, place_gang
from .queue import Decision, Placed, QueuedJob, Waiting, queue_order, schedule
from .state import SchedulerState

__all__ = [
    "Allocation",
    "Decision",
    "NodeFree",
    "Placed",
    "Plan",
    "QueuedJob",
    "SchedulerState",
    "Snapshot",
    "Unschedulable",
    "Waiting",
    "gpu_count",
    "place_gang",
    "queue_order",
    "schedule",
]
