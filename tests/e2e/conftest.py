"""Browser tests drive the system Chromium through Playwright (no browser download here)."""

from __future__ import annotations

import os
from collections.abc import Iterator
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


@pytest.fixture(scope="session", autouse=True)
def _allow_orm_beside_playwright() -> Iterator[None]:
    """Let the test body and the database teardown use the ORM while Playwright runs.

    Sync Playwright keeps an event loop in the main thread from the first browser test to the
    end of the session, so Django's async-safety check would refuse ORM calls (including the
    database flush after each test).  Session scope: set before the first browser test's
    database fixtures and kept while that loop lives; tests that run before any browser test
    keep the check.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}
