"""Reads for forecasting: demand series from the portal's history, stored forecasts, headroom.

Demand (DESIGN §6) is the hourly mean of GPUs running or queued: a job counts from its first
submission to its end (or to now while it is open), a booking for its whole window (until it
ended early or was cancelled; a booking cancelled before its start counts nothing).  Series
are built by ``forecasting.core.series.demand_from_jobs`` on a naive-UTC hourly index, as
Prophet wants it; stored forecasts are aware UTC datetimes.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from django.conf import settings
from django.db.models import Q, Sum

from forecasting.models import CapacityExceedRun, CapacityStudy, ForecastPoint, ForecastRun

# The runtime predictor's reads live in forecasting.runtime_selectors; this module was
# their home, so callers importing them from here keep working.
from forecasting.runtime_selectors import (
    FINISHED_STATUSES,
    RuntimeAccuracy,
    job_engine_request,
    runtime_accuracy_get,
    runtime_predict,
    runtime_predictor_forget,
    runtime_predictor_get,
)
from scheduling.inputs import headroom_gpus, interactive_pool
from scheduling.models import Allocation, Booking, Job, Node

__all__ = [
    "ANY_GPU_TYPE",
    "FINISHED_STATUSES",
    "HOUR",
    "TRACK_RECORD_MIN_HOURS",
    "DemandRecords",
    "ForecastBand",
    "ForecastTrackRecord",
    "RuntimeAccuracy",
    "SeriesKey",
    "capacity_exceed_run_get",
    "capacity_study_get",
    "capacity_study_list",
    "cluster_capacity_by_type",
    "demand_records_get",
    "demand_series_get",
    "forecast_band_get",
    "forecast_events",
    "forecast_points_list",
    "forecast_run_latest",
    "forecast_run_list",
    "forecast_track_record_list",
    "from_naive_utc",
    "hour_floor",
    "interactive_headroom_get",
    "interactive_headroom_policy",
    "interactive_pool_get",
    "job_engine_request",
    "runtime_accuracy_get",
    "runtime_predict",
    "runtime_predictor_forget",
    "runtime_predictor_get",
    "to_naive_utc",
]

HOUR = timedelta(hours=1)
ANY_GPU_TYPE = "any"  # jobs without a type that never ran, on a cluster of several types

SeriesKey = tuple[str, str]  # (ForecastRun.Kind, key)


def hour_floor(value: datetime) -> datetime:
    """The start of the UTC hour containing ``value`` (aware)."""
    return value.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def to_naive_utc(value: datetime) -> pd.Timestamp:
    return pd.Timestamp(value.astimezone(UTC).replace(tzinfo=None))


def from_naive_utc(value: pd.Timestamp) -> datetime:
    out: datetime = value.to_pydatetime().replace(tzinfo=UTC)
    return out


# ---- inventory ----


@functools.lru_cache(maxsize=4)
def _events(path: str) -> tuple[Any, ...]:
    from forecasting.core.events import events_from_json

    return tuple(events_from_json(path)) if path else ()


def forecast_events() -> tuple[Any, ...]:
    """The configured event calendar (``BERTH_FORECAST_EVENTS_FILE``), empty when unset."""
    return _events(str(settings.BERTH_FORECAST_EVENTS_FILE or ""))


def cluster_capacity_by_type(*, cluster_id: int) -> dict[str, int]:
    """GPUs per type on the cluster's nodes that are not down (draining nodes still count)."""
    rows = (
        Node.objects.filter(cluster_id=cluster_id)
        .exclude(status=Node.Status.DOWN)
        .values_list("gpu_type__name")
        .annotate(total=Sum("gpu_count"))
    )
    return {name: int(total) for name, total in rows}


def _cluster_type_names(*, cluster_id: int) -> list[str]:
    return sorted(set(Node.objects.filter(cluster_id=cluster_id).values_list("gpu_type__name", flat=True)))


# ---- demand history ----


@dataclass(frozen=True, slots=True)
class DemandRecords:
    """Job and booking intervals of one cluster in seconds from ``epoch`` (naive UTC)."""

    epoch: pd.Timestamp
    jobs: pd.DataFrame  # submit_time, start_time, end_time, num_gpus, gpu_type, project, kind
    bookings: pd.DataFrame  # start_time, end_time, num_gpus, gpu_type, project


def demand_records_get(*, cluster_id: int, start_at: datetime, end_at: datetime) -> DemandRecords:
    """Jobs and bookings of the cluster that overlap ``[start_at, end_at)``, clipped to it.

    A job without a GPU type gets the type of the GPUs it ran on, the cluster's only type,
    or ``"any"``.  Open work (no ``ended_at``) counts until ``end_at``.
    """
    epoch = to_naive_utc(start_at)
    span_s = (end_at - start_at).total_seconds()

    def rel(value: datetime | None, default: float) -> float:
        if value is None:
            return default
        return min(max((value - start_at).total_seconds(), 0.0), span_s)

    jobs = list(
        Job.objects.filter(cluster_id=cluster_id, submitted_at__lt=end_at)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start_at))
        .values_list(
            "id",
            "first_submitted_at",
            "submitted_at",
            "started_at",
            "ended_at",
            "gpu_count",
            "gpu_type__name",
            "project__slug",
            "kind",
        )
    )
    untyped = [row[0] for row in jobs if row[6] is None]
    ran_on: dict[int, str] = {}
    if untyped:
        ran_on = dict(
            Allocation.objects.filter(job_id__in=untyped)
            .order_by("job_id", "id")
            .values_list("job_id", "gpu__node__gpu_type__name")
            .distinct()
        )
    types = _cluster_type_names(cluster_id=cluster_id)
    fallback = types[0] if len(types) == 1 else ANY_GPU_TYPE
    job_rows: list[dict[str, Any]] = []
    for job_id, first, submitted, started, ended, gpus, type_name, slug, kind in jobs:
        begin, end = rel(first or submitted, 0.0), rel(ended, span_s)
        if end <= begin:
            continue
        job_rows.append(
            {
                "submit_time": begin,
                "start_time": rel(started, math.nan) if started else math.nan,
                "end_time": end,
                "num_gpus": float(gpus),
                "gpu_type": type_name or ran_on.get(job_id, fallback),
                "project": slug,
                "kind": kind,
            }
        )
    bookings = Booking.objects.filter(
        cluster_id=cluster_id, start_at__lt=end_at, end_at__gt=start_at
    ).values_list("start_at", "end_at", "ended_at", "gpu_count", "gpu_type__name", "project__slug")
    booking_rows = []
    for b_start, b_end, b_ended, gpus, type_name, slug in bookings:
        until: datetime = min(b_end, b_ended) if b_ended is not None else b_end
        begin, stop = rel(b_start, 0.0), rel(until, span_s)
        if stop > begin:  # a booking cancelled before its start wanted nothing
            booking_rows.append(
                {
                    "start_time": begin,
                    "end_time": stop,
                    "num_gpus": float(gpus),
                    "gpu_type": type_name,
                    "project": slug,
                }
            )
    job_cols = ["submit_time", "start_time", "end_time", "num_gpus", "gpu_type", "project", "kind"]
    booking_cols = ["start_time", "end_time", "num_gpus", "gpu_type", "project"]
    return DemandRecords(
        epoch=epoch,
        jobs=pd.DataFrame(job_rows, columns=job_cols),
        bookings=pd.DataFrame(booking_rows, columns=booking_cols),
    )


def _grouped_demand(
    jobs: pd.DataFrame, bookings: pd.DataFrame, *, epoch: pd.Timestamp, by: str
) -> dict[str, pd.Series]:
    from forecasting.core.series import demand_from_jobs

    if not len(jobs) and not len(bookings):
        return {}
    if not len(jobs):
        # demand_from_jobs wants a job table; an empty one with the right columns adds nothing.
        jobs = pd.DataFrame(
            {c: pd.Series(dtype=float) for c in ("submit_time", "start_time", "end_time", "num_gpus")}
        )
        jobs[by] = pd.Series(dtype=str)
    out = demand_from_jobs(jobs, epoch=epoch, by=(by,), bookings=bookings if len(bookings) else None)
    result = {key[0]: series for key, series in out.items() if key}
    result[""] = out[()]
    return result


def demand_series_get(
    *, cluster_id: int, end_at: datetime, history_days: int | None = None
) -> dict[SeriesKey, pd.Series]:
    """Hourly demand series of the cluster over the ``history_days`` before ``end_at``.

    ``end_at`` is rounded down to the hour: only complete hours are returned.  Keys:
    ``("gpu_type", name)`` and ``("gpu_type", "")`` (total) from all jobs and bookings,
    ``("project", slug)``, and ``("interactive", name)`` from bookings plus interactive
    jobs.  All series share one index, from the first hour with any record (at most
    ``history_days`` back) to the last complete hour; hours without work are 0.
    """
    days = settings.BERTH_FORECAST_HISTORY_DAYS if history_days is None else history_days
    end = hour_floor(end_at)
    start = end - timedelta(days=days)
    records = demand_records_get(cluster_id=cluster_id, start_at=start, end_at=end)
    jobs, bookings = records.jobs, records.bookings
    if not len(jobs) and not len(bookings):
        return {}
    first_s = min(
        float(jobs["submit_time"].min()) if len(jobs) else math.inf,
        float(bookings["start_time"].min()) if len(bookings) else math.inf,
    )
    first_hour = (records.epoch + pd.Timedelta(seconds=first_s)).floor("h")
    index = pd.date_range(first_hour, to_naive_utc(end) - pd.Timedelta(hours=1), freq="h")
    if not len(index):
        return {}
    out: dict[SeriesKey, pd.Series] = {}

    def add(kind: str, parts: dict[str, pd.Series], *, keep_total: bool) -> None:
        for key, series in sorted(parts.items()):
            if key == "" and not keep_total:
                continue
            s = series.reindex(index, fill_value=0.0).fillna(0.0).astype(float)
            s.name = f"{kind}:{key}"
            out[(kind, key)] = s

    epoch = records.epoch
    add(
        ForecastRun.Kind.GPU_TYPE,
        _grouped_demand(jobs, bookings, epoch=epoch, by="gpu_type"),
        keep_total=True,
    )
    add(
        ForecastRun.Kind.PROJECT, _grouped_demand(jobs, bookings, epoch=epoch, by="project"), keep_total=False
    )
    interactive_jobs = jobs[jobs["kind"] == Job.Kind.INTERACTIVE]
    add(
        ForecastRun.Kind.INTERACTIVE,
        _grouped_demand(interactive_jobs, bookings, epoch=epoch, by="gpu_type"),
        keep_total=False,
    )
    return out


# ---- stored forecasts ----


def forecast_run_latest(
    *, cluster_id: int, kind: str, key: str, at: datetime, model_name: str = "berth"
) -> ForecastRun | None:
    """The newest run of a series issued at or before ``at``."""
    return (
        ForecastRun.objects.filter(
            cluster_id=cluster_id, kind=kind, key=key, model_name=model_name, issued_at__lte=at
        )
        .order_by("-issued_at")
        .first()
    )


def forecast_run_list(
    *, cluster_id: int, at: datetime | None = None, model_name: str = "berth"
) -> list[ForecastRun]:
    """The newest run of every series of the cluster (issued at or before ``at``)."""
    qs = ForecastRun.objects.filter(cluster_id=cluster_id, model_name=model_name)
    if at is not None:
        qs = qs.filter(issued_at__lte=at)
    return list(qs.order_by("kind", "key", "-issued_at").distinct("kind", "key"))


def forecast_points_list(*, run: ForecastRun) -> list[ForecastPoint]:
    return list(ForecastPoint.objects.filter(run=run).order_by("ts"))


@dataclass(frozen=True, slots=True)
class ForecastBand:
    """What a capacity chart draws: recent actual demand, the forecast band and the capacity."""

    run: ForecastRun | None
    history: tuple[tuple[datetime, float], ...]  # (hour start, GPUs) before the run's issue time
    points: tuple[ForecastPoint, ...]
    capacity_gpus: int | None  # None for project series (no capacity of their own)


def forecast_band_get(
    *, cluster_id: int, kind: str, key: str, at: datetime, history_h: int = 72
) -> ForecastBand:
    """The newest stored forecast of a series at ``at`` with the ``history_h`` hours before it.

    For admin pages (capacity planning): callers check that the user is staff.
    """
    run = forecast_run_latest(cluster_id=cluster_id, kind=kind, key=key, at=at)
    end = run.issued_at if run is not None else hour_floor(at)
    series = demand_series_get(cluster_id=cluster_id, end_at=end, history_days=math.ceil(history_h / 24) + 1)
    actual = series.get((kind, key))
    history: tuple[tuple[datetime, float], ...] = ()
    if actual is not None:
        tail = actual.iloc[-history_h:]
        history = tuple((from_naive_utc(ts), float(v)) for ts, v in tail.items())
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    if kind == ForecastRun.Kind.PROJECT:
        total: int | None = None
    elif key == "":
        total = sum(capacity.values())
    else:
        total = capacity.get(key, 0)
    points = tuple(forecast_points_list(run=run)) if run is not None else ()
    return ForecastBand(run=run, history=history, points=points, capacity_gpus=total)


@dataclass(frozen=True, slots=True)
class ForecastTrackRecord:
    """How one series' stored forecasts did against what happened, over a rolling window.

    ``mase``: the model's mean absolute error over the 24 h seasonal naive's on the same
    hours (the naive forecast issued with each run): below 1 the forecast beats repeating
    the last day, and 1 is the naive itself.  ``coverage_80``: share of hours inside the
    80% band (0.8 when calibrated); ``coverage_upper_95``: share at or below the 95% upper
    bound (0.95 when calibrated; None when no point stored one).  Every stored point
    counts: an hour is scored once for each run (lead time) that forecast it.
    """

    kind: str
    key: str
    points: int  # scored (forecast hour, run) pairs
    hours: int  # distinct hours scored
    mae_gpus: float
    mase: float | None  # None: the naive's error is 0 or unknown over the window
    coverage_80: float
    coverage_upper_95: float | None

    @property
    def verdict(self) -> str:
        """One word for the page: ``too_new``, ``worse_than_naive``, ``band_off`` or ``trusted``."""
        if self.hours < TRACK_RECORD_MIN_HOURS:
            return "too_new"
        if self.mase is not None and self.mase >= 1.0:
            return "worse_than_naive"
        if not 0.65 <= self.coverage_80 <= 0.95:
            return "band_off"
        return "trusted"


TRACK_RECORD_MIN_HOURS = 24  # a day of scored hours before the page passes judgement


def forecast_track_record_list(
    *, cluster_id: int, now: datetime, days: int = 7, model_name: str = "berth"
) -> list[ForecastTrackRecord]:
    """The rolling track record of every series of the cluster over the ``days`` before
    ``now``: only hours whose actual is recorded count.  One aggregate query.

    For admin pages (capacity planning): callers check that the user is staff.
    """
    from django.db.models import Avg, Case, Count, F, FloatField, Value, When
    from django.db.models.functions import Abs

    end = hour_floor(now)
    scored = ForecastPoint.objects.filter(
        run__cluster_id=cluster_id,
        run__model_name=model_name,
        actual__isnull=False,
        ts__lt=end,
        ts__gte=end - timedelta(days=days),
    )
    has_naive = Q(naive24__isnull=False)
    rows = (
        scored.values("run__kind", "run__key")
        .annotate(
            points=Count("id"),
            hours=Count("ts", distinct=True),
            mae=Avg(Abs(F("yhat") - F("actual"))),
            mae_on_naive_hours=Avg(Abs(F("yhat") - F("actual")), filter=has_naive),
            naive_mae=Avg(Abs(F("naive24") - F("actual")), filter=has_naive),
            cov80=Avg(
                Case(
                    When(lower80__lte=F("actual"), upper80__gte=F("actual"), then=Value(1.0)),
                    default=Value(0.0),
                    output_field=FloatField(),
                )
            ),
            cov95=Avg(
                Case(
                    When(upper95__gte=F("actual"), then=Value(1.0)),
                    default=Value(0.0),
                    output_field=FloatField(),
                ),
                filter=Q(upper95__isnull=False),
            ),
        )
        .order_by("run__kind", "run__key")
    )
    out: list[ForecastTrackRecord] = []
    for row in rows:
        naive_mae = row["naive_mae"]
        mase = (
            float(row["mae_on_naive_hours"]) / float(naive_mae)
            if naive_mae is not None and naive_mae > 0 and row["mae_on_naive_hours"] is not None
            else None
        )
        out.append(
            ForecastTrackRecord(
                kind=row["run__kind"],
                key=row["run__key"],
                points=int(row["points"]),
                hours=int(row["hours"]),
                mae_gpus=float(row["mae"]),
                mase=mase,
                coverage_80=float(row["cov80"]),
                coverage_upper_95=None if row["cov95"] is None else float(row["cov95"]),
            )
        )
    return out


def capacity_study_get(*, study_id: int) -> CapacityStudy:
    """One what-if (raises ``CapacityStudy.DoesNotExist``); for the staff page that polls it."""
    return CapacityStudy.objects.select_related("cluster", "gpu_type", "requested_by").get(pk=study_id)


def capacity_study_list(*, cluster_id: int, limit: int = 20) -> list[CapacityStudy]:
    """A cluster's newest what-ifs first; for the staff capacity page (callers check staff)."""
    return list(
        CapacityStudy.objects.filter(cluster_id=cluster_id)
        .select_related("gpu_type", "requested_by")
        .order_by("-created_at")[:limit]
    )


def capacity_exceed_run_get(*, cluster_id: int, run_id: int | None = None) -> CapacityExceedRun | None:
    """The cluster's capacity-exceed run ``run_id`` (None if it is another cluster's or unknown),
    or without an id its newest; for the staff capacity page (callers check staff)."""
    runs = CapacityExceedRun.objects.filter(cluster_id=cluster_id).select_related("requested_by")
    return (
        runs.filter(pk=run_id).first() if run_id is not None else runs.order_by("-created_at", "-id").first()
    )


# ---- interactive headroom ----


def interactive_headroom_get(*, cluster_id: int, at: datetime) -> dict[str, int]:
    """GPUs per type to hold idle (lendable to preemptible work) for interactive demand at ``at``.

    Per GPU type of the cluster: the upper end of the 80% interval of the interactive-demand
    forecast over the hour starting at ``at`` (the newest stored run that covers it), rounded
    up, minus the GPUs that open bookings already hold in that hour (they are reserved through
    their own allocations), at least 0 and at most ``BERTH_HEADROOM_MAX_FRACTION`` of the
    type's capacity that bookings leave.  A type without a usable forecast gets 0.  Pass
    ``tuple(sorted(result.items()))`` as ``PolicyConfig.interactive_headroom``.
    """
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    if not capacity:
        return {}
    window_end = at + HOUR
    booked: Counter[str] = Counter()
    for type_name, gpus in Booking.objects.filter(
        cluster_id=cluster_id, status__in=Booking.OPEN_STATUSES, start_at__lt=window_end, end_at__gt=at
    ).values_list("gpu_type__name", "gpu_count"):
        booked[type_name] += gpus
    max_age = timedelta(hours=settings.BERTH_HEADROOM_MAX_FORECAST_AGE_H)
    runs = {
        run.key: run
        for run in ForecastRun.objects.filter(
            cluster_id=cluster_id,
            kind=ForecastRun.Kind.INTERACTIVE,
            key__in=list(capacity),
            model_name=settings.BERTH_FORECAST_MODEL,
            issued_at__lte=at,
            issued_at__gt=at - max_age,
        )
        .order_by("key", "-issued_at")
        .distinct("key")
    }
    upper: dict[int, float] = {}
    if runs:
        # Hours the window touches: the one containing ``at`` and, when ``at`` is not on the
        # hour, the next one.
        hours = [hour_floor(at)]
        if hours[0] < at:
            hours.append(hours[0] + HOUR)
        for run_id, value in ForecastPoint.objects.filter(
            run_id__in=[r.pk for r in runs.values()], ts__in=hours
        ).values_list("run_id", "upper80"):
            upper[run_id] = max(upper.get(run_id, 0.0), value)
    fraction = settings.BERTH_HEADROOM_MAX_FRACTION
    out: dict[str, int] = {}
    for type_name, total in sorted(capacity.items()):
        run = runs.get(type_name)
        out[type_name] = headroom_gpus(
            upper=upper[run.pk] if run is not None and run.pk in upper else None,
            booked=booked[type_name],
            capacity=total,
            max_fraction=fraction,
        )
    return out


def interactive_pool_get(
    *, cluster_id: int, at: datetime, hours: int = 24
) -> tuple[tuple[float, str, int], ...]:
    """``PolicyConfig.interactive_pool`` for the ``hours`` hours from the one containing ``at``.

    Per hour and GPU type, the upper end of the 80% interval of the newest stored interactive
    forecast issued at or before ``at`` (within ``BERTH_HEADROOM_MAX_FORECAST_AGE_H``), capped
    like the headroom (`scheduling.inputs.interactive_pool`); hour starts are epoch seconds.
    """
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    if not capacity:
        return ()
    max_age = timedelta(hours=settings.BERTH_HEADROOM_MAX_FORECAST_AGE_H)
    runs = {
        run.pk: run.key
        for run in ForecastRun.objects.filter(
            cluster_id=cluster_id,
            kind=ForecastRun.Kind.INTERACTIVE,
            key__in=list(capacity),
            model_name=settings.BERTH_FORECAST_MODEL,
            issued_at__lte=at,
            issued_at__gt=at - max_age,
        )
        .order_by("key", "-issued_at")
        .distinct("key")
    }
    first = hour_floor(at)
    by_hour: dict[float, dict[str, float]] = {}
    for run_id, ts, value in ForecastPoint.objects.filter(
        run_id__in=list(runs), ts__gte=first, ts__lt=first + HOUR * hours
    ).values_list("run_id", "ts", "upper80"):
        by_hour.setdefault(ts.timestamp(), {})[runs[run_id]] = value
    return interactive_pool(
        sorted(by_hour.items()), capacity=capacity, max_fraction=settings.BERTH_HEADROOM_MAX_FRACTION
    )


def interactive_headroom_policy(*, cluster_id: int, at: datetime) -> tuple[tuple[str, int], ...]:
    """`interactive_headroom_get` as ``PolicyConfig.interactive_headroom``: sorted, zeros left out."""
    return tuple(
        (name, gpus)
        for name, gpus in sorted(interactive_headroom_get(cluster_id=cluster_id, at=at).items())
        if gpus > 0
    )
