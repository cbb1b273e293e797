"""Forecasting Celery tasks run in-process on real PostgreSQL: idempotent, taking ids."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from forecasting import tasks
from forecasting.models import CapacityStudy, ForecastPoint, ForecastRun
from forecasting.selectors import capacity_study_get, hour_floor, runtime_predictor_forget
from forecasting.services import capacity_study_create, capacity_study_execute
from scheduling.models import Cluster, GpuType, Job, Node
from tests.factories import ClusterFactory, GpuTypeFactory, JobFactory, MembershipFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_predictors() -> None:
    runtime_predictor_forget()


def _recent_history(cluster: Cluster, gpu_type: GpuType, *, days: int = 3) -> None:
    """Hourly jobs up to the current hour: 3 GPUs in the afternoon (UTC), 1 otherwise."""
    user = MembershipFactory().user
    project = user.memberships.get().project
    end = hour_floor(timezone.now())
    start = end - timedelta(days=days)
    Job.objects.bulk_create(
        Job(
            cluster=cluster,
            user=user,
            project=project,
            gpu_type=gpu_type,
            name="h",
            gpu_count=3 if (start + timedelta(hours=h)).hour >= 12 else 1,
            status=Job.Status.COMPLETED,
            submitted_at=start + timedelta(hours=h),
            started_at=start + timedelta(hours=h),
            ended_at=start + timedelta(hours=h + 1),
        )
        for h in range(24 * days)
    )


def _clock_in_this_hour(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """Django's clock pinned to :30 of the current hour (the test moves it by setting ``[0]``):
    run at an hour's last second, the runs would fall in two hours (they used to skip then)."""
    at = [hour_floor(timezone.now()) + timedelta(minutes=30)]
    monkeypatch.setattr(timezone, "now", lambda: at[0])
    return at


@override_settings(BERTH_FORECAST_HORIZON_H=12)
def test_forecast_refresh_task_twice_in_an_hour_stores_once(
    cluster: Cluster, nodes: list[Node], a100: GpuType, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _clock_in_this_hour(monkeypatch)
    _recent_history(cluster, a100)

    first = tasks.forecast_refresh(cluster.pk)
    clock[0] += timedelta(minutes=25)  # :55, the same hour
    second = tasks.forecast_refresh(cluster.pk)

    assert first["created"] == 3  # A100, the cluster total and the project
    assert second["created"] == 0
    assert second["skipped"] == 3
    assert ForecastRun.objects.filter(cluster=cluster).count() == 3
    assert ForecastPoint.objects.filter(run__cluster=cluster).count() == 3 * 12
    assert tasks.forecast_refresh(987_654_321) == {"cluster_id": 987_654_321, "status": "missing"}


@pytest.mark.slow
@override_settings(BERTH_FORECAST_HORIZON_H=12, BERTH_FORECAST_BACKTEST_DAYS=2)
def test_forecast_refit_task_stores_backtest_metrics_and_replaces_the_hour(
    cluster: Cluster, nodes: list[Node], a100: GpuType, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _clock_in_this_hour(monkeypatch)
    _recent_history(cluster, a100)
    tasks.forecast_refresh(cluster.pk)

    clock[0] += timedelta(minutes=10)
    tasks.forecast_refit(cluster.pk)
    clock[0] += timedelta(minutes=10)
    tasks.forecast_refit(cluster.pk)

    runs = list(ForecastRun.objects.filter(cluster=cluster))
    assert len(runs) == 3
    for run in runs:
        assert set(run.metrics) == {"berth", "seasonal_naive_24"}
        scores = run.metrics["berth"]
        assert scores["origins"] == 2.0
        assert 0.0 <= scores["coverage_80"] <= 1.0
        assert scores["mase"] >= 0.0
    assert ForecastPoint.objects.filter(run__cluster=cluster).count() == 3 * 12


def test_forecast_refit_dispatch_prunes_old_runs_and_enqueues_per_active_cluster(
    cluster: Cluster, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker is a Redis other checkouts' workers may share: record instead of sending.
    sent: list[tuple[str, list[int]]] = []
    for task in (tasks.forecast_refit, tasks.forecast_refresh, tasks.jobs_runtime_predict):
        monkeypatch.setattr(
            task, "apply_async", lambda args, _n=task.name, **kw: sent.append((_n, list(args)))
        )
    ClusterFactory(is_active=False)
    old = timezone.now() - timedelta(days=30)
    ForecastRun.objects.create(
        cluster=cluster, kind="gpu_type", key="A100", model_name="berth", issued_at=old,
        train_start_at=old - timedelta(days=1), train_end_at=old, horizon_h=1,
    )  # fmt: skip

    assert tasks.forecast_refit_dispatch() == [cluster.pk]
    assert sent == [("forecasting.tasks.forecast_refit", [cluster.pk])]
    assert not ForecastRun.objects.exists()

    sent.clear()
    assert tasks.forecast_refresh_dispatch() == [cluster.pk]
    assert sorted(sent) == [
        ("forecasting.tasks.forecast_refresh", [cluster.pk]),
        ("forecasting.tasks.jobs_runtime_predict", [cluster.pk]),
    ]


def test_job_runtime_predict_task_by_id(cluster: Cluster, nodes: list[Node]) -> None:
    job = JobFactory(cluster=cluster, requested_s=1_200)
    assert tasks.job_runtime_predict(job.pk) == tasks.job_runtime_predict(job.pk)
    job.refresh_from_db()
    assert job.predicted_p50_s == job.predicted_p90_s == 1_200.0
    assert tasks.job_runtime_predict(987_654_321)["status"] == "missing"


def test_capacity_study_create_checks_input(
    cluster: Cluster, nodes: list[Node], a100: GpuType, django_capture_on_commit_callbacks: Any
) -> None:
    GpuTypeFactory(name="T4")  # exists, but not in this cluster
    with pytest.raises(ValidationError) as error:
        capacity_study_create(cluster=cluster, gpu_type="T4", gpu_delta=4, policy="magic", history_days=0)
    assert set(error.value.message_dict) == {"policy", "history_days", "gpu_type"}
    with pytest.raises(ValidationError) as error:  # 1 GPU more rounds to the same two 4-GPU nodes
        capacity_study_create(cluster=cluster, gpu_type="A100", gpu_delta=1, policy="berth")
    assert "change by a whole node or choose another policy" in error.value.message_dict["gpu_delta"][0]
    # A valid what-if is queued after the commit (captured here, not sent to the shared broker).
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        study = capacity_study_create(cluster=cluster, gpu_type="A100", gpu_delta=1, policy="fifo")
    assert len(callbacks) == 1
    assert study.status == CapacityStudy.Status.QUEUED
    assert (study.current_gpus, study.gpus_per_node, study.baseline_policy) == (8, 4, "berth")


def test_capacity_study_task_stores_both_replays_once(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    user = MembershipFactory().user
    project = user.memberships.get().project
    now = timezone.now()
    for _ in range(10):  # ten 2-GPU jobs of an hour arriving together: 20 GPUs wanted at once
        JobFactory(
            cluster=cluster, user=user, project=project, gpu_type=a100, gpu_count=2,
            status=Job.Status.COMPLETED, submitted_at=now - timedelta(hours=5),
            started_at=now - timedelta(hours=4), ended_at=now - timedelta(hours=3),
        )  # fmt: skip
    study = capacity_study_create(
        cluster=cluster, gpu_type="A100", gpu_delta=12, policy="berth", enqueue=False
    )

    result = tasks.capacity_study_run(study.pk)

    study = capacity_study_get(study_id=study.pk)
    assert result == {"study_id": study.pk, "status": "done"}
    assert study.status == CapacityStudy.Status.DONE
    assert study.progress == 1.0
    assert study.jobs == 10
    baseline, whatif = study.results["baseline"], study.results["whatif"]
    assert (baseline["gpus"], whatif["gpus"]) == (8, 20)
    assert whatif["wait_p95_s"] == 0.0 < baseline["wait_p95_s"]  # 20 GPUs hold all ten at once
    finished_at = study.finished_at

    assert tasks.capacity_study_run(study.pk)["status"] == "done"
    study.refresh_from_db()
    assert study.finished_at == finished_at  # a finished what-if is not run again
    assert tasks.capacity_study_run(987_654_321)["status"] == "missing"


def test_capacity_study_without_history_or_with_a_failing_replay(
    cluster: Cluster, nodes: list[Node], a100: GpuType, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = capacity_study_create(
        cluster=cluster, gpu_type="A100", gpu_delta=4, policy="berth", enqueue=False
    )
    done = capacity_study_execute(study_id=study.pk)
    assert done.status == CapacityStudy.Status.DONE
    assert "No finished jobs" in done.message
    assert done.results["whatif"] == {"gpus": 12, "nodes": 3, "policy": "berth"}

    from celery.exceptions import SoftTimeLimitExceeded

    from forecasting import capacity

    def too_slow(*args: Any, **kwargs: Any) -> Any:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(capacity, "wait_trace_get", too_slow)  # the task's time limit, without waiting
    study = capacity_study_create(
        cluster=cluster, gpu_type="A100", gpu_delta=4, policy="berth", enqueue=False
    )
    failed = capacity_study_execute(study_id=study.pk)
    assert failed.status == CapacityStudy.Status.FAILED
    assert "BERTH_CAPACITY_TIME_BUDGET_S" in failed.message
    assert failed.finished_at is not None


def test_forecast_refresh_command(
    cluster: Cluster, nodes: list[Node], a100: GpuType, capsys: pytest.CaptureFixture[str]
) -> None:
    _recent_history(cluster, a100, days=2)
    with override_settings(BERTH_FORECAST_HORIZON_H=6):
        call_command("forecast_refresh", "--cluster", str(cluster.pk))
    out = capsys.readouterr().out
    assert f"cluster {cluster.pk}: 3 runs stored" in out
    assert "gpu_type:A100" in out
    assert "interactive headroom now: {'A100': 0}" in out


def test_the_hourly_task_keeps_stored_predictions_and_fills_missing_ones(
    cluster: Cluster, nodes: list[Node]
) -> None:
    # a prediction made at submission is kept while the job waits, even once the cluster's
    # history would now predict it otherwise; a job whose submission prediction was lost gets one
    predicted = JobFactory(cluster=cluster, requested_s=7_200)
    assert tasks.job_runtime_predict(predicted.pk)["predicted_p50_s"] == 7_200.0
    lost = JobFactory(cluster=cluster, requested_s=7_200)
    user, project = predicted.user, predicted.project
    now = timezone.now()
    for i in range(8):  # the same user's 10-minute jobs finish meanwhile
        JobFactory(
            cluster=cluster,
            user=user,
            project=project,
            requested_s=7_200,
            status=Job.Status.COMPLETED,
            submitted_at=now - timedelta(hours=2, minutes=i),
            started_at=now - timedelta(hours=1, minutes=i + 10),
            ended_at=now - timedelta(hours=1, minutes=i),
        )
    runtime_predictor_forget(cluster_id=cluster.pk)

    assert tasks.jobs_runtime_predict(cluster.pk) == {"cluster_id": cluster.pk, "jobs": 1}
    predicted.refresh_from_db()
    lost.refresh_from_db()
    assert predicted.predicted_p50_s == 7_200.0
    assert lost.predicted_p50_s is not None
    assert lost.predicted_p50_s < 3_600.0
