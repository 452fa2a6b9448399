"""The launcher's metrics (docs/observability.md): the tasks it watches, and the strays
it stopped (tasks the backend ran that the store did not know as running)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

WATCHED = Gauge(
    "trainyard_launcher_watched_tasks",
    "Tasks this launcher watches as running (updated at every look at them).",
)
STRAYS = Counter(
    "trainyard_launcher_strays_stopped_total",
    "Tasks the backend ran that the store did not know as running, stopped at a start.",
)
