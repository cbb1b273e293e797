"""``berth book``, ``berth bookings``, ``berth extend``, ``berth end`` (and cancel via ``berth cancel``)."""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from typing import Any

import click
from rich.table import Table

from berth_cli.app import (
    DURATION,
    WHEN,
    api,
    console,
    default_project,
    json_option,
    print_json,
    usage_error,
)
from berth_cli.timefmt import api_time, duration_text, local_text, now_utc, parse_api_time, when_text

OPEN = "confirmed,active"


def _gpus_text(booking: dict[str, Any]) -> str:
    by_node: dict[str, list[str]] = {}
    for gpu in booking.get("gpus", []):
        by_node.setdefault(gpu["node"], []).append(str(gpu["index"]))
    return ", ".join(f"{node}:{','.join(indexes)}" for node, indexes in by_node.items()) or "-"


def show_booking(booking: dict[str, Any]) -> None:
    out = console()
    start, end = parse_api_time(booking["start_at"]), parse_api_time(booking["end_at"])
    length = duration_text((end - start).total_seconds()) if start and end else "-"
    out.print(
        f"Booking [bold]{booking['id']}[/] {booking['status']}: "
        f"{booking['gpu_count']}× {booking['gpu_type']} on {booking['cluster']} "
        f"for project {booking['project']}"
    )
    out.print(f"  from  {when_text(booking['start_at'])}")
    out.print(f"  until {when_text(booking['end_at'])}  ({length})")
    out.print(f"  GPUs  {_gpus_text(booking)}")
    if booking.get("note"):
        out.print(f"  note  {booking['note']}")


@click.command()
@click.option("--type", "-t", "gpu_type", required=True, help="GPU type, e.g. A100.")
@click.option("--gpus", "-n", "gpu_count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--at", "at", type=WHEN, help="Start: ISO 8601, '+2h', 'tomorrow 09:00' (default: now).")
@click.option("--hours", "length", type=DURATION, help="Length: 2h, 90m, 1.5 (hours). Default 1 h.")
@click.option("--until", "until", type=WHEN, help="End instead of --hours.")
@click.option("--project", "-p", help="Project slug (default: your only project).")
@click.option("--cluster", "-c", help="Cluster (default: any with free GPUs).")
@click.option("--note", default="", help="A note for the booking.")
@json_option
def book(
    gpu_type: str,
    gpu_count: int,
    at: datetime | None,
    length: timedelta | None,
    until: datetime | None,
    project: str | None,
    cluster: str | None,
    note: str,
    as_json: bool,
) -> None:
    """Book GPUs for an interactive window. If they are taken, prints the nearest free windows (exit 3)."""
    if length is not None and until is not None:
        raise usage_error("Give --hours or --until, not both.")
    start = (at or now_utc()).replace(microsecond=0)
    end = until or start + (length or timedelta(hours=1))
    slug = default_project(project)
    click.get_current_context().meta["berth.suggest"] = f"-p {slug} " + (
        f"--note {shlex.quote(note)} " if note else ""
    )
    body: dict[str, Any] = {
        "project": slug,
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "start_at": api_time(start),
        "end_at": api_time(end),
        "note": note,
    }
    if cluster:
        body["cluster"] = cluster
    booking = api().post("/bookings/", body)
    if as_json:
        print_json(booking)
    else:
        show_booking(booking)


@click.command()
@click.option(
    "--all", "show_all", is_flag=True, help="Also the bookings of projects you manage (staff: all)."
)
@click.option("--status", default=OPEN, show_default=True, help="Comma-separated statuses, or 'any'.")
@click.option("--project", "-p", help="Only this project.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@json_option
def bookings(show_all: bool, status: str, project: str | None, limit: int, as_json: bool) -> None:
    """Your bookings (open ones by default), soonest first."""
    params = {"mine": "false" if show_all else "true", "project": project}
    if status != "any":
        params["status"] = status
    rows = list(api().pages("/bookings/", limit=limit, **params))
    rows.sort(key=lambda b: b["start_at"])
    if as_json:
        print_json(rows)
        return
    if not rows:
        console().print("No bookings.")
        return
    table = Table("id", *(["user"] if show_all else []), "status", "gpus", "cluster", "start", "end", "held")
    for b in rows:
        table.add_row(
            str(b["id"]),
            *([b["user"]] if show_all else []),
            b["status"],
            f"{b['gpu_count']}× {b['gpu_type']}",
            b["cluster"],
            when_text(b["start_at"]),
            local_text(b["end_at"]),
            _gpus_text(b),
        )
    console().print(table)


@click.command()
@click.argument("booking_id", type=click.IntRange(min=1))
@click.option("--by", "by", type=DURATION, help="Extend by this much: 1h, 30m.")
@click.option("--until", "until", type=WHEN, help="New end time.")
@json_option
def extend(booking_id: int, by: timedelta | None, until: datetime | None, as_json: bool) -> None:
    """Move a booking's end later (exit 3 with the limit when the GPUs are taken after it)."""
    if (by is None) == (until is None):
        raise usage_error("Give exactly one of --by or --until.")
    if until is None:
        current = api().get(f"/bookings/{booking_id}/")
        end = parse_api_time(current["end_at"])
        assert end is not None
        assert by is not None
        until = end + by
    booking = api().post(f"/bookings/{booking_id}/extend/", {"end_at": api_time(until)})
    if as_json:
        print_json(booking)
    else:
        show_booking(booking)


@click.command()
@click.argument("booking_id", type=click.IntRange(min=1))
@json_option
def end(booking_id: int, as_json: bool) -> None:
    """End a running booking now (its GPUs are free again)."""
    booking = api().post(f"/bookings/{booking_id}/end/")
    if as_json:
        print_json(booking)
    else:
        show_booking(booking)


def show_access(access: dict[str, Any]) -> None:
    """How to get on a booking's GPUs, as the server words it for the cluster's backend."""
    out = console()
    out.print(access["summary"], highlight=False, markup=False, soft_wrap=True)
    for line in access.get("commands") or ():
        out.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    if access.get("template"):
        out.print("")
        out.print(access["template"], highlight=False, markup=False, soft_wrap=True)


@click.command("booking")
@click.argument("booking_id", type=click.IntRange(min=1))
@json_option
def booking_detail(booking_id: int, as_json: bool) -> None:
    """One booking and how to get on its GPUs (srun line, pod template) on its cluster."""
    booking = api().get(f"/bookings/{booking_id}/")
    access = api().get(f"/bookings/{booking_id}/access/")
    if as_json:
        print_json({**booking, "access": access})
        return
    show_booking(booking)
    console().print("")
    show_access(access)


def print_alternatives(body: dict[str, Any], out: Any, *, extra_flags: str = "") -> None:
    """The server's nearest free windows after a 409, with a command line for each."""
    alternatives = body.get("alternatives") or []
    if not alternatives:
        return
    table = Table("#", "cluster", "gpus", "start", "end", title="Nearest free windows")
    commands = []
    for number, alt in enumerate(alternatives, start=1):
        start, end_at = parse_api_time(alt["start_at"]), parse_api_time(alt["end_at"])
        hours = f"{(end_at - start).total_seconds() / 3600:g}h" if start and end_at else "1h"
        table.add_row(
            str(number),
            alt["cluster"],
            f"{alt['gpu_count']}× {alt['gpu_type']}",
            when_text(alt["start_at"]),
            local_text(alt["end_at"]),
        )
        commands.append(
            f"  {number}: berth book {extra_flags}-t {alt['gpu_type']} -n {alt['gpu_count']} "
            f"-c {alt['cluster']} --at {alt['start_at']} --hours {hours}"
        )
    out.print(table)
    out.print("Book one with:")
    for line in commands:
        out.print(line, soft_wrap=True)


def register(cli: click.Group) -> None:
    for command in (book, bookings, booking_detail, extend, end):
        cli.add_command(command)
