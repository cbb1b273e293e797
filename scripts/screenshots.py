"""Regenerate the screenshots of every researcher and operations page of a running demo into
``docs/screenshots/`` (PNG, full page, 1366 px wide, the laptop width people use).

    scripts/demo.sh start                       # in one terminal (or: make demo)
    .venv/bin/python scripts/screenshots.py     # in another; BASE_URL=http://127.0.0.1:8010 for another port

Drives the system Chromium through Playwright, as the browser tests do (nothing is downloaded).
Signs in as the demo researcher ``katherine`` (her queue holds the demo's never-startable job)
and as ``admin`` for the operations pages, with the printed demo passwords.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
BASE = os.environ.get("BASE_URL", "http://127.0.0.1:8000").rstrip("/")
CHROMIUM = os.environ.get("BERTH_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]

RESEARCHER_PAGES = (
    ("dashboard", "/"),
    ("book", "/bookings/new/"),
    ("availability", "/availability/"),
    ("my-bookings", "/bookings/"),
    ("submit-job", "/jobs/new/"),
    ("my-jobs", "/jobs/"),
    ("api-tokens", "/account/tokens/"),
)
OPS_PAGES = (
    ("ops-home", "/ops/"),
    ("ops-utilization", "/ops/utilization/?days=30&bucket=day"),
    ("ops-fairness", "/ops/fairness/?days=30&bucket=day"),
    ("ops-idle", "/ops/idle/?days=30&bucket=day"),
    ("ops-capacity", "/ops/capacity/"),
    ("ops-quotas", "/ops/quotas/"),
    ("ops-policy", "/ops/policy/"),
    ("ops-audit", "/ops/audit/"),
)


def _login(page: Page, username: str, password: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{BASE}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state("networkidle")


OVERFLOWS: list[str] = []


def _snap(page: Page, name: str) -> Path:
    page.wait_for_load_state("networkidle")
    # charts are drawn after load (ops.js, availability.js); give them their frame
    page.wait_for_timeout(500)
    # Wider than the window: the page scrolls sideways and its right edge is cut in the picture.
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > page.viewport_size["width"]:  # type: ignore[index]
        OVERFLOWS.append(f"{name}: {width} px wide at {page.viewport_size['width']} px")  # type: ignore[index]
    # A table scrolling inside its box hides its last columns in the picture (and on a laptop).
    cut = page.evaluate(
        "[...document.querySelectorAll('.table-wrap')].filter(e => e.offsetParent !== null"
        " && e.scrollWidth > e.clientWidth + 1).map(e => (e.querySelector('table') || e).id || 'table')"
    )
    if cut:
        OVERFLOWS.append(f"{name}: tables wider than their box: {', '.join(cut)}")
    # The navigation on one line at laptop width (a wrapped header pushes every page down).
    header_h = page.evaluate("(document.querySelector('.site-header .inner') || {}).offsetHeight || 0")
    if header_h > 64:
        OVERFLOWS.append(f"{name}: the navigation wraps ({header_h} px tall)")
    target = OUT / f"{name}.png"
    page.screenshot(path=str(target), full_page=True)
    return target


def _shoot(page: Page, name: str, path: str) -> Path:
    page.goto(f"{BASE}{path}")
    return _snap(page, name)


def _shoot_link(page: Page, name: str, path: str, link: str) -> list[Path]:
    """Open ``path``, follow its first link named ``link`` (a job's page, a drill-down)."""
    page.goto(f"{BASE}{path}")
    page.wait_for_load_state("networkidle")
    target = page.get_by_role("link", name=link).first
    if not target.count():
        print(f"{name}: no link {link!r} on {path}", file=sys.stderr)
        return []
    target.click()
    return [_snap(page, name)]


def _shoot_whatif(page: Page, name: str) -> list[Path]:
    """Run a what-if from the capacity page with its default values, wait for the replay (a
    minute or two on a laptop), and shoot its own page (the permanent link)."""
    page.goto(f"{BASE}/ops/capacity/")
    page.wait_for_load_state("networkidle")
    page.get_by_role("button", name="Run what-if").click()
    status = page.locator("#whatif-status")
    timeout_ms = float(os.environ.get("WHATIF_TIMEOUT_MS", 300_000))
    try:
        status.get_by_text("Progress: done").wait_for(timeout=timeout_ms)
    except PlaywrightTimeoutError:  # a slow or failed replay is reported; the other shots stay
        print(f"{name}: the what-if did not finish: {status.text_content()!r}", file=sys.stderr)
    status.get_by_role("link", name="Permanent link to this what-if").click()
    return [_snap(page, name)]


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        _login(page, "katherine", "berth-demo")
        written += [_shoot(page, name, path) for name, path in RESEARCHER_PAGES]
        # her never-startable job: its reason and no ETA
        written += _shoot_link(page, "job-never-startable", "/jobs/", "era5-emulator")
        _login(page, "admin", "berth-admin")
        written += [_shoot(page, name, path) for name, path in OPS_PAGES]
        written += _shoot_link(page, "ops-idle-drill", "/ops/idle/?days=7&bucket=day", "Why idle")
        written += _shoot_whatif(page, "ops-whatif")
        browser.close()
    for path in written:
        print(path.relative_to(ROOT))
    for line in OVERFLOWS:
        print(f"overflows the window: {line}", file=sys.stderr)
    return 1 if OVERFLOWS else 0


if __name__ == "__main__":
    sys.exit(main())
