"""The availability timeline (one day, hour by hour), the outlook with the demand forecast, and its CSV."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from portal.htmx import HtmxHttpRequest
from scheduling.forms import (
    DATETIME_LOCAL_FORMAT,
    next_quarter_hour,
)
from scheduling.models import Cluster
from scheduling.ports import prediction_port
from scheduling.selectors import (
    availability_get,
    gpu_type_list,
)
from scheduling.selectors_ui import OutlookHour, TypeOutlook, availability_outlook

TIMELINE_TEMPLATE = "scheduling/availability.html"


@dataclass(frozen=True, slots=True)
class TimelineCell:
    start_at: datetime
    free_gpus: int
    level: int  # 0 (none free) .. 4 (all free), for the colour
    is_past: bool
    book_start: str  # the booking form's start for this hour (the next quarter hour if it began)


@dataclass(frozen=True, slots=True)
class TimelineRow:
    gpu_type: str
    capacity: int
    cells: tuple[TimelineCell, ...]


def _level(free: int, capacity: int) -> int:
    if capacity <= 0 or free <= 0:
        return 0
    return min(4, 1 + (4 * free - 1) // capacity)  # 1..4: up to a quarter, half, three quarters, all


@login_required
@vary_on_headers("HX-Request")
@require_GET
def availability_timeline(request: HtmxHttpRequest) -> HttpResponse:
    """Free GPUs per type and hour over one day; each hour links to the booking form."""
    today = timezone.localdate()
    try:
        day = date.fromisoformat(request.GET.get("day", "")) if request.GET.get("day") else today
    except ValueError:
        day = today
    # Bookings open from today to BERTH_BOOKING_MAX_ADVANCE_S ahead; keep the view in that range.
    last_day = today + timedelta(seconds=settings.BERTH_BOOKING_MAX_ADVANCE_S)
    day = min(max(day, today), last_day)
    # The local day's real hours (23 or 25 on a summer-time change day), in UTC: local
    # midnight + 1 day is the next local midnight, but + 24 h on the wall clock is not.
    start = timezone.make_aware(datetime.combine(day, time.min)).astimezone(UTC)
    end = timezone.make_aware(datetime.combine(day + timedelta(days=1), time.min)).astimezone(UTC)
    hours = [start + timedelta(hours=h) for h in range(int((end - start) / timedelta(hours=1)))]
    now = timezone.now()
    rows: list[TimelineRow] = []
    for gpu_type in gpu_type_list().filter(nodes__cluster__is_active=True).distinct():
        availability = availability_get(gpu_type_name=gpu_type.name, start_at=start, end_at=end, step_s=3600)
        if availability.capacity == 0:
            continue
        cells = tuple(
            TimelineCell(
                start_at=slot.start_at,
                free_gpus=slot.free_gpus,
                level=_level(slot.free_gpus, availability.capacity),
                is_past=slot.end_at <= now,
                book_start=timezone.localtime(max(slot.start_at, next_quarter_hour(now))).strftime(
                    DATETIME_LOCAL_FORMAT
                ),
            )
            for slot in availability.slots
        )
        rows.append(TimelineRow(gpu_type.name, availability.capacity, cells))
    context: dict[str, Any] = {
        "day": day,
        "previous_day": day - timedelta(days=1) if day > today else None,
        "next_day": day + timedelta(days=1) if day < last_day else None,
        "hours": hours,
        "rows": rows,
        "now": now,
    }
    if request.htmx and not request.htmx.history_restore_request:
        return render(request, f"{TIMELINE_TEMPLATE}#availability-grid", context)
    outlook_days = _outlook_days(request)
    outlook = _outlook(now, days=outlook_days)
    context.update(
        {
            "outlook": outlook,
            "outlook_days": outlook_days,
            "outlook_day_choices": OUTLOOK_DAY_CHOICES,
            "outlook_has_forecast": any(
                h.forecast is not None for view in outlook for h in view.type_outlook.hours
            ),
            "outlook_fitting": _forecast_fitting(),
        }
    )
    return render(request, TIMELINE_TEMPLATE, context)


def _forecast_fitting() -> bool:
    """A demand-forecast fit is queued or running on some active cluster (the page says so)."""
    port = prediction_port()
    return any(
        (state := port.forecast_refresh_state(cluster_id=cid)) is not None
        and state.get("status") in ("queued", "running")
        for cid in Cluster.objects.filter(is_active=True).values_list("id", flat=True)
    )


OUTLOOK_DAY_CHOICES = (1, 3, 7)
OUTLOOK_DEFAULT_DAYS = 3


def _outlook_days(request: HtmxHttpRequest) -> int:
    try:
        days = int(request.GET.get("days", OUTLOOK_DEFAULT_DAYS))
    except ValueError:
        return OUTLOOK_DEFAULT_DAYS
    return days if days in OUTLOOK_DAY_CHOICES else OUTLOOK_DEFAULT_DAYS


def _outlook(now: datetime, *, days: int) -> list[OutlookView]:
    """The coming ``days`` from the start of the current hour, with a booking link per hour."""
    start = timezone.localtime(now).replace(minute=0, second=0, microsecond=0)
    soonest = next_quarter_hour(now)
    return [
        OutlookView(
            type_outlook=t,
            book_starts=tuple(
                timezone.localtime(max(h.start_at, soonest)).strftime(DATETIME_LOCAL_FORMAT) for h in t.hours
            ),
        )
        for t in availability_outlook(start_at=start, hours=24 * days)
    ]


@dataclass(frozen=True, slots=True)
class OutlookView:
    """One GPU type's outlook and, per hour, the booking form's start for it."""

    type_outlook: TypeOutlook
    book_starts: tuple[str, ...]

    @property
    def gpu_type(self) -> str:
        return self.type_outlook.gpu_type

    @property
    def capacity(self) -> int:
        return self.type_outlook.capacity

    @property
    def rows(self) -> list[tuple[OutlookHour, str]]:
        return list(zip(self.type_outlook.hours, self.book_starts, strict=True))

    @property
    def chart_id(self) -> str:
        return f"outlook-data-{slugify(self.gpu_type)}"

    @property
    def chart(self) -> dict[str, Any]:
        data = self.type_outlook.chart_data()
        url = reverse("booking-new")
        data["bookUrls"] = [
            f"{url}?{urlencode({'gpu_type': self.gpu_type, 'start_at': start, 'duration_h': 1})}"
            if hour.free_gpus > 0
            else None
            for hour, start in self.rows
        ]
        return data


CSV_COLUMNS = (
    "gpu_type",
    "hour_start_utc",
    "capacity_gpus",
    "free_gpus",
    "booked_gpus",
    "lendable_gpus",
    "forecast_gpus",
    "forecast_lower80_gpus",
    "forecast_upper80_gpus",
)


@login_required
@require_GET
def availability_csv(request: HtmxHttpRequest) -> HttpResponse:
    """The availability outlook's numbers (the chart's and the table's) as CSV, one row per type-hour."""
    days = _outlook_days(request)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="berth-availability-{days}d.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for view in _outlook(timezone.now(), days=days):
        for hour, _start in view.rows:
            writer.writerow(
                (
                    view.gpu_type,
                    hour.start_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    view.capacity,
                    hour.free_gpus,
                    hour.booked_gpus,
                    hour.lendable_gpus,
                    "" if hour.forecast is None else hour.forecast,
                    "" if hour.forecast_lower80 is None else hour.forecast_lower80,
                    "" if hour.forecast_upper80 is None else hour.forecast_upper80,
                )
            )
    return response
