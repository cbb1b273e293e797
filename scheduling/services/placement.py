"""Booking placement: window rules, free GPUs under the node lock, the quota check, one-statement insert."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg.errors
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from portal.accounts.models import Project, Quota
from scheduling import admission
from scheduling.alternatives import peak_concurrent_gpus
from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Gpu,
    GpuType,
    Node,
)
from scheduling.selectors import prepared_fetchall
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


_FreeNode = admission.FreeNode  # the rule set is pure: scheduling.admission


# GPUs of the type on up nodes with no blocking allocation overlapping the period, one row per
# node with its free GPUs' ids and indexes as arrays (in index order).  Raw SQL: it runs under
# the node lock of every booking, and the ORM's compilation of the NOT EXISTS cost more CPU
# than PostgreSQL's answer; one row per node rather than per GPU saves converting and
# regrouping every GPU in Python.  ``NOT (state = 'released')`` is the exclusion index's
# predicate, so the index serves the anti-join.
_FREE_GPUS_SQL = f"""
SELECT n.id, n.name, n.cluster_id, array_agg(g.id ORDER BY g.index), array_agg(g.index ORDER BY g.index)
  FROM {Gpu._meta.db_table} g
  JOIN {Node._meta.db_table} n ON n.id = g.node_id
 WHERE n.gpu_type_id = %(gpu_type)s AND n.cluster_id = ANY(%(clusters)s) AND n.status = %(up)s
   AND NOT EXISTS (
       SELECT 1 FROM {Allocation._meta.db_table} a
        WHERE a.gpu_id = g.id AND a.period && %(period)s AND NOT (a.state = %(released)s)
   )
 GROUP BY n.id
 ORDER BY n.id
"""  # noqa: S608 - table names from the models, values bound


def _free_nodes(*, gpu_type: GpuType, cluster_ids: Sequence[int], period: DateTimeTZRange) -> list[_FreeNode]:
    """GPUs of the type on up nodes with no blocking allocation overlapping ``period``."""
    rows = prepared_fetchall(
        _FREE_GPUS_SQL,
        {
            "gpu_type": gpu_type.pk,
            "clusters": list(cluster_ids),
            "up": Node.Status.UP.value,
            "period": period,
            "released": Allocation.State.RELEASED.value,
        },
    )
    return [
        _FreeNode(node_id, name, cluster_id, tuple(gpu_ids), tuple(indexes))
        for node_id, name, cluster_id, gpu_ids, indexes in rows
    ]


# A booking, its allocations and its audit events (the booking's, then one per allocation in
# GPU order) in one prepared statement: through the ORM these were three INSERTs whose
# compilation cost more CPU than anything else in booking_create.  The allocations reference
# the booking inserted by the same statement (foreign keys are checked at its end).  The
# allocation events' ``after`` is ``allocation_state`` of each new allocation, built in Python.
_BOOKING_INSERT_AUDITED_SQL = f"""
WITH booking AS (
    INSERT INTO {Booking._meta.db_table}
           (user_id, project_id, cluster_id, gpu_type_id, gpu_count, start_at, end_at, status, note,
            created_at, updated_at, ended_at, status_message)
    VALUES (%(user)s::bigint, %(project)s::bigint, %(cluster)s::bigint, %(gpu_type)s::bigint,
            %(gpu_count)s::smallint, %(start_at)s::timestamptz, %(end_at)s::timestamptz,
            %(status)s::varchar, %(note)s::varchar, %(created_at)s::timestamptz,
            %(created_at)s::timestamptz, NULL, '')
    RETURNING id
),
alloc AS (
    INSERT INTO {Allocation._meta.db_table}
           (gpu_id, booking_id, job_id, period, is_preemptible, state, created_at)
    SELECT u.gpu, booking.id, NULL, %(period)s::tstzrange, false, %(state)s::varchar, %(at)s::timestamptz
      FROM booking, unnest(%(gpus)s::bigint[]) WITH ORDINALITY AS u(gpu, ord)
     ORDER BY u.ord
    RETURNING id, gpu_id
),
events AS (
    SELECT 0::bigint AS ord, booking.id AS entity_id, 'booking' AS entity_type,
           'booking.create' AS verb, %(booking_after)s::jsonb AS after
      FROM booking
    UNION ALL
    SELECT a.ord, alloc.id, 'allocation', 'allocation.create', a.after
      FROM alloc JOIN unnest(%(gpus)s::bigint[], %(afters)s::jsonb[]) WITH ORDINALITY AS a(gpu, after, ord)
        ON a.gpu = alloc.gpu_id
),
audited AS (
    INSERT INTO {AuditEvent._meta.db_table}
           (actor_id, actor_label, verb, entity_type, entity_id, before, after, at)
    SELECT %(actor)s::bigint, %(label)s::varchar, verb, entity_type, entity_id, NULL, after,
           %(at)s::timestamptz
      FROM events ORDER BY ord
)
SELECT id FROM booking
"""  # noqa: S608 - table names from the models, values bound


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
    """Insert the unsaved ``booking`` (setting its id and timestamps, as ``save()`` would) and
    its planned allocations, and write ``booking.create`` and one ``allocation.create`` event per
    allocation, as ``allocation_events_record`` would."""
    state = Allocation.State.PLANNED.value
    afters = [
        json.dumps(
            {
                "gpu_id": g,
                "state": state,
                "lower": iso_or_none(period.lower),
                "upper": iso_or_none(period.upper),
                "is_preemptible": False,
            }
        )
        for g in gpu_ids
    ]
    created_at = timezone.now()  # what auto_now_add / auto_now would set
    # ``prepared_execute`` (server-side binding, planned once per connection), reading back the id.
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            _BOOKING_INSERT_AUDITED_SQL,
            {
                "user": booking.user_id,
                "project": booking.project_id,
                "cluster": booking.cluster_id,
                "gpu_type": booking.gpu_type_id,
                "gpu_count": booking.gpu_count,
                "start_at": booking.start_at,
                "end_at": booking.end_at,
                "status": str(booking.status),
                "note": booking.note,
                "created_at": created_at,
                "period": period,
                "state": state,
                "at": at,
                "gpus": list(gpu_ids),
                "booking_after": json.dumps(booking_after),
                "afters": afters,
                "actor": _actor_id(actor),
                "label": str(actor_label),
            },
            prepare=True,
        )
        [(booking_id,)] = cursor.fetchall()
    booking.pk = booking_id
    booking.created_at = booking.updated_at = created_at
    booking._state.adding = False
    booking._state.db = connection.alias


_pick_gpus = admission.pick_gpus


_QUOTA_UNREAD = object()


def _check_booking_quota(
    *,
    project: Project,
    gpu_type: GpuType,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    exclude_booking_id: int | None = None,
    quota: Any = _QUOTA_UNREAD,
) -> None:
    """Refuse (400) what would take the project over its quota of the type in the window.

    ``quota``: the project's ``Quota`` row for the type (or ``None``) when the caller has read it
    already; the peak is always computed here, under the caller's node lock.
    """
    if quota is _QUOTA_UNREAD:
        quota = Quota.objects.filter(project=project, gpu_type=gpu_type).first()
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
