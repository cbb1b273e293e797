"""Shared pieces of the operations-page tests: the pages, a fixed past day, a finished job
holding one GPU, a day's range and CSV rows."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.postgres.fields.ranges import DateTimeTZRange

from ops.selectors import Range
from portal.accounts.models import Project
from scheduling.models import Allocation, Cluster, GpuType, Job, Node
from tests.factories import JobFactory

PAGES = [
    ("ops:home", {}),
    ("ops:utilization", {}),
    ("ops:fairness", {}),
    ("ops:idle", {}),
    ("ops:capacity", {}),
    ("ops:quotas", {}),
    ("ops:policy", {}),
    ("ops:audit", {}),
]

# A fixed past day, whole hours (UTC): the selectors get `now` after it.
DAY = datetime(2026, 11, 2, tzinfo=UTC)


def ran(
    job_project: Project,
    cluster: Cluster,
    gpu_type: GpuType,
    node: Node,
    start: datetime,
    hours: float,
    *,
    index: int = 0,
    kind: str = "batch",
    wait_s: float = 600.0,
) -> Job:
    """A finished job that held GPU ``index`` of ``node`` for ``hours`` from ``start``."""
    end = start + timedelta(hours=hours)
    job = JobFactory(
        project=job_project,
        cluster=cluster,
        gpu_type=gpu_type,
        kind=kind,
        status=Job.Status.COMPLETED,
        submitted_at=start - timedelta(seconds=wait_s),
        started_at=start,
        ended_at=end,
    )
    Allocation.objects.create(
        gpu=node.gpus.get(index=index),
        job=job,
        period=DateTimeTZRange(start, end, "[)"),
        state=Allocation.State.ENDED,
    )
    return job


def day_range() -> Range:
    return Range(start_at=DAY, end_at=DAY + timedelta(days=1), bucket="hour")


def csv_rows(response: Any) -> list[list[str]]:
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(response.content.decode())))
