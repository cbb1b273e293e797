"""The availability timeline and the booking form's default start in a site time zone with
summer time (``TIME_ZONE`` is UTC by default; a site may set its own): on a change day the local
day has 23 or 25 real hours, and each hour's count must be the count of the hour it is labelled
with.

Python adds and subtracts times of one zone on the wall clock, so local midnight + 24 h is the
next local midnight and "local midnight + h hours" skips or repeats nothing: the timeline
showed 24 columns, one of them an hour that does not exist, and from there on each count sat
one column off its hour (the database counts real hours from midnight)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import Project
from scheduling.models import GpuType, Node
from scheduling.services import booking_create

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("day", "booked_utc", "labels", "booked_columns"),
    [
        # 28 Mar 2027: 02:00 CET jumps to 03:00 CEST; 01:00-03:00 UTC is 03:00-05:00 local.
        ("2027-03-28", 1, ["00:00", "01:00", *(f"{h:02d}:00" for h in range(3, 24))], (2, 3)),
        # 31 Oct 2027: 03:00 CEST goes back to 02:00 CET, so 02:00 comes twice; 01:00-03:00 UTC
        # is the second 02:00 and 03:00.
        (
            "2027-10-31",
            1,
            ["00:00", "01:00", "02:00", "02:00", *(f"{h:02d}:00" for h in range(3, 24))],
            (3, 4),
        ),
    ],
)
def test_a_summer_time_change_day_has_its_real_hours_each_with_its_own_count(
    client: Client,
    member: User,
    project: Project,
    nodes: list[Node],
    a100: GpuType,
    settings,
    monkeypatch: pytest.MonkeyPatch,
    day: str,
    booked_utc: int,
    labels: list[str],
    booked_columns: tuple[int, int],
) -> None:
    settings.TIME_ZONE = "Europe/Berlin"
    on = datetime.fromisoformat(day).replace(tzinfo=UTC)
    now = on - timedelta(hours=12)  # the day before, so the day is in range and nothing is past
    monkeypatch.setattr(timezone, "now", lambda: now)
    client.force_login(member)  # after the clock moved: a session is valid for two weeks from now
    start = on.replace(hour=booked_utc)
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=2,
        start_at=start,
        end_at=start + timedelta(hours=2),
        now=now,
    )

    html = client.get(reverse("availability"), {"day": day}, **HTMX).content.decode()

    cells = re.findall(r'aria-label="(\d+) A100 free from (\d\d:\d\d): book"', html)
    assert [label for _, label in cells] == labels
    assert [int(n) for n, _ in cells] == [6 if i in booked_columns else 8 for i in range(len(labels))]
    header = re.findall(r'<th scope="col" class="num">(\d\d)</th>', html)
    assert header == [label[:2] for label in labels]


@pytest.mark.parametrize(
    ("now", "start"),
    [
        ("2027-03-28T00:50:00+00:00", "2027-03-28T03:00"),  # 01:50 CET: the next quarter is 03:00 CEST
        ("2027-03-28T00:40:00+00:00", "2027-03-28T01:45"),
        ("2027-07-01T10:07:00+00:00", "2027-07-01T12:15"),
    ],
)
def test_the_booking_form_default_start_exists_on_the_local_clock(settings, now: str, start: str) -> None:
    """The empty form's start is the next quarter hour; on the night summer time starts, from
    01:45 to 02:00 CET that was "02:00", an hour that does not exist there (the form refused it)."""
    from scheduling.forms import booking_form_initial

    settings.TIME_ZONE = "Europe/Berlin"
    initial = booking_form_initial(project_slug=None, gpu_type_name=None, now=datetime.fromisoformat(now))
    assert initial["start_at"] == start
