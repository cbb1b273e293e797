"""The forecast track record on real PostgreSQL: stored forecasts keep their later actuals,
and the capacity page scores each series against seasonal naive.  Prophet fits for real."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from forecasting.models import ForecastPoint, ForecastRun
from forecasting.selectors import demand_series_get, forecast_track_record_list, from_naive_utc
from forecasting.services import forecast_actuals_record, forecast_refresh, seasonal_naive_24
from forecasting.tasks import forecast_refresh as forecast_refresh_task
from scheduling.models import Cluster, GpuType, Job, Node
from tests.factories import MembershipFactory, ProjectFactory

pytestmark = pytest.mark.django_db

ISSUED = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)


def _office_hours(cluster: Cluster, gpu_type: GpuType, *, start: datetime, end: datetime) -> None:
    """One job per hour: 4 GPUs in office hours (9-18 UTC), 1 otherwise; a 2-hour burst of
    8 GPUs on the day after ``ISSUED`` (09:00-11:00) that no forecast can know about."""
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project).user
    jobs = []
    t = start
    while t < end:
        gpus = 4 if 9 <= t.hour < 18 else 1
        if ISSUED + timedelta(hours=9) <= t < ISSUED + timedelta(hours=11):
            gpus = 8
        jobs.append(
            Job(
                cluster=cluster,
                user=user,
                project=project,
                gpu_type=gpu_type,
                name="j",
                gpu_count=gpus,
                status=Job.Status.COMPLETED,
                submitted_at=t,
                started_at=t,
                ended_at=t + timedelta(hours=1),
            )
        )
        t += timedelta(hours=1)
    Job.objects.bulk_create(jobs)


def test_seasonal_naive_24_repeats_the_last_day() -> None:
    import pandas as pd

    y = pd.Series([float(h) for h in range(30)], index=pd.date_range("2026-01-01", periods=30, freq="h"))
    naive = seasonal_naive_24(y, horizon_h=50)
    assert naive[0] == 6.0  # the hour 24 h before the first forecast hour
    assert naive[23] == 29.0
    assert naive[24] == 6.0  # day two repeats the same last day
    assert naive[49] == 7.0
    assert seasonal_naive_24(y.iloc[:10], horizon_h=3) == [None, None, None]


@override_settings(BERTH_FORECAST_HORIZON_H=24)
def test_stored_forecasts_get_their_actuals_and_a_track_record(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    _office_hours(cluster, a100, start=ISSUED - timedelta(days=6), end=ISSUED + timedelta(days=2))
    forecast_refresh(cluster_id=cluster.pk, at=ISSUED + timedelta(minutes=10))
    run = ForecastRun.objects.get(cluster=cluster, kind="gpu_type", key="A100")
    points = list(ForecastPoint.objects.filter(run=run).order_by("ts"))
    # Stored with the run: the 95% bound and the seasonal naive issued at the same time.
    assert all(p.upper95 is not None and p.upper95 >= p.upper80 for p in points)
    assert [p.naive24 for p in points] == [4.0 if 9 <= h < 18 else 1.0 for h in range(24)]
    assert all(p.actual is None for p in points)

    # Ten hours later only the ten hours that are over get their actual.
    # Three series (A100, the cluster total, the project); ten hours of each are over.
    assert forecast_actuals_record(cluster_id=cluster.pk, now=ISSUED + timedelta(hours=10, minutes=5)) == 30
    recorded = {p.ts: p.actual for p in ForecastPoint.objects.filter(run=run) if p.actual is not None}
    assert sorted(recorded) == [ISSUED + timedelta(hours=h) for h in range(10)]
    assert recorded[ISSUED + timedelta(hours=9)] == 8.0  # the burst, as it happened

    # A day later all of it; a second call finds nothing left to do.
    later = ISSUED + timedelta(hours=25)
    assert forecast_actuals_record(cluster_id=cluster.pk, now=later) == 3 * 24 - 30
    assert forecast_actuals_record(cluster_id=cluster.pk, now=later) == 0
    actual = demand_series_get(cluster_id=cluster.pk, end_at=later, history_days=2)[("gpu_type", "A100")]
    points = list(ForecastPoint.objects.filter(run=run).order_by("ts"))
    assert [p.actual for p in points] == [
        float(actual[pd_ts]) for pd_ts in actual.index if from_naive_utc(pd_ts) >= ISSUED
    ][:24]

    # The track record, recomputed by hand from the stored rows.
    records = {(r.kind, r.key): r for r in forecast_track_record_list(cluster_id=cluster.pk, now=later)}
    assert set(records) == {("gpu_type", "A100"), ("gpu_type", ""), ("project", "vision")}
    rec = records[("gpu_type", "A100")]
    mae = sum(abs(p.yhat - p.actual) for p in points) / 24
    naive_mae = sum(abs(p.naive24 - p.actual) for p in points) / 24
    assert naive_mae == pytest.approx(8.0 / 24)  # the naive misses only the burst: 4 GPUs twice
    assert rec.hours == rec.points == 24
    assert rec.mae_gpus == pytest.approx(mae)
    assert rec.mase == pytest.approx(mae / naive_mae)
    assert rec.coverage_80 == pytest.approx(sum(p.lower80 <= p.actual <= p.upper80 for p in points) / 24)
    assert rec.coverage_upper_95 == pytest.approx(sum(p.actual <= p.upper95 for p in points) / 24)
    # The burst hours are outside any sensible band.
    assert rec.coverage_80 < 1.0
    assert rec.verdict in {"trusted", "worse_than_naive", "band_off"}
    # Only hours inside the window count.
    assert forecast_track_record_list(cluster_id=cluster.pk, now=later + timedelta(days=8)) == []


def _stored_run(
    cluster: Cluster, *, key: str, issued: datetime, hours: int, error: float, band: float = 2.0
) -> ForecastRun:
    """A stored run forecasting ``10 + error`` GPUs with an 80% band of +-``band`` GPUs and
    the upper 95% 1 GPU above it.  What happened: 10 GPUs, except a burst of 20 every tenth
    hour; the naive said 11 throughout."""
    run = ForecastRun.objects.create(
        cluster=cluster,
        kind=ForecastRun.Kind.GPU_TYPE,
        key=key,
        model_name="berth",
        issued_at=issued,
        train_start_at=issued - timedelta(days=7),
        train_end_at=issued,
        horizon_h=hours,
    )
    ForecastPoint.objects.bulk_create(
        ForecastPoint(
            run=run,
            ts=issued + timedelta(hours=h),
            yhat=10.0 + error,
            lower80=10.0 + error - band,
            upper80=10.0 + error + band,
            upper95=11.0 + error + band,
            naive24=11.0,
            actual=20.0 if h % 10 == 9 else 10.0,
        )
        for h in range(hours)
    )
    return run


def test_track_record_verdicts(cluster: Cluster) -> None:
    now = ISSUED + timedelta(days=3)
    _stored_run(cluster, key="good", issued=ISSUED, hours=50, error=0.5)
    _stored_run(cluster, key="bad", issued=ISSUED, hours=50, error=3.0)
    _stored_run(cluster, key="narrow", issued=ISSUED, hours=50, error=0.5, band=0.0)
    _stored_run(cluster, key="new", issued=now - timedelta(hours=5), hours=5, error=0.0)
    records = {r.key: r for r in forecast_track_record_list(cluster_id=cluster.pk, now=now)}
    # MAE 0.9 * 0.5 + 0.1 * 9.5 = 1.4 against the naive's 0.9 * 1 + 0.1 * 9 = 1.8.
    assert records["good"].mase == pytest.approx(1.4 / 1.8)
    assert records["good"].mae_gpus == pytest.approx(1.4)
    assert records["good"].coverage_80 == pytest.approx(0.9)  # the bursts are outside
    assert records["good"].coverage_upper_95 == pytest.approx(0.9)
    assert records["good"].verdict == "trusted"
    # MAE 0.9 * 3 + 0.1 * 7 = 3.4: worse than the naive, and the band misses everything.
    assert records["bad"].mase == pytest.approx(3.4 / 1.8)
    assert records["bad"].coverage_80 == 0.0
    assert records["bad"].coverage_upper_95 == pytest.approx(0.9)  # 16 GPUs: above all but bursts
    assert records["bad"].verdict == "worse_than_naive"
    # The same points as "good" with a zero-width band: the point is fine, the band is not.
    assert records["narrow"].mase == pytest.approx(records["good"].mase)
    assert records["narrow"].coverage_80 == 0.0
    assert records["narrow"].verdict == "band_off"
    assert records["new"].hours == 5
    assert records["new"].verdict == "too_new"


def test_track_record_costs_one_query(cluster: Cluster, django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    for i in range(5):
        _stored_run(cluster, key=f"t{i}", issued=ISSUED, hours=24, error=1.0)
    with django_assert_num_queries(1):
        records = forecast_track_record_list(cluster_id=cluster.pk, now=ISSUED + timedelta(days=2))
    assert len(records) == 5


def test_capacity_page_shows_the_track_record(
    client: Client, staff: User, member: User, cluster: Cluster, nodes: list[Node]
) -> None:
    from django.utils import timezone

    issued = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(days=2)
    _stored_run(cluster, key="A100", issued=issued, hours=30, error=0.5)
    _stored_run(cluster, key="", issued=issued, hours=30, error=3.0)
    _stored_run(cluster, key="H100", issued=issued - timedelta(days=30), hours=30, error=0.0)
    url = reverse("ops:capacity") + f"?cluster={cluster.pk}"
    client.force_login(member)
    assert client.get(url + "&csv=forecast-track-record").status_code == 403  # staff only
    client.force_login(staff)
    body = client.get(url).content.decode()
    assert 'id="forecast-track-record"' in body
    section = body[body.index('id="forecast-track-record"') :]
    assert "GPU type A100" in section
    assert "trusted: beats seasonal naive" in section
    assert "do not trust: worse than repeating the last day" in section
    assert "Cluster total" in section
    assert "GPU type H100" not in section  # scored only over the last 7 days
    assert "0.78" in section  # the two MASE values
    assert "1.89" in section
    rows = client.get(url + "&csv=forecast-track-record").content.decode().splitlines()
    assert rows[0].startswith("Series,Hours scored,MAE (GPUs),MASE vs seasonal naive")
    assert any(r.startswith('GPU type A100,30,1.4,0.78,90%,90%,"trusted:') for r in rows)


@override_settings(BERTH_FORECAST_HORIZON_H=24)
def test_hourly_task_records_actuals_before_refreshing(
    cluster: Cluster, nodes: list[Node], a100: GpuType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _office_hours(cluster, a100, start=ISSUED - timedelta(days=6), end=ISSUED + timedelta(days=1))
    forecast_refresh(cluster_id=cluster.pk, at=ISSUED)
    # The task reads the wall clock; run it "three hours later" (Celery calls it the same way).
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: ISSUED + timedelta(hours=3, minutes=1))
    out = forecast_refresh_task.run(cluster.pk)
    assert out["actuals_recorded"] == 3 * 3  # three series, three hours over
    assert out["created"] == 3  # this hour's new runs
    assert ForecastPoint.objects.filter(run__cluster=cluster, actual__isnull=False).count() == 9
