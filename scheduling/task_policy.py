"""The policy every Celery task of Berth follows (DESIGN §1): a stable name, ``acks_late`` (a
worker that dies mid-task leaves the message to be redelivered, so tasks are idempotent) and
both time limits.  Tasks take ids and call one service; they never decide anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task, shared_task

from scheduling.models import Cluster


def berth_task(
    *, name: str, soft_time_limit: float, time_limit: float, **options: Any
) -> Callable[[Callable[..., Any]], Task[Any, Any]]:
    """``shared_task`` with ``acks_late`` and both time limits always set; other options pass through.

    Typed once here (celery-types): a task is a ``Task``, so ``.delay`` and ``.apply_async`` are
    checked as Celery declares them. The limits may be fractional seconds (Celery takes floats; its
    stubs say int), and the options are Celery's own, hence the one ``**`` call.
    """
    options.update(name=name, acks_late=True, soft_time_limit=soft_time_limit, time_limit=time_limit)
    decorator: Callable[[Callable[..., Any]], Task[Any, Any]] = shared_task(**options)
    return decorator


def active_cluster_ids() -> list[int]:
    """Ids of the active clusters, in id order: what every per-cluster dispatch task iterates."""
    return list(Cluster.objects.filter(is_active=True).order_by("id").values_list("id", flat=True))
