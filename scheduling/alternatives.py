"""Conflicts of a booking: the nearest free windows offered with a 409 (`booking_alternatives`),
quota peaks (`peak_concurrent_gpus`, `booking_quota_get`) and a new job's warnings.

Re-exported by `scheduling.selectors` (their old home); reads only, like every selector.
"""

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from portal.accounts.models import Project
from scheduling import admission
from scheduling.models import Booking, Cluster, Gpu, GpuType, Job, Node
from scheduling.snapshots import job_startability

AnyUser = User | AnonymousUser


# ---- conflicts: alternatives and quota peaks ----


@dataclass(frozen=True, slots=True)
class Alternative:
    """A free window offered when a booking is refused."""

    cluster: str
    gpu_type: str
    gpu_count: int
    start_at: datetime
    end_at: datetime


def _earliest_start(
    *,
    gpu_ids: Sequence[int],
    busy: dict[int, list[tuple[float, float | None]]],
    gpu_count: int,
    duration_s: float,
    start_s: float,
    latest_s: float,
) -> float | None:
    """Earliest ``t`` in ``[start_s, latest_s]`` with ``gpu_count`` GPUs free over ``[t, t+duration_s)``.

    Times are epoch seconds.  One sweep: each free gap ``[a, b)`` of a GPU admits the starts
    ``[a, b - duration_s]``; the earliest instant covered by ``gpu_count`` such ranges is the
    answer.  O(A log A) for A busy intervals (trying every end instant against every interval,
    as before, was quadratic).
    """
    events: list[tuple[float, int]] = []
    for gpu_id in gpu_ids:
        cursor = start_s
        for lower, upper in sorted(busy.get(gpu_id, ())):
            if lower - duration_s >= cursor:
                hi = min(lower - duration_s, latest_s)
                if cursor <= hi:
                    events.append((cursor, 0))  # 0 sorts first: an opening before a closing
                    events.append((hi, 1))
            if upper is None:
                cursor = math.inf
                break
            cursor = max(cursor, upper)
            if cursor > latest_s:
                break
        if cursor <= latest_s:
            events.append((cursor, 0))
            events.append((latest_s, 1))
    events.sort()
    free = 0
    for at, kind in events:
        if kind == 0:
            free += 1
            if free >= gpu_count:
                return at
        else:
            free -= 1
    return None


def booking_alternatives(
    *,
    gpu_type: GpuType,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    cluster_ids: Sequence[int] | None = None,
    limit: int = 3,
) -> list[Alternative]:
    """The nearest free windows of the same length: the earliest for the requested type first,
    then the earliest for other types with enough memory, each at or after ``start_at``.

    Bounded work (a refused booking is something anyone can send in a loop): three queries
    (types, GPUs, overlapping allocations) whatever the horizon, and at most
    ``BERTH_ALTERNATIVES_MAX_ROWS`` allocations read, the earliest first.  When the calendar
    holds more, the search stops where the rows read stop (every window offered is still
    really free: all allocations starting before that instant were read).
    """
    duration = end_at - start_at
    # Never offer what booking_create would refuse as too far ahead.
    latest_start = min(
        start_at + timedelta(seconds=settings.BERTH_ALTERNATIVES_HORIZON_S),
        timezone.now() + timedelta(seconds=settings.BERTH_BOOKING_MAX_ADVANCE_S),
    )
    types, groups = _candidate_gpus(gpu_type=gpu_type, gpu_count=gpu_count, cluster_ids=cluster_ids)
    if not groups:
        return []
    rows, latest_start = _busy_rows(
        gpu_ids=[g for ids in groups.values() for g in ids],
        start_at=start_at,
        latest_start=latest_start,
        duration=duration,
    )
    if latest_start < start_at:
        return []
    start_s, duration_s = start_at.timestamp(), duration.total_seconds()
    latest_s = latest_start.timestamp()
    busy: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
    for gpu_id, lower, upper in rows:
        busy[gpu_id].append((-math.inf if lower is None else lower, upper))

    best_by_type: dict[int, Alternative] = {}
    for (type_id, _cluster_id, cluster_name), gpu_ids in sorted(groups.items(), key=lambda kv: kv[0][2]):
        if len(gpu_ids) < gpu_count:
            continue
        t_s = _earliest_start(
            gpu_ids=gpu_ids,
            busy=busy,
            gpu_count=gpu_count,
            duration_s=duration_s,
            start_s=start_s,
            latest_s=latest_s,
        )
        if t_s is None:
            continue
        # The exact requested start when it is free (no float round trip), else an end instant.
        t = start_at if t_s == start_s else datetime.fromtimestamp(t_s, tz=UTC)
        known = best_by_type.get(type_id)
        if known is None or t < known.start_at:
            best_by_type[type_id] = Alternative(cluster_name, types[type_id].name, gpu_count, t, t + duration)
    same = [best_by_type.pop(gpu_type.pk)] if gpu_type.pk in best_by_type else []
    others = sorted(best_by_type.values(), key=lambda a: (a.start_at, a.gpu_type))
    return (same + others)[:limit]


_CANDIDATES_SQL = f"""
    SELECT g.id, n.gpu_type_id, n.cluster_id, c.name
      FROM {Gpu._meta.db_table} g
      JOIN {Node._meta.db_table} n ON n.id = g.node_id
      JOIN {Cluster._meta.db_table} c ON c.id = n.cluster_id
     WHERE n.gpu_type_id = ANY(%s::bigint[]) AND n.status = %s AND c.is_active
"""  # noqa: S608 (table names from the models; values are parameters)


def _candidate_gpus(
    *, gpu_type: GpuType, gpu_count: int, cluster_ids: Sequence[int] | None
) -> tuple[dict[int, GpuType], dict[tuple[int, int, str], list[int]]]:
    """The types with at least ``gpu_type``'s memory, and the bookable GPUs per (type, cluster)
    of those groups that have ``gpu_count`` GPUs at all (empty: nothing to offer)."""
    types = {
        t.pk: t for t in GpuType.objects.filter(Q(pk=gpu_type.pk) | Q(memory_gib__gte=gpu_type.memory_gib))
    }
    # Plain SQL: the ORM spent ~3 ms of CPU building and reading this join for 256 GPUs, as much
    # as the allocation rows cost.
    sql = _CANDIDATES_SQL
    params: list[Any] = [list(types), Node.Status.UP]
    if cluster_ids is not None:
        sql += " AND n.cluster_id = ANY(%s::bigint[])"
        params.append(list(cluster_ids))
    groups: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for gpu_id, type_id, cluster_id, cluster_name in cursor.fetchall():
            groups[(type_id, cluster_id, cluster_name)].append(gpu_id)
    return types, {key: ids for key, ids in groups.items() if len(ids) >= gpu_count}


def _busy_rows(
    *, gpu_ids: list[int], start_at: datetime, latest_start: datetime, duration: timedelta
) -> tuple[list[tuple[int, float | None, float | None]], datetime]:
    """Blocking allocations of ``gpu_ids`` from ``start_at`` on, at most
    ``BERTH_ALTERNATIVES_MAX_ROWS`` of those starting later, and the latest start the rows read
    still cover (earlier than ``latest_start`` when the calendar holds more)."""
    max_rows = settings.BERTH_ALTERNATIVES_MAX_ROWS
    # Bounds as epoch seconds: parsing timestamps (or ranges of them) was most of the cost.  Two
    # parts: what overlaps the requested start (the GiST index), then what starts after it in
    # start order (the ``allocation_lower_blocking`` index), so PostgreSQL reads at most the
    # rows returned instead of sorting the whole horizon.
    # ``::bigint[]``, the column's type: psycopg sends a list of small ints as ``smallint[]``,
    # and PostgreSQL then tests every row against the whole array (no hashed lookup across
    # types): 11 ms against 1.8 ms for 4,000 rows of 256 GPUs.  ``date_part`` gives the float
    # directly (the same value: microseconds / 1e6, correctly rounded); ``extract`` computes a
    # numeric first, which cost as much again.
    select = (
        "SELECT gpu_id, date_part('epoch', lower(period)), date_part('epoch', upper(period)) "
        "FROM scheduling_allocation WHERE gpu_id = ANY(%s::bigint[]) AND state <> 'released' "
    )
    with connection.cursor() as cursor:
        cursor.execute(
            select + "AND period && tstzrange(%s, %s, '[]') AND lower(period) < %s",
            [gpu_ids, start_at, start_at, start_at],
        )
        rows = cursor.fetchall()
        cursor.execute(
            select + "AND lower(period) >= %s AND lower(period) < %s ORDER BY lower(period) LIMIT %s",
            [gpu_ids, start_at, latest_start + duration, max_rows + 1],
        )
        later = cursor.fetchall()
    if len(later) > max_rows:
        # Only windows ending before the first unread allocation can start are known to be free.
        latest_start = min(latest_start, datetime.fromtimestamp(later[max_rows][1], tz=UTC) - duration)
        later = later[:max_rows]
    return rows + later, latest_start


def peak_concurrent_gpus(
    *,
    project: Project,
    gpu_type: GpuType,
    start_at: datetime,
    end_at: datetime,
    exclude_booking_id: int | None = None,
) -> int:
    """Most GPUs of the type the project's open bookings hold at one instant within the window."""
    bookings = Booking.objects.filter(
        project=project,
        gpu_type=gpu_type,
        status__in=Booking.OPEN_STATUSES,
        start_at__lt=end_at,
        end_at__gt=start_at,
    )
    if exclude_booking_id is not None:
        bookings = bookings.exclude(pk=exclude_booking_id)
    windows: list[tuple[datetime, datetime, int]] = list(
        bookings.values_list("start_at", "end_at", "gpu_count")
    )
    return admission.peak_concurrent(windows, start_at=start_at, end_at=end_at)


def job_warnings(job: Job) -> list[str]:
    """What a user should know right after submitting ``job``: that it can never start under
    today's inventory and quotas, and what would unblock it (empty when it can start)."""
    if job.status != Job.Status.PENDING:
        return []
    never = job_startability(job)
    return [never.message] if never is not None else []


@dataclass(frozen=True, slots=True)
class BookingQuota:
    """What a project may still book of one GPU type over a whole window."""

    project: str
    max_gpus: int | None  # guaranteed + borrowable; None: no limit
    booked_peak: int  # most GPUs of the type its open bookings hold at one instant in the window
    bookable_gpus: int | None  # max_gpus - booked_peak (never negative); None: no limit


def booking_quota_get(
    *, project: Project, gpu_type: GpuType, start_at: datetime, end_at: datetime
) -> BookingQuota:
    """The project's booking room of ``gpu_type`` in ``[start_at, end_at)`` under its quota (the
    same rule `booking_create` enforces), for the booking box and the availability API."""
    from portal.accounts.models import Quota

    quota = Quota.objects.filter(project=project, gpu_type=gpu_type).first()
    max_gpus = quota.max_gpus if quota is not None else None
    peak = (
        peak_concurrent_gpus(project=project, gpu_type=gpu_type, start_at=start_at, end_at=end_at)
        if max_gpus is not None
        else 0
    )
    bookable = max(0, max_gpus - peak) if max_gpus is not None else None
    return BookingQuota(project=project.slug, max_gpus=max_gpus, booked_peak=peak, bookable_gpus=bookable)
