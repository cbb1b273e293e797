"""Exit codes and the one error type every command raises.

The codes are a contract for scripts (documented in docs/cli.md and ``berth --help``):

* 0: done.
* 1: the command ran but the outcome is not what was asked (a waited-for job failed or was
  cancelled, or the wait timed out).
* 2: usage: bad flags or arguments, or input the server refused (400, 413).
* 3: conflict: the GPUs are taken (409); the server's nearest alternatives are printed.
* 4: not found or not allowed (404, 403) or not signed in (401).
* 5: the server is unavailable: cannot connect, time-out, 5xx or 429 (retry later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

import click

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3
EXIT_NOT_FOUND = 4
EXIT_UNAVAILABLE = 5


class BerthCliError(click.ClickException):
    """A failure with its exit code and, when the server answered, its JSON body."""

    def __init__(self, message: str, *, exit_code: int, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click reads it from the instance
        self.body = body or {}
        # Printed after the message (e.g. a 409's alternatives); set by whoever knows the context.
        self.after: Callable[[], None] | None = None

    def show(self, file: IO[Any] | None = None) -> None:
        super().show(file)
        if self.after is not None:
            self.after()
