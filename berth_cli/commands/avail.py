"""``berth avail``: free GPUs per type over a window, as the server counts them."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import click
from rich.table import Table

from berth_cli.app import WHEN, api, console, json_option, print_json, usage_error
from berth_cli.timefmt import api_time, local_text, now_utc


def _availability(
    gpu_type: str, start: datetime, end: datetime, step_s: int, cluster: str | None
) -> dict[str, Any]:
    result: dict[str, Any] = api().get(
        "/availability/",
        gpu_type=gpu_type,
        start=api_time(start),
        end=api_time(end),
        step=step_s,
        cluster=cluster,
    )
    return result


@click.command()
@click.option("--type", "-t", "gpu_type", help="GPU type (default: every type).")
@click.option("--at", "at", type=WHEN, help="Window start: ISO 8601, '+2h', 'tomorrow 09:00' (default: now).")
@click.option(
    "--hours", "hours", type=click.FloatRange(min=0.25, max=24 * 31), default=4.0, show_default=True
)
@click.option("--cluster", "-c", help="Only this cluster.")
@json_option
def avail(
    gpu_type: str | None, at: datetime | None, hours: float, cluster: str | None, as_json: bool
) -> None:
    """Free GPUs from --at for --hours: for the whole window (what a booking can get) and per hour."""
    start = (at or now_utc()).replace(second=0, microsecond=0)
    end = start + timedelta(hours=hours)
    window_s = max(1, math.ceil((end - start).total_seconds()))
    step_s = 3600 if hours >= 2 else 900
    types = [gpu_type] if gpu_type else [t["name"] for t in api().get("/gpu-types/")]
    if not types:
        raise usage_error("The server knows no GPU types yet.")
    rows = []
    for name in types:
        whole = _availability(name, start, end, window_s, cluster)
        steps = _availability(name, start, end, step_s, cluster)
        rows.append(
            {
                "gpu_type": name,
                "cluster": whole["cluster"],
                "capacity": whole["capacity"],
                "free_whole_window": whole["slots"][0]["free_gpus"] if whole["slots"] else 0,
                "start_at": api_time(start),
                "end_at": api_time(end),
                "step_s": step_s,
                "slots": steps["slots"],
            }
        )
    if as_json:
        print_json(rows)
        return
    out = console()
    out.print(f"Free GPUs {local_text(start)} → {local_text(end)}" + (f" on {cluster}" if cluster else ""))
    if gpu_type:
        row = rows[0]
        out.print(
            f"{row['gpu_type']}: {row['free_whole_window']} of {row['capacity']} free for the whole window"
        )
        has_bar = row["capacity"] <= 64  # one block per free GPU while that fits a line
        table = Table("from", "to", "free", *([""] if has_bar else []))
        for slot in row["slots"]:
            bar = ["█" * slot["free_gpus"]] if has_bar else []
            table.add_row(
                local_text(slot["start_at"]), local_text(slot["end_at"]), str(slot["free_gpus"]), *bar
            )
        out.print(table)
        return
    table = Table("type", "capacity", "free whole window", f"free per {step_s // 60} min (from start)")
    for row in rows:
        table.add_row(
            row["gpu_type"],
            str(row["capacity"]),
            str(row["free_whole_window"]),
            " ".join(str(slot["free_gpus"]) for slot in row["slots"]),
        )
    out.print(table)


def register(cli: click.Group) -> None:
    cli.add_command(avail)
