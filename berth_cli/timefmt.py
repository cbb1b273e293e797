"""Times in and out: WHEN parsing (ISO 8601, "+2h", "tomorrow 09:00"), local display, durations.

Input without a zone is the user's local time; output is the user's local time with its UTC
offset ("Tue 01 Dec 22:30 +01:00"), plus a human distance from now ("in 12 min").  The local
zone is ``TZ`` when it names an IANA zone, else the system's.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil import parser as date_parser  # type: ignore[import-untyped]

_UNITS_S = {
    "s": 1,
    "sec": 1,
    "m": 60,
    "min": 60,
    "h": 3600,
    "hr": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m|hr|h|days|day|d|w)", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*(?:s|sec|min|m|hr|h|days|day|d|w)\s*)+$", re.IGNORECASE)
_DAY_WORDS = {"today": 0, "tomorrow": 1, "yesterday": -1}


class WhenError(ValueError):
    """A time or duration the CLI cannot read (shown to the user as a usage error)."""


def local_zone() -> tzinfo:
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    zone = datetime.now().astimezone().tzinfo
    return zone or UTC


def now_utc() -> datetime:
    return datetime.now(UTC)


def parse_duration(text: str) -> timedelta:
    """``"2h"``, ``"90m"``, ``"1h30m"``, ``"1.5h"``, ``"3d"``; a bare number is hours."""
    raw = text.strip().lstrip("+")
    try:
        return timedelta(hours=float(raw))
    except ValueError:
        pass
    if not _DURATION.match(raw):
        raise WhenError(f"Cannot read {text!r} as a duration (try 2h, 90m, 1h30m or 1.5).")
    seconds = sum(float(n) * _UNITS_S[u.lower()] for n, u in _PART.findall(raw))
    return timedelta(seconds=seconds)


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """An aware UTC datetime from ``now``, ``+2h``/``+1h30m``, ``today 18:00``,
    ``tomorrow 09:00``, or anything dateutil reads (ISO 8601 and the like; local unless it
    names a zone)."""
    current = now or now_utc()
    zone = local_zone()
    raw = text.strip()
    lowered = raw.lower()
    if lowered in ("", "now"):
        return current
    if lowered.startswith("+"):
        return current + parse_duration(raw)
    first, _, rest = lowered.partition(" ")
    if first in _DAY_WORDS:
        base = current.astimezone(zone) + timedelta(days=_DAY_WORDS[first])
        midnight = base.replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
        if not rest.strip():
            return midnight.replace(tzinfo=zone).astimezone(UTC)
        try:
            parsed = date_parser.parse(rest, default=midnight)
        except (ValueError, OverflowError) as exc:
            raise WhenError(f"Cannot read the time in {text!r} (try 'tomorrow 09:00').") from exc
        naive = parsed.replace(year=midnight.year, month=midnight.month, day=midnight.day, tzinfo=None)
        return _localize(naive, zone, parsed.tzinfo)
    try:
        parsed = date_parser.isoparse(raw)
    except ValueError:
        try:
            default = current.astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
            parsed = date_parser.parse(raw, default=default)
        except (ValueError, OverflowError) as exc:
            raise WhenError(
                f"Cannot read {text!r} as a time (try 2026-12-01T14:00, '+2h', 'tomorrow 09:00')."
            ) from exc
    return _localize(parsed.replace(tzinfo=None), zone, parsed.tzinfo)


def _localize(naive: datetime, zone: tzinfo, given: tzinfo | None) -> datetime:
    return naive.replace(tzinfo=given or zone).astimezone(UTC)


def parse_api_time(value: str | None) -> datetime | None:
    """A time as the API renders it (ISO 8601, ``Z`` for UTC)."""
    if not value:
        return None
    parsed: datetime = date_parser.isoparse(value)
    return parsed


def api_time(value: datetime) -> str:
    """A time for the API: ISO 8601 in UTC with a ``Z``."""
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _offset(moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    total = int(offset.total_seconds())
    sign = "+" if total >= 0 else "-"
    hours, minutes = divmod(abs(total) // 60, 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


def local_text(value: datetime | str | None, *, now: datetime | None = None) -> str:
    """``Tue 01 Dec 22:30 +01:00`` (the year too when it is not this year's); ``-`` for none."""
    moment = parse_api_time(value) if isinstance(value, str) else value
    if moment is None:
        return "-"
    local = moment.astimezone(local_zone())
    this_year = (now or now_utc()).astimezone(local_zone()).year
    pattern = "%a %d %b %H:%M" if local.year == this_year else "%a %d %b %Y %H:%M"
    return f"{local.strftime(pattern)} {_offset(local)}"


def duration_text(seconds: float) -> str:
    """``40 s``, ``12 min``, ``3 h 20 min``, ``2 d 4 h``."""
    total = round(abs(seconds))
    if total < 60:
        return f"{total} s"
    minutes = round(total / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, mins = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {mins} min" if mins else f"{hours} h"
    days, hrs = divmod(hours, 24)
    return f"{days} d {hrs} h" if hrs else f"{days} d"


def relative_text(value: datetime | str | None, *, now: datetime | None = None) -> str:
    """``in 12 min``, ``3 h ago``, ``now`` (within 30 s); ``-`` for none."""
    moment = parse_api_time(value) if isinstance(value, str) else value
    if moment is None:
        return "-"
    delta = (moment - (now or now_utc())).total_seconds()
    if abs(delta) < 30:
        return "now"
    text = duration_text(delta)
    return f"in {text}" if delta > 0 else f"{text} ago"


def when_text(value: datetime | str | None, *, now: datetime | None = None) -> str:
    """Local time and distance: ``Tue 01 Dec 22:30 +01:00 (in 12 min)``."""
    if value is None or value == "":
        return "-"
    return f"{local_text(value, now=now)} ({relative_text(value, now=now)})"
