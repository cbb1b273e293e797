"""Done-when of the demo lab (issue 12), in real Chromium on a fresh demo-equivalent database:
without any scheduled task having run, the ops pages show the replayed history (utilization on
at least 14 past days, fairness shares, idle reasons), the capacity page a stored forecast band
for every GPU type with history, and the never-startable demo job its reason and no ETA in the
dashboard, the job list and the API.

The demo lab is built with `demo_lab_build` from the shipped trace samples (the real traces
may be absent here), exactly as ``make demo`` builds it before any worker starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from forecasting.models import ForecastRun
from scheduling.management.demo_lab import ADMIN_PASSWORD, RESEARCHER_PASSWORD, demo_lab_build
from scheduling.models import Cluster, EngineRound, Job

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
HISTORY_DAYS = 21


def _login(page: Page, base: str, username: str, password: str, next_url: str) -> None:
    page.goto(f"{base}/login/?next={next_url}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def _column(page: Page, table_id: str, header: str) -> list[str]:
    # text_content: the tables are folded under their charts (a user opens them to read numbers)
    headers = [h.strip() for h in page.locator(f"#{table_id} thead th").all_text_contents()]
    index = headers.index(header)
    return [
        (row.locator("th, td").nth(index).text_content() or "").strip()
        for row in page.locator(f"#{table_id} tbody tr").all()
    ]


NO_DATA = "–"  # a period before the first record: no data, which the page does not call 0


def _numbers(cells: list[str]) -> list[float | None]:
    """Cells as numbers, "–" as None; every "–" comes before the first number (no record yet)."""
    out = [None if v == NO_DATA else float(v) for v in cells]
    first = next((i for i, v in enumerate(out) if v is not None), len(out))
    assert all(v is not None for v in out[first:]), cells
    return out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_fresh_demo_lab_shows_its_history_forecasts_and_an_honest_unstartable_job(
    live_server: object, page: Page, settings: object
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # type: ignore[attr-defined]
    report = demo_lab_build(traces_dir=None, history_days=HISTORY_DAYS)
    cluster = Cluster.objects.get(name="demo")
    assert EngineRound.objects.filter(cluster=cluster, decisions__replayed=True).exists()
    base = str(live_server).rstrip("/")
    page.set_default_timeout(20_000)
    ARTIFACTS.mkdir(exist_ok=True)
    query = f"cluster={cluster.pk}&days=30&bucket=day"

    _login(page, base, "admin", ADMIN_PASSWORD, "/ops/")
    page.goto(f"{base}/ops/utilization/?{query}")
    utilization = [u or 0.0 for u in _numbers(_column(page, "table-utilization-by-type", "Utilization %"))]
    today = timezone.now().strftime("%Y-%m-%d")
    days = _column(page, "table-utilization-by-type", "Period")
    past = [u for d, u in zip(days, utilization, strict=True) if d != today]
    assert sum(1 for u in past if u > 0) >= 14, utilization

    page.goto(f"{base}/ops/fairness/?{query}")
    shares = page.locator("#table-fairness-summary tbody tr")
    assert shares.count() >= 3
    gpu_hours = [float(v) for v in _column(page, "table-fairness-summary", _column_name(page))]
    assert sum(1 for h in gpu_hours if h > 0) >= 3

    page.goto(f"{base}/ops/idle/?{query}")
    idle_headers = [h.strip() for h in page.locator("#table-idle-by-reason thead th").all_text_contents()]
    reasons = [h for h in idle_headers if h not in ("Period", "Details")]
    assert reasons
    periods = _column(page, "table-idle-by-reason", "Period")
    totals = [0.0] * len(periods)
    for reason in reasons:
        for i, v in enumerate(_numbers(_column(page, "table-idle-by-reason", reason))):
            totals[i] += v or 0.0
    assert sum(1 for d, t in zip(periods, totals, strict=True) if d != today and t > 0) >= 14

    page.goto(f"{base}/ops/capacity/?cluster={cluster.pk}")
    with_history = set(
        Job.objects.filter(cluster=cluster, started_at__isnull=False).values_list("gpu_type__name", flat=True)
    ) - {None}
    assert with_history
    for type_name in with_history:
        caption = page.locator(f"#h-forecast-{type_name}")
        expect(caption).to_contain_text("issued")
        expect(caption).not_to_contain_text("no forecast stored yet")
        assert ForecastRun.objects.filter(cluster=cluster, kind="gpu_type", key=type_name).exists()
    page.screenshot(path=str(ARTIFACTS / "e2e-demo-capacity.png"), full_page=True)

    # The never-startable demo job: katherine's non-preemptible 2 x V100M32 for a project that
    # may neither be guaranteed nor borrow V100M32 (`demo_lab.QUOTA_OVERRIDES`), if this
    # inventory has that type.
    job = Job.objects.filter(cluster=cluster, name="era5-emulator").first()
    if job is None:
        pytest.skip("this scaled inventory has no V100M32 (no never-startable demo job)")
    assert job.pending_reason == Job.PendingReason.QUOTA
    page.context.clear_cookies()
    _login(page, base, "katherine", RESEARCHER_PASSWORD, "/")
    row = page.locator("tr", has_text="era5-emulator").first
    expect(row).to_contain_text("Cannot start")
    expect(row).to_contain_text("borrowing limit")
    expect(row).not_to_contain_text("Likely start")
    expect(row).not_to_contain_text("Expected start")
    page.screenshot(path=str(ARTIFACTS / "e2e-demo-dashboard.png"), full_page=True)
    page.goto(f"{base}/jobs/")
    row = page.locator("tr", has_text="era5-emulator").first
    expect(row).to_contain_text("Cannot start")
    expect(row).not_to_contain_text("Likely start")
    api = page.request.get(f"{base}/api/v1/jobs/{job.pk}/")
    assert api.ok
    data = api.json()
    assert data["pending_reason"] == "quota"
    assert data["eta_p50_at"] is None
    assert data["eta_p90_at"] is None
    assert re.search(r"Cannot start: .*guaranteed 0", data["pending_sentence"])
    assert report.forecasts_created > 0
    assert User.objects.filter(username="katherine").exists()


def _column_name(page: Page) -> str:
    headers = [h.strip() for h in page.locator("#table-fairness-summary thead th").all_text_contents()]
    return next(h for h in headers if "GPU-h" in h or "GPU h" in h or "hours" in h.lower())
