"""What every command shares: the root group, the API session, ``--json`` and output."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import click
from rich.console import Console

from berth_cli import __version__
from berth_cli.client import Api
from berth_cli.config import Settings, load_settings
from berth_cli.errors import EXIT_USAGE, BerthCliError
from berth_cli.timefmt import WhenError, parse_duration, parse_when

F = TypeVar("F", bound=Callable[..., Any])

EPILOG = """\b
Exit codes: 0 done; 1 the awaited outcome did not happen (job failed, wait timed out);
2 usage or input the server refused; 3 conflict (the GPUs are taken, alternatives printed);
4 not found, not allowed or not signed in; 5 server unavailable (retry later).
Environment: BERTH_URL and BERTH_TOKEN override the stored login; TZ sets the display zone."""


class State:
    """Per-invocation state on the click context: the server URL override and the session."""

    def __init__(self, url: str | None) -> None:
        self.url_override = url
        self._api: Api | None = None
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.url_override)
        return self._settings

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(self.settings.url, self.settings.token)
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()


class BerthGroup(click.Group):
    """The root group: prints ``BerthCliError`` as JSON on stdout when the command had --json."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BerthCliError as exc:
            if ctx.meta.get("berth.json"):
                click.echo(json.dumps({"error": {"message": exc.message, **exc.body}}, indent=2))
            elif exc.body.get("alternatives"):
                from berth_cli.commands.bookings import print_alternatives

                suggest = str(ctx.meta.get("berth.suggest", ""))
                body = exc.body
                exc.after = lambda: print_alternatives(body, err_console(), extra_flags=suggest)
            raise


@click.group(cls=BerthGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar=None, help="Berth server URL (default: BERTH_URL, then the stored login).")
@click.version_option(__version__, prog_name="berth")
@click.pass_context
def cli(ctx: click.Context, url: str | None) -> None:
    """Berth from the terminal: GPU availability, bookings, batch jobs and their queue."""
    state = State(url)
    ctx.obj = state
    ctx.call_on_close(state.close)


def json_option(func: F) -> F:
    """Add ``--json`` (print the API's JSON instead of tables) to a command."""

    @click.option("--json", "as_json", is_flag=True, help="Print JSON (the API's own data) for scripts.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, **kwargs: Any) -> Any:
        click.get_current_context().meta["berth.json"] = as_json
        return func(*args, as_json=as_json, **kwargs)

    return wrapper  # type: ignore[return-value]


def state() -> State:
    obj = click.get_current_context().find_root().obj
    assert isinstance(obj, State)
    return obj


def api() -> Api:
    return state().api


def console() -> Console:
    """Rich console on stdout (no colours or spinners when stdout is not a terminal)."""
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


class WhenType(click.ParamType[datetime]):
    """A WHEN flag: ISO 8601, ``now``, ``+2h``, ``today 18:00``, ``tomorrow 09:00``."""

    name = "WHEN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse_when(value)
        except WhenError as exc:
            self.fail(str(exc), param, ctx)


class DurationType(click.ParamType[timedelta]):
    """A DURATION flag: ``2h``, ``90m``, ``1h30m``; a bare number is hours."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            duration = parse_duration(value)
        except WhenError as exc:
            self.fail(str(exc), param, ctx)
        if duration.total_seconds() <= 0:
            self.fail("Give a positive duration.", param, ctx)
        return duration


WHEN = WhenType()
DURATION = DurationType()


def usage_error(message: str) -> BerthCliError:
    return BerthCliError(message, exit_code=EXIT_USAGE)


def default_project(project: str | None) -> str:
    """The ``--project`` flag, else the user's only project (several: ask which)."""
    if project:
        return project
    me = api().get("/me/")
    slugs = [m["project"] for m in me.get("memberships", [])]
    if len(slugs) == 1:
        return str(slugs[0])
    if not slugs:
        raise usage_error("You are in no project; ask a project manager to add you.")
    raise usage_error(f"You are in several projects; choose one with --project ({', '.join(slugs)}).")
