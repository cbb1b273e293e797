"""``manage.py forecast_refresh [--cluster ID ...] [--backtest] [--replace] [--at ISO]``: forecast now."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from forecasting.selectors import forecast_run_list, interactive_headroom_get
from forecasting.services import forecast_refresh
from scheduling.models import Cluster


class Command(BaseCommand):
    help = "Fit the shipped demand model on every series of the clusters and store the forecasts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", type=int, action="append", help="cluster id (default: all active)")
        parser.add_argument(
            "--backtest", action="store_true", help="also store rolling-origin backtest metrics"
        )
        parser.add_argument("--replace", action="store_true", help="refit series already stored this hour")
        parser.add_argument("--at", help="ISO datetime with offset to forecast from (default: now)")

    def handle(self, *args: Any, **options: Any) -> None:
        at: datetime | None = None
        if options["at"]:
            at = parse_datetime(options["at"])
            if at is None or at.tzinfo is None:
                raise CommandError(
                    "--at needs an ISO datetime with a UTC offset, e.g. 2026-11-30T10:00+00:00"
                )
        ids = options["cluster"] or list(
            Cluster.objects.filter(is_active=True).order_by("id").values_list("id", flat=True)
        )
        for cluster_id in ids:
            if not Cluster.objects.filter(pk=cluster_id).exists():
                raise CommandError(f"no cluster {cluster_id}")
            result = forecast_refresh(
                cluster_id=cluster_id, at=at, backtest=options["backtest"], replace=options["replace"]
            )
            self.stdout.write(
                f"cluster {cluster_id}: {result.created} runs stored, "
                f"{result.skipped} skipped, {result.failed} failed"
            )
            for run in forecast_run_list(cluster_id=cluster_id, at=at):
                mase = (run.metrics or {}).get(run.model_name, {}).get("mase")
                extra = f" mase={mase:.3f}" if isinstance(mase, float) else ""
                self.stdout.write(
                    f"  {run.kind}:{run.key or 'total'} issued {run.issued_at:%Y-%m-%d %H:%M} "
                    f"history {run.history_hours} h fit {run.fit_s:.2f} s{extra}"
                )
            headroom = interactive_headroom_get(cluster_id=cluster_id, at=at or timezone.now())
            self.stdout.write(f"  interactive headroom now: {headroom}")
