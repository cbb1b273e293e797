"""``manage.py demo_lab``: build (or rebuild) the demo cluster, people and history."""

from __future__ import annotations

import time
from argparse import ArgumentParser, ArgumentTypeError
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scheduling.management.demo_lab import (
    DEFAULT_HISTORY_DAYS,
    DEFAULT_LOAD,
    DEFAULT_SCALE,
    DemoLabError,
    demo_lab_build,
    demo_lab_reset,
)


def _aware_datetime(raw: str) -> datetime:
    try:
        value = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ArgumentTypeError(f"not an ISO 8601 instant: {raw!r}") from exc
    if value.tzinfo is None:
        raise ArgumentTypeError("give a time zone (e.g. 2026-12-01T12:00:00+00:00)")
    return value


class Command(BaseCommand):
    help = (
        "Build the demo lab: a scaled-down real GPU inventory, demo users and projects with quotas, "
        "months of job history from a real trace, and a few upcoming bookings. Idempotent."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--scale",
            type=float,
            default=DEFAULT_SCALE,
            help=f"fraction of the real inventory's nodes to keep (default {DEFAULT_SCALE})",
        )
        parser.add_argument(
            "--history-days",
            type=int,
            default=DEFAULT_HISTORY_DAYS,
            help=f"days of job history ending now (default {DEFAULT_HISTORY_DAYS})",
        )
        parser.add_argument(
            "--traces",
            type=Path,
            default=None,
            help="directory with the real traces (default settings.TRACES_DIR; shipped samples if absent)",
        )
        parser.add_argument(
            "--load",
            type=float,
            default=DEFAULT_LOAD,
            help="offered load of the replayed history, GPU-hours asked / GPU-hours there (default: "
            "the trace's own load on its own machine, about 0.7; 0 takes the log's last weeks once)",
        )
        parser.add_argument("--reset", action="store_true", help="delete the demo lab first, then rebuild")
        parser.add_argument("--no-bookings", action="store_true", help="skip the upcoming demo bookings")
        parser.add_argument(
            "--forecasts",
            choices=("now", "queue", "skip"),
            default="now",
            help="fit the demand forecasts here ('now', the default), leave them to a Celery task "
            "queued for the worker ('queue': what `make demo` does; the pages say 'fitting' until it "
            "is done), or not at all ('skip')",
        )
        parser.add_argument("--no-forecasts", action="store_true", help="same as --forecasts skip")
        parser.add_argument(
            "--now",
            type=_aware_datetime,
            default=None,
            help="the instant the history ends at (ISO 8601 with a zone; default: the clock). A pinned "
            "value makes two builds identical (the tests use it).",
        )
        parser.add_argument("--no-queue", action="store_true", help="skip the queued demo jobs")
        parser.add_argument(
            "--allow-production",
            action="store_true",
            help="run even with DJANGO_ENV=production (the demo logins have printed passwords)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if getattr(settings, "IS_PRODUCTION", False) and not options["allow_production"]:
            raise CommandError("refusing to create demo logins in production; pass --allow-production")
        scale: float = options["scale"]
        if not 0 < scale <= 1:
            raise CommandError("--scale must be in (0, 1]")
        if options["load"] is not None and not 0 <= options["load"] <= 4:
            raise CommandError("--load must be in [0, 4]")
        if options["history_days"] < 0:
            raise CommandError("--history-days must be >= 0")
        traces_dir: Path | None = options["traces"] or getattr(settings, "TRACES_DIR", None)
        if options["traces"] is not None and not options["traces"].is_dir():
            raise CommandError(f"--traces {options['traces']}: no such directory")

        started = time.monotonic()
        if options["reset"]:
            demo_lab_reset()
            self.stdout.write("reset: removed the previous demo lab")
        try:
            report = demo_lab_build(
                traces_dir=Path(traces_dir) if traces_dir else None,
                scale=scale,
                history_days=options["history_days"],
                make_bookings=not options["no_bookings"],
                make_queue=not options["no_queue"],
                load=options["load"],
                make_forecasts="skip" if options["no_forecasts"] else options["forecasts"],
                now=options["now"],
                log=self.stdout.write,
            )
        except DemoLabError as exc:
            raise CommandError(str(exc)) from exc

        out = self.stdout.write
        out(f"Inventory from {report.inventory_source}")
        types = ", ".join(f"{name} {count}" for name, count in report.gpus_by_type.items())
        out(f"Cluster 'demo': {report.nodes} nodes, {report.gpus} GPUs ({types})")
        out(f"Projects: {report.projects}; users created now: {report.users_created}")
        span = ""
        if report.history_from and report.history_to:
            span = f" from {report.history_from:%Y-%m-%d %H:%M} to {report.history_to:%Y-%m-%d %H:%M} UTC"
        out(f"History from {report.history_source}")
        out(f"Jobs: {report.jobs_total} in the history{span} ({report.jobs_created} created now)")
        if report.replay_rounds:
            out(
                f"Replayed through the engine: {report.replay_rounds} rounds "
                f"in {report.replay_wall_s:.1f} s, {report.sessions_created} interactive sessions, "
                f"offered load {report.offered_load:.2f} (target {report.target_load:.2f}), "
                f"{report.arrival_compression:.2f} uses per trace job"
            )
        out(f"Upcoming bookings created now: {report.bookings_created}")
        out(f"Queued jobs created now: {report.queued_jobs_created}")
        out(f"Running at now: {report.running_at_now} jobs; pending at now: {report.pending_at_now}")
        if report.forecasts_queued:
            out("Demand forecasts: queued for the Celery worker (the pages say 'fitting' until done)")
        else:
            out(f"Demand forecasts stored now: {report.forecasts_created} ({report.forecast_s:.1f} s)")
        for reason in report.skipped:
            out(f"  skipped: {reason}")
        out(f"Done in {time.monotonic() - started:.1f} s")
        out("Logins (username / password):")
        for username, password, what in report.logins:
            out(f"  {username:<10} {password:<12} {what}")
