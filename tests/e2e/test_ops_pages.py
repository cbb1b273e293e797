"""In real Chromium: a staff user opens every operations page, drills into idle GPUs, edits a
quota and runs a what-if until its progress bar reaches 100%."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.db import connection
from django.utils import timezone
from playwright.sync_api import ConsoleMessage, Page, expect

from portal.accounts.models import Project, Quota
from scheduling.models import Allocation, AuditEvent, Cluster, EngineRound, GpuType, Job, Node
from tests.e2e.console import record_console_error
from tests.factories import JobFactory, QuotaFactory

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
# Elements outside a scrolling table box that reach past the right edge of the window.
WIDE_ELEMENTS_JS = """
Array.from(document.querySelectorAll("body *"))
  .filter((e) => !e.parentElement.closest(".table-wrap"))
  .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 8)
  .map((e) => `${e.tagName}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)
"""


def _history(cluster: Cluster, a100: GpuType, nodes: list[Node], project: Project) -> None:
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    for k in range(16):
        start = now - timedelta(hours=20 - k)
        job = JobFactory(
            project=project,
            cluster=cluster,
            gpu_type=a100,
            status=Job.Status.COMPLETED,
            submitted_at=start - timedelta(minutes=k),
            started_at=start,
            ended_at=start + timedelta(minutes=50),
            gpu_count=2,
        )
        for index in (0, 1):
            Allocation.objects.create(
                gpu=nodes[k % 2].gpus.get(index=index + 2 * (k % 2)),
                job=job,
                period=DateTimeTZRange(start, start + timedelta(minutes=50), "[)"),
                state=Allocation.State.ENDED,
            )
        EngineRound.objects.create(
            cluster=cluster, started_at=start, decisions={"idle": {"no_demand": 4, "fragmentation": 2}}
        )
    JobFactory(
        project=project,
        cluster=cluster,
        name="stuck-8gpu",
        gpu_count=8,
        submitted_at=now - timedelta(hours=3),
        pending_reason="fragmentation",
    )


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_staff_opens_every_ops_page_and_runs_a_whatif(
    live_server: object,
    page: Page,
    staff: User,
    cluster: Cluster,
    a100: GpuType,
    nodes: list[Node],
    project: Project,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from forecasting import services, tasks

    _history(cluster, a100, nodes, project)
    quota = QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2, borrow_limit_gpus=2)
    workers: list[threading.Thread] = []

    def run_in_thread(study_id: int) -> None:
        # No Celery worker in this test: run the task's function in a thread, as a worker would.
        def work() -> None:
            try:
                services.capacity_study_execute(study_id=study_id)
            finally:
                connection.close()

        worker = threading.Thread(target=work, daemon=True)
        workers.append(worker)
        worker.start()

    monkeypatch.setattr(tasks.capacity_study_run, "delay", run_in_thread)

    base = str(live_server).rstrip("/")
    page.set_default_timeout(20_000)
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        record_console_error(errors, message)

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{base}/login/?next=/ops/")
    page.get_by_label("Username").fill(staff.username)
    page.get_by_label("Password").fill("pw-not-secret")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Operations", exact=True)).to_be_visible()

    _utilization_fairness_idle(page, base, cluster=cluster, project=project)

    _capacity_and_whatif(page)

    _quotas_policy_audit(page, project=project, quota=quota)

    _narrow_screens(page, base)

    for worker in workers:
        worker.join(timeout=30)
    assert errors == []


def _utilization_fairness_idle(page: Page, base: str, *, cluster: Cluster, project: Project) -> None:
    # Utilization: charts drawn by ops.js (Chart.js from static/), the same numbers in tables.
    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Utilization").click()
    expect(page.get_by_role("heading", name="Utilization", exact=True)).to_be_visible()
    page.locator("#id_bucket").select_option("hour")  # htmx swaps the report in place
    expect(page).to_have_url(f"{base}/ops/utilization/?cluster={cluster.pk}&days=7&bucket=hour")
    expect(page.locator('canvas[data-chart="chart-utilization-by-type"][data-drawn="true"]')).to_have_count(1)
    expect(page.locator("#table-node-heatmap tbody tr")).to_have_count(2)
    expect(page.get_by_role("link", name="Download CSV of Busy GPU-hours by GPU type")).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-utilization.png"), full_page=True)

    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Fairness").click()
    expect(page.locator('canvas[data-chart="chart-fairness-jain"][data-drawn="true"]')).to_have_count(1)
    expect(page.locator("#table-fairness-summary")).to_contain_text(project.slug)
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-fairness.png"), full_page=True)

    # Idle GPUs: drill into a period with the keyboard; the focus lands on the details.
    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Idle GPUs").click()
    page.locator("#id_bucket").select_option("hour")
    expect(page.locator('canvas[data-chart="chart-idle-by-reason"][data-drawn="true"]')).to_have_count(1)
    expect(page).to_have_url(f"{base}/ops/idle/?cluster={cluster.pk}&days=7&bucket=hour")
    period = (timezone.now() - timedelta(hours=5)).strftime("%Y-%m-%d %H:00")
    drill_link = page.get_by_role("link", name=f"Why idle in {period}")
    drill_link.focus()
    page.keyboard.press("Enter")
    drill = page.locator("#idle-drill")
    expect(drill).to_contain_text("Fragmented")  # the reason's label, not the engine's key
    expect(drill).to_be_focused()
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-idle.png"), full_page=True)


def _capacity_and_whatif(page: Page) -> None:
    # Capacity: bands per GPU type, then a what-if with 8 more A100s.
    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Capacity").click()
    table = page.locator("#table-forecast-A100")
    expect(table).to_be_hidden()  # folded under its chart
    page.locator("details.ops-numbers", has=table).locator("summary").click()
    expect(table).to_be_visible()
    page.get_by_label("Add (+) or remove (-) GPUs").fill("8")
    page.get_by_label("History replayed (days)").fill("2")
    page.get_by_role("button", name="Run what-if").click()
    progress = page.locator("#whatif-status progress")
    expect(progress).to_have_attribute("value", "100", timeout=60_000)
    expect(page.locator("#whatif-status")).to_contain_text("Wait p95 (min)")
    expect(page.locator("#table-whatif")).to_contain_text("16")
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-whatif.png"), full_page=True)


def _quotas_policy_audit(page: Page, *, project: Project, quota: Quota) -> None:
    # Quotas: an edit saves in place and lands in the audit log.
    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Quotas").click()
    page.get_by_label(f"Guaranteed A100 GPUs for {project.name}").fill("3")
    page.get_by_role("button", name=f"Save quota of {project.name} for A100").click()
    expect(page.locator(f"#quota-row-{quota.pk}")).to_contain_text("Saved")
    assert AuditEvent.objects.filter(verb="quota.update", entity_id=quota.pk).count() == 1

    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Policy").click()
    expect(page.locator("#id_name")).to_have_value("berth")
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-policy.png"), full_page=True)

    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Audit log").click()
    page.get_by_label("Verb starts with").fill("quota.")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#audit-list tbody tr")).to_have_count(1)
    expect(page.locator("#audit-list")).to_contain_text("quota.update")
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-audit.png"), full_page=True)


def _narrow_screens(page: Page, base: str) -> None:
    # Narrow screens: the pages reflow; wide tables scroll inside their own box, not the page.
    page.set_viewport_size({"width": 390, "height": 844})
    for path in ("/ops/utilization/", "/ops/fairness/", "/ops/capacity/", "/ops/quotas/", "/ops/audit/"):
        page.goto(f"{base}{path}")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        culprits = page.evaluate(WIDE_ELEMENTS_JS)
        assert overflow <= 1, f"{path} scrolls sideways by {overflow}px: {culprits}"
    page.goto(f"{base}/ops/utilization/")
    page.screenshot(path=str(ARTIFACTS / "e2e-ops-utilization-narrow.png"), full_page=False)
