"""Console errors a browser test must not see, one rule for every e2e test."""

from __future__ import annotations

from playwright.sync_api import ConsoleMessage


def record_console_error(errors: list[str], message: ConsoleMessage) -> None:
    """Append ``message`` to ``errors`` if it is an error the user could meet.

    Left out: htmx's report of a request the browser aborted because the page navigated away
    while it was in flight (a dashboard poll, say), which htmx logs as the pair
    ``htmx:afterRequest`` + ``htmx:sendAbort``.  Failed requests (``htmx:responseError``,
    ``htmx:sendError``) and script errors stay.
    """
    if message.type != "error":
        return
    if message.text.startswith("htmx:sendAbort"):
        if errors and errors[-1].startswith("htmx:afterRequest"):
            errors.pop()
        return
    errors.append(message.text)
