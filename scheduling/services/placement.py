"""Booking placement: window rules, free GPUs under the node lock, the quota check, the audited insert."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from portal.accounts.models import Quota
from scheduling import admission, queries
from scheduling.alternatives import peak_concurrent_gpus
from scheduling.models import Allocation, Booking
from scheduling.queries import GpuTypeRef, ProjectRef
from scheduling.services.audit import _actor_id, iso_or_none
from scheduling.services.common import _human


def _validate_window(*, start_at: datetime, end_at: datetime, now: datetime) -> None:
    errors: dict[str, list[str]] = defaultdict(list)
    for name, value in (("start_at", start_at), ("end_at", end_at)):
        if timezone.is_naive(value):
            errors[name].append("Give a timezone (for example 2026-01-31T09:00:00Z).")
    if errors:
        raise ValidationError(dict(errors))
    min_duration = timedelta(seconds=settings.BERTH_BOOKING_MIN_DURATION_S)
    if end_at <= start_at:
        errors["end_at"].append("The end must be after the start.")
    elif end_at - start_at < min_duration:
        errors["end_at"].append(
            f"A booking lasts at least {int(min_duration.total_seconds() // 60)} minutes."
        )
    if start_at < now - timedelta(seconds=settings.BERTH_BOOKING_PAST_TOLERANCE_S):
        errors["start_at"].append("The start is in the past.")
    max_advance = timedelta(seconds=settings.BERTH_BOOKING_MAX_ADVANCE_S)
    if start_at > now + max_advance:
        errors["start_at"].append(f"Bookings open at most {max_advance.days} days ahead.")
    max_duration = timedelta(seconds=settings.BERTH_BOOKING_MAX_DURATION_S)
    if end_at - start_at > max_duration:
        errors["end_at"].append(f"A booking lasts at most {_human(max_duration)}.")
    if errors:
        raise ValidationError(dict(errors))


def _free_nodes(
    *, gpu_type: GpuTypeRef, cluster_ids: Sequence[int], period: DateTimeTZRange
) -> list[admission.FreeNode]:
    """GPUs of the type on up nodes with no blocking allocation overlapping ``period``."""
    return queries.free_nodes_get(gpu_type_id=gpu_type.pk, cluster_ids=cluster_ids, period=period)


def _booking_insert_audited(
    *,
    booking: Booking,
    gpu_ids: Sequence[int],
    period: DateTimeTZRange,
    actor: User,
    actor_label: str,
    booking_after: dict[str, Any],
    at: datetime,
) -> None:
    """Insert the unsaved ``booking`` and its planned allocations, and write ``booking.create``
    and one ``allocation.create`` event per allocation, as ``allocation_events_record`` would."""
    booking.save(force_insert=True)
    afters = [
        {
            "gpu_id": g,
            "state": Allocation.State.PLANNED.value,
            "lower": iso_or_none(period.lower),
            "upper": iso_or_none(period.upper),
            "is_preemptible": False,
        }
        for g in gpu_ids
    ]
    queries.booking_allocations_insert_audited(
        booking_id=booking.pk,
        gpu_ids=gpu_ids,
        period=period,
        booking_after=booking_after,
        allocation_afters=afters,
        actor_id=_actor_id(actor),
        actor_label=actor_label,
        at=at,
    )


_pick_gpus = admission.pick_gpus


_QUOTA_UNREAD = object()


def _check_booking_quota(
    *,
    project: ProjectRef,
    gpu_type: GpuTypeRef,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    exclude_booking_id: int | None = None,
    quota: Any = _QUOTA_UNREAD,
) -> None:
    """Refuse (400) what would take the project over its quota of the type in the window.

    ``quota``: the project's quota row for the type (a ``Quota`` or a ``queries.QuotaRow``, or
    ``None``) when the caller has read it already; the peak is always computed here, under the
    caller's node lock.
    """
    if quota is _QUOTA_UNREAD:
        quota = Quota.objects.filter(project_id=project.pk, gpu_type_id=gpu_type.pk).first()
    if quota is None or quota.max_gpus is None:
        return
    peak = peak_concurrent_gpus(
        project=project,
        gpu_type=gpu_type,
        start_at=start_at,
        end_at=end_at,
        exclude_booking_id=exclude_booking_id,
    )
    message = admission.booking_cap_error(
        project=project.slug, gpu_type=gpu_type.name, max_gpus=quota.max_gpus, peak=peak, gpu_count=gpu_count
    )
    if message is not None:
        raise ValidationError({"gpu_count": message})
