"""My bookings: the list, cancel / extend / end early on one row, and one booking's access details."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from portal.htmx import HtmxHttpRequest, refusal_text, render_page, row_action_redirect
from scheduling.models import Booking
from scheduling.selectors import (
    booking_list,
)
from scheduling.services import (
    BookingConflictError,
    booking_cancel,
    booking_end_early,
    booking_extend,
)

BOOKINGS_TEMPLATE = "scheduling/my_bookings.html"
BOOKINGS_PER_PAGE = 50
EXTEND_STEP = timedelta(hours=1)  # the "+1 h" button on an open booking
BOOKING_DETAIL_TEMPLATE = "scheduling/booking_detail.html"


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
    return render_page(request, BOOKINGS_TEMPLATE, "booking-list", context)


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
        error = refusal_text(exc)
    except BookingConflictError as exc:
        error = exc.message
        latest = max((alt.end_at for alt in exc.alternatives), default=None)
        if latest is not None and latest > booking.end_at:
            error += f" It can run until {timezone.localtime(latest):%a %d %b %H:%M} at most."
    if request.htmx:
        booking = _my_booking(request, booking_id)
        context = {"booking": booking, "row_error": error, "now": timezone.now()}
        return render(request, f"{BOOKINGS_TEMPLATE}#booking-row", context)
    return row_action_redirect(
        request, error=error, success=f"{done} booking {booking.pk}.", to="my-bookings"
    )


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


@login_required
@vary_on_headers("HX-Request")
@require_GET
def booking_detail(request: HtmxHttpRequest, booking_id: int) -> HttpResponse:
    """One of the user's bookings and exactly how to get on its GPUs on its backend."""
    from scheduling.access import booking_access

    booking = _my_booking(request, booking_id)
    context = {"booking": booking, "access": booking_access(booking), "now": timezone.now()}
    return render_page(request, BOOKING_DETAIL_TEMPLATE, "booking-access", context)
