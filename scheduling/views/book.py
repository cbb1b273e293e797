"""Book a GPU window: the form, its live availability box, and the POST that books (`booking_create`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers

from portal.accounts.selectors import project_list
from portal.htmx import (
    CONFLICT,
    UNPROCESSABLE,
    HtmxHttpRequest,
    redirect_after_post,
    render_page,
    service_errors_add,
)
from portal.security import refused_booking_record, refused_bookings_retry_after
from scheduling.alternatives import Alternative, booking_alternatives, booking_quota_get
from scheduling.forms import (
    BookingForm,
    booking_form_initial,
)
from scheduling.models import GpuType
from scheduling.selectors import (
    availability_get,
    cluster_capacity,
    gpu_type_list,
)
from scheduling.services import (
    BookingConflictError,
    booking_create,
)

BOOK_TEMPLATE = "scheduling/book.html"


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
    service_errors_add(form, exc, fields=_FORM_FIELDS)


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
        return render_page(
            request, BOOK_TEMPLATE, "booking-form", _book_context(form, availability=_availability(preview))
        )

    form = _booking_form(request, request.POST)

    def box() -> AvailabilityView | None:
        # The box keeps answering for what the form says after a refused submit: from a fresh
        # bound copy, since the service's errors on the form would hide its fields.
        return _availability(_booking_form(request, request.POST))

    if not form.is_valid():
        context = _book_context(form, availability=box())
        return render_page(request, BOOK_TEMPLATE, "booking-form", context, status=UNPROCESSABLE)
    wait_s = refused_bookings_retry_after(request.user.pk)
    if wait_s is not None:
        form.add_error(
            None, f"Too many refused bookings; look at availability, then retry in {int(wait_s) + 1} s."
        )
        response = render_page(
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
        return render_page(request, BOOK_TEMPLATE, "booking-form", context, status=CONFLICT)
    except ValidationError as exc:
        _add_service_errors(form, exc)
        context = _book_context(form, availability=box())
        return render_page(request, BOOK_TEMPLATE, "booking-form", context, status=UNPROCESSABLE)
    except PermissionDenied as exc:
        form.add_error("project", str(exc) or "You may not book for this project.")
        context = _book_context(form, availability=box())
        return render_page(request, BOOK_TEMPLATE, "booking-form", context, status=UNPROCESSABLE)

    start, end = timezone.localtime(booking.start_at), timezone.localtime(booking.end_at)
    messages.success(
        request,
        f"Booked {booking.gpu_count} {booking.gpu_type.name} GPU(s) from {start:%Y-%m-%d %H:%M} "
        f"to {end:%Y-%m-%d %H:%M}.",
    )
    return redirect_after_post(request, f"{reverse('my-bookings')}#booking-row-{booking.pk}")


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
