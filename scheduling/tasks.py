"""Celery tasks of the engine loop: thin callers of `scheduling.rounds` that take ids.

* `engine_round(cluster_id)`: one round; ``acks_late`` (a worker killed mid-round leaves the
  message to be redelivered), time-limited, retried with backoff when the backend is unreachable.
* `engine_rounds_dispatch()`: beat sends it every 15 s; it enqueues a round per active cluster,
  at most one queued per cluster (a Redis key with a TTL), so slow rounds do not pile up.
* `demo_load_dispatch()`: beat sends it every ``BERTH_DEMO_LOAD_TICK_S`` while the demo's load
  generator is on (`scheduling.demo_load`); one tick of arrivals per active simulator cluster.
* `engine_round_trigger(cluster_id)`: not a task.  Services call it after a submit, cancel,
  booking change or job end; after the commit it enqueues a round, debounced so that a burst
  of changes costs one round.
* `idempotency_keys_clean()`: beat sends it hourly; deletes expired ``Idempotency-Key`` answers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import Task
from celery.signals import worker_init, worker_process_init
from django.conf import settings
from django.db import transaction

from scheduling.backends.base import BackendError
from scheduling.models import Cluster
from scheduling.rounds import cyclic_gc_paused, engine_round_run, round_process_warm
from scheduling.task_policy import active_cluster_ids, berth_task

logger = logging.getLogger(__name__)

_QUEUED_KEY = "berth:engine:queued:{cluster_id}"
_MIN_WAKE_S = 1.0  # follow-up rounds closer than this are not worth a message
_TRIGGER_KEY = "berth:engine:trigger:{cluster_id}"


@worker_process_init.connect  # a prefork child, before its first task
@worker_init.connect  # the solo and thread pools
def _warm_for_rounds(**kwargs: Any) -> None:
    try:
        round_process_warm()
    except Exception:  # a cold first round is slower, never broken
        logger.warning("could not warm the worker for rounds", exc_info=True)


def _redis() -> redis.Redis:
    from scheduling.backend_registry import engine_redis

    return engine_redis(settings.BERTH_ENGINE_REDIS_URL)


@berth_task(
    bind=True,
    name="scheduling.tasks.engine_round",
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_ENGINE_ROUND_SOFT_TIME_LIMIT_S,
    time_limit=settings.BERTH_ENGINE_ROUND_TIME_LIMIT_S,
    autoretry_for=(BackendError,),
    retry_backoff=5,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=3,
)
def engine_round(self: Task[Any, Any], cluster_id: int, is_triggered: bool = False) -> dict[str, Any]:
    """Run one engine round for ``cluster_id``; raises `BackendError` (retried) while it is unreachable.

    A triggered round (``is_triggered``) that finds another round running tries once more a little
    later, so the change that triggered it is not left for the next beat.
    """
    try:
        _redis().delete(_QUEUED_KEY.format(cluster_id=cluster_id))
    except Exception:
        logger.warning("could not clear the queued mark of cluster %s", cluster_id, exc_info=True)
    if not Cluster.objects.filter(pk=cluster_id).exists():
        return {"cluster_id": cluster_id, "status": "missing"}
    # The round pauses the cyclic collector itself; holding it paused here too moves the
    # collection the round leaves (a generation-0 pass over everything it allocated, ~40 ms
    # after a full-size first round) from the round's exit, lock released but round not yet
    # returned, to just after it.
    with cyclic_gc_paused():
        result = engine_round_run(cluster_id=cluster_id)
    logger.info("engine round cluster=%s %s", cluster_id, result.as_dict())
    if result.status == "backend_error":
        raise BackendError(result.message)
    if result.status == "locked" and is_triggered:
        engine_round.apply_async(args=(cluster_id,), countdown=settings.BERTH_ENGINE_TRIGGER_DEBOUNCE_S + 1)
    _schedule_wake(cluster_id, result.next_round_at)
    return result.as_dict()


def _schedule_wake(cluster_id: int, next_round_at: float | None) -> None:
    """The engine wants a round before the next beat (a reclaim signal or a booking start is due)."""
    if next_round_at is None:
        return
    delay_s = next_round_at - time.time()
    if not _MIN_WAKE_S <= delay_s < settings.BERTH_ENGINE_ROUND_INTERVAL_S:
        return  # due now (the round just ran) or later than the next beat anyway
    try:
        engine_round.apply_async(args=(cluster_id,), countdown=delay_s)
    except Exception:
        logger.warning("could not schedule the wake-up round of cluster %s", cluster_id, exc_info=True)


@berth_task(
    name="scheduling.tasks.engine_rounds_dispatch",
    soft_time_limit=20,
    time_limit=30,
    ignore_result=True,
)
def engine_rounds_dispatch() -> list[int]:
    """Enqueue a round for every active cluster that has none queued yet; returns the ids enqueued."""
    enqueued = []
    ttl = settings.BERTH_ENGINE_QUEUED_TTL_S
    for cluster_id in active_cluster_ids():
        try:
            fresh = _redis().set(_QUEUED_KEY.format(cluster_id=cluster_id), "1", nx=True, ex=ttl)
        except Exception:
            logger.warning("redis unavailable for the queued mark; enqueueing anyway", exc_info=True)
            fresh = True
        if fresh:
            engine_round.apply_async(args=(cluster_id,), expires=ttl)
            enqueued.append(cluster_id)
    return enqueued


def _enqueue_debounced(cluster_id: int) -> bool:
    debounce_s = settings.BERTH_ENGINE_TRIGGER_DEBOUNCE_S
    try:
        first = _redis().set(
            _TRIGGER_KEY.format(cluster_id=cluster_id), "1", nx=True, px=max(1, int(debounce_s * 1000))
        )
    except Exception:
        logger.warning("redis unavailable: round trigger for cluster %s skipped (beat covers it)", cluster_id)
        return False
    if not first:
        return False  # a round is already due after the debounce window and will see this change
    try:
        engine_round.apply_async(args=(cluster_id, True), countdown=debounce_s)
    except Exception:
        logger.warning("could not enqueue a round for cluster %s (beat covers it)", cluster_id, exc_info=True)
        return False
    return True


def engine_round_trigger(cluster_id: int) -> None:
    """Ask for a round of ``cluster_id`` soon, after the current transaction commits.

    Debounced: the first call in a window of ``BERTH_ENGINE_TRIGGER_DEBOUNCE_S`` enqueues a round
    that runs when the window ends; later calls in the window are covered by it.  Never raises:
    a missed trigger only delays the change to the next beat round.
    """
    transaction.on_commit(lambda: _enqueue_debounced(cluster_id))


@berth_task(
    name="scheduling.tasks.demo_load_dispatch",
    soft_time_limit=30,
    time_limit=45,
    ignore_result=True,
)
def demo_load_dispatch() -> list[dict[str, Any]]:
    """One tick of the live demo's arrivals on every active simulator cluster (off: nothing)."""
    from scheduling.demo_load import demo_load_tick

    if not settings.BERTH_DEMO_LOAD:
        return []
    out = []
    for cluster_id in Cluster.objects.filter(is_active=True, backend=Cluster.Backend.SIMULATOR).values_list(
        "id", flat=True
    ):
        result = demo_load_tick(cluster_id=cluster_id)
        logger.info("demo load cluster=%s %s", cluster_id, result.as_dict())
        out.append({"cluster_id": cluster_id, **result.as_dict()})
    return out


@berth_task(
    name="scheduling.tasks.idempotency_keys_clean",
    soft_time_limit=120,
    time_limit=180,
    ignore_result=True,
)
def idempotency_keys_clean() -> int:
    """Delete the stored answers of ``Idempotency-Key`` writes older than ``BERTH_IDEMPOTENCY_TTL_S``
    (beat sends it hourly; an expired key is treated as new anyway, so this only bounds the table)."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.models import IdempotencyKey

    cutoff = timezone.now() - timedelta(seconds=settings.BERTH_IDEMPOTENCY_TTL_S)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    if deleted:
        logger.info("idempotency keys: deleted %d expired", deleted)
    return deleted
