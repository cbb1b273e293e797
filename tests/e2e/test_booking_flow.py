"""In real Chromium: log in, watch availability update, book a window, see it, cancel it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import ConsoleMessage, Dialog, Page, expect

from portal.accounts.models import Project
from scheduling.models import Booking, GpuType, Job, Node
from scheduling.services import booking_create
from tests.e2e.console import record_console_error
from tests.factories import MembershipFactory

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_book_see_and_cancel_a_window(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node], soon: datetime
) -> None:
    base = str(live_server).rstrip("/")
    page.set_default_timeout(10_000)
    console_errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        # The form error below is a deliberate 422, which Chromium logs; anything else counts.
        if "status of 422" not in message.text:
            record_console_error(console_errors, message)

    page.on("console", on_console)

    # Log in: the booking form sends us to the login form first, and back after it.
    page.goto(f"{base}/bookings/new/")
    expect(page).to_have_url(f"{base}/login/?next=/bookings/new/")
    page.get_by_label("Username").fill(member.username)
    page.get_by_label("Password").fill("pw-not-secret")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Book a GPU window")).to_be_visible()

    # The availability box follows the form (htmx hx-get on change / keyup).
    availability = page.locator("#availability")
    page.get_by_label("Start").fill(soon.strftime("%Y-%m-%dT%H:%M"))
    # Typed key by key, as a person would: keyup (debounced 300 ms) asks again.
    gpus = page.get_by_label("GPUs", exact=True)
    gpus.fill("")
    gpus.press_sequentially("12")
    expect(availability).to_contain_text("Not enough: you asked for 12.")
    gpus.press("Backspace")
    gpus.press("Backspace")
    gpus.press_sequentially("3")
    expect(availability).to_contain_text("Enough: 3 GPUs can be booked")
    expect(availability.locator(".big-number")).to_contain_text("8")

    # A bad value comes back as a form error, with the keyboard focus on the field.
    gpus.fill("0")
    page.get_by_role("button", name="Book", exact=True).click()
    expect(page.locator("#id_gpu_count_error")).to_contain_text("greater than or equal to 1")
    expect(gpus).to_be_focused()
    gpus.fill("3")

    page.get_by_label("Note").fill("e2e: attention sweep")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-book.png"), full_page=True)
    page.get_by_role("button", name="Book", exact=True).click()

    # My bookings shows it, with a success message.
    expect(page.get_by_role("heading", name="My bookings")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("Booked 3 A100 GPU(s)")
    booking = Booking.objects.get(user=member)
    row = page.locator(f"#booking-row-{booking.pk}")
    expect(row).to_contain_text("3 × A100")
    expect(row).to_contain_text("e2e: attention sweep")
    expect(row).to_contain_text("Confirmed")
    page.screenshot(path=str(ARTIFACTS / "e2e-my-bookings.png"), full_page=True)

    # Cancel: confirm the dialog; the row is swapped in place.
    messages: list[str] = []

    def accept(dialog: Dialog) -> None:
        messages.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    row.get_by_role("button", name=f"Cancel booking {booking.pk}").click()
    expect(row).to_contain_text("Cancelled")
    expect(row.get_by_role("button")).to_have_count(0)
    assert messages
    assert messages[0].startswith(f"Cancel booking {booking.pk}")
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CANCELLED
    page.screenshot(path=str(ARTIFACTS / "e2e-cancelled.png"), full_page=True)
    # Nothing the pages do trips the Content-Security-Policy or throws.
    assert console_errors == []


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_submit_and_cancel_a_job(
    live_server: object, page: Page, member: User, project: Project, nodes: list[Node]
) -> None:
    base = str(live_server).rstrip("/")
    page.set_default_timeout(10_000)
    page.goto(f"{base}/login/?next=/jobs/new/")
    page.get_by_label("Username").fill(member.username)
    page.get_by_label("Password").fill("pw-not-secret")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()

    page.get_by_label("Name").fill("bert-pretrain")
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_label("BF16").check()
    page.get_by_label("Runtime estimate (hours)").fill("3")
    page.get_by_label("Preemptible").check()
    page.get_by_label("Command").fill("python pretrain.py --steps 10000")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-submit-job.png"), full_page=True)
    page.get_by_role("button", name="Submit", exact=True).click()

    expect(page.get_by_role("heading", name="My jobs")).to_be_visible()
    job = Job.objects.get(user=member)
    assert (job.gpu_count, job.requested_s, job.is_preemptible, job.precisions) == (2, 10_800, True, ["bf16"])
    row = page.locator(f"#job-row-{job.pk}")
    expect(row).to_contain_text("Pending")

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Cancel job bert-pretrain").click()
    expect(row).to_contain_text("Cancelled")
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_full_window_offers_the_next_free_one_in_one_click(
    live_server: object,
    page: Page,
    member: User,
    project: Project,
    nodes: list[Node],
    a100: GpuType,
    soon: datetime,
) -> None:
    other = MembershipFactory(project=project).user
    booking_create(
        other, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + timedelta(hours=3)
    )
    base = str(live_server).rstrip("/")
    page.set_default_timeout(10_000)
    page.goto(f"{base}/login/?next=/bookings/new/")
    page.get_by_label("Username").fill(member.username)
    page.get_by_label("Password").fill("pw-not-secret")
    page.get_by_role("button", name="Log in").click()

    page.get_by_label("Start").fill(soon.strftime("%Y-%m-%dT%H:%M"))
    availability = page.locator("#availability")
    expect(availability).to_contain_text("Not enough")
    expect(availability).to_contain_text("Nearest alternative")
    availability.get_by_role("button", name="Book this instead").click()

    expect(page.get_by_role("heading", name="My bookings")).to_be_visible()
    booking = Booking.objects.get(user=member)
    assert booking.start_at == soon + timedelta(hours=3)  # right after the full window
    assert booking.end_at - booking.start_at == timedelta(hours=2)
    expect(page.locator(f"#booking-row-{booking.pk}")).to_contain_text("Confirmed")
