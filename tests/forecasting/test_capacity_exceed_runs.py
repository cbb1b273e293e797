"""Capacity-exceed runs on real PostgreSQL: the row the ops page's button creates, the task that
fits one forecast per GPU type and stores the crossings with its progress, failures on the row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from forecasting import capacity, tasks
from forecasting.models import CapacityExceedRun
from forecasting.services import capacity_exceed_run_create, capacity_exceed_run_execute
from scheduling.models import Cluster, GpuType, Job, Node
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db

ISSUED = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)


def _growing_jobs(cluster: Cluster, gpu_type: GpuType, *, days: int) -> None:
    """One job per hour over ``days`` days before ``ISSUED``, from 2 GPUs growing towards 7."""
    user = MembershipFactory().user
    project = user.memberships.get().project
    start = ISSUED - timedelta(days=days)
    Job.objects.bulk_create(
        Job(
            cluster=cluster,
            user=user,
            project=project,
            gpu_type=gpu_type,
            name="grow",
            gpu_count=2 + (5 * h) // (24 * days),
            status=Job.Status.COMPLETED,
            submitted_at=start + timedelta(hours=h),
            started_at=start + timedelta(hours=h),
            ended_at=start + timedelta(hours=h + 1),
        )
        for h in range(24 * days)
    )


def test_a_run_stores_each_types_crossing(cluster: Cluster, nodes: list[Node], a100: GpuType) -> None:
    _growing_jobs(cluster, a100, days=28)
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=21, enqueue=False)
    done = capacity_exceed_run_execute(run_id=run.pk, now=ISSUED + timedelta(minutes=5))
    assert (done.status, done.types_done, done.types_total, done.message) == ("done", 1, 1, "")
    assert done.started_at is not None
    assert done.finished_at is not None
    [crossing] = done.results
    assert (crossing["gpu_type"], crossing["capacity_gpus"], crossing["horizon_h"]) == ("A100", 8, 21 * 24)
    assert crossing["issued_at"] == ISSUED.isoformat()
    yhat_at = datetime.fromisoformat(crossing["yhat_exceeds_at"])
    upper_at = datetime.fromisoformat(crossing["upper80_exceeds_at"])
    assert ISSUED < upper_at <= yhat_at <= ISSUED + timedelta(days=21)
    assert crossing["peak_upper80"] >= crossing["peak_yhat"] > 8


def test_progress_is_stored_as_each_type_is_fitted(
    cluster: Cluster, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False)
    seen: list[tuple[str, int, int]] = []

    def fits(*, progress: Any, **kwargs: Any) -> dict[str, Any]:
        assert kwargs["cluster_id"] == cluster.pk
        assert kwargs["horizon_days"] == 28
        for done in range(3):
            progress(done, 2)
            row = CapacityExceedRun.objects.get(pk=run.pk)  # what the polling page reads now
            seen.append((row.status, row.types_done, row.types_total))
        return {}

    monkeypatch.setattr(capacity, "capacity_exceed_when", fits)
    done = capacity_exceed_run_execute(run_id=run.pk)
    assert seen == [("running", 0, 2), ("running", 1, 2), ("running", 2, 2)]
    assert (done.status, done.results) == ("done", [])


def test_a_failure_or_the_time_limit_is_said_on_the_row(
    cluster: Cluster, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    def broken(**kwargs: Any) -> Any:
        raise ValueError("no convergence")

    def too_slow(**kwargs: Any) -> Any:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(capacity, "capacity_exceed_when", broken)
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False)
    failed = capacity_exceed_run_execute(run_id=run.pk)
    assert (failed.status, failed.message) == (
        "failed",
        "The forecast fit failed: ValueError: no convergence",
    )
    assert failed.finished_at is not None

    monkeypatch.setattr(capacity, "capacity_exceed_when", too_slow)
    failed = capacity_exceed_run_execute(run_id=run.pk)  # a failed run starts again
    assert failed.status == "failed"
    assert "BERTH_FORECAST_SOFT_TIME_LIMIT_S" in failed.message


def test_the_task_takes_an_id_and_leaves_a_done_run_alone(cluster: Cluster, nodes: list[Node]) -> None:
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=7, enqueue=False)
    assert tasks.capacity_exceed_run(run.pk) == {"run_id": run.pk, "status": "done"}
    run.refresh_from_db()
    finished_at = run.finished_at
    assert run.results[0]["yhat_exceeds_at"] is None  # no demand history: no crossing
    assert tasks.capacity_exceed_run(run.pk)["status"] == "done"
    run.refresh_from_db()
    assert run.finished_at == finished_at
    assert tasks.capacity_exceed_run(987_654_321)["status"] == "missing"


def test_create_refuses_a_bad_horizon_and_reuses_an_active_run(cluster: Cluster, nodes: list[Node]) -> None:
    for days in (0, 91):
        with pytest.raises(ValidationError) as refused:
            capacity_exceed_run_create(cluster=cluster, horizon_days=days, enqueue=False)
        assert "horizon_days" in refused.value.message_dict
    first = capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False)
    assert capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False) == first
    assert capacity_exceed_run_create(cluster=cluster, horizon_days=14, enqueue=False) != first
    CapacityExceedRun.objects.filter(pk=first.pk).update(status="done")
    assert capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False) != first
