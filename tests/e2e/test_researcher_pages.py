"""In real Chromium: the researcher pages.

Book from the availability chart, see it on the dashboard, cancel it; submit a job and watch the
dashboard change from pending to running while engine rounds run on a simulator cluster; the
API tokens page's copy buttons; the pages at a phone's width.  Screenshots go to ``artifacts/``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from playwright.sync_api import Browser, ConsoleMessage, Page, expect
from rest_framework.authtoken.models import Token

from forecasting.models import ForecastPoint, ForecastRun
from forecasting.selectors import runtime_predictor_forget
from portal.accounts.models import Project
from scheduling.models import Booking, Cluster, Job, Node
from scheduling.rounds import engine_round_run
from tests.e2e.console import record_console_error
from tests.factories import JobFactory

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
PHONE = {"width": 390, "height": 844}


def _log_in(page: Page, base: str, user: User, next_url: str = "/") -> None:
    page.goto(f"{base}/login/?next={next_url}")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill("pw-not-secret")
    page.get_by_role("button", name="Log in").click()


def _console_errors(page: Page) -> list[str]:
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        record_console_error(errors, message)

    page.on("console", on_console)
    return errors


def _forecast(cluster: Cluster) -> None:
    issued = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    run = ForecastRun.objects.create(
        cluster=cluster,
        kind=ForecastRun.Kind.GPU_TYPE,
        key="A100",
        model_name="berth",
        issued_at=issued,
        train_start_at=issued - timedelta(days=7),
        train_end_at=issued,
        horizon_h=96,
    )
    ForecastPoint.objects.bulk_create(
        ForecastPoint(run=run, ts=issued + timedelta(hours=h), yhat=3 + (h % 24) / 8, lower80=2, upper80=6)
        for h in range(96)
    )


@pytest.fixture
def clean_simulator(nodes: list[Node]) -> None:
    """The simulator keeps its state in Redis per database and cluster id; ids repeat across runs."""
    client = redis.Redis.from_url(settings.BERTH_ENGINE_REDIS_URL)
    keys = list(client.scan_iter(match=f"berth:livesim:{connection.settings_dict['NAME']}:*", count=500))
    if keys:
        client.delete(*keys)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_book_from_the_availability_chart_see_it_on_the_dashboard_and_cancel(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    page.set_default_timeout(10_000)
    errors = _console_errors(page)
    _forecast(nodes[0].cluster)

    _log_in(page, base, member)
    expect(page.get_by_role("heading", name="Dashboard", exact=True)).to_be_visible()
    expect(page.locator("#dashboard-summary")).to_contain_text("0 open bookings")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Availability").click()
    expect(page.get_by_role("heading", name="The next 3 days")).to_be_visible()
    chart = page.locator("canvas.outlook-chart").first
    expect(chart).to_have_attribute("data-drawn", "true")
    # The table holds the same numbers: 72 hours, all 8 GPUs free.
    page.get_by_text("A100: the numbers as a table").click()
    first_row = page.locator("details.outlook-table tbody tr").first
    expect(first_row.locator("td").nth(0)).to_have_text("8")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-availability-outlook.png"), full_page=True)

    # Click an hour in the chart: the booking form opens pre-filled for it.
    box = chart.bounding_box()
    assert box is not None
    chart.click(position={"x": box["width"] * 0.55, "y": box["height"] * 0.6})
    expect(page).to_have_url(re.compile(r"/bookings/new/\?gpu_type=A100&start_at=.*&duration_h=1$"))
    expect(page.get_by_label("GPU type")).to_have_value("A100")
    start_value = page.get_by_label("Start").input_value()
    assert start_value
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_label("GPUs", exact=True).press("Tab")  # a change event asks for fresh availability
    expect(page.locator("#availability")).to_contain_text("Enough: 2 GPUs can be booked")
    page.get_by_role("button", name="Book", exact=True).click()

    expect(page.get_by_role("heading", name="My bookings")).to_be_visible()
    booking = Booking.objects.get(user=member)
    assert booking.gpu_count == 2
    assert timezone.localtime(booking.start_at).strftime("%Y-%m-%dT%H:%M") == start_value

    page.get_by_role("link", name="Dashboard").click()
    row = page.locator(f"#dash-booking-{booking.pk}")
    expect(row).to_contain_text("2 × A100")
    expect(row).to_contain_text("Confirmed")
    expect(page.locator("#dashboard-summary")).to_contain_text("1 open booking")
    page.screenshot(path=str(ARTIFACTS / "e2e-dashboard-booking.png"), full_page=True)

    # Cancel on My bookings; the dashboard's next poll drops it without a reload.
    page.get_by_role("link", name="Extend, end or cancel them").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Cancel booking {booking.pk}").click()
    expect(page.locator(f"#booking-row-{booking.pk}")).to_contain_text("Cancelled")
    page.go_back()
    expect(page.locator(f"#dash-booking-{booking.pk}")).to_have_count(0, timeout=12_000)
    expect(page.locator("#dashboard-summary")).to_contain_text("0 open bookings")
    assert errors == [], errors


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_submit_a_job_see_the_prediction_and_watch_it_start_on_the_dashboard(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node], clean_simulator: None
) -> None:
    base = str(live_server).rstrip("/")
    page.set_default_timeout(10_000)
    errors = _console_errors(page)
    cluster = nodes[0].cluster
    # History the runtime predictor learns from: five earlier runs of this job took 90 minutes.
    ended = timezone.now() - timedelta(hours=1)
    for _ in range(5):
        JobFactory(
            user=member, project=project, cluster=cluster, name="bert-pretrain", gpu_count=2,
            requested_s=3 * 3600, status=Job.Status.COMPLETED, started_at=ended - timedelta(minutes=90),
            ended_at=ended, submitted_at=ended - timedelta(hours=2),
        )  # fmt: skip
    runtime_predictor_forget()

    _log_in(page, base, member, "/jobs/new/")
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
    prediction = page.locator("#job-prediction")
    page.get_by_label("Name").fill("bert-pretrain")
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_label("Runtime estimate (hours)").fill("3")
    expect(prediction.locator(".big-number")).to_have_text("1 h 30 min")
    expect(prediction).to_contain_text("Your estimate: 3 h")
    page.get_by_label("Runtime estimate (hours)").press_sequentially("8", delay=50)  # "38": typed on
    expect(prediction).to_contain_text("Your estimate: 38 h")
    page.get_by_label("Runtime estimate (hours)").fill("8")
    expect(prediction).to_contain_text("Your estimate: 8 h")
    expect(prediction).to_contain_text("well above the prediction")
    page.get_by_label("Preemptible").check()
    page.get_by_label("Checkpoints").check()
    page.get_by_label("Command").fill("python pretrain.py")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-job-prediction.png"), full_page=True)
    page.get_by_role("button", name="Submit", exact=True).click()
    expect(page.get_by_role("heading", name="My jobs")).to_be_visible()
    job = Job.objects.get(user=member, status=Job.Status.PENDING)

    page.get_by_role("link", name="Dashboard").click()
    row = page.locator(f"#dash-job-{job.pk}")
    expect(row).to_contain_text("Pending")
    expect(row).to_contain_text("you said 8 h")

    # The engine places it (simulator cluster); the page learns it from its 5-second poll.
    for _ in range(3):
        engine_round_run(cluster_id=cluster.pk)
        job.refresh_from_db()
        if job.status == Job.Status.RUNNING:
            break
    assert job.status in (Job.Status.STARTING, Job.Status.RUNNING)
    expect(row.locator(".badge")).to_have_text(re.compile("Starting|Running"), timeout=12_000)
    expect(page.locator("#dashboard-summary")).to_contain_text("1 job running, 0 pending")
    # Screen readers hear the new summary (a live region outside the replaced part).
    expect(page.locator("#dashboard-live-announce")).to_contain_text(
        "Updated: 0 open bookings, 1 job running"
    )
    page.screenshot(path=str(ARTIFACTS / "e2e-dashboard-job-running.png"), full_page=True)
    assert errors == [], errors


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_dashboard_does_not_poll_while_the_tab_is_hidden(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    _log_in(page, base, member)
    expect(page.locator("#dashboard-live")).to_be_visible()
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if r.headers.get("hx-request") else None)
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true});"
    )
    page.wait_for_timeout(6_000)
    assert polls == []
    # Visible again: one poll at once, and the 5-second polling goes on.
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
        "Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    page.wait_for_timeout(1_000)
    assert len(polls) == 1


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_tokens_page_create_copy_and_revoke(
    live_server: object, browser: Browser, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"], base_url=base)
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors = _console_errors(page)
    _log_in(page, base, member, "/account/tokens/")
    expect(page.get_by_role("heading", name="API tokens")).to_be_visible()
    expect(page.locator("#token-state")).to_have_text("You have no API token.")

    page.get_by_role("button", name="Create a token").click()
    token_field = page.get_by_label("Token", exact=True)
    expect(token_field).to_be_visible()
    key = Token.objects.get(user=member).key
    expect(token_field).to_have_value(key)
    page.get_by_role("button", name="Copy token").click()
    expect(page.locator("#new-token-status")).to_have_text("Copied.")
    assert page.evaluate("navigator.clipboard.readText()") == key

    # The curl example for a booking: the real host, the token placeholder.
    page.locator('button[data-copy="curl-book"]').click()
    expect(page.locator("#curl-book-status")).to_have_text("Copied.")
    snippet = page.evaluate("navigator.clipboard.readText()")
    assert snippet.startswith(f"curl -s -X POST {base}/api/v1/bookings/")
    assert '-H "Authorization: Token $BERTH_TOKEN"' in snippet
    assert '"project": "vision"' in snippet
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-tokens.png"), full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke token").click()
    expect(page.locator("#token-state")).to_have_text("You have no API token.")
    assert not Token.objects.filter(user=member).exists()
    assert errors == [], errors
    context.close()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_pages_fit_a_phone(
    live_server: object, browser: Browser, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors = _console_errors(page)
    _forecast(nodes[0].cluster)
    _log_in(page, base, member)
    ARTIFACTS.mkdir(exist_ok=True)
    for path, name in (
        ("/", "dashboard"),
        ("/availability/", "availability"),
        ("/bookings/new/", "book"),
        ("/jobs/new/", "job-new"),
        ("/account/tokens/", "tokens"),
    ):
        page.goto(f"{base}{path}")
        expect(page.locator("h1")).to_be_visible()
        # Nothing makes the page wider than the phone: wide tables and code scroll in their own box.
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], path
        page.screenshot(path=str(ARTIFACTS / f"e2e-phone-{name}.png"), full_page=True)
    # Keyboard: the skip link is the first stop and takes focus to the content.
    page.goto(f"{base}/")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#main")).to_be_focused()
    assert errors == [], errors
    context.close()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_book_a_window_starting_now(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    page.set_default_timeout(10_000)
    errors = _console_errors(page)
    _log_in(page, base, member, "/bookings/new/")
    page.get_by_role("button", name="Start now").click()
    now = timezone.localtime()
    start = page.get_by_label("Start")
    expect(start).to_be_focused()
    assert abs(
        datetime.strptime(start.input_value(), "%Y-%m-%dT%H:%M").replace(tzinfo=now.tzinfo) - now
    ) < timedelta(minutes=2)
    expect(page.locator("#availability")).to_contain_text(f"{now:%H:%M}"[:4])
    page.get_by_role("button", name="Book", exact=True).click()
    expect(page.get_by_role("heading", name="My bookings")).to_be_visible()
    booking = Booking.objects.get(user=member)
    assert abs(booking.start_at - timezone.now()) < timedelta(minutes=2)
    page.get_by_role("link", name="Dashboard").click()
    expect(page.locator(f"#dash-booking-{booking.pk}")).to_contain_text("1 × A100")
    assert errors == [], errors


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_poll_after_the_session_ended_shows_the_login_page_not_a_page_in_a_page(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    _log_in(page, base, member)
    expect(page.locator("#dashboard-live")).to_be_visible()
    page.context.clear_cookies()  # the session ends (logged out elsewhere, or expired)
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"), timeout=12_000)
    expect(page.get_by_role("heading", name="Dashboard")).to_have_count(0)
    expect(page.get_by_label("Username")).to_be_visible()
