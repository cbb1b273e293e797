"""Celery tasks of forecasting: thin callers of `forecasting.services` that take ids.

* `forecast_refresh_dispatch()` (beat, hourly): a `forecast_refresh` per active cluster and
  the runtime predictions pending jobs lack.
* `forecast_refresh(cluster_id)`: record the actuals of forecast hours that are over (the
  track record), then fit and store the hour's forecasts; idempotent (a second run in the
  same hour skips what is stored and finds no actual left to record).
* `forecast_refit_dispatch()` (beat, nightly): `forecast_refit` per active cluster (refit with
  backtest metrics, replacing the hour's runs) and pruning of old runs.
* `forecast_refresh_now(cluster_id)`: the admin's "Refresh forecasts now" (and the demo's
  start-up): refit this hour's forecasts with progress stored for the capacity page.
* `job_runtime_predict(job_id)`: store a job's predicted runtime quantiles.
* `jobs_runtime_predict(cluster_id)`: store a prediction for every pending job that has none.
* `capacity_study_run(study_id)`: a what-if (the ops capacity page's), progress stored on the row.
* `capacity_exceed_run(run_id)`: "when does demand exceed capacity" (the same page's): one
  forecast fit per GPU type, progress and crossings stored on the row.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from forecasting import services
from forecasting.models import CapacityExceedRun, CapacityStudy
from scheduling.models import Cluster, Job
from scheduling.task_policy import active_cluster_ids, berth_task

logger = logging.getLogger(__name__)


@berth_task(
    name="forecasting.tasks.forecast_refresh",
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S,
    time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S + 60,
)
def forecast_refresh(cluster_id: int) -> dict[str, Any]:
    """Record the actual demand of the hours stored forecasts covered that are now over, then
    store this hour's demand forecasts of one cluster (skips series already stored)."""
    if not Cluster.objects.filter(pk=cluster_id).exists():
        return {"cluster_id": cluster_id, "status": "missing"}
    actuals = services.forecast_actuals_record(cluster_id=cluster_id)
    result = services.forecast_refresh(cluster_id=cluster_id)
    logger.info("forecast refresh cluster=%s actuals=%s %s", cluster_id, actuals, result.as_dict())
    return {"cluster_id": cluster_id, "actuals_recorded": actuals, **result.as_dict()}


@berth_task(
    name="forecasting.tasks.forecast_refresh_now",
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


@berth_task(
    name="forecasting.tasks.forecast_refit",
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


@berth_task(
    name="forecasting.tasks.forecast_refresh_dispatch",
    soft_time_limit=30,
    time_limit=60,
    ignore_result=True,
)
def forecast_refresh_dispatch() -> list[int]:
    """Hourly: enqueue a forecast refresh and the missing runtime predictions per active cluster."""
    ids = active_cluster_ids()
    expires = 3000  # a refresh that could not start within the hour is superseded by the next
    for cluster_id in ids:
        forecast_refresh.apply_async(args=(cluster_id,), expires=expires)
        jobs_runtime_predict.apply_async(args=(cluster_id,), expires=expires)
    return ids


@berth_task(
    name="forecasting.tasks.forecast_refit_dispatch",
    soft_time_limit=60,
    time_limit=120,
    ignore_result=True,
)
def forecast_refit_dispatch() -> list[int]:
    """Nightly: prune old runs, then enqueue a refit with backtests per active cluster."""
    pruned = services.forecast_runs_prune(before=services.forecast_retention_cutoff())
    logger.info("forecast runs pruned: %s", pruned)
    ids = active_cluster_ids()
    for cluster_id in ids:
        forecast_refit.apply_async(args=(cluster_id,), expires=6 * 3600)
    return ids


@berth_task(
    name="forecasting.tasks.job_runtime_predict",
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


@berth_task(
    name="forecasting.tasks.jobs_runtime_predict",
    soft_time_limit=120,
    time_limit=180,
)
def jobs_runtime_predict(cluster_id: int) -> dict[str, Any]:
    """Store the runtime prediction of every pending job of a cluster that has none (its
    submission's `job_runtime_predict` was lost, e.g. to a broker outage).

    A stored prediction is kept while the job waits: re-predicting every pending job each hour
    reshuffles berth's queue and reservations.  Replaying that refresh (docs/benchmarks.md,
    "Refreshing pending predictions every hour") made berth's mean wait on the Alibaba pods
    1.35x easy's instead of 1.00x, and its slowdown 1.81x instead of 1.17x (geometric means
    over 16 seeds); on KTH it lowered wait and slowdown by 1-3 %.  The replay predicts a job
    when it is queued, as the portal does with this.
    """
    jobs = services.jobs_runtime_predict(cluster_id=cluster_id, only_missing=True)
    return {"cluster_id": cluster_id, "jobs": jobs}


@berth_task(
    name="forecasting.tasks.capacity_study_run",
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_CAPACITY_TIME_BUDGET_S,
    time_limit=settings.BERTH_CAPACITY_TIME_BUDGET_S + 60,
)
def capacity_study_run(study_id: int) -> dict[str, Any]:
    """Run a what-if's replays (a finished one is left alone; past the soft limit it is failed)."""
    if not CapacityStudy.objects.filter(pk=study_id).exists():
        return {"study_id": study_id, "status": "missing"}
    study = services.capacity_study_execute(study_id=study_id)
    return {"study_id": study_id, "status": study.status}


@berth_task(
    name="forecasting.tasks.capacity_exceed_run",
    reject_on_worker_lost=True,
    soft_time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S,
    time_limit=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S + 60,
)
def capacity_exceed_run(run_id: int) -> dict[str, Any]:
    """Fit a capacity-exceed run's forecasts (a finished one is left alone; past the soft limit
    it is failed)."""
    if not CapacityExceedRun.objects.filter(pk=run_id).exists():
        return {"run_id": run_id, "status": "missing"}
    run = services.capacity_exceed_run_execute(run_id=run_id)
    return {"run_id": run_id, "status": run.status}


class CeleryTaskQueue:
    """`forecasting.queue.TaskQueue` on Celery: each method sends this module's task (read at
    call time, so a test that swaps a task's ``delay`` swaps what the services send)."""

    def capacity_study_run(self, study_id: int) -> None:
        capacity_study_run.delay(study_id)

    def capacity_exceed_run(self, run_id: int) -> None:
        capacity_exceed_run.delay(run_id)

    def forecast_refresh_now(self, cluster_id: int) -> None:
        forecast_refresh_now.apply_async(args=[cluster_id], expires=3600)  # type: ignore[arg-type]  # tests compare a list
