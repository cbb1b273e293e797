"""The policy every Celery task of Berth follows (DESIGN §1): a stable name, ``acks_late`` (a
worker that dies mid-task leaves the message to be redelivered, so tasks are idempotent) and
both time limits.  Tasks take ids and call one service; they never decide anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import shared_task

from scheduling.models import Cluster


def berth_task(
    *, name: str, soft_time_limit: float, time_limit: float, **options: Any
) -> Callable[[Callable[..., Any]], Any]:
    """``shared_task`` with ``acks_late`` and both time limits always set; other options pass through.

    Typed once here: Celery ships no type hints, so the task object (``.delay``, ``.apply_async``)
    is ``Any`` to its callers either way, and no task needs a ``type: ignore`` of its own.
    """
    decorator: Callable[[Callable[..., Any]], Any] = shared_task(
        name=name, acks_late=True, soft_time_limit=soft_time_limit, time_limit=time_limit, **options
    )
    return decorator


def active_cluster_ids() -> list[int]:
    """Ids of the active clusters, in id order: what every per-cluster dispatch task iterates."""
    return list(Cluster.objects.filter(is_active=True).order_by("id").values_list("id", flat=True))
