"""Reads for forecasting: the portal's runtime predictor and its accuracy.

Split from :mod:`forecasting.selectors`, which re-exports every public name here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q

from scheduling.models import Job

# ---- runtime predictor ----


@dataclass(slots=True)
class _CachedPredictor:
    predictor: Any  # forecasting.core.runtime.HistoryRuntimePredictor
    built_at: float  # time.monotonic() of the last full build
    checked_at: float  # time.monotonic() of the last look for newly finished jobs
    cursor: tuple[datetime, int] | None  # (ended_at, id) of the newest job observed


_PREDICTORS: dict[int, _CachedPredictor] = {}
# Held while a cached predictor is fed or asked: its per-key deques must not change mid-read.
_PREDICTORS_LOCK = threading.RLock()

FINISHED_STATUSES = (Job.Status.COMPLETED, Job.Status.FAILED)


def job_engine_request(
    *,
    job_id: int,
    username: str,
    project_slug: str,
    name: str,
    gpu_count: int,
    submitted_at: datetime,
    requested_s: int | None,
    kind: str,
    gpu_type: str | None,
) -> Any:
    """The ``JobRequest`` the runtime predictor keys on.

    Users by username and projects by slug, as in the engine's snapshot
    (``scheduling.snapshots.job_request``): the snapshot's requests can be passed to
    `runtime_predict` as they are.
    """
    from scheduling.engine.types import JobKind, JobRequest

    return JobRequest(
        id=str(job_id),
        user=username,
        project=project_slug,
        gpu_count=gpu_count,
        submit_at=submitted_at.timestamp(),
        kind=JobKind(kind),
        gpu_type=gpu_type,
        requested_s=float(requested_s) if requested_s else None,
        name=name,
    )


def _observe_finished(
    predictor: Any, *, cluster_id: int, after: tuple[datetime, int] | None
) -> tuple[datetime, int] | None:
    """Feed the predictor the cluster's jobs that finished after ``after``, oldest first.

    At most the newest ``BERTH_RUNTIME_HISTORY_JOBS``; returns the new cursor.
    """
    jobs = Job.objects.filter(
        cluster_id=cluster_id, status__in=FINISHED_STATUSES, started_at__isnull=False, ended_at__isnull=False
    )
    if after is not None:
        jobs = jobs.filter(Q(ended_at__gt=after[0]) | Q(ended_at=after[0], id__gt=after[1]))
    rows = list(
        jobs.order_by("-ended_at", "-id").values_list(
            "id", "user__username", "project__slug", "name", "gpu_count", "submitted_at", "requested_s",
            "kind", "gpu_type__name", "started_at", "ended_at", "status",
        )[: settings.BERTH_RUNTIME_HISTORY_JOBS]
    )  # fmt: skip
    cursor = after
    for (
        job_id,
        username,
        slug,
        name,
        gpus,
        submitted,
        requested,
        kind,
        type_name,
        started,
        ended,
        status,
    ) in reversed(rows):
        if started is None or ended is None:  # filtered above; for the type checker
            continue
        request = job_engine_request(
            job_id=job_id, username=username, project_slug=slug, name=name, gpu_count=gpus,
            submitted_at=submitted, requested_s=requested, kind=kind, gpu_type=type_name,
        )  # fmt: skip
        # The end time and outcome feed the user's session context (the last job failed
        # within a minute, how long ago it ended).
        predictor.observe(
            request,
            max((ended - started).total_seconds(), 0.0),
            ended_at=ended.timestamp(),
            status=str(status),
        )
        cursor = (ended, job_id)
    return cursor


def runtime_predictor_get(*, cluster_id: int, max_age_s: float | None = None) -> Any:
    """A `HistoryRuntimePredictor` fed with the cluster's finished jobs, cached per process.

    Finished means completed or failed with a start and an end (a failed job really ran that
    long; cancelled and preempted runs are not runtimes), observed in end order.  The first
    call in a process builds it from the newest ``BERTH_RUNTIME_HISTORY_JOBS`` jobs (about
    0.25 ms a job); afterwards, once ``BERTH_RUNTIME_PREDICTOR_TTL_S`` (or ``max_age_s``) has
    passed, a call only observes the jobs that finished since, and a full rebuild happens every
    ``BERTH_RUNTIME_PREDICTOR_REBUILD_S`` (it also picks up end times recorded late).
    """
    from forecasting.core.runtime import HistoryRuntimePredictor

    ttl = settings.BERTH_RUNTIME_PREDICTOR_TTL_S if max_age_s is None else max_age_s
    now = time.monotonic()
    with _PREDICTORS_LOCK:
        cached = _PREDICTORS.get(cluster_id)
        if cached is not None and now - cached.checked_at < ttl:
            return cached.predictor
        if cached is not None and now - cached.built_at < settings.BERTH_RUNTIME_PREDICTOR_REBUILD_S:
            # Incremental and small: under the lock so two threads never feed one predictor.
            cached.cursor = _observe_finished(cached.predictor, cluster_id=cluster_id, after=cached.cursor)
            cached.checked_at = now
            return cached.predictor
    predictor = HistoryRuntimePredictor()
    cursor = _observe_finished(predictor, cluster_id=cluster_id, after=None)
    with _PREDICTORS_LOCK:
        _PREDICTORS[cluster_id] = _CachedPredictor(
            predictor=predictor, built_at=now, checked_at=now, cursor=cursor
        )
    return predictor


def runtime_predict(*, cluster_id: int, requests: Sequence[Any]) -> list[tuple[float, float]]:
    """(p50_s, p90_s) for each ``JobRequest`` from the cluster's cached predictor (thread-safe).

    Requests key users by username and projects by slug (`job_engine_request`, or the
    engine snapshot's own requests).
    """
    predictor = runtime_predictor_get(cluster_id=cluster_id)
    with _PREDICTORS_LOCK:
        answers: list[tuple[float, float]] = predictor.predict_many(requests)
        return answers


def runtime_predictor_forget(*, cluster_id: int | None = None) -> None:
    """Drop the cached predictor of one cluster (or all): the next prediction rebuilds it."""
    with _PREDICTORS_LOCK:
        if cluster_id is None:
            _PREDICTORS.clear()
        else:
            _PREDICTORS.pop(cluster_id, None)


@dataclass(frozen=True, slots=True)
class RuntimeAccuracy:
    """How close stored predictions and users' own estimates came to real runtimes (DESIGN §6)."""

    jobs: int  # finished jobs that had a prediction
    predictor_within_2x: float | None  # share with p50 within a factor 2 of the runtime
    predictor_mae_s: float | None
    estimated_jobs: int  # of those, the ones with a user estimate
    user_estimate_within_2x: float | None
    user_estimate_mae_s: float | None
    p90_coverage: float | None  # share of runtimes at or below the predicted p90


def runtime_accuracy_get(*, cluster_id: int, since: datetime) -> RuntimeAccuracy:
    """Accuracy of the predictions stored on jobs that finished since ``since``, against the
    users' own runtime estimates (``requested_s``) on the same jobs."""
    rows = Job.objects.filter(
        cluster_id=cluster_id,
        status__in=FINISHED_STATUSES,
        ended_at__gte=since,
        started_at__isnull=False,
        predicted_p50_s__isnull=False,
    ).values_list("started_at", "ended_at", "predicted_p50_s", "predicted_p90_s", "requested_s")
    pred_err: list[float] = []
    pred_ok: list[bool] = []
    covered: list[bool] = []
    est_err: list[float] = []
    est_ok: list[bool] = []

    def within_2x(actual: float, guess: float) -> bool:
        actual, guess = max(actual, 1.0), max(guess, 1.0)
        return 0.5 <= guess / actual <= 2.0

    for started, ended, p50, p90, requested in rows:
        if started is None or ended is None or p50 is None:
            continue
        actual = (ended - started).total_seconds()
        pred_err.append(abs(actual - p50))
        pred_ok.append(within_2x(actual, p50))
        if p90 is not None:
            covered.append(actual <= p90)
        if requested:
            est_err.append(abs(actual - requested))
            est_ok.append(within_2x(actual, float(requested)))

    def mean(values: list[float] | list[bool]) -> float | None:
        return float(sum(values)) / len(values) if values else None

    return RuntimeAccuracy(
        jobs=len(pred_err),
        predictor_within_2x=mean(pred_ok),
        predictor_mae_s=mean(pred_err),
        estimated_jobs=len(est_err),
        user_estimate_within_2x=mean(est_ok),
        user_estimate_mae_s=mean(est_err),
        p90_coverage=mean(covered),
    )
