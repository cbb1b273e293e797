"""Small display filters for the researcher and operations pages."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template

from scheduling.labels import pending_reason_label, reason_label

register = template.Library()


@register.filter
def duration_s(value: float | str | None) -> str:
    """Seconds as a short human duration: "45 min", "2 h 30 min", "3 d 4 h"; "–" when unknown."""
    if value is None or value == "":
        return "–"
    minutes = round(float(value) / 60)
    if minutes < 60:
        return f"{max(minutes, 1)} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def gpu_hours(value: float | None) -> str:
    """GPU-hours with one decimal (two below 1), e.g. "0.25 GPU-h"."""
    if value is None:
        return "–"
    return f"{value:.2f} GPU-h" if value < 1 else f"{value:.1f} GPU-h"


@register.filter
def header_label(value: object) -> str:
    """A column name as people read it: ``constraint_mismatch`` -> ``constraint mismatch`` (the
    CSV keeps the machine name); a long one-word name could not wrap and pushed tables wider."""
    return reason_label(value)


@register.filter
def idle_label(value: object) -> str:
    """An idle-reason key as people read it: ``quota_blocked`` -> "Quota-blocked"."""
    return reason_label(value)


@register.filter
def pending_label(value: object) -> str:
    """A pending-reason key as people read it: ``priority`` -> "Behind higher priority"."""
    return pending_reason_label(str(value)) if value else "–"


def _plural(count: int, unit: str) -> str:
    return f"{count} {unit}{'' if count == 1 else 's'}"


@register.filter
def span(value: float | int | timedelta | datetime | str | None, end: datetime | None = None) -> str:
    """A duration in words, two units at most: "45 seconds", "12 minutes", "2 hours 6 minutes",
    "3 days 4 hours"; "–" when unknown.  Seconds, a timedelta, or two instants
    (``{{ job.started_at|span:job.ended_at }}``)."""
    if value is None or value == "":
        return "–"
    if isinstance(value, datetime):
        if not isinstance(end, datetime):
            return "–"
        value = end - value
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    seconds = max(0, round(seconds))
    if seconds < 60:
        return _plural(seconds, "second")
    minutes = round(seconds / 60)
    if minutes < 60:
        return _plural(minutes, "minute")
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return _plural(hours, "hour") + (f" {_plural(minutes, 'minute')}" if minutes else "")
    days, hours = divmod(hours, 24)
    return _plural(days, "day") + (f" {_plural(hours, 'hour')}" if hours else "")


@register.filter
def span_short(value: datetime | None, end: datetime | None = None) -> str:
    """The time from ``value`` to ``end`` as `duration_s` says it ("2 h 6 min"), for table cells."""
    if not isinstance(value, datetime) or not isinstance(end, datetime):
        return "–"
    return duration_s(max(0.0, (end - value).total_seconds()))
