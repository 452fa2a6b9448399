"""The scheduler's pure core: capacity snapshots, gang placement and the queue cycle.
No I/O here (docs/design/0001)."""

from .capacity import Allocation, NodeFree, Snapshot, gpu_count
from .gang import Plan, Unschedulable, place_gang
from .growth import growth
from .plugins import (
    QUEUE_ORDERS,
    VICTIM_CHOOSERS,
    Candidate,
    Fifo,
    LeastWork,
    LowestPriority,
    PriorityFifo,
    QueueOrder,
    Rules,
    UnknownSetting,
    VictimChooser,
)
from .policies import DEFAULT_POLICY, POLICIES, UnknownPolicy, scorer_named
from .queue import (
    Decision,
    Placed,
    Preempt,
    QueuedJob,
    Running,
    Waiting,
    queue_order,
    schedule,
)
from .scoring import ClusterContext, Scorer
from .state import SchedulerState

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "QUEUE_ORDERS",
    "VICTIM_CHOOSERS",
    "Allocation",
    "Candidate",
    "ClusterContext",
    "Decision",
    "Fifo",
    "LeastWork",
    "LowestPriority",
    "NodeFree",
    "Placed",
    "Plan",
    "Preempt",
    "PriorityFifo",
    "QueueOrder",
    "QueuedJob",
    "Rules",
    "Running",
    "Scorer",
    "SchedulerState",
    "Snapshot",
    "UnknownPolicy",
    "UnknownSetting",
    "Unschedulable",
    "VictimChooser",
    "Waiting",
    "gpu_count",
    "growth",
    "place_gang",
    "queue_order",
    "schedule",
    "scorer_named",
]
