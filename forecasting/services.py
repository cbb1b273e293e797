"""Writes for forecasting: stored demand forecasts, runtime predictions on jobs, what-ifs (capacity
studies) and capacity-exceed runs (their rows and queued tasks here, their execution on a worker
in `forecasting.capacity.runs`).

Fits and replays are slow compared with a transaction, so they run first and only the
storing is atomic.  One run per series, model and hour is enforced by a unique constraint:
a second refresh in the same hour skips what is there (or, with ``replace``, swaps it).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from forecasting.capacity.replay import replay_nodes
from forecasting.capacity.runs import (  # the tasks' half (run on a worker), re-exported
    capacity_exceed_run_execute as capacity_exceed_run_execute,
)
from forecasting.capacity.runs import (
    capacity_study_execute as capacity_study_execute,
)
from forecasting.models import CapacityExceedRun, CapacityStudy, ForecastPoint, ForecastRun
from forecasting.queue import task_queue
from forecasting.selectors import (
    cluster_capacity_by_type,
    demand_series_get,
    forecast_events,
    from_naive_utc,
    hour_floor,
    job_engine_request,
    runtime_predict,
)
from portal.accounts.models import Project
from scheduling.models import Cluster, GpuType, Job

logger = logging.getLogger(__name__)


# ---- demand forecasts ----


def model_version(model: Any) -> str:
    """A short hash of the model's configuration: changes when the shipped defaults change."""
    config = getattr(model, "config", None)
    text = repr(config) if config is not None else type(model).__name__
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class RefreshResult:
    created: int
    skipped: int  # already stored for this hour, or no demand to learn from
    failed: int
    run_ids: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "skipped": self.skipped,
            "failed": self.failed,
            "run_ids": list(self.run_ids),
        }


def _backtest_metrics(y: pd.Series, *, model_name: str, events: Sequence[Any]) -> dict[str, Any] | None:
    from forecasting.core.backtest import backtest
    from forecasting.core.models import make_model

    try:
        results = backtest(
            y,
            [lambda: make_model(model_name, events=events), lambda: make_model("seasonal_naive_24")],
            days=settings.BERTH_FORECAST_BACKTEST_DAYS,
            horizon_h=24,
        )
    except ValueError:
        return None  # too short for a backtest
    return {
        r.model: {k: (None if not math.isfinite(v) else v) for k, v in r.as_dict().items()} for r in results
    }


def forecast_ceiling(*, kind: str, key: str, capacity_by_type: dict[str, int]) -> float | None:
    """The most GPUs a series can physically reach, or None when it has no such bound.

    Interactive demand on a GPU type runs on that type's pool (sessions and bookings are
    admitted against it): its capacity bounds the forecast.  GPU-type and project demand
    count queued work too, which has no physical bound (the model caps those at a
    multiple of their history's maximum instead).
    """
    if kind == ForecastRun.Kind.INTERACTIVE and key:
        capacity = capacity_by_type.get(key)
        return float(capacity) if capacity else None
    return None


@dataclass(frozen=True, slots=True)
class _SeriesFit:
    model: Any
    forecast: Any  # forecasting.core.models.Forecast, bounded
    fit_s: float
    metrics: dict[str, Any] | None


def _fit_series(
    y: pd.Series, *, name: str, events: Sequence[Any], horizon_h: int, ceiling: float | None, backtest: bool
) -> _SeriesFit:
    """Fit the model on one series and bound its forecast (see :func:`forecast_ceiling`)."""
    from forecasting.core.models import make_model

    started = time.perf_counter()
    model = make_model(name, events=events)
    fc = model.fit(y).forecast(horizon_h)
    # Demand is never negative, a pool never runs more than it holds, and the interval
    # always contains the point (a DB check).
    fc = fc.bounded(ceiling)
    fit_s = time.perf_counter() - started
    metrics = _backtest_metrics(y, model_name=name, events=events) if backtest else None
    return _SeriesFit(model=model, forecast=fc, fit_s=fit_s, metrics=metrics)


def _run_store(
    *,
    run_fields: dict[str, Any],
    fitted: _SeriesFit,
    y: pd.Series,
    replace: bool,
    type_ids: dict[str, int],
    project_ids: dict[str, int],
) -> ForecastRun:
    """Store one run and its points atomically (raises IntegrityError on a duplicate hour)."""
    fc = fitted.forecast
    kind, key, issued = run_fields["kind"], run_fields["key"], run_fields["issued_at"]
    upper95 = fc.upper_95_or_upper
    naive = seasonal_naive_24(y, horizon_h=len(fc.point))
    with transaction.atomic():
        if replace:
            ForecastRun.objects.filter(**run_fields).delete()
        run = ForecastRun.objects.create(
            **run_fields,
            gpu_type_id=type_ids.get(key) if kind != ForecastRun.Kind.PROJECT else None,
            project_id=project_ids.get(key) if kind == ForecastRun.Kind.PROJECT else None,
            model_version=model_version(fitted.model),
            train_start_at=from_naive_utc(y.index[0]),
            train_end_at=issued,
            horizon_h=len(fc.point),
            history_hours=len(y),
            fit_s=fitted.fit_s,
            metrics=fitted.metrics,
            flag=fc.flag or "",
        )
        ForecastPoint.objects.bulk_create(
            ForecastPoint(
                run=run,
                ts=from_naive_utc(ts),
                yhat=float(p),
                lower80=float(lo),
                upper80=float(hi),
                upper95=float(hi95),
                naive24=nv,
            )
            for ts, p, lo, hi, hi95, nv in zip(
                fc.index, fc.point, fc.lower, fc.upper, upper95, naive, strict=True
            )
        )
    return run


def forecast_refresh(
    *,
    cluster_id: int,
    at: datetime | None = None,
    backtest: bool = False,
    replace: bool = False,
    model_name: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> RefreshResult:
    """Fit the shipped model on every demand series of the cluster and store runs and points.

    The run is issued at the start of the hour containing ``at`` (default now) and trained on
    the complete hours before it.  Series without any demand are skipped (nothing to learn;
    the headroom treats a missing forecast as 0).  A series already stored for this hour is
    skipped unless ``replace`` (the nightly refit, which also stores backtest metrics:
    MASE, sMAPE and 80% coverage against the 24 h seasonal naive).  Every forecast is
    clipped to ``[0, forecast_ceiling]``; a series with too few non-zero hours to model is
    stored with ``flag="no_signal"``.
    """
    now = at or timezone.now()
    issued = hour_floor(now)
    name = model_name or settings.BERTH_FORECAST_MODEL
    horizon_h = settings.BERTH_FORECAST_HORIZON_H
    events = forecast_events()
    series = demand_series_get(cluster_id=cluster_id, end_at=issued)
    stored = set(
        ForecastRun.objects.filter(cluster_id=cluster_id, model_name=name, issued_at=issued).values_list(
            "kind", "key"
        )
    )
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    ids = {"type_ids": dict(GpuType.objects.values_list("name", "id"))}
    ids["project_ids"] = dict(Project.objects.values_list("slug", "id"))
    created: list[int] = []
    skipped = failed = 0
    total = len(series)
    for done, ((kind, key), y) in enumerate(series.items()):
        if progress is not None:
            progress(done, total, f"{kind}:{key}")
        if ((kind, key) in stored and not replace) or not bool(np.any(y.to_numpy() > 0)):
            skipped += 1
            continue
        ceiling = forecast_ceiling(kind=kind, key=key, capacity_by_type=capacity)
        try:
            fitted = _fit_series(
                y, name=name, events=events, horizon_h=horizon_h, ceiling=ceiling, backtest=backtest
            )
        except Exception:
            # One bad series must not cost the cluster its other forecasts.
            logger.exception("forecast fit failed: cluster=%s %s:%s", cluster_id, kind, key)
            failed += 1
            continue
        run_fields = {
            "cluster_id": cluster_id,
            "kind": kind,
            "key": key,
            "model_name": name,
            "issued_at": issued,
        }
        try:
            run = _run_store(run_fields=run_fields, fitted=fitted, y=y, replace=replace, **ids)
        except IntegrityError:
            # A concurrent refresh stored this series for this hour first: that is the same answer.
            skipped += 1
            continue
        created.append(run.pk)
    if progress is not None:
        progress(total, total, "")
    return RefreshResult(created=len(created), skipped=skipped, failed=failed, run_ids=tuple(created))


def seasonal_naive_24(y: pd.Series, *, horizon_h: int) -> list[float | None]:
    """The 24 h seasonal naive's forecast of the ``horizon_h`` hours after ``y`` ends.

    Hour ``h`` (1-based) repeats the value ``24 * ceil(h / 24)`` hours earlier: the same
    hour of the last day the history covers.  None where that hour is before ``y`` starts or
    unknown (NaN).  This is the yardstick of the track record: MASE scales by its error.
    """
    values = y.to_numpy(dtype=float)
    n = len(values)
    out: list[float | None] = []
    for h in range(1, horizon_h + 1):
        i = n + h - 1 - 24 * math.ceil(h / 24)
        out.append(float(values[i]) if 0 <= i < n and math.isfinite(values[i]) else None)
    return out


def forecast_actuals_record(*, cluster_id: int, now: datetime | None = None) -> int:
    """Record the actual demand on every stored forecast hour of the cluster that is over.

    Looks at hours that ended before the current hour began and still have no actual, back
    to the retention cutoff (older runs are pruned anyway).  The actual is the same hourly
    demand the forecasts were fitted on (``demand_series_get``: running + queued + booked
    GPUs, hourly mean); an hour without any recorded work is 0.  Idempotent: an hour gets
    its actual once, and a second call finds nothing to do.  Returns the points updated.
    """
    end = hour_floor(now or timezone.now())
    cutoff = forecast_retention_cutoff(now=end)
    waiting = list(
        ForecastPoint.objects.filter(
            run__cluster_id=cluster_id, actual__isnull=True, ts__lt=end, ts__gte=cutoff
        ).values_list("id", "ts", "run__kind", "run__key")
    )
    if not waiting:
        return 0
    first = min(ts for _, ts, _, _ in waiting)
    days = max(1, math.ceil((end - first).total_seconds() / 86400))
    series = demand_series_get(cluster_id=cluster_id, end_at=end, history_days=days)
    updates: list[ForecastPoint] = []
    for point_id, ts, kind, key in waiting:
        y = series.get((kind, key))
        value = 0.0
        if y is not None:
            got = y.get(pd.Timestamp(ts.astimezone(UTC).replace(tzinfo=None)))
            value = float(got) if got is not None and math.isfinite(float(got)) else 0.0
        updates.append(ForecastPoint(id=point_id, actual=value))
    with transaction.atomic():
        # Only points still waiting: a concurrent call that got there first keeps its value.
        ids = set(
            ForecastPoint.objects.select_for_update()
            .filter(id__in=[p.id for p in updates], actual__isnull=True)
            .values_list("id", flat=True)
        )
        todo = [p for p in updates if p.id in ids]
        ForecastPoint.objects.bulk_update(todo, ["actual"], batch_size=2000)
    return len(todo)


def forecast_runs_prune(*, before: datetime) -> int:
    """Delete runs (and their points) issued before ``before``; returns the runs deleted."""
    with transaction.atomic():
        _, per_model = ForecastRun.objects.filter(issued_at__lt=before).delete()
    return int(per_model.get(ForecastRun._meta.label, 0))


# ---- runtime predictions ----


def _request_for(job: Job) -> Any:
    return job_engine_request(
        job_id=job.pk,
        username=job.user.username,
        project_slug=job.project.slug,
        name=job.name,
        gpu_count=job.gpu_count,
        submitted_at=job.first_submitted_at or job.submitted_at,
        requested_s=job.requested_s,
        kind=job.kind,
        gpu_type=job.gpu_type.name if job.gpu_type_id and job.gpu_type else None,
    )


def job_runtime_predict(*, job: Job) -> tuple[float, float]:
    """Predict ``job``'s runtime (p50_s, p90_s) and store it on the job.

    From the cluster's finished jobs (`runtime_predictor_get`: cached per process and fed
    only the newly finished jobs after a minute): the predictor pools the user's own history
    with the project's and everyone's, so a new user falls back to the project and a new
    project to the whole cluster; with no history at all the answer is the requested time (or
    an hour).  Both are capped at the requested time.  About a millisecond once the process
    has built its predictor; the first call in a process builds it (about 0.25 ms per finished
    job), which is why ``job_submit`` may prefer the ``job_runtime_predict`` task after commit.
    """
    [(p50, p90)] = runtime_predict(cluster_id=job.cluster_id, requests=[_request_for(job)])
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(predicted_p50_s=p50, predicted_p90_s=p90)
    job.predicted_p50_s, job.predicted_p90_s = p50, p90
    return p50, p90


def jobs_runtime_predict(*, cluster_id: int, only_missing: bool = False) -> int:
    """Predict and store the runtimes of the cluster's pending jobs; with ``only_missing``
    only of those without a stored prediction (the hourly task: `tasks.jobs_runtime_predict`)."""
    jobs = Job.objects.filter(cluster_id=cluster_id, status=Job.Status.PENDING).select_related(
        "gpu_type", "user", "project"
    )
    if only_missing:
        jobs = jobs.filter(predicted_p50_s__isnull=True)
    todo = list(jobs.order_by("id"))
    if not todo:
        return 0
    predictions = runtime_predict(cluster_id=cluster_id, requests=[_request_for(job) for job in todo])
    for job, (p50, p90) in zip(todo, predictions, strict=True):
        job.predicted_p50_s, job.predicted_p90_s = p50, p90
    with transaction.atomic():
        Job.objects.bulk_update(todo, ["predicted_p50_s", "predicted_p90_s"], batch_size=500)
    return len(todo)


# ---- what-ifs (capacity studies) ----


def capacity_study_create(
    *,
    cluster: Cluster,
    gpu_type: str,
    gpu_delta: int,
    policy: str,
    history_days: int = 14,
    requested_by: Any = None,
    enqueue: bool = True,
) -> CapacityStudy:
    """Queue a what-if: the finished ``gpu_type`` jobs of the last ``history_days`` days replayed
    as ``cluster`` is and with ``gpu_delta`` GPUs more (whole nodes of its usual size) under
    ``policy``.

    Refusals are field errors: a type the cluster lacks, less than one node left, a change
    that rounds to the cluster as it is, an unknown policy, history outside 1-90 days.  The
    task ``forecasting.tasks.capacity_study_run`` runs it after the commit.
    """
    from forecasting.capacity import gpus_per_node, policy_name
    from scheduling.engine import POLICIES

    errors: dict[str, str] = {}
    current = cluster_capacity_by_type(cluster_id=cluster.pk).get(gpu_type)
    per_node = gpus_per_node(cluster_id=cluster.pk, gpu_type=gpu_type)
    baseline_policy = policy_name(cluster_id=cluster.pk)
    if current is None:
        errors["gpu_type"] = f"{cluster.name} has no {gpu_type} GPUs."
    elif current + gpu_delta < per_node:
        errors["gpu_delta"] = f"Keep at least one node ({per_node} GPUs); {cluster.name} has {current}."
    elif policy == baseline_policy and replay_nodes(current + gpu_delta, per_node) == replay_nodes(
        current, per_node
    ):
        errors["gpu_delta"] = (
            f"{gpu_delta:+d} GPUs rounds to the {replay_nodes(current, per_node)} nodes of {per_node} GPUs "
            f"the cluster has, with its own policy: change by a whole node or choose another policy."
        )
    if policy not in POLICIES:
        errors["policy"] = f"Choose one of {', '.join(POLICIES)}."
    if not 1 <= history_days <= 90:
        errors["history_days"] = "Replay between 1 and 90 days of history."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        study = CapacityStudy.objects.create(
            cluster=cluster,
            gpu_type=GpuType.objects.get(name=gpu_type),
            gpu_delta=gpu_delta,
            policy=policy,
            baseline_policy=baseline_policy,
            current_gpus=current or 0,
            gpus_per_node=per_node,
            history_days=history_days,
            requested_by=requested_by if getattr(requested_by, "pk", None) else None,
        )
        if enqueue:
            study_id = study.pk
            transaction.on_commit(lambda: task_queue().capacity_study_run(study_id))
    return study


# ---- "when does demand exceed capacity" (capacity-exceed runs) ----


def capacity_exceed_run_create(
    *, cluster: Cluster, horizon_days: int = 28, requested_by: Any = None, enqueue: bool = True
) -> CapacityExceedRun:
    """Queue the per-type forecast fits of ``cluster`` over ``horizon_days`` (1-90, else a field
    error); one already queued or running for the same cluster and horizon is returned instead of
    a second.  The task ``forecasting.tasks.capacity_exceed_run`` runs it after the commit."""
    if not 1 <= horizon_days <= 90:
        raise ValidationError({"horizon_days": "Look between 1 and 90 days ahead."})
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()  # one active run per cluster
        active = (CapacityExceedRun.Status.QUEUED, CapacityExceedRun.Status.RUNNING)
        run = CapacityExceedRun.objects.filter(
            cluster=cluster, horizon_days=horizon_days, status__in=active
        ).first()
        if run is not None:
            return run
        run = CapacityExceedRun.objects.create(
            cluster=cluster,
            horizon_days=horizon_days,
            requested_by=requested_by if getattr(requested_by, "pk", None) else None,
        )
        if enqueue:
            run_id = run.pk
            transaction.on_commit(lambda: task_queue().capacity_exceed_run(run_id))
    return run


def forecast_retention_cutoff(*, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(days=settings.BERTH_FORECAST_RETENTION_DAYS)


# ---- "Refresh forecasts now" (the admin's button and the demo's start-up) ----

REFRESH_STATE_TTL_S = 6 * 3600


def _refresh_key(cluster_id: int) -> str:
    return f"forecasting:refresh-now:{cluster_id}"


def forecast_refresh_state_get(*, cluster_id: int) -> dict[str, Any] | None:
    """The latest refresh-now of a cluster: status (queued, running, done, failed), series
    done and total, and a message; None when none ran within `REFRESH_STATE_TTL_S`."""
    from django.core.cache import cache

    state: dict[str, Any] | None = cache.get(_refresh_key(cluster_id))
    return state


def _refresh_state_set(cluster_id: int, **state: Any) -> None:
    from django.core.cache import cache

    cache.set(_refresh_key(cluster_id), {"cluster_id": cluster_id, **state}, REFRESH_STATE_TTL_S)


def forecast_refresh_request(*, cluster_id: int) -> dict[str, Any]:
    """Queue a refit of this hour's forecasts of a cluster (replacing what is stored), unless one
    is queued or running; returns its state.  The worker reports progress per series."""
    state = forecast_refresh_state_get(cluster_id=cluster_id)
    if state is not None and state.get("status") in ("queued", "running"):
        return state
    _refresh_state_set(cluster_id, status="queued", done=0, total=0, message="Waiting for a worker.")
    transaction.on_commit(lambda: task_queue().forecast_refresh_now(cluster_id))
    state = forecast_refresh_state_get(cluster_id=cluster_id)
    return state or {"cluster_id": cluster_id, "status": "queued", "done": 0, "total": 0, "message": ""}


def forecast_refresh_run_now(*, cluster_id: int, replace: bool = True) -> RefreshResult:
    """Fit and store the cluster's forecasts now, recording progress for the admin's page."""

    def progress(done: int, total: int, series: str) -> None:
        _refresh_state_set(
            cluster_id,
            status="running" if done < total else "done",
            done=done,
            total=total,
            message=f"Fitting {series}" if series else "",
        )

    try:
        result = forecast_refresh(cluster_id=cluster_id, replace=replace, progress=progress)
    except Exception as exc:
        _refresh_state_set(
            cluster_id, status="failed", done=0, total=0, message=f"{type(exc).__name__}: {exc}"
        )
        raise
    _refresh_state_set(
        cluster_id,
        status="done",
        done=result.created + result.skipped + result.failed,
        total=result.created + result.skipped + result.failed,
        message=f"{result.created} forecast(s) stored, {result.skipped} skipped, {result.failed} failed.",
    )
    return result
