"""Forecasting wired into the portal, on real PostgreSQL: demand series, stored forecasts,
runtime predictions and interactive headroom.  Prophet fits for real (no mocks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.test import override_settings
from psycopg.types.range import Range

from forecasting.models import ForecastPoint, ForecastRun
from forecasting.selectors import (
    demand_series_get,
    forecast_band_get,
    forecast_points_list,
    interactive_headroom_get,
    interactive_headroom_policy,
    runtime_accuracy_get,
    runtime_predict,
    runtime_predictor_forget,
    runtime_predictor_get,
)
from forecasting.services import forecast_refresh, job_runtime_predict, jobs_runtime_predict
from scheduling.models import Allocation, Booking, Cluster, Gpu, GpuType, Job, Node
from scheduling.snapshots import job_request
from tests.factories import (
    BookingFactory,
    ClusterFactory,
    GpuTypeFactory,
    JobFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)  # a Monday


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


@pytest.fixture(autouse=True)
def _fresh_predictors() -> None:
    runtime_predictor_forget()


@pytest.fixture
def h100() -> GpuType:
    return GpuTypeFactory(name="H100")


@pytest.fixture
def mixed(cluster: Cluster, nodes: list[Node], h100: GpuType) -> Cluster:
    """The ``alpha`` cluster: 8 A100 (two nodes) and 4 H100 (one node)."""
    NodeFactory(cluster=cluster, gpu_type=h100, name="h0", gpu_count=4)
    return cluster


def test_demand_series_match_hand_computed_hours(mixed: Cluster, a100: GpuType, h100: GpuType) -> None:
    vision, other = ProjectFactory(slug="vision"), ProjectFactory(slug="other")
    user = MembershipFactory(project=vision).user
    # A: 2 A100 queued 0:30-1:00, running 1:00-2:30.
    JobFactory(
        cluster=mixed,
        user=user,
        project=vision,
        gpu_type=a100,
        gpu_count=2,
        status=Job.Status.COMPLETED,
        submitted_at=at(0.5),
        started_at=at(1),
        ended_at=at(2.5),
    )
    # B: 1 H100 interactive session running from 3:00, still open at the end of the window.
    JobFactory(
        cluster=mixed,
        user=user,
        project=other,
        gpu_type=h100,
        kind=Job.Kind.INTERACTIVE,
        status=Job.Status.RUNNING,
        submitted_at=at(3),
        started_at=at(3),
    )
    # C: 4 GPUs of no stated type, queued from 4:15, running on an A100 from 4:30.
    untyped = JobFactory(
        cluster=mixed,
        user=user,
        project=vision,
        gpu_type=None,
        gpu_count=4,
        status=Job.Status.RUNNING,
        submitted_at=at(4.25),
        started_at=at(4.5),
    )
    gpu = Gpu.objects.filter(node__cluster=mixed, node__gpu_type=a100).first()
    Allocation.objects.create(gpu=gpu, job=untyped, period=Range(at(4.5), None, "[)"), state="active")
    # D: a booking of 2 A100 for 2:00-4:00; E: cancelled before its start; F: ended early at 1:30.
    BookingFactory(
        cluster=mixed, user=user, project=vision, gpu_type=a100, gpu_count=2, start_at=at(2), end_at=at(4)
    )
    BookingFactory(
        cluster=mixed,
        user=user,
        project=vision,
        gpu_type=a100,
        gpu_count=3,
        start_at=at(5),
        end_at=at(6),
        status=Booking.Status.CANCELLED,
        ended_at=at(1),
    )
    BookingFactory(
        cluster=mixed,
        user=user,
        project=other,
        gpu_type=a100,
        gpu_count=1,
        start_at=at(1),
        end_at=at(5),
        status=Booking.Status.COMPLETED,
        ended_at=at(1.5),
    )
    # Another cluster's work is not this cluster's demand.
    JobFactory(gpu_type=a100, gpu_count=8, submitted_at=at(0), status=Job.Status.PENDING)

    series = demand_series_get(cluster_id=mixed.pk, end_at=at(6.2))  # the partial hour 6 is left out

    def values(kind: str, key: str) -> list[float]:
        return [round(v, 6) for v in series[(kind, key)].to_numpy()]

    assert series[("gpu_type", "A100")].index[0].to_pydatetime() == at(0).replace(tzinfo=None)
    assert values("gpu_type", "A100") == [1.0, 2.5, 3.0, 2.0, 3.0, 4.0]
    assert values("gpu_type", "H100") == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert values("gpu_type", "") == [1.0, 2.5, 3.0, 3.0, 4.0, 5.0]
    assert values("project", "vision") == [1.0, 2.0, 3.0, 2.0, 3.0, 4.0]
    assert values("project", "other") == [0.0, 0.5, 0.0, 1.0, 1.0, 1.0]
    assert values("interactive", "A100") == [0.0, 0.5, 2.0, 2.0, 0.0, 0.0]
    assert values("interactive", "H100") == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert demand_series_get(cluster_id=ClusterFactory().pk, end_at=at(6)) == {}


def _daily_history(cluster: Cluster, gpu_type: GpuType, *, days: int, end: datetime) -> None:
    """One job per hour running that hour: 4 GPUs in office hours (9-18 UTC), 1 otherwise;
    plus a 1-GPU interactive session every office hour."""
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project).user
    start = end - timedelta(days=days)
    jobs = []
    for h in range(24 * days):
        t = start + timedelta(hours=h)
        busy = 9 <= t.hour < 18
        common = {"cluster": cluster, "user": user, "project": project, "gpu_type": gpu_type, "name": "j"}
        jobs.append(
            Job(
                **common,
                gpu_count=4 if busy else 1,
                status=Job.Status.COMPLETED,
                submitted_at=t,
                started_at=t,
                ended_at=t + timedelta(hours=1),
            )
        )
        if busy:
            jobs.append(
                Job(
                    **common,
                    gpu_count=1,
                    kind=Job.Kind.INTERACTIVE,
                    status=Job.Status.COMPLETED,
                    submitted_at=t,
                    started_at=t,
                    ended_at=t + timedelta(hours=1),
                )
            )
    Job.objects.bulk_create(jobs)


@override_settings(BERTH_FORECAST_HORIZON_H=24)
def test_forecast_refresh_stores_runs_points_and_intervals_once_per_hour(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    issued = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
    _daily_history(cluster, a100, days=6, end=issued)

    result = forecast_refresh(cluster_id=cluster.pk, at=issued + timedelta(minutes=20))

    runs = {(r.kind, r.key): r for r in ForecastRun.objects.filter(cluster=cluster)}
    assert set(runs) == {
        ("gpu_type", "A100"),
        ("gpu_type", ""),
        ("project", "vision"),
        ("interactive", "A100"),
    }
    assert result.created == 4
    assert result.failed == 0
    run = runs[("gpu_type", "A100")]
    assert run.issued_at == issued == run.train_end_at
    assert run.train_start_at == issued - timedelta(days=6)
    assert run.history_hours == 144
    assert run.horizon_h == 24
    assert run.model_name == "berth"
    assert run.model_version
    assert run.fit_s > 0
    assert run.gpu_type == a100
    assert runs[("project", "vision")].project is not None
    points = forecast_points_list(run=run)
    assert [p.ts for p in points] == [issued + timedelta(hours=h) for h in range(24)]
    assert all(p.lower80 <= p.yhat <= p.upper80 for p in points)
    assert any(p.upper80 > p.lower80 for p in points)
    # The fit learned the office-hours pattern: noon busier than 3 a.m., both near the truth.
    by_hour = {p.ts.hour: p.yhat for p in points}
    assert by_hour[12] > by_hour[3] + 1.5
    assert 3.5 <= by_hour[12] <= 6.0  # truth: 4 batch + 1 interactive GPU
    assert by_hour[3] <= 2.0

    again = forecast_refresh(cluster_id=cluster.pk, at=issued + timedelta(minutes=50))
    assert again.created == 0
    assert again.skipped == 4
    assert ForecastRun.objects.filter(cluster=cluster).count() == 4
    assert ForecastPoint.objects.filter(run__cluster=cluster).count() == 4 * 24

    replaced = forecast_refresh(cluster_id=cluster.pk, at=issued, replace=True)
    assert replaced.created == 4
    assert ForecastRun.objects.filter(cluster=cluster).count() == 4
    assert not ForecastRun.objects.filter(pk=run.pk).exists()

    # What the capacity page draws: the last day of actual demand, the band and the capacity.
    band = forecast_band_get(
        cluster_id=cluster.pk, kind="gpu_type", key="A100", at=issued + timedelta(hours=1), history_h=24
    )
    assert band.run is not None
    assert band.run.issued_at == issued
    assert band.capacity_gpus == 8
    assert len(band.points) == 24
    assert [ts for ts, _ in band.history] == [issued - timedelta(hours=24 - h) for h in range(24)]
    assert [v for _, v in band.history] == [5.0 if 9 <= h < 18 else 1.0 for h in range(24)]  # + sessions
    assert (
        forecast_band_get(cluster_id=cluster.pk, kind="project", key="vision", at=issued).capacity_gpus
        is None
    )

    # The engine's headroom from that stored forecast: >= 0 and within the cap of the type.
    headroom = interactive_headroom_get(cluster_id=cluster.pk, at=issued + timedelta(hours=12))
    assert set(headroom) == {"A100"}
    assert 0 <= headroom["A100"] <= 2


def _store_interactive_run(cluster: Cluster, *, issued: datetime, upper80: float, hours: int = 12) -> None:
    run = ForecastRun.objects.create(
        cluster=cluster,
        kind=ForecastRun.Kind.INTERACTIVE,
        key="A100",
        model_name="berth",
        issued_at=issued,
        train_start_at=issued - timedelta(days=7),
        train_end_at=issued,
        horizon_h=hours,
    )
    ForecastPoint.objects.bulk_create(
        ForecastPoint(run=run, ts=issued + timedelta(hours=h), yhat=upper80 / 2, lower80=0.0, upper80=upper80)
        for h in range(hours)
    )


@override_settings(BERTH_HEADROOM_MAX_FRACTION=1.0)
def test_headroom_is_forecast_upper_minus_what_bookings_hold(
    cluster: Cluster, nodes: list[Node], a100: GpuType, h100: GpuType
) -> None:
    NodeFactory(cluster=cluster, gpu_type=h100, name="h0", gpu_count=4)
    issued = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    now = issued + timedelta(minutes=30)
    _store_interactive_run(cluster, issued=issued, upper80=3.4)

    # Round up the forecast; no forecast for H100 means no headroom there.
    assert interactive_headroom_get(cluster_id=cluster.pk, at=now) == {"A100": 4, "H100": 0}
    assert interactive_headroom_policy(cluster_id=cluster.pk, at=now) == (("A100", 4),)

    project = ProjectFactory()
    common = {"cluster": cluster, "project": project, "gpu_type": a100}
    BookingFactory(**common, gpu_count=3, start_at=issued, end_at=issued + timedelta(hours=2))
    assert interactive_headroom_get(cluster_id=cluster.pk, at=now) == {"A100": 1, "H100": 0}
    # A cancelled booking holds nothing; a later one that starts within the hour does.
    BookingFactory(
        **common,
        gpu_count=2,
        start_at=issued,
        end_at=now + timedelta(hours=1),
        status=Booking.Status.CANCELLED,
    )
    BookingFactory(
        **common, gpu_count=2, start_at=now + timedelta(minutes=20), end_at=now + timedelta(hours=2)
    )
    assert interactive_headroom_get(cluster_id=cluster.pk, at=now) == {"A100": 0, "H100": 0}
    # A forecast older than the age limit (6 h) is not used, though it covers the hour.
    later = issued + timedelta(hours=7)
    assert Booking.objects.filter(end_at__gt=later).count() == 0
    assert interactive_headroom_get(cluster_id=cluster.pk, at=issued + timedelta(hours=5))["A100"] == 4
    assert interactive_headroom_get(cluster_id=cluster.pk, at=later)["A100"] == 0


def test_headroom_capped_at_a_share_of_free_capacity(cluster: Cluster, nodes: list[Node]) -> None:
    issued = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    _store_interactive_run(cluster, issued=issued, upper80=7.0)
    assert interactive_headroom_get(cluster_id=cluster.pk, at=issued) == {"A100": 2}  # 25% of 8
    assert interactive_headroom_get(cluster_id=cluster.pk, at=issued - timedelta(hours=1)) == {"A100": 0}


def _finished(user, project, cluster, *, runtime_s: float, end: datetime, count: int) -> None:
    for i in range(count):
        stop = end + timedelta(minutes=i)
        JobFactory(
            cluster=cluster,
            user=user,
            project=project,
            requested_s=None,
            status=Job.Status.COMPLETED,
            submitted_at=stop - timedelta(seconds=runtime_s + 60),
            started_at=stop - timedelta(seconds=runtime_s),
            ended_at=stop,
        )


def test_job_runtime_predict_falls_back_user_project_global(cluster: Cluster, nodes: list[Node]) -> None:
    short, long_ = ProjectFactory(slug="short"), ProjectFactory(slug="long")
    alice = MembershipFactory(project=short).user  # 10-minute jobs
    bob, carol = MembershipFactory(project=long_).user, MembershipFactory(project=long_).user  # 5.5 h jobs
    dave = MembershipFactory(project=long_).user  # 15-minute jobs in the long project
    _finished(alice, short, cluster, runtime_s=600, end=at(0), count=8)
    _finished(dave, long_, cluster, runtime_s=900, end=at(10), count=5)
    _finished(bob, long_, cluster, runtime_s=20_000, end=at(20), count=8)
    _finished(carol, long_, cluster, runtime_s=20_000, end=at(30), count=8)
    newcomer_short = MembershipFactory(project=short).user
    newcomer_elsewhere = MembershipFactory().user

    def predict(user, project) -> tuple[float, float]:
        job = JobFactory(cluster=cluster, user=user, project=project, requested_s=None, submitted_at=at(40))
        p50, p90 = job_runtime_predict(job=job)
        job.refresh_from_db()
        assert (job.predicted_p50_s, job.predicted_p90_s) == (p50, p90)
        assert p90 >= p50 > 0
        return p50, p90

    assert 400 <= predict(alice, short)[0] <= 900  # her own history
    assert 600 <= predict(dave, long_)[0] <= 1_400  # his own history beats his project's
    assert 400 <= predict(newcomer_short, short)[0] <= 900  # no history: the project's
    stranger = newcomer_elsewhere.memberships.get().project
    assert 13_000 <= predict(newcomer_elsewhere, stranger)[0] <= 30_000  # no project history: everyone's

    # The engine snapshot's own requests (username, project slug) get the same answers.
    job = JobFactory(cluster=cluster, user=dave, project=long_, requested_s=None, submitted_at=at(41))
    request = job_request(job, usernames={dave.pk: dave.username}, slugs={long_.pk: long_.slug})
    assert runtime_predict(cluster_id=cluster.pk, requests=[request]) == [job_runtime_predict(job=job)]


def test_job_runtime_predict_without_history_uses_the_request_and_caps_at_it(
    cluster: Cluster, nodes: list[Node]
) -> None:
    job = JobFactory(cluster=cluster, requested_s=5_400)
    assert job_runtime_predict(job=job) == (5_400.0, 5_400.0)
    user = MembershipFactory().user
    project = user.memberships.get().project
    _finished(user, project, cluster, runtime_s=20_000, end=at(0), count=6)
    runtime_predictor_forget(cluster_id=cluster.pk)
    capped = JobFactory(cluster=cluster, user=user, project=project, requested_s=3_600, submitted_at=at(1))
    p50, p90 = job_runtime_predict(job=capped)
    assert p50 <= p90 <= 3_600


def test_jobs_runtime_predict_fills_pending_jobs_only(cluster: Cluster, nodes: list[Node]) -> None:
    pending = [JobFactory(cluster=cluster, requested_s=1_800) for _ in range(3)]
    done = JobFactory(cluster=cluster, status=Job.Status.COMPLETED, started_at=at(0), ended_at=at(1))
    assert jobs_runtime_predict(cluster_id=cluster.pk) == 3
    assert all(Job.objects.get(pk=j.pk).predicted_p50_s == 1_800.0 for j in pending)
    assert Job.objects.get(pk=done.pk).predicted_p50_s is None
    assert jobs_runtime_predict(cluster_id=cluster.pk, only_missing=True) == 0


def test_demand_totals_match_job_gpu_hours(cluster: Cluster, nodes: list[Node], a100: GpuType) -> None:
    """Whatever the grouping, the hourly means integrate to the GPU-hours of the records."""
    issued = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
    _daily_history(cluster, a100, days=2, end=issued)
    series = demand_series_get(cluster_id=cluster.pk, end_at=issued)
    gpu_hours = sum(j.gpu_count for j in Job.objects.filter(cluster=cluster))  # each ran one hour
    assert np.isclose(series[("gpu_type", "")].sum(), gpu_hours)
    assert np.isclose(series[("project", "vision")].sum(), gpu_hours)
    interactive = Job.objects.filter(cluster=cluster, kind=Job.Kind.INTERACTIVE).count()
    assert np.isclose(series[("interactive", "A100")].sum(), interactive)


def test_runtime_predictor_cache_learns_new_jobs_incrementally(cluster: Cluster, nodes: list[Node]) -> None:
    user = MembershipFactory().user
    project = user.memberships.get().project
    _finished(user, project, cluster, runtime_s=600, end=at(0), count=3)
    first = runtime_predictor_get(cluster_id=cluster.pk)
    assert first.n_observed == 3
    _finished(user, project, cluster, runtime_s=600, end=at(1), count=2)

    assert runtime_predictor_get(cluster_id=cluster.pk) is first  # within the TTL: as it was
    assert first.n_observed == 3
    assert runtime_predictor_get(cluster_id=cluster.pk, max_age_s=0) is first  # only the new jobs
    assert first.n_observed == 5
    assert runtime_predictor_get(cluster_id=cluster.pk, max_age_s=0).n_observed == 5  # nothing twice
    with override_settings(BERTH_RUNTIME_PREDICTOR_REBUILD_S=0):
        rebuilt = runtime_predictor_get(cluster_id=cluster.pk, max_age_s=0)
    assert rebuilt is not first
    assert rebuilt.n_observed == 5


def test_headroom_costs_a_fixed_number_of_queries(
    cluster: Cluster, nodes: list[Node], django_assert_max_num_queries: Any
) -> None:
    issued = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    _store_interactive_run(cluster, issued=issued, upper80=1.0)
    for _ in range(5):
        BookingFactory(
            cluster=cluster, gpu_type=GpuType.objects.get(name="A100"), start_at=issued, end_at=at(500)
        )
    with django_assert_max_num_queries(4):
        interactive_headroom_get(cluster_id=cluster.pk, at=issued)


def test_runtime_accuracy_compares_predictions_with_user_estimates(
    cluster: Cluster, nodes: list[Node]
) -> None:
    def finished(runtime_s: float, *, p50: float | None, p90: float | None, requested: int | None) -> None:
        JobFactory(
            cluster=cluster, status=Job.Status.COMPLETED, started_at=at(0),
            ended_at=at(0) + timedelta(seconds=runtime_s),
            predicted_p50_s=p50, predicted_p90_s=p90, requested_s=requested,
        )  # fmt: skip

    finished(1_000, p50=900, p90=1_500, requested=8_000)  # prediction close, estimate 8x off
    finished(1_000, p50=3_000, p90=4_000, requested=1_200)  # prediction 3x off, estimate close
    finished(2_000, p50=1_500, p90=1_800, requested=None)  # close, but beyond its p90
    finished(5_000, p50=None, p90=None, requested=5_000)  # never predicted: not counted
    JobFactory(
        cluster=cluster, status=Job.Status.CANCELLED, started_at=at(0), ended_at=at(1), predicted_p50_s=60
    )

    acc = runtime_accuracy_get(cluster_id=cluster.pk, since=at(-1))

    assert acc.jobs == 3
    assert acc.predictor_within_2x == pytest.approx(2 / 3)
    assert acc.predictor_mae_s == pytest.approx((100 + 2_000 + 500) / 3)
    assert acc.p90_coverage == pytest.approx(2 / 3)
    assert acc.estimated_jobs == 2
    assert acc.user_estimate_within_2x == pytest.approx(1 / 2)
    assert acc.user_estimate_mae_s == pytest.approx((7_000 + 200) / 2)
    assert runtime_accuracy_get(cluster_id=cluster.pk, since=at(2)).jobs == 0
