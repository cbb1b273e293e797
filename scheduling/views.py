"""Browser pages (server-rendered, htmx): dashboard, book a GPU window, availability, my bookings,
my jobs, submit a job, API tokens.

Each view renders its full page, or only the named partial of that page when htmx asks
(``page.html#name``; the DOM id is the partial's name), and varies its cache on
``HX-Request``.  Views parse input, call one selector or service and render: every write
goes through ``scheduling.services``; bad input comes back as form errors, never a 500.
"""

from __future__ import annotations

import csv
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails
from rest_framework.authtoken.models import Token

from forecasting.selectors import job_engine_request, runtime_predict
from portal.accounts.selectors import membership_list, project_list
from portal.accounts.services import token_create, token_revoke
from portal.security import refused_booking_record, refused_bookings_retry_after
from scheduling.alternatives import Alternative, booking_alternatives, booking_quota_get, job_warnings
from scheduling.forms import (
    DATETIME_LOCAL_FORMAT,
    BookingForm,
    JobForm,
    booking_form_initial,
    next_quarter_hour,
)
from scheduling.models import Booking, Cluster, GpuType, Job
from scheduling.selectors import (
    availability_get,
    booking_list,
    cluster_capacity,
    cluster_list,
    gpu_type_list,
    job_list,
)
from scheduling.selectors_ui import OutlookHour, TypeOutlook, availability_outlook, dashboard_get
from scheduling.services import (
    BookingConflictError,
    booking_cancel,
    booking_create,
    booking_end_early,
    booking_extend,
    job_cancel,
    job_submit,
)

BOOK_TEMPLATE = "scheduling/book.html"
BOOKINGS_TEMPLATE = "scheduling/my_bookings.html"
JOBS_TEMPLATE = "scheduling/my_jobs.html"
TIMELINE_TEMPLATE = "scheduling/availability.html"
JOB_NEW_TEMPLATE = "scheduling/job_new.html"
JOBS_PER_PAGE = 50
BOOKINGS_PER_PAGE = 50
EXTEND_STEP = timedelta(hours=1)  # the "+1 h" button on an open booking
# Status codes whose htmx responses are swapped in (base.html sets htmx's responseHandling).
UNPROCESSABLE = 422
CONFLICT = 409


class HtmxHttpRequest(HttpRequest):
    """A signed-in request that went through django-htmx's middleware (typed, as django-htmx
    suggests); every view here is behind ``login_required``, so ``user`` is a real user."""

    htmx: HtmxDetails
    user: User


def _render(
    request: HtmxHttpRequest, template: str, partial: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """The whole page, or only ``partial`` of it for an htmx request.

    A history-restore request (htmx lost its cached copy of a pushed URL) gets the whole page:
    htmx swaps it in as the body.
    """
    is_fragment = bool(request.htmx) and not request.htmx.history_restore_request
    name = f"{template}#{partial}" if is_fragment else template
    return render(request, name, context, status=status)


# ---- book a GPU window ----


@dataclass(frozen=True, slots=True)
class AvailabilityView:
    """What the live availability box says about the window in the form."""

    gpu_type: str
    gpu_count: int
    start_at: datetime
    end_at: datetime
    capacity: int
    free_gpus: int
    alternatives: tuple[Alternative, ...]
    project: str = ""
    quota_max_gpus: int | None = None  # the project's limit of the type (None: no limit)
    quota_bookable_gpus: int | None = None  # what the quota leaves it in the window

    @property
    def bookable_gpus(self) -> int:
        """What this project can book now: free GPUs, capped by what its quota leaves."""
        if self.quota_bookable_gpus is None:
            return self.free_gpus
        return min(self.free_gpus, self.quota_bookable_gpus)

    @property
    def is_quota_short(self) -> bool:
        return self.quota_bookable_gpus is not None and self.quota_bookable_gpus < self.gpu_count

    @property
    def is_enough(self) -> bool:
        return self.bookable_gpus >= self.gpu_count

    @property
    def free_percent(self) -> int:
        return round(100 * self.free_gpus / self.capacity) if self.capacity else 0


def _booking_initial(request: HtmxHttpRequest) -> dict[str, str]:
    """Defaults: the user's first project and the GPU type with the most bookable GPUs."""
    project = project_list(request.user).first()
    totals: dict[str, int] = {}
    for capacities in cluster_capacity().values():
        for capacity in capacities:
            totals[capacity.gpu_type] = totals.get(capacity.gpu_type, 0) + capacity.up_gpu_count
    gpu_type_name = max(totals, key=lambda name: (totals[name], name)) if totals else None
    return booking_form_initial(project_slug=project.slug if project else None, gpu_type_name=gpu_type_name)


def _booking_form(
    request: HtmxHttpRequest, data: Any = None, *, initial: dict[str, str] | None = None
) -> BookingForm:
    return BookingForm(
        data,
        projects=project_list(request.user),
        gpu_types=gpu_type_list().filter(nodes__cluster__is_active=True).distinct(),
        initial=initial,
    )


_PREFILL_FIELDS = frozenset({"project", "gpu_type", "gpu_count", "start_at", "duration_h"})
_AVAILABILITY_FIELDS = ("gpu_type", "gpu_count", "start_at", "duration_h", "end_at")


def _availability(form: BookingForm) -> AvailabilityView | None:
    """Free GPUs of the form's type over its whole window, and alternatives when short.

    ``None`` while the fields it needs are incomplete or invalid (their errors show on
    submit); the project and the note do not matter here.
    """
    form.is_valid()
    if any(name in form.errors for name in _AVAILABILITY_FIELDS):
        return None
    cleaned = form.cleaned_data
    if not all(cleaned.get(name) for name in ("gpu_type", "gpu_count", "start_at", "end_at")):
        return None
    gpu_type: GpuType = cleaned["gpu_type"]
    gpu_count: int = cleaned["gpu_count"]
    start_at, end_at = cleaned["start_at"], cleaned["end_at"]
    step_s = max(1, int((end_at - start_at).total_seconds()))
    try:
        # One step as long as the window: a GPU counts only if it is free for all of it.
        availability = availability_get(
            gpu_type_name=gpu_type.name, start_at=start_at, end_at=end_at, step_s=step_s
        )
    except ValidationError:
        return None
    free = min((slot.free_gpus for slot in availability.slots), default=0)
    alternatives: tuple[Alternative, ...] = ()
    if free < gpu_count:
        alternatives = tuple(
            booking_alternatives(
                gpu_type=gpu_type, gpu_count=gpu_count, start_at=start_at, end_at=end_at, limit=1
            )
        )
    project = cleaned.get("project") if "project" not in form.errors else None
    quota = (
        booking_quota_get(project=project, gpu_type=gpu_type, start_at=start_at, end_at=end_at)
        if project is not None
        else None
    )
    return AvailabilityView(
        gpu_type=gpu_type.name,
        gpu_count=gpu_count,
        start_at=start_at,
        end_at=end_at,
        capacity=availability.capacity,
        free_gpus=free,
        alternatives=alternatives,
        project=project.slug if project is not None else "",
        quota_max_gpus=quota.max_gpus if quota else None,
        quota_bookable_gpus=quota.bookable_gpus if quota else None,
    )


# Service error keys that are not form fields land on the form as a whole.
_FORM_FIELDS = frozenset({"project", "gpu_type", "gpu_count", "start_at", "end_at", "note"})


def _add_service_errors(form: BookingForm, exc: ValidationError) -> None:
    if hasattr(exc, "error_dict"):
        for field, errors in exc.message_dict.items():
            target = field if field in _FORM_FIELDS else None
            for message in errors:
                form.add_error(target, message)
    else:
        for message in exc.messages:
            form.add_error(None, message)


def _book_context(form: BookingForm, **extra: Any) -> dict[str, Any]:
    return {
        "form": form,
        "availability": extra.pop("availability", None),
        "alternatives": (),
        "max_advance_days": settings.BERTH_BOOKING_MAX_ADVANCE_S // 86400,
        **extra,
    }


@login_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def booking_new(request: HtmxHttpRequest) -> HttpResponse:
    """A form to book GPUs; POST books them through ``booking_create``."""
    if request.method == "GET":
        initial = _booking_initial(request)
        # Links from the availability timeline pre-fill the form (?gpu_type=…&start_at=…).
        prefill = {name: request.GET.get(name, "") for name in _PREFILL_FIELDS}
        initial.update({name: value for name, value in prefill.items() if value and len(value) <= 40})
        form = _booking_form(request, initial=initial)
        # Show availability for the initial values at once: an unbound form is never valid,
        # so check a bound copy of its initial data.
        preview = _booking_form(request, initial)
        return _render(
            request, BOOK_TEMPLATE, "booking-form", _book_context(form, availability=_availability(preview))
        )

    form = _booking_form(request, request.POST)

    def box() -> AvailabilityView | None:
        # The box keeps answering for what the form says after a refused submit: from a fresh
        # bound copy, since the service's errors on the form would hide its fields.
        return _availability(_booking_form(request, request.POST))

    if not form.is_valid():
        context = _book_context(form, availability=box())
        return _render(request, BOOK_TEMPLATE, "booking-form", context, status=UNPROCESSABLE)
    wait_s = refused_bookings_retry_after(request.user.pk)
    if wait_s is not None:
        form.add_error(
            None, f"Too many refused bookings; look at availability, then retry in {int(wait_s) + 1} s."
        )
        response = _render(
            request, BOOK_TEMPLATE, "booking-form", _book_context(form, availability=box()), status=429
        )
        response["Retry-After"] = str(int(wait_s) + 1)
        return response
    start_at, end_at = form.window()
    try:
        booking = booking_create(
            request.user,
            project=form.cleaned_data["project"],
            gpu_type=form.cleaned_data["gpu_type"],
            gpu_count=form.cleaned_data["gpu_count"],
            start_at=start_at,
            end_at=end_at,
            note=form.cleaned_data["note"],
        )
    except BookingConflictError as exc:
        refused_booking_record(request.user.pk)
        form.add_error(None, exc.message)
        context = _book_context(form, availability=box(), alternatives=tuple(exc.alternatives))
        return _render(request, BOOK_TEMPLATE, "booking-form", context, status=CONFLICT)
    except ValidationError as exc:
        _add_service_errors(form, exc)
        context = _book_context(form, availability=box())
        return _render(request, BOOK_TEMPLATE, "booking-form", context, status=UNPROCESSABLE)
    except PermissionDenied as exc:
        form.add_error("project", str(exc) or "You may not book for this project.")
        context = _book_context(form, availability=box())
        return _render(request, BOOK_TEMPLATE, "booking-form", context, status=UNPROCESSABLE)

    start, end = timezone.localtime(booking.start_at), timezone.localtime(booking.end_at)
    messages.success(
        request,
        f"Booked {booking.gpu_count} {booking.gpu_type.name} GPU(s) from {start:%Y-%m-%d %H:%M} "
        f"to {end:%Y-%m-%d %H:%M}.",
    )
    url = f"{reverse('my-bookings')}#booking-row-{booking.pk}"
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url, status=303)


@login_required
@vary_on_headers("HX-Request")
@require_GET
def booking_availability(request: HtmxHttpRequest) -> HttpResponse:
    """The live availability box for the form's values (htmx), or the page with it (no JS)."""
    form = _booking_form(request, request.GET)
    availability = _availability(form)
    if request.htmx:
        return render(request, f"{BOOK_TEMPLATE}#availability", {"form": form, "availability": availability})
    return render(request, BOOK_TEMPLATE, _book_context(form, availability=availability))


# ---- availability timeline ----


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
    start = timezone.make_aware(datetime.combine(day, time.min))
    end = start + timedelta(days=1)
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
        "hours": [start + timedelta(hours=h) for h in range(24)],
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
    from forecasting.services import forecast_refresh_state_get

    return any(
        (state := forecast_refresh_state_get(cluster_id=cid)) is not None
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


# ---- my bookings ----


def _my_booking(request: HtmxHttpRequest, booking_id: int) -> Booking:
    """One of the user's own bookings; anyone else's (even a managed project's) is a 404 here."""
    booking = booking_list(request.user, mine_only=True).filter(pk=booking_id).first()
    if booking is None:
        raise Http404("No such booking.")
    return booking


@login_required
@vary_on_headers("HX-Request")
@require_GET
def my_bookings(request: HtmxHttpRequest) -> HttpResponse:
    """The user's bookings: open ones first (soonest first, a page at a time), then the last 50
    closed ones.  Paged: a user with thousands of open bookings gets a bounded page, not megabytes."""
    bookings = booking_list(request.user, mine_only=True)
    page = Paginator(
        bookings.filter(status__in=Booking.OPEN_STATUSES).order_by("start_at", "id"), BOOKINGS_PER_PAGE
    ).get_page(request.GET.get("page"))
    closed_bookings = list(
        bookings.exclude(status__in=Booking.OPEN_STATUSES).order_by("-start_at", "-id")[:50]
    )
    context = {
        "open_bookings": page.object_list,
        "page": page,
        "closed_bookings": closed_bookings,
        "now": timezone.now(),
    }
    return _render(request, BOOKINGS_TEMPLATE, "booking-list", context)


def _booking_row_action(
    request: HtmxHttpRequest, booking_id: int, *, action: Callable[..., Booking], done: str
) -> HttpResponse:
    """Run ``action`` (cancel or end early) on one of the user's bookings.

    htmx gets the updated row back (with the refusal, if any, in it); others a redirect with a
    message.  The services' refusals (already cancelled, not started yet) are messages, not errors.
    """
    booking = _my_booking(request, booking_id)
    error = ""
    try:
        booking = action(booking, user=request.user)
    except (ValidationError, PermissionDenied) as exc:
        error = " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
    except BookingConflictError as exc:
        error = exc.message
        latest = max((alt.end_at for alt in exc.alternatives), default=None)
        if latest is not None and latest > booking.end_at:
            error += f" It can run until {timezone.localtime(latest):%a %d %b %H:%M} at most."
    if request.htmx:
        booking = _my_booking(request, booking_id)
        context = {"booking": booking, "row_error": error, "now": timezone.now()}
        return render(request, f"{BOOKINGS_TEMPLATE}#booking-row", context)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, f"{done} booking {booking.pk}.")
    return HttpResponseRedirect(reverse("my-bookings"), status=303)


@login_required
@vary_on_headers("HX-Request")
@require_POST
def booking_cancel_view(request: HtmxHttpRequest, booking_id: int) -> HttpResponse:
    """Cancel one of the user's bookings (before its start: its GPUs are released)."""
    return _booking_row_action(request, booking_id, action=booking_cancel, done="Cancelled")


@login_required
@vary_on_headers("HX-Request")
@require_POST
def booking_extend_view(request: HtmxHttpRequest, booking_id: int) -> HttpResponse:
    """Move one of the user's open bookings' end an hour later, on the same GPUs."""

    def extend(booking: Booking, *, user: User) -> Booking:
        return booking_extend(booking, user=user, end_at=booking.end_at + EXTEND_STEP)

    return _booking_row_action(request, booking_id, action=extend, done="Extended")


@login_required
@vary_on_headers("HX-Request")
@require_POST
def booking_end_view(request: HtmxHttpRequest, booking_id: int) -> HttpResponse:
    """End one of the user's running bookings now; its GPUs are free from now on."""
    return _booking_row_action(request, booking_id, action=booking_end_early, done="Ended")


# ---- submit a job ----

_JOB_FORM_FIELDS = frozenset({"project", "name", "gpu_count", "gpu_type", "min_memory_gib", "precisions"})
# Service error keys whose form field has another name (the form takes hours and minutes).
_JOB_FIELD_ALIASES = {"requested_s": "requested_h", "checkpoint_interval_s": "checkpoint_interval_min"}


def _add_job_service_errors(form: JobForm, exc: ValidationError) -> None:
    if not hasattr(exc, "error_dict"):
        for message in exc.messages:
            form.add_error(None, message)
        return
    for field, errors in exc.message_dict.items():
        target = _JOB_FIELD_ALIASES.get(field, field if field in _JOB_FORM_FIELDS else None)
        for message in errors:
            form.add_error(target, message)


@login_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def job_new(request: HtmxHttpRequest) -> HttpResponse:
    """Submit a batch job through ``job_submit``; the engine places it in a later round."""
    projects = project_list(request.user)
    gpu_types = gpu_type_list().filter(nodes__cluster__is_active=True).distinct()
    if request.method == "GET":
        form = JobForm(projects=projects, gpu_types=gpu_types)
        # Predict for the initial values at once (an unbound form is never valid: use a bound copy).
        first = projects.first()
        initial = {"project": first.slug if first else "", "gpu_count": "1", "requested_h": "1"}
        prediction = _job_prediction(request, JobForm(initial, projects=projects, gpu_types=gpu_types))
        return _render(request, JOB_NEW_TEMPLATE, "job-form", {"form": form, "prediction": prediction})

    form = JobForm(request.POST, projects=projects, gpu_types=gpu_types)
    if not form.is_valid():
        context = {"form": form, "prediction": _job_prediction(request, form)}
        return _render(request, JOB_NEW_TEMPLATE, "job-form", context, status=UNPROCESSABLE)
    data = form.cleaned_data
    try:
        job = job_submit(
            request.user,
            project=data["project"],
            name=data["name"],
            gpu_count=data["gpu_count"],
            gpu_type=data["gpu_type"],
            min_memory_gib=data["min_memory_gib"] or 0.0,
            precisions=data["precisions"],
            requested_s=form.requested_s(),
            is_preemptible=data["is_preemptible"],
            is_checkpointable=data["is_checkpointable"],
            checkpoint_interval_s=form.checkpoint_interval_s(),
            payload={"command": data["command"]},
        )
    except ValidationError as exc:
        _add_job_service_errors(form, exc)
        return _render(request, JOB_NEW_TEMPLATE, "job-form", {"form": form}, status=UNPROCESSABLE)
    except PermissionDenied as exc:
        form.add_error("project", str(exc) or "You may not submit jobs for this project.")
        return _render(request, JOB_NEW_TEMPLATE, "job-form", {"form": form}, status=UNPROCESSABLE)

    warnings = job_warnings(job)
    if warnings:
        messages.warning(request, f"Submitted {job.name}, but it cannot start as it is: {' '.join(warnings)}")
    else:
        messages.success(request, f"Submitted {job.name}: it waits for the next scheduling round.")
    url = f"{reverse('my-jobs')}#job-row-{job.pk}"
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url, status=303)


# ---- my jobs ----


@login_required
@vary_on_headers("HX-Request")
@require_GET
def my_jobs(request: HtmxHttpRequest) -> HttpResponse:
    """The user's jobs, newest first, a page at a time, optionally by status."""
    status = request.GET.get("status", "")
    valid_statuses = {value for value, _ in Job.Status.choices}
    jobs = job_list(request.user, mine_only=True, status=[status] if status in valid_statuses else ())
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "status": status if status in valid_statuses else "",
        "statuses": Job.Status.choices,
    }
    return _render(request, JOBS_TEMPLATE, "job-list", context)


@login_required
@vary_on_headers("HX-Request")
@require_POST
def job_cancel_view(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """Cancel one of the user's pending or running jobs; htmx gets the updated row back."""
    job = job_list(request.user, mine_only=True).filter(pk=job_id).first()
    if job is None:
        raise Http404("No such job.")
    error = ""
    try:
        job_cancel(job, user=request.user)
    except (ValidationError, PermissionDenied) as exc:
        error = " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
    if request.htmx:
        job = job_list(request.user, mine_only=True).get(pk=job_id)
        return render(request, f"{JOBS_TEMPLATE}#job-row", {"job": job, "row_error": error})
    if error:
        messages.error(request, error)
    else:
        messages.success(request, f"Cancelled job {job.name}.")
    return HttpResponseRedirect(reverse("my-jobs"), status=303)


# ---- one booking (how to use it) and one job (its output) ----

BOOKING_DETAIL_TEMPLATE = "scheduling/booking_detail.html"
JOB_DETAIL_TEMPLATE = "scheduling/job_detail.html"


@login_required
@vary_on_headers("HX-Request")
@require_GET
def booking_detail(request: HtmxHttpRequest, booking_id: int) -> HttpResponse:
    """One of the user's bookings and exactly how to get on its GPUs on its backend."""
    from scheduling.access import booking_access

    booking = _my_booking(request, booking_id)
    context = {"booking": booking, "access": booking_access(booking), "now": timezone.now()}
    return _render(request, BOOKING_DETAIL_TEMPLATE, "booking-access", context)


@login_required
@vary_on_headers("HX-Request")
@require_GET
def job_detail(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """One of the user's jobs with the tail of its output and its exit code; htmx refreshes the output."""
    from scheduling.backends.base import BackendError
    from scheduling.selectors import job_output_get

    if not job_list(request.user, mine_only=True).filter(pk=job_id).exists():
        raise Http404("No such job.")
    error = ""
    try:
        job, output = job_output_get(request.user, job_id=job_id, tail_lines=200)
    except BackendError as exc:
        job, output = job_list(request.user, mine_only=True).get(pk=job_id), None
        error = f"The cluster cannot be reached right now ({exc}); try again in a minute."
    context = {"job": job, "output": output, "output_error": error}
    return _render(request, JOB_DETAIL_TEMPLATE, "job-output", context)


# ---- dashboard (the home page) ----

DASHBOARD_TEMPLATE = "scheduling/dashboard.html"


@login_required
@vary_on_headers("HX-Request")
@require_GET
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """The user's bookings and jobs with live status; htmx polls the ``dashboard-live`` part."""
    # The memberships are a lazy queryset: read by the full page only, not by the polled part.
    context = {
        "dash": dashboard_get(request.user),
        "now": timezone.now(),
        "memberships": membership_list(request.user),
    }
    return _render(request, DASHBOARD_TEMPLATE, "dashboard-live", context)


# ---- predicted runtime beside the user's estimate ----


def _job_prediction(request: HtmxHttpRequest, form: JobForm) -> dict[str, Any]:
    """The runtime predictor's p50/p90 for the job the form describes, and the user's estimate.

    Only the fields the predictor keys on matter (project, name, GPU type and count, the
    estimate); the others may still be incomplete.
    """
    form.is_valid()
    data = form.cleaned_data
    estimate_s = round(data["requested_h"] * 3600) if data.get("requested_h") else None
    result: dict[str, Any] = {"estimate_s": estimate_s, "p50_s": None, "p90_s": None}
    project, gpu_count = data.get("project"), data.get("gpu_count")
    if project is None or not gpu_count:
        return result
    gpu_type: GpuType | None = data.get("gpu_type")
    clusters = cluster_list().filter(is_active=True)
    if gpu_type is not None:
        clusters = clusters.filter(nodes__gpu_type=gpu_type)
    cluster = clusters.distinct().order_by("pk").first()
    if cluster is None:
        return result
    features = (
        request.user.get_username(),
        project.slug,
        data.get("name") or "",
        gpu_count,
        estimate_s,
        gpu_type.name if gpu_type else None,
    )
    request_ = job_engine_request(
        # The predictor caches a prediction per job id until it observes more history: a
        # preview's id is its features (negative, never a real job's), so equal forms share it
        # and different ones never get each other's answer.
        job_id=-1 - zlib.crc32(repr(features).encode()),
        username=features[0],
        project_slug=features[1],
        name=features[2],
        gpu_count=gpu_count,
        submitted_at=timezone.now(),
        requested_s=estimate_s,
        kind=Job.Kind.BATCH,
        gpu_type=features[5],
    )
    ((p50_s, p90_s),) = runtime_predict(cluster_id=cluster.pk, requests=[request_])
    result.update({"p50_s": p50_s, "p90_s": p90_s})
    # With no history for jobs like this one the predictor answers the estimate itself.
    result["is_estimate_only"] = estimate_s is not None and p50_s == p90_s == float(estimate_s)
    if estimate_s and p50_s:
        result["ratio"] = estimate_s / p50_s
    return result


@login_required
@vary_on_headers("HX-Request")
@require_GET
def job_prediction(request: HtmxHttpRequest) -> HttpResponse:
    """The "predicted runtime" box for the job form's values (htmx), or the form with it."""
    form = JobForm(
        request.GET,
        projects=project_list(request.user),
        gpu_types=gpu_type_list().filter(nodes__cluster__is_active=True).distinct(),
    )
    prediction = _job_prediction(request, form)
    if request.htmx:
        return render(request, f"{JOB_NEW_TEMPLATE}#job-prediction", {"prediction": prediction})
    return render(request, JOB_NEW_TEMPLATE, {"form": form, "prediction": prediction})


# ---- API tokens ----

TOKENS_TEMPLATE = "scheduling/tokens.html"


def _tokens_context(request: HtmxHttpRequest, *, new_key: str = "") -> dict[str, Any]:
    token = Token.objects.filter(user=request.user).first()
    api_root = request.build_absolute_uri("/api/v1")
    example_start = timezone.localtime(next_quarter_hour(timezone.now()) + timedelta(hours=1))
    return {
        "token": token,
        "new_key": new_key,
        "api_root": api_root,
        "host_url": request.build_absolute_uri("/").rstrip("/"),
        "project": project_list(request.user).first(),
        "gpu_type": gpu_type_list().filter(nodes__cluster__is_active=True).distinct().first(),
        "example_start": example_start.isoformat(),
        "example_end": (example_start + timedelta(hours=2)).isoformat(),
    }


@login_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def api_tokens(request: HtmxHttpRequest) -> HttpResponse:
    """Whether the user has an API token; POST ``action=create`` issues a new one (shown once),
    ``action=revoke`` deletes it.  Both through ``portal.accounts.services``."""
    if request.method == "GET":
        return _render(request, TOKENS_TEMPLATE, "token-panel", _tokens_context(request))
    action = request.POST.get("action", "")
    new_key = ""
    if action == "create":
        new_key = token_create(user=request.user, actor_label="user")
        messages.success(request, "A new API token was created; any older token no longer works.")
    elif action == "revoke":
        had = token_revoke(user=request.user, actor_label="user")
        messages.success(request, "Your API token was revoked." if had else "You had no API token.")
    else:
        return HttpResponse("Unknown action.", status=400)
    if new_key:
        # Shown once, on this response only (not through a redirect, which would put it in a URL
        # or the session).
        return _render(request, TOKENS_TEMPLATE, "token-panel", _tokens_context(request, new_key=new_key))
    if request.htmx:
        return _render(request, TOKENS_TEMPLATE, "token-panel", _tokens_context(request))
    return HttpResponseRedirect(reverse("api-tokens"), status=303)
