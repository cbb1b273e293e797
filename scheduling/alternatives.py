"""Conflicts of a booking: the nearest free windows offered with a 409 (`booking_alternatives`),
quota peaks (`peak_concurrent_gpus`, `booking_quota_get`) and a new job's warnings.

Re-exported by `scheduling.selectors` (their old home); reads only, like every selector.
"""

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.utils import timezone

from scheduling import admission, queries
from scheduling.models import Booking, Job, Node
from scheduling.queries import GpuTypeRef, ProjectRef
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
    gpu_type: GpuTypeRef,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    cluster_ids: Sequence[int] | None = None,
    limit: int = 3,
) -> list[Alternative]:
    """The nearest free windows of the same length: the earliest for the requested type first,
    then the earliest for other types with enough memory, each at or after ``start_at``.

    Bounded work (a refused booking is something anyone can send in a loop): one statement
    (types, GPUs, overlapping allocations: `_SEARCH_SQL`) whatever the horizon, and at most
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
    max_rows = settings.BERTH_ALTERNATIVES_MAX_ROWS
    groups, rows, later = _search_rows(
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        cluster_ids=cluster_ids,
        start_at=start_at,
        until=latest_start + duration,
        limit=min(_FIRST_ROWS, max_rows),
    )
    groups = {key: ids for key, ids in groups.items() if len(ids) >= gpu_count}
    if not groups or latest_start < start_at:
        return []
    start_s, duration_s = start_at.timestamp(), duration.total_seconds()
    busy: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
    for gpu_id, lower, upper in rows:
        busy[gpu_id].append((-math.inf if lower is None else lower, upper))
    best = _earliest_per_group(
        groups,
        busy=busy,
        later=later,
        gpu_count=gpu_count,
        start_s=start_s,
        duration_s=duration_s,
        latest_start=latest_start,
        until=latest_start + duration,
    )
    return _ranked(best, gpu_type=gpu_type, gpu_count=gpu_count, start_at=start_at, duration=duration)[:limit]


def _earliest_per_group(
    groups: dict[tuple[int, str, str], list[int]],
    *,
    busy: dict[int, list[tuple[float, float | None]]],
    later: list[tuple[int, float | None, float | None]],
    gpu_count: int,
    start_s: float,
    duration_s: float,
    latest_start: datetime,
    until: datetime,
) -> dict[tuple[int, str, str], float]:
    """The earliest free start (epoch s) of each group (type id, type, cluster) that has one.

    ``busy`` holds the allocations over the requested start; ``later`` the first part of those
    starting later, in start order (`_search_rows`).  The rest are read (only when some group
    found no window in the first part) up to ``BERTH_ALTERNATIVES_MAX_ROWS``: most refusals
    find a window in the first few hundred rows.  With the rows read so far, every window
    ending before the first unread allocation starts is known exactly, so a group's earliest
    start found within that bound is its earliest overall.
    """
    max_rows = settings.BERTH_ALTERNATIVES_MAX_ROWS
    best: dict[tuple[int, str, str], float] = {}
    read = 0
    rows_limit = min(_FIRST_ROWS, max_rows)
    for part in (1, 2):  # at most two reads of later rows: the first part, then the rest
        next_lower = later[rows_limit][1] if len(later) > rows_limit else None
        kept = [r for r in later if next_lower is None or (r[1] or 0.0) < next_lower]
        for gpu_id, lower, upper in kept:
            busy[gpu_id].append((-math.inf if lower is None else lower, upper))
        read += len(kept)
        latest_s = latest_start.timestamp()
        if next_lower is not None:
            latest_s = min(latest_s, next_lower - duration_s)
        for key, gpu_ids in groups.items():
            if key in best:
                continue
            t_s = _earliest_start(
                gpu_ids=gpu_ids,
                busy=busy,
                gpu_count=gpu_count,
                duration_s=duration_s,
                start_s=start_s,
                latest_s=latest_s,
            )
            if t_s is not None:
                best[key] = t_s
        if part == 2 or next_lower is None or len(best) == len(groups) or read >= max_rows:
            break
        rows_limit = max_rows - read
        later = queries.alternatives_later_rows(
            gpu_ids=[g for key, ids in groups.items() if key not in best for g in ids],
            after_s=next_lower,
            until=until,
            limit=rows_limit,
        )
    return best


def _ranked(
    best: dict[tuple[int, str, str], float],
    *,
    gpu_type: GpuTypeRef,
    gpu_count: int,
    start_at: datetime,
    duration: timedelta,
) -> list[Alternative]:
    """One alternative per type (its earliest cluster), the requested type first, then by start."""
    start_s = start_at.timestamp()
    best_by_type: dict[int, Alternative] = {}
    for (type_id, type_name, cluster_name), t_s in sorted(best.items(), key=lambda kv: kv[0][2]):
        # The exact requested start when it is free (no float round trip), else an end instant.
        t = start_at if t_s == start_s else datetime.fromtimestamp(t_s, tz=UTC)
        known = best_by_type.get(type_id)
        if known is None or t < known.start_at:
            best_by_type[type_id] = Alternative(cluster_name, type_name, gpu_count, t, t + duration)
    same = [best_by_type.pop(gpu_type.pk)] if gpu_type.pk in best_by_type else []
    others = sorted(best_by_type.values(), key=lambda a: (a.start_at, a.gpu_type))
    return same + others


# Allocations starting after the requested start read in a first part of this many rows.
_FIRST_ROWS = 400


def _search_rows(
    *,
    gpu_type: GpuTypeRef,
    gpu_count: int,
    cluster_ids: Sequence[int] | None,
    start_at: datetime,
    until: datetime,
    limit: int,
) -> tuple[
    dict[tuple[int, str, str], list[int]],
    list[tuple[int, float | None, float | None]],
    list[tuple[int, float | None, float | None]],
]:
    """`queries.alternatives_search_rows`: the candidate GPUs per (type id, type name, cluster
    name), the blocking allocations of those GPUs over ``start_at``, and the first ``limit + 1``
    of those starting in ``[start_at, until)``, in start order (``limit + 1``: whether more
    follow)."""
    found = queries.alternatives_search_rows(
        {
            "type": gpu_type.pk,
            "memory": gpu_type.memory_gib,
            "up": str(Node.Status.UP),
            "clusters": list(cluster_ids) if cluster_ids is not None else None,
            "count": gpu_count,
            "start": start_at,
            "until": until,
            "limit": limit + 1,
        },
    )
    groups: dict[tuple[int, str, str], list[int]] = defaultdict(list)
    rows: list[tuple[int, float | None, float | None]] = []
    later: list[tuple[int, float | None, float | None]] = []
    for part, gpu_id, type_id, type_name, cluster_name, lower, upper in found:
        if part == 0:
            groups[(type_id, type_name, cluster_name)].append(gpu_id)
        else:
            (rows if part == 1 else later).append((gpu_id, lower, upper))
    later.sort(key=lambda r: r[1] or 0.0)  # UNION ALL keeps each part's order; not promised
    return dict(groups), rows, later


def peak_concurrent_gpus(
    *,
    project: ProjectRef,
    gpu_type: GpuTypeRef,
    start_at: datetime,
    end_at: datetime,
    exclude_booking_id: int | None = None,
) -> int:
    """Most GPUs of the type the project's open bookings hold at one instant within the window
    (``project`` and ``gpu_type``: instances or ``scheduling.queries`` rows)."""
    bookings = Booking.objects.filter(
        project_id=project.pk,
        gpu_type_id=gpu_type.pk,
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
    *, project: ProjectRef, gpu_type: GpuTypeRef, start_at: datetime, end_at: datetime
) -> BookingQuota:
    """The project's booking room of ``gpu_type`` in ``[start_at, end_at)`` under its quota (the
    same rule `booking_create` enforces), for the booking box and the availability API."""
    from portal.accounts.models import Quota

    quota = Quota.objects.filter(project_id=project.pk, gpu_type_id=gpu_type.pk).first()
    max_gpus = quota.max_gpus if quota is not None else None
    peak = (
        peak_concurrent_gpus(project=project, gpu_type=gpu_type, start_at=start_at, end_at=end_at)
        if max_gpus is not None
        else 0
    )
    bookable = max(0, max_gpus - peak) if max_gpus is not None else None
    return BookingQuota(project=project.slug, max_gpus=max_gpus, booked_peak=peak, bookable_gpus=bookable)
