"""Browser tests drive the system Chromium through Playwright (no browser download here)."""

from __future__ import annotations

import os
from typing import Any

import pytest

# The Debian package; Playwright's own browser download is not available on this machine kind.
CHROMIUM = os.environ.get("BERTH_CHROMIUM", "/usr/bin/chromium")
# Quiet Chromium's background connections, which the sandbox refuses (notes/machine-setup.md §6).
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(autouse=True)
def _allow_orm_beside_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sync Playwright runs an event loop in the test thread, so Django's async-safety check
    # would refuse the test body's ORM calls; only for these tests (Django reads it per call).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}
