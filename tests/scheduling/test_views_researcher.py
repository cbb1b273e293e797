"""Researcher pages: dashboard, availability outlook and CSV, predicted runtime, API tokens.

Against the real PostgreSQL test database; bookings go through the real ``booking_create``
service.  Nothing is mocked except where a test says so.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.authtoken.models import Token

from forecasting.models import ForecastPoint, ForecastRun
from forecasting.selectors import runtime_predictor_forget
from portal.accounts.models import Project
from scheduling.models import Allocation, AuditEvent, Booking, Cluster, Gpu, GpuType, Job, Node, Preemption
from scheduling.services import booking_create
from tests.factories import AllocationFactory, JobFactory, MembershipFactory

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def member_web(client: Client, member: User) -> Client:
    client.force_login(member)
    return client


# ---- access ----


@pytest.mark.parametrize(
    ("method", "name"),
    [
        ("get", "home"),
        ("get", "availability-csv"),
        ("get", "job-prediction"),
        ("get", "api-tokens"),
        ("post", "api-tokens"),
    ],
)
def test_new_pages_require_login(client: Client, method: str, name: str) -> None:
    response = getattr(client, method)(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_login_lands_on_the_dashboard(client: Client, member: User) -> None:
    response = client.post(reverse("login"), {"username": member.username, "password": "pw-not-secret"})
    assert response["Location"] == reverse("home") == "/"
    page = client.get("/").content.decode()
    assert "<h1>Dashboard</h1>" in page
    # The booking form moved; the navigation links both.
    assert f'href="{reverse("booking-new")}"' in page
    assert reverse("booking-new") == "/bookings/new/"


def test_operations_link_only_for_staff_and_only_once_the_route_exists(
    client: Client, member: User, staff: User
) -> None:
    client.force_login(member)
    assert ">Operations<" not in client.get("/").content.decode()
    client.force_login(staff)
    page = client.get("/").content.decode()
    try:
        ops_url = reverse("ops:home")
    except Exception:  # no ops app in this configuration: no link, and no error
        assert ">Operations<" not in page
    else:
        assert f'href="{ops_url}"' in page


# ---- dashboard ----


def test_dashboard_shows_my_open_work_with_why_pending_eta_and_predictions(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    cluster = nodes[0].cluster
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + timedelta(hours=2)
    )
    Booking.objects.filter(pk=booking.pk).update(status_message="May start up to 10 min late: a job drains.")
    eta = timezone.now() + timedelta(hours=3)
    pending = JobFactory(
        user=member,
        project=project,
        cluster=cluster,
        name="waits-for-gpus",
        gpu_count=4,
        pending_reason=Job.PendingReason.RESOURCES,
        pending_sentence="Waiting for 4 A100s: all are busy until 14:00.",
        eta_p50_at=eta,
        eta_p90_at=eta + timedelta(hours=1),
        predicted_p50_s=5400,
        predicted_p90_s=9000,
        requested_s=7200,
    )
    other = MembershipFactory(project=project).user
    JobFactory(user=other, project=project, cluster=cluster, name="someone-elses")

    response = member_web.get("/")
    html = response.content.decode()
    assert response.status_code == 200
    assert f'id="dash-booking-{booking.pk}"' in html
    assert "May start up to 10 min late: a job drains." in html
    row = html.split(f'id="dash-job-{pending.pk}"')[1].split("</tr>")[0]
    assert "Waiting for 4 A100s: all are busy until 14:00." in row
    assert f"Likely start {timezone.localtime(eta):%a %-d %b %H:%M}" in row
    assert "1 h 30 min" in row
    assert "up to 2 h 30 min (p90); you said 2 h" in row
    assert "someone-elses" not in html
    assert "1 open booking, 0 jobs running, 1 pending." in re.sub(r"\s+", " ", html)


def test_dashboard_runtime_column_without_a_prediction(
    member_web: Client, member: User, project: Project
) -> None:
    """A session runs until its user ends it (no runtime to predict); a batch job not yet
    predicted says so, with what its user asked for."""
    session = JobFactory(
        user=member, project=project, name="notebook", kind=Job.Kind.INTERACTIVE, requested_s=None
    )
    batch = JobFactory(user=member, project=project, name="not-yet", requested_s=7200)
    html = member_web.get("/").content.decode()
    session_row = html.split(f'id="dash-job-{session.pk}"')[1].split("</tr>")[0]
    batch_row = html.split(f'id="dash-job-{batch.pk}"')[1].split("</tr>")[0]
    assert "Interactive: runs until you end it" in session_row
    assert "Not predicted yet" not in session_row
    assert "Not predicted yet; you said 2 h" in batch_row


def test_dashboard_polls_a_fragment_inside_a_live_region(member_web: Client, nodes: list[Node]) -> None:
    html = member_web.get("/").content.decode()
    tag = re.search(r'<div id="dashboard-live"[^>]*>', html)
    assert tag is not None
    assert 'hx-trigger="every 5s, berth:visible from:document"' in tag.group(0)
    assert "data-poll" in tag.group(0)
    # A persistent live region outside the polled part; berth.js fills it from [data-announce].
    assert '<p id="dashboard-live-announce" class="visually-hidden" aria-live="polite"' in html
    assert 'id="dashboard-summary" data-announce' in html

    fragment = member_web.get("/", **HTMX)
    assert fragment.content.decode().lstrip().startswith('<div id="dashboard-live"')
    assert "HX-Request" in fragment["Vary"]


def test_dashboard_tells_what_a_preemption_cost_and_when_the_job_resumes(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    now = timezone.now()
    eta = now + timedelta(minutes=40)
    job = JobFactory(
        user=member,
        project=project,
        cluster=nodes[0].cluster,
        name="ckpt-train",
        gpu_count=2,
        is_preemptible=True,
        is_checkpointable=True,
        eta_p50_at=eta,
        eta_p90_at=eta + timedelta(minutes=30),
    )
    Preemption.objects.create(
        job=job,
        signalled_at=now - timedelta(minutes=20),
        kill_at=now - timedelta(minutes=18),
        killed_at=now - timedelta(minutes=18),
        lost_gpu_s=1800.0,  # 0.5 GPU-hours
        reason="Reclaimed for a booking that starts now.",
    )
    html = re.sub(r"\s+", " ", member_web.get("/", **HTMX).content.decode())
    assert "ckpt-train</strong> was preempted" in html
    assert "Reclaimed for a booking that starts now." in html
    assert "It lost 0.50 GPU-h of work since its last checkpoint." in html
    assert f"it will likely resume {timezone.localtime(eta):%a %-d %b %H:%M}" in html

    # Back running: the notice says so instead of an ETA.
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=now - timedelta(minutes=5))
    html = re.sub(r"\s+", " ", member_web.get("/", **HTMX).content.decode())
    assert "It is running again since" in html


def test_dashboard_query_count_does_not_grow_with_the_work(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert member_web.get("/", **HTMX).status_code == 200
        return len(ctx.captured_queries)

    JobFactory.create_batch(2, user=member, project=project, cluster=nodes[0].cluster)
    few = count()
    JobFactory.create_batch(30, user=member, project=project, cluster=nodes[0].cluster)
    assert count() == few


# ---- availability outlook ----


def _forecast(cluster: Cluster, *, hours: int = 48, yhat: float = 3.0) -> None:
    issued = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    run = ForecastRun.objects.create(
        cluster=cluster,
        kind=ForecastRun.Kind.GPU_TYPE,
        key="A100",
        model_name="berth",
        issued_at=issued,
        train_start_at=issued - timedelta(days=7),
        train_end_at=issued,
        horizon_h=hours,
    )
    ForecastPoint.objects.bulk_create(
        ForecastPoint(run=run, ts=issued + timedelta(hours=h), yhat=yhat, lower80=yhat - 1, upper80=yhat + 2)
        for h in range(hours)
    )


def _csv(member_web: Client, days: int = 1) -> list[dict[str, str]]:
    response = member_web.get(reverse("availability-csv"), {"days": days})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_outlook_counts_free_booked_and_lendable_with_the_forecast(
    member_web: Client,
    member: User,
    project: Project,
    nodes: list[Node],
    a100: GpuType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The clock is pinned to the middle of the current hour: run in an hour's last minute, the
    # booking "starting in a minute" would begin in the next hour and the view's hour 0 could
    # differ from the test's (CI failed so at 12:59:43).
    hour0 = timezone.now().replace(minute=0, second=0, microsecond=0)
    now = hour0 + timedelta(minutes=30)
    monkeypatch.setattr(timezone, "now", lambda: now)
    # A booking that has started but is not in use (lendable), and one later today (booked only).
    started = booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=2,
        start_at=now + timedelta(minutes=1),
        end_at=hour0 + timedelta(hours=3),
    )
    Booking.objects.filter(pk=started.pk).update(
        start_at=now - timedelta(minutes=5), status=Booking.Status.ACTIVE
    )
    later_start = hour0 + timedelta(hours=5)
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=3,
        start_at=later_start,
        end_at=later_start + timedelta(hours=1),
    )
    _forecast(nodes[0].cluster, yhat=3.0)

    rows = _csv(member_web, days=1)
    assert len(rows) == 24
    assert {r["gpu_type"] for r in rows} == {"A100"}
    first = rows[0]
    assert first["hour_start_utc"] == hour0.astimezone(UTC).strftime("%Y-%m-%dT%H:00:00Z")
    assert first["capacity_gpus"] == "8"
    assert (first["booked_gpus"], first["lendable_gpus"]) == ("2", "2")
    assert first["free_gpus"] == "6"
    assert (first["forecast_gpus"], first["forecast_lower80_gpus"], first["forecast_upper80_gpus"]) == (
        "3.0",
        "2.0",
        "5.0",
    )
    assert (rows[5]["booked_gpus"], rows[5]["lendable_gpus"], rows[5]["free_gpus"]) == ("3", "0", "5")
    assert (rows[4]["booked_gpus"], rows[4]["free_gpus"]) == ("0", "8")


def test_outlook_page_has_chart_data_table_and_booking_links(
    member_web: Client, member: User, project: Project, nodes: list[Node], a100: GpuType
) -> None:
    _forecast(nodes[0].cluster)
    html = member_web.get(reverse("availability"), {"days": 3}).content.decode()
    assert 'src="/static/vendor/chart.umd.min.js"' in html
    assert 'src="/static/js/availability.js"' in html
    assert '<canvas id="outlook-chart-1" class="outlook-chart" data-chart="outlook-data-a100"' in html
    data = re.search(r'<script id="outlook-data-a100" type="application/json">(.*?)</script>', html, re.S)
    assert data is not None
    assert '"capacity": 8' in data.group(1)
    assert data.group(1).count("/bookings/new/?gpu_type=A100") == 72
    table = html.split("<caption>A100 GPUs per hour")[1]
    assert table.count('<th scope="row">') == 72
    assert f'href="{reverse("availability-csv")}?days=3"' in html
    # No inline script that would run (the CSP allows none): only JSON data blocks.
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag or 'type="application/json"' in tag, tag


def test_outlook_query_count_does_not_grow_with_the_days(member_web: Client, nodes: list[Node]) -> None:
    _forecast(nodes[0].cluster)
    counts = []
    for days in (1, 7):
        with CaptureQueriesContext(connection) as ctx:
            assert member_web.get(reverse("availability"), {"days": days}).status_code == 200
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1] <= 20


def test_outlook_days_are_limited_to_the_offered_choices(member_web: Client, nodes: list[Node]) -> None:
    assert len(_csv(member_web, days=7)) == 7 * 24
    response = member_web.get(reverse("availability-csv"), {"days": "365"})
    assert len(response.content.decode().strip().splitlines()) == 1 + 3 * 24  # the default, 3 days


# ---- predicted runtime beside the estimate ----


def test_job_prediction_fragment_shows_the_predictors_quantiles_and_the_estimate(
    member_web: Client, member: User, project: Project, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling.views import jobs as job_views

    seen = []

    # The predictor itself is tested in forecasting/; here: the request the page builds from the form.
    def fake_predict(*, cluster_id: int, requests: list) -> list[tuple[float, float]]:
        seen.append((cluster_id, requests))
        return [(2700.0, 7200.0)]

    monkeypatch.setattr(job_views, "runtime_predict", fake_predict)
    params = {
        "project": project.slug,
        "name": "vit-l",
        "gpu_count": "4",
        "gpu_type": "A100",
        "requested_h": "8",
    }
    response = member_web.get(reverse("job-prediction"), params, **HTMX)
    html = re.sub(r"\s+", " ", response.content.decode())
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="job-prediction"')
    assert '<p class="big-number">45 min</p>' in html
    assert "<strong>2 h</strong>" in html
    assert "Your estimate: <strong>8 h</strong>" in html
    assert "well above the prediction" in html
    ((cluster_id, (request,)),) = seen
    assert cluster_id == nodes[0].cluster_id
    assert (request.user, request.project, request.gpu_count, request.gpu_type) == (
        member.username,
        project.slug,
        4,
        "A100",
    )
    assert (request.requested_s, request.name) == (8 * 3600.0, "vit-l")


def test_job_prediction_with_the_real_predictor_and_an_incomplete_form(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    url = reverse("job-prediction")
    incomplete = member_web.get(url, {"requested_h": "2"}, **HTMX).content.decode()
    assert "No prediction yet" in incomplete
    params = {"project": project.slug, "name": "bert", "gpu_count": "1", "requested_h": "4"}
    runtime_predictor_forget()
    real = member_web.get(url, params, **HTMX)
    assert real.status_code == 200
    assert "No finished jobs like this one yet" in real.content.decode()
    # Once jobs like it have finished (about 90 minutes each), the prediction follows them.
    ended = timezone.now() - timedelta(hours=1)
    for _ in range(5):
        JobFactory(
            user=member, project=project, cluster=nodes[0].cluster, name="bert", gpu_count=1,
            requested_s=4 * 3600, status=Job.Status.COMPLETED, started_at=ended - timedelta(minutes=90),
            ended_at=ended, submitted_at=ended - timedelta(hours=2),
        )  # fmt: skip
    runtime_predictor_forget()
    # Another form first: its answer must not be reused for this one (the predictor caches by id).
    other = member_web.get(url, {**params, "name": "other", "requested_h": "0.5"}, **HTMX).content.decode()
    assert '<p class="big-number">1 h 30 min</p>' not in other
    learned = re.sub(r"\s+", " ", member_web.get(url, params, **HTMX).content.decode())
    assert '<p class="big-number">1 h 30 min</p>' in learned
    assert "Your estimate: <strong>4 h</strong>" in learned
    page = member_web.get(reverse("job-new")).content.decode()
    assert 'hx-get="/jobs/new/prediction/"' in page
    assert re.search(r'<div aria-live="polite">\s*<section id="job-prediction"', page)


# ---- API tokens ----


def test_tokens_page_creates_shows_once_regenerates_and_revokes(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    url = reverse("api-tokens")
    page = member_web.get(url).content.decode()
    assert "You have no API token." in page
    assert "http://testserver/api/v1/bookings/" in page
    assert "http://testserver/api/v1/jobs/" in page
    assert '"project": "vision"' in page
    assert "$BERTH_TOKEN" in page
    assert 'data-copy="curl-book"' in page

    created = member_web.post(url, {"action": "create"}, **HTMX)
    key = Token.objects.get(user=member).key
    assert f'value="{key}"' in created.content.decode()
    again = member_web.get(url).content.decode()
    assert key not in again  # shown once
    assert "You have an API token, created" in again

    member_web.post(url, {"action": "create"}, **HTMX)
    new_key = Token.objects.get(user=member).key
    assert new_key != key

    revoked = member_web.post(url, {"action": "revoke"})
    assert revoked.status_code == 303
    assert not Token.objects.filter(user=member).exists()
    verbs = list(
        AuditEvent.objects.filter(entity_type="user", entity_id=member.pk)
        .order_by("id")
        .values_list("verb", "actor_label")
    )
    assert verbs == [
        ("auth.token_create", "user"),
        ("auth.token_create", "user"),
        ("auth.token_revoke", "user"),
    ]
    assert member_web.post(url, {"action": "explode"}).status_code == 400


def test_the_token_from_the_page_works_on_the_api(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    member_web.post(reverse("api-tokens"), {"action": "create"})
    key = Token.objects.get(user=member).key
    api = Client()
    assert api.get("/api/v1/bookings/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    member_web.post(reverse("api-tokens"), {"action": "revoke"})
    assert api.get("/api/v1/bookings/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401


def test_outlook_counts_the_held_interactive_headroom_as_lendable(
    member_web: Client, nodes: list[Node]
) -> None:
    issued = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    run = ForecastRun.objects.create(
        cluster=nodes[0].cluster,
        kind=ForecastRun.Kind.INTERACTIVE,
        key="A100",
        model_name="berth",
        issued_at=issued,
        train_start_at=issued - timedelta(days=7),
        train_end_at=issued,
        horizon_h=12,
    )
    ForecastPoint.objects.bulk_create(
        ForecastPoint(run=run, ts=issued + timedelta(hours=h), yhat=1.0, lower80=0.0, upper80=1.6)
        for h in range(12)
    )
    rows = _csv(member_web, days=1)
    # Two GPUs held (the forecast's upper 1.6 rounded up, within a quarter of the 8) while the
    # run is younger than BERTH_HEADROOM_MAX_FORECAST_AGE_H (6 h: the first five hours here).
    assert [int(r["lendable_gpus"]) for r in rows[:7]] == [2, 2, 2, 2, 2, 0, 0]
    assert all(r["free_gpus"] == "8" for r in rows)


def test_my_jobs_shows_the_predicted_runtime_beside_the_estimate(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    job = JobFactory(
        user=member, project=project, cluster=nodes[0].cluster, predicted_p50_s=1800, predicted_p90_s=5400
    )
    row = (
        member_web.get(reverse("my-jobs"))
        .content.decode()
        .split(f'id="job-row-{job.pk}"')[1]
        .split("</tr>")[0]
    )
    assert "Predicted runtime 30 min (p90 1 h 30 min); you said 1 h." in row


def test_waited_counts_only_queued_time_over_every_attempt(
    member_web: Client, member: User, project: Project, nodes: list[Node]
) -> None:
    """A job preempted once waited 10 min, ran 40 min on 2 GPUs, waited 5 min more and runs
    again: it waited 15 min, not the 55 min from its first submission to its current start."""
    t0 = timezone.now() - timedelta(hours=2)
    job = JobFactory(
        user=member,
        project=project,
        cluster=nodes[0].cluster,
        name="resumed",
        gpu_count=2,
        status=Job.Status.RUNNING,
        first_submitted_at=t0,
        submitted_at=t0 + timedelta(minutes=50),
        started_at=t0 + timedelta(minutes=55),
        attempt=1,
    )
    first_run = DateTimeTZRange(t0 + timedelta(minutes=10), t0 + timedelta(minutes=50), "[)")
    current = DateTimeTZRange(t0 + timedelta(minutes=55), t0 + timedelta(hours=3), "[)")
    gpus = list(Gpu.objects.filter(node__in=nodes).order_by("id")[:2])
    for gpu in gpus:  # one allocation per GPU and run: the run counts once
        AllocationFactory(job=job, gpu=gpu, period=first_run, state=Allocation.State.ENDED)
        AllocationFactory(job=job, gpu=gpu, period=current, state=Allocation.State.ACTIVE)
    fresh = JobFactory(
        user=member,
        project=project,
        cluster=nodes[0].cluster,
        name="fresh",
        status=Job.Status.RUNNING,
        submitted_at=t0,
        started_at=t0 + timedelta(minutes=20),
    )

    page = member_web.get(reverse("my-jobs")).content.decode()
    row = page.split(f'id="job-row-{job.pk}"')[1].split("</tr>")[0]
    assert 'title="Waited 15 minutes in all, not counting its 1 earlier run">15 min<' in row
    fresh_row = page.split(f'id="job-row-{fresh.pk}"')[1].split("</tr>")[0]
    assert 'title="Waited 20 minutes">20 min<' in fresh_row
    detail = re.sub(r"\s+", " ", member_web.get(reverse("job-detail", args=[job.pk])).content.decode())
    assert "after waiting 15 minutes in all (not counting its 1 earlier run)" in detail
