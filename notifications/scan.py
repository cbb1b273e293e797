"""Time-based events: a booking starts, or ends, within its owner's lead time.

Run every minute by `notifications.tasks.notifications_sweep`; each occurrence's key includes the
start (or end) time, so overlapping scans emit once and an extended booking gets a new notice.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from notifications.events import booking_event_emit
from notifications.models import EventKind, Preference
from scheduling.models import Booking

_DEFAULT_START_LEAD_MIN = Preference._meta.get_field("booking_start_lead_min").get_default()
_DEFAULT_END_LEAD_MIN = Preference._meta.get_field("booking_end_lead_min").get_default()


def bookings_scan(*, now: datetime) -> int:
    """Emit "starts in N min" and "ends in N min" for the bookings now within their owner's lead."""
    leads = {
        p["user_id"]: (p["booking_start_lead_min"], p["booking_end_lead_min"])
        for p in Preference.objects.values("user_id", "booking_start_lead_min", "booking_end_lead_min")
    }
    longest = max([_DEFAULT_START_LEAD_MIN, _DEFAULT_END_LEAD_MIN, *(max(v) for v in leads.values())])
    horizon = now + timedelta(minutes=longest)
    emitted = 0
    with transaction.atomic():
        starting = Booking.objects.filter(
            status=Booking.Status.CONFIRMED, start_at__gt=now, start_at__lte=horizon
        ).select_related("project", "cluster", "gpu_type")
        for booking in starting:
            lead = leads.get(booking.user_id, (_DEFAULT_START_LEAD_MIN, _DEFAULT_END_LEAD_MIN))[0]
            if lead and booking.start_at <= now + timedelta(minutes=lead):
                booking_event_emit(booking, kind=EventKind.BOOKING_STARTING, at=now)
                emitted += 1
        ending = Booking.objects.filter(
            status=Booking.Status.ACTIVE, end_at__gt=now, end_at__lte=horizon
        ).select_related("project", "cluster", "gpu_type")
        for booking in ending:
            lead = leads.get(booking.user_id, (_DEFAULT_START_LEAD_MIN, _DEFAULT_END_LEAD_MIN))[1]
            if lead and booking.end_at <= now + timedelta(minutes=lead):
                booking_event_emit(booking, kind=EventKind.BOOKING_ENDING, at=now)
                emitted += 1
    return emitted
