"""The CLI's time input and output: WHEN forms, durations, local display with the UTC offset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth_cli.timefmt import (
    WhenError,
    duration_text,
    local_text,
    parse_duration,
    parse_when,
    relative_text,
)

NOW = datetime(2026, 12, 1, 21, 30, tzinfo=UTC)  # 22:30 in Berlin (UTC+1 in winter)


@pytest.fixture(autouse=True)
def berlin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Europe/Berlin")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("+2h", NOW + timedelta(hours=2)),
        ("+1h30m", NOW + timedelta(minutes=90)),
        ("+45min", NOW + timedelta(minutes=45)),
        ("tomorrow 09:00", datetime(2026, 12, 2, 8, 0, tzinfo=UTC)),
        ("today 23:15", datetime(2026, 12, 1, 22, 15, tzinfo=UTC)),
        ("tomorrow", datetime(2026, 12, 1, 23, 0, tzinfo=UTC)),  # local midnight
        ("2026-12-03T14:00", datetime(2026, 12, 3, 13, 0, tzinfo=UTC)),  # naive = local
        ("2026-12-03T14:00Z", datetime(2026, 12, 3, 14, 0, tzinfo=UTC)),
        ("2026-12-03T14:00-05:00", datetime(2026, 12, 3, 19, 0, tzinfo=UTC)),
        ("2026-07-01 10:00", datetime(2026, 7, 1, 8, 0, tzinfo=UTC)),  # summer: UTC+2
        ("Dec 5 08:00", datetime(2026, 12, 5, 7, 0, tzinfo=UTC)),
    ],
)
def test_when_forms(text: str, expected: datetime) -> None:
    assert parse_when(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["soonish", "+2 fortnights", "tomorrow at teatime", "2026-13-40"])
def test_unreadable_when_is_an_error(text: str) -> None:
    with pytest.raises(WhenError):
        parse_when(text, now=NOW)


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h", 7200), ("90m", 5400), ("1.5", 5400), ("1h30m", 5400), ("2d", 172800)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


def test_bad_duration() -> None:
    with pytest.raises(WhenError):
        parse_duration("long")


def test_local_display_shows_the_offset_and_the_distance() -> None:
    assert local_text(datetime(2026, 12, 1, 21, 42, tzinfo=UTC), now=NOW) == "Tue 01 Dec 22:42 +01:00"
    assert local_text("2027-01-04T08:00:00Z", now=NOW) == "Mon 04 Jan 2027 09:00 +01:00"
    assert relative_text(NOW + timedelta(minutes=12), now=NOW) == "in 12 min"
    assert relative_text(NOW - timedelta(hours=3, minutes=20), now=NOW) == "3 h 20 min ago"
    assert relative_text(NOW + timedelta(seconds=10), now=NOW) == "now"
    assert duration_text(3 * 86400 + 3600) == "3 d 1 h"
