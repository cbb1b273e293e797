"""Browser pages: full page or htmx fragment, form errors instead of 500s, own bookings only.

Runs against the real PostgreSQL test database; bookings are placed through the real
``booking_create`` service (nothing is mocked).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import Project
from scheduling.models import Booking, GpuType, Job, Node
from scheduling.services import booking_cancel, booking_create
from tests.factories import JobFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
LOCAL = "%Y-%m-%dT%H:%M"


@pytest.fixture
def member_web(client: Client, member: User) -> Client:
    client.force_login(member)
    return client


def _form(
    project: Project, *, start: datetime, hours: float = 2, gpus: int = 1, **extra: str
) -> dict[str, str]:
    data = {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": str(gpus),
        "start_at": start.strftime(LOCAL),
        "duration_h": str(hours) if hours != int(hours) else str(int(hours)),
        "note": "",
    }
    data.update(extra)
    return data


# ---- access ----


@pytest.mark.parametrize(
    ("method", "name", "kwargs"),
    [
        ("get", "home", {}),
        ("get", "booking-new", {}),
        ("get", "booking-availability", {}),
        ("get", "my-bookings", {}),
        ("get", "my-jobs", {}),
        ("post", "booking-cancel", {"booking_id": 1}),
        ("post", "job-cancel", {"job_id": 1}),
        ("post", "booking-end", {"booking_id": 1}),
        ("post", "booking-extend", {"booking_id": 1}),
        ("get", "availability", {}),
        ("get", "job-new", {}),
    ],
)
def test_pages_require_login(client: Client, method: str, name: str, kwargs: dict[str, int]) -> None:
    url = reverse(name, kwargs=kwargs)
    response = getattr(client, method)(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_login_and_logout_with_django_auth(client: Client, member: User) -> None:
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert b'autocomplete="current-password"' in page.content

    response = client.post(reverse("login"), {"username": member.username, "password": "pw-not-secret"})
    assert response.status_code == 302
    assert response["Location"] == reverse("home")
    assert client.get(reverse("home")).status_code == 200

    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert client.get(reverse("home")).status_code == 302


def test_wrong_password_is_a_form_error(client: Client, member: User) -> None:
    response = client.post(reverse("login"), {"username": member.username, "password": "nope"})
    assert response.status_code == 200
    assert b'role="alert"' in response.content


# ---- full page or fragment ----


@pytest.mark.parametrize(
    ("name", "fragment_id"),
    [
        ("booking-new", "booking-form"),
        ("home", "dashboard-live"),
        ("my-bookings", "booking-list"),
        ("my-jobs", "job-list"),
    ],
)
def test_htmx_gets_only_the_fragment(
    member_web: Client, nodes: list[Node], name: str, fragment_id: str
) -> None:
    full = member_web.get(reverse(name))
    fragment = member_web.get(reverse(name), **HTMX)

    assert full.status_code == fragment.status_code == 200
    assert b"<html" in full.content
    assert b"{#" not in full.content  # a template comment that leaked (they are one line only)
    assert f'id="{fragment_id}"'.encode() in full.content
    # The CSRF token rides on <body hx-headers> for every htmx request of the page.
    assert (
        b"hx-headers='{&quot;X-CSRFToken&quot;" in full.content
        or b'hx-headers=\'{"X-CSRFToken"' in full.content
    )

    body = fragment.content.decode().strip()
    assert "<html" not in body
    assert "<body" not in body
    assert body.startswith(f'<div id="{fragment_id}"')
    for response in (full, fragment):
        assert "HX-Request" in response["Vary"]


@pytest.mark.parametrize("name", ["my-jobs", "availability"])
def test_history_restore_gets_the_whole_page(member_web: Client, nodes: list[Node], name: str) -> None:
    # These pages push their URL (pagination, days); after a cache miss htmx asks for the page.
    response = member_web.get(reverse(name), HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert b"<html" in response.content


def test_every_hx_get_has_an_href_or_a_form_action(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    JobFactory.create_batch(60, user=member, project=project)  # enough for the pager links
    for name in ("booking-new", "my-bookings", "my-jobs"):
        html = member_web.get(reverse(name)).content.decode()
        for tag in re.findall(r"<(?:a|div|form)\b[^>]*\bhx-get=[^>]*>", html):
            if tag.startswith("<a"):
                assert "href=" in tag, tag
        # The live availability box has a no-JavaScript twin: the day's timeline, a plain link.
        if name == "booking-new":
            assert f'href="{reverse("availability")}?day=' in html
            assert 'hx-params="not csrfmiddlewaretoken"' in html  # no token in GET URLs or logs


# ---- live availability ----


def test_availability_counts_free_gpus_over_the_window(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    url = reverse("booking-availability")
    params = _form(project, start=soon, hours=2, gpus=4)

    empty = member_web.get(url, params, **HTMX)
    assert empty.status_code == 200
    assert empty.content.decode().strip().startswith('<section id="availability"')
    assert re.search(r'class="big-number">\s*8\b', empty.content.decode())
    assert "Enough" in empty.content.decode()

    booking_create(
        member, project=project, gpu_type=a100, gpu_count=6, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    short = member_web.get(url, params, **HTMX).content.decode()
    assert re.search(r'class="big-number">\s*2\b', short)
    assert "Not enough" in short
    # The nearest alternative starts when the 6-GPU booking ends, offered as one click.
    assert "Book this instead" in short
    assert f'value="{(soon + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")}"' in short


def test_availability_without_htmx_renders_the_page(
    member_web: Client, project: Project, nodes: list[Node], soon: datetime
) -> None:
    response = member_web.get(reverse("booking-availability"), _form(project, start=soon))
    assert response.status_code == 200
    assert b"<html" in response.content
    assert b'id="availability"' in response.content


def test_availability_with_bad_input_is_not_an_error(member_web: Client, nodes: list[Node]) -> None:
    response = member_web.get(
        reverse("booking-availability"), {"gpu_count": "lots", "start_at": "soon"}, **HTMX
    )
    assert response.status_code == 200
    assert b"Fill in" in response.content


def test_availability_does_not_need_a_project(client: Client, nodes: list[Node], soon: datetime) -> None:
    client.force_login(UserFactory())  # in no project yet: can still look
    params = {"gpu_type": "A100", "gpu_count": "2", "start_at": soon.strftime(LOCAL), "duration_h": "1"}
    html = client.get(reverse("booking-availability"), params, **HTMX).content.decode()
    assert re.search(r'class="big-number">\s*8\b', html)
    page = client.get(reverse("booking-new")).content.decode()
    assert "not a member of any project" in page


# ---- booking ----


def test_booking_is_created_through_the_service(
    member_web: Client, member: User, project: Project, nodes: list[Node], soon: datetime
) -> None:
    response = member_web.post(
        reverse("booking-new"), _form(project, start=soon, hours=4, gpus=2, note="ablation")
    )

    assert response.status_code == 303
    booking = Booking.objects.get(user=member)
    assert (booking.gpu_count, booking.end_at - booking.start_at, booking.note) == (
        2,
        timedelta(hours=4),
        "ablation",
    )
    assert booking.allocations.count() == 2  # placed on concrete GPUs by booking_create
    assert response["Location"].endswith(f"#booking-row-{booking.pk}")


def test_booking_with_an_exact_end_overrides_the_duration(
    member_web: Client, member: User, project: Project, nodes: list[Node], soon: datetime
) -> None:
    end = soon + timedelta(hours=3, minutes=30)
    member_web.post(reverse("booking-new"), _form(project, start=soon, hours=1, end_at=end.strftime(LOCAL)))
    booking = Booking.objects.get(user=member)
    assert booking.end_at == end


def test_htmx_booking_redirects_on_the_client(
    member_web: Client, project: Project, nodes: list[Node], soon: datetime
) -> None:
    response = member_web.post(reverse("booking-new"), _form(project, start=soon), **HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith(reverse("my-bookings"))


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"gpu_count": "0"}, "gpu_count", "greater than or equal to 1"),
        ({"gpu_count": "many"}, "gpu_count", "Enter a whole number"),
        ({"start_at": "next tuesday"}, "start_at", "Enter a valid date/time"),
        ({"start_at": ""}, "start_at", "This field is required"),
        ({"gpu_type": "H999"}, "gpu_type", "Select a valid choice"),
        ({"project": "someone-elses"}, "project", "Select a valid choice"),
        ({"duration_h": "", "end_at": ""}, "duration_h", "Choose a duration"),
        ({"duration_h": "5000"}, "duration_h", "Select a valid choice"),
    ],
)
def test_bad_form_input_is_shown_as_form_errors(
    member_web: Client,
    member: User,
    project: Project,
    nodes: list[Node],
    soon: datetime,
    changes: dict[str, str],
    field: str,
    message: str,
) -> None:
    data = {**_form(project, start=soon), **changes}
    for extra in ({}, HTMX):
        response = member_web.post(reverse("booking-new"), data, **extra)
        assert response.status_code == 422
        assert message in response.content.decode()
        assert f'id="id_{field}_error"'.encode() in response.content
    assert not Booking.objects.filter(user=member).exists()


@pytest.mark.parametrize(
    ("start_shift", "hours", "gpus", "message"),
    [
        (timedelta(days=-2), 2, 1, "The start is in the past."),
        (timedelta(days=400), 2, 1, "Bookings open at most"),
        (timedelta(0), 2, 9, "At most 8 A100 GPUs exist"),
    ],
)
def test_service_refusals_come_back_as_form_errors(
    member_web: Client,
    member: User,
    project: Project,
    nodes: list[Node],
    soon: datetime,
    start_shift: timedelta,
    hours: int,
    gpus: int,
    message: str,
) -> None:
    response = member_web.post(
        reverse("booking-new"), _form(project, start=soon + start_shift, hours=hours, gpus=gpus)
    )
    assert response.status_code == 422
    assert message in response.content.decode()
    assert not Booking.objects.filter(user=member).exists()


def test_end_before_start_is_a_form_error(
    member_web: Client, project: Project, nodes: list[Node], soon: datetime
) -> None:
    data = _form(project, start=soon, end_at=(soon - timedelta(hours=1)).strftime(LOCAL))
    response = member_web.post(reverse("booking-new"), data)
    assert response.status_code == 422
    assert b"The end must be after the start." in response.content


def test_conflict_offers_the_nearest_alternative_in_one_click(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    other = MembershipFactory(project=project).user
    booking_create(
        other, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + timedelta(hours=3)
    )

    response = member_web.post(reverse("booking-new"), _form(project, start=soon, hours=2, gpus=2), **HTMX)

    assert response.status_code == 409
    html = response.content.decode()
    assert "are not free" in html
    assert "Book this instead" in html
    # Re-post exactly what the first "book this instead" button carries.
    alt_form = re.search(
        r'<form method="post" action="/bookings/new/"[^>]*>(.*?)</form>',
        html.split("Free windows nearby")[1],
        re.S,
    )
    assert alt_form is not None
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', alt_form.group(1)))
    assert fields["start_at"] == (soon + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%S")

    again = member_web.post(reverse("booking-new"), fields, **HTMX)
    assert again.status_code == 200, again.content.decode()[:500]
    booking = Booking.objects.get(user=member)
    assert (booking.start_at, booking.end_at) == (soon + timedelta(hours=3), soon + timedelta(hours=5))


# ---- my bookings and cancel ----


def test_my_bookings_lists_only_mine(
    member_web: Client,
    member: User,
    outsider: User,
    project: Project,
    nodes: list[Node],
    a100: GpuType,
    soon: datetime,
) -> None:
    mine = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    other = MembershipFactory(project=project).user
    theirs = booking_create(
        other, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )

    html = member_web.get(reverse("my-bookings")).content.decode()
    assert f'id="booking-row-{mine.pk}"' in html
    assert f'id="booking-row-{theirs.pk}"' not in html


def test_cancel_swaps_the_row_and_frees_the_gpus(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + timedelta(hours=1)
    )

    response = member_web.post(reverse("booking-cancel", kwargs={"booking_id": booking.pk}), **HTMX)

    assert response.status_code == 200
    html = response.content.decode().strip()
    assert html.startswith(f'<tr id="booking-row-{booking.pk}"')
    assert "Cancelled" in html
    assert "hx-post" not in html  # no cancel button on a cancelled booking
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CANCELLED
    # The GPUs are free again: the same window can be booked in full.
    assert booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + timedelta(hours=1)
    )


def test_cancel_without_htmx_redirects_with_a_message(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    response = member_web.post(reverse("booking-cancel", kwargs={"booking_id": booking.pk}), follow=True)
    assert response.redirect_chain[-1] == (reverse("my-bookings"), 303)
    assert f"Cancelled booking {booking.pk}." in response.content.decode()


def test_cancelling_twice_is_a_message_not_an_error(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    url = reverse("booking-cancel", kwargs={"booking_id": booking.pk})
    member_web.post(url, **HTMX)
    response = member_web.post(url, **HTMX)
    assert response.status_code == 200
    assert "already cancelled" in response.content.decode()


@pytest.mark.parametrize("as_manager", [False, True])
def test_cancelling_someone_elses_booking_is_404(
    client: Client,
    manager: User,
    project: Project,
    nodes: list[Node],
    a100: GpuType,
    soon: datetime,
    as_manager: bool,
) -> None:
    owner = MembershipFactory(project=project).user
    booking = booking_create(
        owner, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    # Even a manager of the project cannot cancel it from *my* bookings: the page is per person.
    client.force_login(manager if as_manager else MembershipFactory().user)

    for extra in ({}, HTMX):
        response = client.post(reverse("booking-cancel", kwargs={"booking_id": booking.pk}), **extra)
        assert response.status_code == 404
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CONFIRMED


def test_cancel_is_post_only(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    assert member_web.get(reverse("booking-cancel", kwargs={"booking_id": booking.pk})).status_code == 405


def test_my_bookings_query_count_does_not_grow_with_bookings(
    member_web: Client,
    member: User,
    project: Project,
    nodes: list[Node],
    a100: GpuType,
    soon: datetime,
    django_assert_max_num_queries: Any,
) -> None:
    for i in range(12):
        start = soon + timedelta(hours=i)
        booking = booking_create(
            member,
            project=project,
            gpu_type=a100,
            gpu_count=2,
            start_at=start,
            end_at=start + timedelta(hours=1),
        )
        if i % 3 == 0:
            booking_cancel(booking, user=member)
    with django_assert_max_num_queries(7):
        html = member_web.get(reverse("my-bookings")).content.decode()
    assert html.count('id="booking-row-') == 12


# ---- my jobs ----


def test_my_jobs_pages_and_filters_my_jobs_only(
    member_web: Client, member: User, project: Project, outsider: User, django_assert_max_num_queries: Any
) -> None:
    JobFactory.create_batch(55, user=member, project=project, status=Job.Status.COMPLETED)
    JobFactory.create_batch(3, user=member, project=project, status=Job.Status.FAILED)
    JobFactory(user=outsider, name="not-mine")

    first = member_web.get(reverse("my-jobs")).content.decode()
    assert "58 jobs" in first
    assert first.count('id="job-row-') == 50
    assert "not-mine" not in first

    second = member_web.get(reverse("my-jobs"), {"page": 2}, **HTMX).content.decode()
    assert second.count('id="job-row-') == 8

    failed = member_web.get(reverse("my-jobs"), {"status": "failed"}, **HTMX).content.decode()
    assert failed.count('id="job-row-') == 3

    with django_assert_max_num_queries(5):
        member_web.get(reverse("my-jobs"), {"page": 2})

    unknown = member_web.get(reverse("my-jobs"), {"status": "bogus", "page": "x"})
    assert unknown.status_code == 200
    assert "58 jobs" in unknown.content.decode()


def test_pending_jobs_say_why_and_when(member_web: Client, member: User, project: Project) -> None:
    eta = timezone.now() + timedelta(hours=3)
    JobFactory(
        user=member,
        project=project,
        status=Job.Status.PENDING,
        pending_reason=Job.PendingReason.RESOURCES,
        pending_sentence="Waiting for 4 free A100 GPUs.",
        eta_p50_at=eta,
        eta_p90_at=eta + timedelta(hours=2),
    )
    html = member_web.get(reverse("my-jobs")).content.decode()
    assert "Waiting for 4 free A100 GPUs." in html
    assert "Likely start" in html
    assert "(p90)" in html


# ---- availability timeline ----


def test_timeline_shows_free_gpus_per_hour_and_links_to_the_form(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType
) -> None:
    tomorrow = timezone.localdate() + timedelta(days=1)
    ten = timezone.make_aware(datetime.combine(tomorrow, datetime.min.time())) + timedelta(hours=10)
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=6, start_at=ten, end_at=ten + timedelta(hours=2)
    )

    html = member_web.get(reverse("availability"), {"day": tomorrow.isoformat()}, **HTMX).content.decode()

    assert html.strip().startswith('<div id="availability-grid"')
    counts = [int(n) for n in re.findall(r'aria-label="(\d+) A100 free from', html)]
    assert len(counts) == 24
    assert counts[10] == counts[11] == 2
    assert all(counts[h] == 8 for h in range(24) if h not in (10, 11))
    assert f"start_at={ten.strftime('%Y-%m-%dT%H')}%3A00" in html
    # Each hour's number links to the booking form, which opens pre-filled.
    form = member_web.get(
        reverse("booking-new"), {"gpu_type": "A100", "start_at": ten.strftime(LOCAL), "duration_h": "1"}
    )
    assert f'value="{ten.strftime(LOCAL)}"' in form.content.decode()


@pytest.mark.parametrize("day", ["yesterday", "1999-01-01", "not-a-date"])
def test_timeline_falls_back_to_today_for_a_day_out_of_range(
    member_web: Client, nodes: list[Node], day: str
) -> None:
    response = member_web.get(reverse("availability"), {"day": day})
    assert response.status_code == 200
    assert timezone.localdate().strftime("%A %-d %B %Y") in response.content.decode()
    assert "Previous day" not in response.content.decode()


def test_timeline_full_page_and_fragment(member_web: Client, nodes: list[Node]) -> None:
    full = member_web.get(reverse("availability"))
    fragment = member_web.get(reverse("availability"), **HTMX)
    assert b"<html" in full.content
    assert b"<html" not in fragment.content
    assert fragment.content.decode().strip().startswith('<div id="availability-grid"')
    assert "HX-Request" in fragment["Vary"]


# ---- cancel a job ----


def test_cancel_my_pending_job_swaps_the_row(member_web: Client, member: User, project: Project) -> None:
    job = JobFactory(user=member, project=project, status=Job.Status.PENDING)

    response = member_web.post(reverse("job-cancel", kwargs={"job_id": job.pk}), **HTMX)

    assert response.status_code == 200
    html = response.content.decode().strip()
    assert html.startswith(f'<tr id="job-row-{job.pk}"')
    assert "Cancelled" in html
    assert "hx-post" not in html
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED


def test_cancelling_a_finished_job_is_a_message(member_web: Client, member: User, project: Project) -> None:
    job = JobFactory(user=member, project=project, status=Job.Status.COMPLETED)
    response = member_web.post(reverse("job-cancel", kwargs={"job_id": job.pk}), follow=True)
    assert response.status_code == 200
    assert "already completed" in response.content.decode()


def test_cancelling_someone_elses_job_is_404(member_web: Client, outsider: User) -> None:
    job = JobFactory(user=outsider, status=Job.Status.PENDING)
    for extra in ({}, HTMX):
        assert member_web.post(reverse("job-cancel", kwargs={"job_id": job.pk}), **extra).status_code == 404
    job.refresh_from_db()
    assert job.status == Job.Status.PENDING


# ---- submit a job ----


def _job_form(project: Project, **changes: str) -> dict[str, str]:
    data = {
        "project": project.slug,
        "name": "resnet50-sweep",
        "gpu_count": "2",
        "gpu_type": "A100",
        "min_memory_gib": "",
        "requested_h": "1.5",
        "command": "python train.py --lr 3e-4",
    }
    data.update(changes)
    return data


def test_submit_a_job_through_the_service(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    data = _job_form(project, is_preemptible="on", is_checkpointable="on", checkpoint_interval_min="10")
    data["precisions"] = ["bf16", "tf32"]  # type: ignore[assignment]

    response = member_web.post(reverse("job-new"), data)

    assert response.status_code == 303
    job = Job.objects.get(user=member)
    assert (job.name, job.gpu_count, job.gpu_type.name if job.gpu_type else None) == (
        "resnet50-sweep",
        2,
        "A100",
    )
    assert job.requested_s == 5400
    assert (job.is_preemptible, job.is_checkpointable, job.checkpoint_interval_s) == (True, True, 600)
    assert job.precisions == ["bf16", "tf32"]
    assert job.payload == {"command": "python train.py --lr 3e-4"}
    assert job.status == Job.Status.PENDING
    assert response["Location"].endswith(f"#job-row-{job.pk}")


def test_submit_any_type_that_fits(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    response = member_web.post(
        reverse("job-new"), _job_form(project, gpu_type="", min_memory_gib="40"), **HTMX
    )
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith(reverse("my-jobs"))
    job = Job.objects.get(user=member)
    assert job.gpu_type is None
    assert job.min_memory_gib == 40


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"name": ""}, "name", "This field is required"),
        ({"gpu_count": "0"}, "gpu_count", "greater than or equal to 1"),
        ({"requested_h": "-1"}, "requested_h", "greater than or equal to 0.01"),
        ({"command": ""}, "command", "This field is required"),
        ({"checkpoint_interval_min": "5"}, "checkpoint_interval_min", "Only a job that checkpoints"),
        # Refused by job_submit, not by the form: shown on the right field all the same.
        ({"gpu_count": "9"}, "gpu_count", "At most 8 fitting GPUs"),
        ({"gpu_type": "", "min_memory_gib": "200"}, "gpu_type", "No GPU type satisfies"),
    ],
)
def test_bad_job_input_is_shown_as_form_errors(
    member_web: Client,
    member: User,
    project: Project,
    nodes: list[Node],
    changes: dict[str, str],
    field: str,
    message: str,
) -> None:
    for extra in ({}, HTMX):
        response = member_web.post(reverse("job-new"), _job_form(project, **changes), **extra)
        assert response.status_code == 422
        assert message in response.content.decode()
        assert f'id="id_{field}_error"'.encode() in response.content
    assert not Job.objects.filter(user=member).exists()


def test_job_form_page_and_fragment(member_web: Client, nodes: list[Node]) -> None:
    full = member_web.get(reverse("job-new"))
    fragment = member_web.get(reverse("job-new"), **HTMX)
    assert b"<html" in full.content
    assert fragment.content.decode().strip().startswith('<div id="job-form"')
    assert "HX-Request" in fragment["Vary"]


# ---- end a running booking ----


def test_a_running_booking_can_be_ended_now(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType
) -> None:
    start = timezone.now() - timedelta(minutes=2)  # within the service's past tolerance
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=start, end_at=start + timedelta(hours=2)
    )
    page = member_web.get(reverse("my-bookings")).content.decode()
    assert f'aria-label="End booking {booking.pk} now"' in page
    assert f'aria-label="Cancel booking {booking.pk}"' not in page

    response = member_web.post(reverse("booking-end", kwargs={"booking_id": booking.pk}), **HTMX)

    assert response.status_code == 200
    assert "Completed" in response.content.decode()
    booking.refresh_from_db()
    assert booking.status == Booking.Status.COMPLETED
    assert booking.ended_at is not None
    # From now on all eight GPUs are free again.
    later = timezone.now() + timedelta(minutes=1)
    assert booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=later, end_at=later + timedelta(hours=1)
    )


def test_ending_a_booking_that_has_not_started_says_cancel_instead(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    response = member_web.post(reverse("booking-end", kwargs={"booking_id": booking.pk}), follow=True)
    assert "cancel it instead" in response.content.decode()
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CONFIRMED


def test_ending_someone_elses_booking_is_404(
    client: Client, project: Project, nodes: list[Node], a100: GpuType
) -> None:
    owner = MembershipFactory(project=project).user
    start = timezone.now() - timedelta(minutes=1)
    booking = booking_create(
        owner, project=project, gpu_type=a100, gpu_count=1, start_at=start, end_at=start + timedelta(hours=1)
    )
    client.force_login(MembershipFactory(project=project).user)
    assert client.post(reverse("booking-end", kwargs={"booking_id": booking.pk}), **HTMX).status_code == 404
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CONFIRMED


# ---- extend a booking ----


def test_extend_moves_the_end_an_hour_later_on_the_same_gpus(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    gpus = sorted(booking.allocations.values_list("gpu_id", flat=True))

    response = member_web.post(reverse("booking-extend", kwargs={"booking_id": booking.pk}), **HTMX)

    assert response.status_code == 200
    assert response.content.decode().strip().startswith(f'<tr id="booking-row-{booking.pk}"')
    booking.refresh_from_db()
    assert booking.end_at == soon + timedelta(hours=2)
    assert sorted(booking.allocations.values_list("gpu_id", flat=True)) == gpus
    assert all(a.period.upper == booking.end_at for a in booking.allocations.all())


def test_extending_a_cancelled_booking_in_the_browser_says_it_was_cancelled(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    member_web.post(reverse("booking-cancel", kwargs={"booking_id": booking.pk}), **HTMX)
    url = reverse("booking-extend", kwargs={"booking_id": booking.pk})

    response = member_web.post(url, **HTMX)
    assert response.status_code == 200
    assert "This booking was cancelled, so it cannot be extended." in response.content.decode()
    followed = member_web.post(url, follow=True)  # without JavaScript: a message on the list
    assert "This booking was cancelled, so it cannot be extended." in followed.content.decode()
    booking.refresh_from_db()
    assert booking.end_at == soon + timedelta(hours=1)


def test_extend_into_someone_elses_window_says_how_far_it_can_go(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    other = MembershipFactory(project=project).user
    later = soon + timedelta(hours=1, minutes=30)
    booking_create(
        other, project=project, gpu_type=a100, gpu_count=8, start_at=later, end_at=later + timedelta(hours=1)
    )

    response = member_web.post(reverse("booking-extend", kwargs={"booking_id": booking.pk}), **HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert 'role="alert"' in html
    assert f"until {later:%a %d %b %H:%M} at most" in html
    booking.refresh_from_db()
    assert booking.end_at == soon + timedelta(hours=1)  # unchanged


def test_extending_someone_elses_booking_is_404(
    client: Client, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    owner = MembershipFactory(project=project).user
    booking = booking_create(
        owner, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    client.force_login(MembershipFactory(project=project).user)
    assert client.post(reverse("booking-extend", kwargs={"booking_id": booking.pk})).status_code == 404
    booking.refresh_from_db()
    assert booking.end_at == soon + timedelta(hours=1)
