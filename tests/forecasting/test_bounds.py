"""Forecast bounds and the no-signal fallback (issue 16: the demo's 1-GPU A10 pool got a band
reaching hundreds of GPUs).  Real Prophet fits, no mocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from forecasting.core.models import NO_SIGNAL, Forecast, make_model
from forecasting.models import ForecastPoint, ForecastRun
from forecasting.services import forecast_ceiling, forecast_refresh
from scheduling.models import Cluster, GpuType, Job
from tests.factories import GpuTypeFactory, MembershipFactory, NodeFactory, ProjectFactory
from tests.forecasting.conftest import seasonal_series


def _hourly(values: np.ndarray) -> pd.Series:
    return pd.Series(values, index=pd.date_range("2026-01-05", periods=len(values), freq="h"))


def _assert_ordered_within(fc: Forecast, low: float, high: float) -> None:
    for arr in (fc.point, fc.lower, fc.upper, fc.upper_95_or_upper):
        assert np.isfinite(arr).all()
        assert (arr >= low - 1e-12).all(), arr.min()
        assert (arr <= high + 1e-9).all(), arr.max()
    assert (fc.lower <= fc.point + 1e-12).all()
    assert (fc.point <= fc.upper + 1e-12).all()
    assert (fc.upper <= fc.upper_95_or_upper + 1e-12).all()


def test_near_zero_series_is_flagged_and_stays_within_what_it_ever_reached() -> None:
    # Eight weeks of an idle 1-GPU pool, then one session over the last 30 hours.  Before the
    # fix the log-space band put the upper 95% at 3 GPUs (three times what the pool holds).
    y = np.zeros(24 * 56)
    y[-30:] = 1.0
    fc = make_model("berth").fit(_hourly(y)).forecast(24)
    assert fc.flag == NO_SIGNAL
    _assert_ordered_within(fc, 0.0, 1.0)
    # The empirical distribution of the last week: 30 of 168 hours busy.
    np.testing.assert_allclose(fc.point, 30 / 168)
    assert fc.upper_95_or_upper.max() == pytest.approx(1.0)


@pytest.mark.parametrize("busy_hours", [60, 100])
def test_sparse_series_with_signal_is_modelled_but_bounded_by_twice_its_history_max(busy_hours: int) -> None:
    # Enough non-zero hours to model (not flagged), and the band used to reach 3x the maximum.
    y = np.zeros(24 * 56)
    y[-busy_hours:] = 1.0
    fc = make_model("berth").fit(_hourly(y)).forecast(24)
    assert fc.flag is None
    _assert_ordered_within(fc, 0.0, 2.0)


def test_many_sparse_shapes_never_exceed_the_ceiling() -> None:
    rng = np.random.default_rng(7)
    for _ in range(6):
        n = int(rng.choice([72, 240, 24 * 28]))
        y = np.zeros(n)
        start = int(rng.integers(0, n - 10))
        y[start : start + int(rng.integers(1, 60))] = rng.uniform(0.05, 1.0)
        fc = make_model("berth").fit(_hourly(y)).forecast(24)
        _assert_ordered_within(fc, 0.0, 2.0 * y.max())


def test_busy_series_is_not_flagged_and_its_forecast_is_unchanged_by_the_ceiling() -> None:
    y = seasonal_series(days=21)
    fc = make_model("berth").fit(y).forecast(24)
    assert fc.flag is None
    assert fc.upper_95_or_upper.max() < 2.0 * y.max()


def test_bounded_clips_and_keeps_the_order() -> None:
    index = pd.date_range("2026-01-01", periods=3, freq="h")
    fc = Forecast(
        index,
        point=np.array([-1.0, 0.5, 900.0]),
        lower=np.array([-2.0, 0.1, 400.0]),
        upper=np.array([0.5, np.nan, 1000.0]),
        upper_95=np.array([0.2, 2.0, 1200.0]),
        flag=NO_SIGNAL,
    ).bounded(1.0)
    np.testing.assert_array_equal(fc.point, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(fc.lower, [0.0, 0.1, 1.0])
    np.testing.assert_array_equal(fc.upper, [0.5, 0.5, 1.0])
    np.testing.assert_array_equal(fc.upper_95_or_upper, [0.5, 1.0, 1.0])
    assert fc.flag == NO_SIGNAL


def test_ceiling_is_the_pool_for_interactive_series_only() -> None:
    capacity = {"A10": 1, "A100": 8}
    assert forecast_ceiling(kind="interactive", key="A10", capacity_by_type=capacity) == 1.0
    assert forecast_ceiling(kind="interactive", key="H100", capacity_by_type=capacity) is None
    # Type and project demand count queued work: no physical bound.
    assert forecast_ceiling(kind="gpu_type", key="A10", capacity_by_type=capacity) is None
    assert forecast_ceiling(kind="project", key="vision", capacity_by_type=capacity) is None


@pytest.mark.django_db
def test_refresh_stores_a_one_gpu_pool_forecast_within_the_pool_and_flagged(cluster: Cluster) -> None:
    a10: GpuType = GpuTypeFactory(name="A10")
    NodeFactory(cluster=cluster, gpu_type=a10, name="g0", gpu_count=1)
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project).user
    issued = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
    common = {"cluster": cluster, "user": user, "project": project, "gpu_type": a10, "name": "s"}
    # Three weeks of one 1-GPU batch job a day, and one interactive session 6 h ago.
    jobs = [
        Job(
            **common,
            gpu_count=1,
            status=Job.Status.COMPLETED,
            submitted_at=issued - timedelta(days=d, hours=5),
            started_at=issued - timedelta(days=d, hours=5),
            ended_at=issued - timedelta(days=d, hours=3),
        )
        for d in range(1, 22)
    ]
    jobs.append(
        Job(
            **common,
            gpu_count=1,
            kind=Job.Kind.INTERACTIVE,
            status=Job.Status.COMPLETED,
            submitted_at=issued - timedelta(hours=6),
            started_at=issued - timedelta(hours=6),
            ended_at=issued - timedelta(hours=4),
        )
    )
    Job.objects.bulk_create(jobs)

    result = forecast_refresh(cluster_id=cluster.pk, at=issued)

    assert result.failed == 0
    pool = ForecastRun.objects.get(cluster=cluster, kind="interactive", key="A10")
    assert pool.flag == NO_SIGNAL
    points = ForecastPoint.objects.filter(run=pool)
    assert points.count() == pool.horizon_h
    for p in points:
        assert 0.0 <= p.lower80 <= p.yhat <= p.upper80 <= p.upper95 <= 1.0
    # The type series has 42 busy hours in three weeks: also too few to model.
    assert ForecastRun.objects.get(cluster=cluster, kind="gpu_type", key="A10").flag == NO_SIGNAL
