"""Celery tasks of the notifications app (thin callers; ids in, idempotent, acks_late).

* `delivery_send(delivery_id)`: one attempt; on failure the row says ``retrying`` with the next
  attempt time and the task retries itself with exponential backoff
  (``BERTH_NOTIFY_BACKOFF_S`` × 2^(attempt-1), capped at ``BERTH_NOTIFY_BACKOFF_MAX_S``) until
  ``BERTH_NOTIFY_MAX_ATTEMPTS``, then ``failed``.  A delivery already sent, or being sent by
  another worker (its row is locked), is skipped.
* `notifications_sweep()`: beat, every minute: enqueues deliveries whose task was lost (broker
  down at commit, a worker killed between retries) and emits the time-based events (a booking
  starts or ends within the owner's lead time).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from notifications import channels
from notifications.models import Delivery
from notifications.services import delivery_record_attempt

logger = logging.getLogger(__name__)


def backoff_s(attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt."""
    return float(
        min(settings.BERTH_NOTIFY_BACKOFF_MAX_S, settings.BERTH_NOTIFY_BACKOFF_S * 2 ** (attempts - 1))
    )


def delivery_attempt(delivery_id: int, *, now: datetime | None = None) -> Delivery | None:
    """Try to send one delivery once and record the outcome; None when there was nothing to do.

    The row stays locked while sending, so two workers never send the same delivery.
    """
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("webhook")
            .filter(pk=delivery_id, status__in=(Delivery.Status.PENDING, Delivery.Status.RETRYING))
            .first()
        )
        if delivery is None:
            return None
        result = channels.send(delivery)
        now = now or timezone.now()
        attempts = delivery.attempts + 1
        is_last = attempts >= settings.BERTH_NOTIFY_MAX_ATTEMPTS or not result.is_retryable
        next_at = None if result.is_ok or is_last else now + timedelta(seconds=backoff_s(attempts))
        return delivery_record_attempt(
            delivery_id=delivery.pk,
            is_ok=result.is_ok,
            response_status=result.response_status,
            error=result.error,
            next_attempt_at=next_at,
            now=now,
        )


@shared_task(
    bind=True,
    name="notifications.tasks.delivery_send",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=60,
    time_limit=90,
    max_retries=None,  # the row's attempts bound the retries (BERTH_NOTIFY_MAX_ATTEMPTS)
)
def delivery_send(self: Task[Any, Any], delivery_id: int) -> dict[str, Any]:
    delivery = delivery_attempt(delivery_id)
    if delivery is None:
        return {"delivery_id": delivery_id, "status": "skipped"}
    if delivery.status == Delivery.Status.RETRYING and delivery.next_attempt_at is not None:
        countdown = max(0.0, (delivery.next_attempt_at - timezone.now()).total_seconds())
        logger.info("delivery %s failed (%s); retry in %.0f s", delivery_id, delivery.last_error, countdown)
        raise self.retry(countdown=countdown)
    return {"delivery_id": delivery_id, "status": delivery.status, "attempts": delivery.attempts}


def deliveries_due(*, now: datetime) -> list[int]:
    """Deliveries whose sending task may have been lost: pending for over a minute, or a retry overdue."""
    slack = timedelta(seconds=60)
    pending = Delivery.objects.filter(status=Delivery.Status.PENDING, created_at__lt=now - slack)
    overdue = Delivery.objects.filter(status=Delivery.Status.RETRYING, next_attempt_at__lt=now - slack)
    return list((pending | overdue).order_by("id").values_list("id", flat=True)[:1000])


@shared_task(
    name="notifications.tasks.notifications_sweep",
    acks_late=True,
    soft_time_limit=120,
    time_limit=150,
)
def notifications_sweep() -> dict[str, int]:
    from notifications.scan import bookings_scan

    now = timezone.now()
    emitted = bookings_scan(now=now)
    due = deliveries_due(now=now)
    for delivery_id in due:
        delivery_send.delay(delivery_id)
    return {"emitted": emitted, "requeued": len(due)}
