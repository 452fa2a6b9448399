"""The scheduler's pure core: capacity snapshots, gang placement and the queue cycle.
No I/O here (docs/design/0001)."""

from .capacity import Allocation, NodeFree, Snapshot, gpu_count
from .gang import Plan, Unschedulable, place_gang
from .policies import DEFAULT_POLICY, POLICIES, UnknownPolicy, scorer_named
from .queue import Decision, Placed, QueuedJob, Waiting, queue_order, schedule
from .scoring import ClusterContext, Scorer
from .state import SchedulerState

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Allocation",
    "ClusterContext",
    "Decision",
    "NodeFree",
    "Placed",
    "Plan",
    "QueuedJob",
    "Scorer",
    "SchedulerState",
    "Snapshot",
    "UnknownPolicy",
    "Unschedulable",
    "Waiting",
    "gpu_count",
    "place_gang",
    "queue_order",
    "schedule",
    "scorer_named",
]
