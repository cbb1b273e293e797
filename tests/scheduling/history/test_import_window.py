"""``history_import slurmrestd``'s ``--since``/``--until``: sent relative to slurmrestd's own clock."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError

from scheduling.management.commands.history_import import _slurm_time

NOW = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "zone", "expected"),
    [
        ("2026-01-01T09:55:00", "Europe/Stockholm", "now-300"),  # naive: read in --tz (UTC+1)
        ("2026-01-01T08:55:00Z", "Asia/Tokyo", "now-300"),  # a zone given wins over --tz
        ("2026-01-01T08:59:59.200+00:00", "UTC", "now-1"),  # rounded to include the whole second
        ("2026-01-01T10:00:00+00:00", "UTC", "now+3600"),  # --until in the future
        ("2025-12-31", "UTC", "now-118800"),
    ],
)
def test_a_window_bound_is_seconds_before_now(text: str, zone: str, expected: str) -> None:
    assert _slurm_time(text, "--since", ZoneInfo(zone), now=NOW) == expected


def test_no_bound_and_a_bad_bound() -> None:
    assert _slurm_time(None, "--since", ZoneInfo("UTC"), now=NOW) is None
    with pytest.raises(CommandError, match="--until 'yesterday': give an ISO 8601"):
        _slurm_time("yesterday", "--until", ZoneInfo("UTC"), now=NOW)
