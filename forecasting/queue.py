"""The port through which the forecasting services queue work for a worker, without importing
the tasks (which import the services): ``forecasting.apps.ready`` registers the Celery
implementation (``forecasting.tasks.CeleryTaskQueue``); the services ask `task_queue()` at call
time.  Pure: no Django, no Celery.
"""

from __future__ import annotations

from typing import Protocol


class TaskQueue(Protocol):
    """What the forecasting services hand to a worker.  Each call enqueues and returns."""

    def capacity_study_run(self, study_id: int) -> None:
        """Run a what-if capacity study."""
        ...

    def capacity_exceed_run(self, run_id: int) -> None:
        """Run a "when does demand exceed capacity" forecast."""
        ...

    def forecast_refresh_now(self, cluster_id: int) -> None:
        """Refit this hour's forecasts of a cluster (expires after an hour in the queue)."""
        ...


_queue: TaskQueue | None = None


def set_task_queue(queue: TaskQueue | None) -> None:
    global _queue  # the one registry, set once at start-up
    _queue = queue


def task_queue() -> TaskQueue:
    if _queue is None:
        raise RuntimeError("no task queue is registered (forecasting.apps registers one at start-up)")
    return _queue
