"""Bookings: create (placed on concrete GPUs), cancel, end early; extending one is `extension`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, OperationalError, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from portal.accounts.models import Project
from scheduling.alternatives import booking_alternatives
from scheduling.models import (
    AuditEvent,
    Booking,
    Cluster,
    GpuType,
)
from scheduling.queries import ClusterRef, GpuTypeRef, ProjectRef, QuotaRow
from scheduling.services.audit import (
    _booking_state,
    allocations_close,
    entity_event_record,
)
from scheduling.services.common import (
    BookingConflictError,
    _capacity_by_cluster,
    _engine_round_soon,
    _is_deadlock,
    _lock_booking,
    _lock_nodes,
    _now,
    _require_can_manage,
    _require_member_read_quota,
    _utc,
    is_exclusion_violation,
)
from scheduling.services.placement import (
    _booking_insert_audited,
    _check_booking_quota,
    _free_nodes,
    _pick_gpus,
    _validate_window,
)

logger = logging.getLogger(__name__)

# How many times booking_create picks GPUs again after the exclusion constraint refused its pick.
_PLACEMENT_ATTEMPTS = 3


def booking_create(
    user: User,
    *,
    project: ProjectRef,
    gpu_type: GpuTypeRef,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    cluster: ClusterRef | None = None,
    note: str = "",
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """Book ``gpu_count`` GPUs of ``gpu_type`` over ``[start_at, end_at)`` on concrete GPUs.

    Picks free GPUs on one node when the count fits one node (best fit), else across as few
    nodes of one cluster as possible, and inserts one allocation per GPU.  Raises
    ``ValidationError`` for bad input, ``PermissionDenied`` for a project the user is not in
    and ``BookingConflictError`` (with the nearest free windows) when the GPUs are taken.
    Nothing is written unless the whole booking succeeds.

    ``project``, ``gpu_type`` and ``cluster`` are model instances or `scheduling.queries` rows
    (the booking API's); the booking's relations are set to the instances given, and only ids
    are written for rows.
    """
    now = _now(now)
    quota, clusters = _booking_request_check(
        user,
        project=project,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        start_at=start_at,
        end_at=end_at,
        cluster=cluster,
        now=now,
    )
    booking = Booking(
        user=user,
        project_id=project.pk,
        gpu_type_id=gpu_type.pk,
        gpu_count=gpu_count,
        start_at=start_at,
        end_at=end_at,
        note=note,
        status=Booking.Status.CONFIRMED,
    )
    if isinstance(project, Project):
        booking.project = project
    if isinstance(gpu_type, GpuType):
        booking.gpu_type = gpu_type
    for attempt in range(_PLACEMENT_ATTEMPTS):
        try:
            placed = _booking_place(
                booking,
                refs=(project, gpu_type),
                clusters=clusters,
                quota=quota,
                actor_label=actor_label,
                now=now,
            )
        except (IntegrityError, OperationalError) as exc:
            is_retryable = (
                is_exclusion_violation(exc) if isinstance(exc, IntegrityError) else _is_deadlock(exc)
            )
            if not is_retryable:
                raise
            # Another writer (one that skipped the node lock) took a GPU between our read
            # and our insert: read again and pick other GPUs.
            logger.info(
                "booking_create: %s on attempt %d; picking again", type(exc.__cause__).__name__, attempt + 1
            )
            continue
        if placed is None:
            break
        return placed
    raise _booking_refusal(
        gpu_type=gpu_type, gpu_count=gpu_count, start_at=start_at, end_at=end_at, clusters=clusters
    )


def _booking_request_check(
    user: User,
    *,
    project: ProjectRef,
    gpu_type: GpuTypeRef,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    cluster: ClusterRef | None,
    now: datetime,
) -> tuple[QuotaRow | None, list[ClusterRef]]:
    """Refuse a bad request before any lock; return the project's quota row (read once) and the
    clusters to place on."""
    _validate_window(start_at=start_at, end_at=end_at, now=now)
    if gpu_count < 1:
        raise ValidationError({"gpu_count": "Book at least one GPU."})
    quota = _require_member_read_quota(user, project=project, gpu_type=gpu_type)
    if not project.is_active:
        raise ValidationError({"project": "This project is archived."})
    clusters: list[ClusterRef] = (
        [cluster] if cluster is not None else list(Cluster.objects.filter(is_active=True))
    )
    if cluster is not None and not cluster.is_active:
        raise ValidationError({"cluster": "This cluster is not active."})
    # A count no cluster has is a 400, not a 409; checked only when placement fails
    # (`_booking_refusal`), so a booking that fits costs no capacity query.
    return quota, clusters


def _booking_place(
    booking: Booking,
    *,
    refs: tuple[ProjectRef, GpuTypeRef],
    clusters: Sequence[ClusterRef],
    quota: QuotaRow | None,
    actor_label: str,
    now: datetime,
) -> Booking | None:
    """One placement attempt in one transaction: lock the type's nodes, check the quota, pick free
    GPUs and insert the booking with its allocations and audit events.  ``None``: they do not fit."""
    project, gpu_type = refs
    cluster_ids = [c.pk for c in clusters]
    period = DateTimeTZRange(booking.start_at, booking.end_at, "[)")
    with transaction.atomic():
        _lock_nodes(gpu_type=gpu_type, cluster_ids=cluster_ids)
        # Under the node lock: two bookings of one project cannot both pass the quota.
        _check_booking_quota(
            project=project,
            gpu_type=gpu_type,
            gpu_count=booking.gpu_count,
            start_at=booking.start_at,
            end_at=booking.end_at,
            quota=quota,
        )
        free = _free_nodes(gpu_type=gpu_type, cluster_ids=cluster_ids, period=period)
        pick = _pick_gpus(free, gpu_count=booking.gpu_count)
        if pick is None:
            return None
        gpu_ids, cluster_id = pick
        booking.cluster_id = cluster_id
        _booking_insert_audited(
            booking=booking,
            gpu_ids=gpu_ids,
            period=period,
            actor=booking.user,
            actor_label=actor_label,
            booking_after={**_booking_state(booking), "gpu_ids": list(gpu_ids), "cluster_id": cluster_id},
            at=now,
        )
        _engine_round_soon(cluster_id)
        # What the API shows, without reading the booking back: its cluster and GPUs.
        chosen = next(c for c in clusters if c.pk == cluster_id)
        if isinstance(chosen, Cluster):
            booking.cluster = chosen
        where = {
            g: (node.name, i) for node in free for g, i in zip(node.gpu_ids, node.gpu_indexes, strict=True)
        }
        booking.held_gpus = [(g, *where[g]) for g in sorted(gpu_ids)]  # type: ignore[attr-defined]
        return booking


def _booking_refusal(
    *,
    gpu_type: GpuTypeRef,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    clusters: Sequence[ClusterRef],
) -> Exception:
    """Why the GPUs could not be placed: a count no cluster has (400), else taken GPUs (409) with
    the nearest free alternatives."""
    cluster_ids = [c.pk for c in clusters]
    capacity = _capacity_by_cluster(gpu_type=gpu_type, cluster_ids=cluster_ids)
    largest = max(capacity.values(), default=0)
    if largest == 0:
        return ValidationError({"gpu_type": f"No cluster here has {gpu_type.name} GPUs."})
    if gpu_count > largest:
        return ValidationError(
            {
                "gpu_count": (
                    f"At most {largest} {gpu_type.name} GPUs exist in one cluster; asked for {gpu_count}."
                )
            }
        )
    alternatives = booking_alternatives(
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        start_at=start_at,
        end_at=end_at,
        cluster_ids=cluster_ids,
    )
    return BookingConflictError(
        f"{gpu_count} {gpu_type.name} GPU(s) are not free from {_utc(start_at)} to {_utc(end_at)}.",
        alternatives=alternatives,
        fields={"start_at": ["Not enough free GPUs in this window."]},
    )


def _lock_open_booking(booking: Booking, *, user: User) -> Booking:
    booking = _lock_booking(booking)
    _require_can_manage(user, owner_id=booking.user_id, project_id=booking.project_id)
    if booking.status not in Booking.OPEN_STATUSES:
        raise ValidationError({"status": f"This booking is already {booking.status}."})
    return booking


def _booking_close(
    booking: Booking,
    *,
    status: str,
    ended_at: datetime | None,
    user: User,
    actor_label: str,
    verb: str,
    allocation_verb: str,
    now: datetime,
) -> Booking:
    """Set the booking's final status, end its allocations at ``now`` and audit both."""
    before = _booking_state(booking)
    booking.status = status
    booking.ended_at = ended_at
    booking.save(update_fields=["status", "ended_at", "updated_at"])
    allocations_close(
        booking.allocations.all(), at=now, actor=user, actor_label=actor_label, verb=allocation_verb
    )
    entity_event_record(booking, verb=verb, before=before, actor=user, actor_label=actor_label, at=now)
    _engine_round_soon(booking.cluster_id)
    return booking


@transaction.atomic
def booking_cancel(
    booking: Booking,
    *,
    user: User,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """Cancel an open booking.

    Before its start, its allocations are released (they stop blocking at once).  After its
    start, it ends now: allocations are truncated to ``[start, now)`` and kept as history.
    """
    now = _now(now)
    booking = _lock_open_booking(booking, user=user)
    return _booking_close(
        booking,
        status=Booking.Status.CANCELLED,
        ended_at=now if booking.start_at < now else booking.ended_at,
        user=user,
        actor_label=actor_label,
        verb="booking.cancel",
        allocation_verb="allocation.cancel",
        now=now,
    )


@transaction.atomic
def booking_end_early(
    booking: Booking,
    *,
    user: User,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """End a running booking now; its GPUs are free again from now on.

    Only for a booking that has started and not yet ended (use ``booking_cancel`` before the start).
    """
    now = _now(now)
    booking = _lock_open_booking(booking, user=user)
    if now <= booking.start_at:
        raise ValidationError({"status": "This booking has not started yet; cancel it instead."})
    if now >= booking.end_at:
        raise ValidationError({"status": "This booking has already ended."})
    return _booking_close(
        booking,
        status=Booking.Status.COMPLETED,
        ended_at=now,
        user=user,
        actor_label=actor_label,
        verb="booking.end_early",
        allocation_verb="allocation.end",
        now=now,
    )
