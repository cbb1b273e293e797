"""Celery tasks of forecasting: thin callers of `forecasting.services` that take ids.

* `forecast_refresh_dispatch()` (beat, hourly): a `forecast_refresh` per active cluster and
  the pending jobs' runtime predictions.
* `forecast_refresh(cluster_id)`: fit and store the hour's forecasts; idempotent (a second
  run in the same hour skips what is stored).
* `forecast_refit_dispatch()` (beat, nightly): `forecast_refit` per active cluster (refit with
  backtest metrics, replacing the hour's runs) and pruning of old runs.
* `forecast_refresh_now(cluster_id)`: the admin's "Refresh forecasts now" (and the demo's
  start-up): refit this hour's forecasts with progress stored for the capacity page.
* `job_runtime_predict(job_id)`: store a job's predicted runtime quantiles.
* `jobs_runtime_predict(cluster_id)`: refresh every pending job's prediction.
* `capacity_study_run(study_id)`: a what-if capacity study, progress stored on the row.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings

from forecasting import services
from forecasting.models import CapacityStudy
from scheduling.models import Cluster, Job

logger = logging.getLogger(__name__)


def _active_cluster_ids() -> list[int]:
    return list(Cluster.objects.filter(is_active=True).order_by("id").values_list("id", flat=True))


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.forecast_refresh",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S,
    time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S + 60,
)
def forecast_refresh(cluster_id: int) -> dict[str, Any]:
    """Store this hour's demand forecasts of one cluster (skips series already stored)."""
    if not Cluster.objects.filter(pk=cluster_id).exists():
        return {"cluster_id": cluster_id, "status": "missing"}
    result = services.forecast_refresh(cluster_id=cluster_id)
    logger.info("forecast refresh cluster=%s %s", cluster_id, result.as_dict())
    return {"cluster_id": cluster_id, **result.as_dict()}


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.forecast_refresh_now",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S,
    time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S + 60,
)
def forecast_refresh_now(cluster_id: int) -> dict[str, Any]:
    """The admin's "Refresh forecasts now" and the demo's start-up: refit this hour's forecasts
    of one cluster (replacing them), with progress for the capacity page."""
    if not Cluster.objects.filter(pk=cluster_id).exists():
        return {"cluster_id": cluster_id, "status": "missing"}
    result = services.forecast_refresh_run_now(cluster_id=cluster_id)
    return {"cluster_id": cluster_id, **result.as_dict()}


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.forecast_refit",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_FORECAST_REFIT_SOFT_TIME_LIMIT_S,
    time_limit=settings.BERTH_FORECAST_REFIT_SOFT_TIME_LIMIT_S + 120,
)
def forecast_refit(cluster_id: int) -> dict[str, Any]:
    """Nightly: refit every series with rolling-origin backtest metrics (replaces this hour's runs)."""
    if not Cluster.objects.filter(pk=cluster_id).exists():
        return {"cluster_id": cluster_id, "status": "missing"}
    result = services.forecast_refresh(cluster_id=cluster_id, backtest=True, replace=True)
    return {"cluster_id": cluster_id, **result.as_dict()}


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.forecast_refresh_dispatch",
    acks_late=True,
    soft_time_limit=30,
    time_limit=60,
    ignore_result=True,
)
def forecast_refresh_dispatch() -> list[int]:
    """Hourly: enqueue a forecast refresh and a runtime-prediction refresh per active cluster."""
    ids = _active_cluster_ids()
    expires = 3000  # a refresh that could not start within the hour is superseded by the next
    for cluster_id in ids:
        forecast_refresh.apply_async(args=[cluster_id], expires=expires)
        jobs_runtime_predict.apply_async(args=[cluster_id], expires=expires)
    return ids


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.forecast_refit_dispatch",
    acks_late=True,
    soft_time_limit=60,
    time_limit=120,
    ignore_result=True,
)
def forecast_refit_dispatch() -> list[int]:
    """Nightly: prune old runs, then enqueue a refit with backtests per active cluster."""
    pruned = services.forecast_runs_prune(before=services.forecast_retention_cutoff())
    logger.info("forecast runs pruned: %s", pruned)
    ids = _active_cluster_ids()
    for cluster_id in ids:
        forecast_refit.apply_async(args=[cluster_id], expires=6 * 3600)
    return ids


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.job_runtime_predict",
    acks_late=True,
    soft_time_limit=60,
    time_limit=90,
)
def job_runtime_predict(job_id: int) -> dict[str, Any]:
    """Store one job's predicted runtime (p50, p90); recomputing gives the same answer."""
    job = Job.objects.select_related("gpu_type", "user", "project").filter(pk=job_id).first()
    if job is None:
        return {"job_id": job_id, "status": "missing"}
    p50, p90 = services.job_runtime_predict(job=job)
    return {"job_id": job_id, "predicted_p50_s": p50, "predicted_p90_s": p90}


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.jobs_runtime_predict",
    acks_late=True,
    soft_time_limit=120,
    time_limit=180,
)
def jobs_runtime_predict(cluster_id: int) -> dict[str, Any]:
    """Refresh the runtime predictions of every pending job of a cluster."""
    return {"cluster_id": cluster_id, "jobs": services.jobs_runtime_predict(cluster_id=cluster_id)}


@shared_task(  # type: ignore[untyped-decorator]  # celery ships no types
    name="forecasting.tasks.capacity_study_run",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_CAPACITY_TIME_BUDGET_S + 240,
    time_limit=settings.BERTH_CAPACITY_TIME_BUDGET_S + 300,
)
def capacity_study_run(study_id: int) -> dict[str, Any]:
    """Run a capacity study (a finished one is left alone)."""
    if not CapacityStudy.objects.filter(pk=study_id).exists():
        return {"study_id": study_id, "status": "missing"}
    study = services.capacity_study_execute(study_id=study_id)
    return {"study_id": study_id, "status": study.status, "answer_gpus": study.answer_gpus}
