"""The stored capacity runs' execution, on a Celery worker: a what-if's two replays
(`capacity_study_execute`, a `CapacityStudy` row) and "when does demand exceed capacity"
(`capacity_exceed_run_execute`, a `CapacityExceedRun` row).  Each stores its progress on its
row with one autocommitted UPDATE per step, so the polling staff page sees it at once, and a
failure (the task's time limit included) as the row's ``failed`` status and message.

The rows are created, and the tasks queued, by ``forecasting.services`` (which re-exports
these two); ``forecasting.tasks`` calls them.  The slow parts are looked up on the
``forecasting.capacity`` package at call time (tests replace them there).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from forecasting.capacity.replay import replay_nodes
from forecasting.models import CapacityExceedRun, CapacityStudy

logger = logging.getLogger(__name__)


def _study_update(study_id: int, **fields: Any) -> None:
    """One autocommitted UPDATE: the polling page sees each step as soon as it is done."""
    CapacityStudy.objects.filter(pk=study_id).update(**fields)


def _failure_text(error: BaseException) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(error, SoftTimeLimitExceeded):
        return (
            f"The replays took longer than the {settings.BERTH_CAPACITY_TIME_BUDGET_S} s a what-if may "
            "take (BERTH_CAPACITY_TIME_BUDGET_S): replay fewer days of history."
        )
    return f"The replay failed: {type(error).__name__}: {error}"[:500]


def capacity_study_execute(*, study_id: int, now: datetime | None = None) -> CapacityStudy:
    """Run a what-if's two replays (``baseline``, then ``whatif``), storing each result and the
    progress as soon as it is done.  A done what-if is left alone; a failed or interrupted one
    (a lost worker) starts again.  An error, the time limit included, marks it failed with the
    reason (logged, not raised: the row is the answer)."""
    from forecasting.capacity import wait_replay, wait_trace_get

    with transaction.atomic():
        study = CapacityStudy.objects.select_for_update().select_related("gpu_type").get(pk=study_id)
        if study.status == CapacityStudy.Status.DONE:
            return study
        study.status, study.started_at = CapacityStudy.Status.RUNNING, timezone.now()
        study.results, study.progress, study.message, study.jobs = {}, 0.0, "", 0
        study.save(update_fields=["status", "started_at", "results", "progress", "message", "jobs"])
    per_node, results = study.gpus_per_node, {}
    runs = (
        ("baseline", study.current_gpus, study.baseline_policy),
        ("whatif", study.current_gpus + study.gpu_delta, study.policy),
    )
    try:
        end = now or timezone.now()
        trace = wait_trace_get(
            cluster_id=study.cluster_id,
            gpu_type=study.gpu_type.name,
            start_at=end - timedelta(days=study.history_days),
            end_at=end,
            max_jobs=settings.BERTH_CAPACITY_MAX_JOBS,
        )
        _study_update(study_id, jobs=len(trace.jobs))
        for k, (label, gpus, policy) in enumerate(runs):
            nodes = replay_nodes(gpus, per_node)
            result = {"gpus": nodes * per_node, "nodes": nodes}
            if trace.jobs:
                point = wait_replay(
                    trace, gpu_type=study.gpu_type.name, nodes=nodes, gpus_per_node=per_node, policy=policy
                )
                result = point.as_dict()
            results[label] = {**result, "policy": policy}
            _study_update(study_id, results=results, progress=round((k + 1) / len(runs), 2))
        message = "" if trace.jobs else "No finished jobs of this type in the history: nothing to replay."
        _study_update(
            study_id,
            status=CapacityStudy.Status.DONE,
            progress=1.0,
            message=message,
            finished_at=timezone.now(),
        )
    except Exception as error:  # the time limit too: the row says why, the page shows it
        logger.exception("what-if %s failed", study_id)
        _study_update(
            study_id,
            status=CapacityStudy.Status.FAILED,
            message=_failure_text(error),
            finished_at=timezone.now(),
        )
    study.refresh_from_db()
    return study


def capacity_exceed_run_execute(*, run_id: int, now: datetime | None = None) -> CapacityExceedRun:
    """Fit one forecast per GPU type and store each type's crossing, with the types fitted so far
    as they finish.  A done run is left alone; a failed or interrupted one starts again.  An
    error, the time limit included, marks it failed with the reason (logged, not raised)."""
    from celery.exceptions import SoftTimeLimitExceeded

    from forecasting.capacity import capacity_exceed_when

    with transaction.atomic():
        run = CapacityExceedRun.objects.select_for_update().get(pk=run_id)
        if run.status == CapacityExceedRun.Status.DONE:
            return run
        run.status, run.started_at = CapacityExceedRun.Status.RUNNING, timezone.now()
        run.results, run.types_done, run.types_total, run.message = [], 0, 0, ""
        run.save(update_fields=["status", "started_at", "results", "types_done", "types_total", "message"])
    runs = CapacityExceedRun.objects.filter(pk=run_id)
    try:
        crossings = capacity_exceed_when(
            cluster_id=run.cluster_id,
            horizon_days=run.horizon_days,
            at=now,
            model_name=run.model_name,
            progress=lambda done, total: runs.update(types_done=done, types_total=total),
        )
        results = [c.as_dict() for c in crossings.values()]
        runs.update(status=CapacityExceedRun.Status.DONE, results=results, finished_at=timezone.now())
    except Exception as error:  # the time limit too: the row says why, the page shows it
        logger.exception("capacity-exceed run %s failed", run_id)
        message = (
            f"The fits took longer than the {settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S} s they may take "
            "(BERTH_FORECAST_SOFT_TIME_LIMIT_S)."
            if isinstance(error, SoftTimeLimitExceeded)
            else f"The forecast fit failed: {type(error).__name__}: {error}"
        )
        runs.update(status=CapacityExceedRun.Status.FAILED, message=message[:500], finished_at=timezone.now())
    run.refresh_from_db()
    return run
