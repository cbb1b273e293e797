"""Forecast models on synthetic series: interface, accuracy against naive, intervals, no peeking.

Prophet really runs here (it needs no network); tests that fit it many times are marked slow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting.core.events import Event
from forecasting.core.metrics import coverage, mae
from forecasting.core.models import (
    ABLATION_NAMES,
    MODEL_NAMES,
    BerthModel,
    ProphetModel,
    SeasonalNaiveModel,
    make_model,
)
from tests.forecasting.conftest import seasonal_series


def test_seasonal_naive_repeats_last_season_with_empirical_interval() -> None:
    index = pd.date_range("2024-01-01", periods=72, freq="h")
    y = pd.Series(np.tile(np.arange(24.0), 3), index=index)
    y.iloc[-24:] += 2.0  # the last day is 2 higher: seasonal differences are 0 or 2
    fc = SeasonalNaiveModel(period=24).fit(y).forecast(30)
    assert fc.index[0] == index[-1] + pd.Timedelta(hours=1)
    np.testing.assert_array_equal(fc.point[:24], y.to_numpy()[-24:])
    np.testing.assert_array_equal(fc.point[24:], y.to_numpy()[-24:-18])  # wraps around
    assert (fc.lower <= fc.point).all()
    assert (fc.upper >= fc.point).all()
    assert fc.upper[0] - fc.point[0] == pytest.approx(2.0)  # 90% quantile of {0 x24, 2 x24}


def test_seasonal_naive_168_falls_back_to_a_day_on_short_history() -> None:
    y = pd.Series(np.arange(48.0), index=pd.date_range("2024-01-01", periods=48, freq="h"))
    fc = SeasonalNaiveModel(period=168).fit(y).forecast(24)
    np.testing.assert_array_equal(fc.point, np.arange(24.0, 48.0))


def test_history_must_be_hourly() -> None:
    y = pd.Series([1.0, 2.0], index=pd.to_datetime(["2024-01-01 00:00", "2024-01-01 03:00"]))
    with pytest.raises(ValueError, match="hourly"):
        SeasonalNaiveModel(period=24).fit(y)


def test_prophet_beats_seasonal_naive_on_clean_seasonal_trend() -> None:
    # One real Prophet fit (fast).  A trend plus weekday effect is what Prophet models and
    # what repeating yesterday gets wrong every Monday and Saturday.
    y = seasonal_series(days=27, trend_per_day=1.0, noise=1.0, seed=1)
    history, future = y.iloc[:-24], y.iloc[-24:]
    assert future.index[0].day_of_week == 5  # a Saturday: yesterday was a weekday
    prophet = ProphetModel().fit(history).forecast(24)
    naive = SeasonalNaiveModel(period=24).fit(history).forecast(24)
    assert mae(future, prophet.point) < 0.5 * mae(future, naive.point)
    assert coverage(future, prophet.lower, prophet.upper) >= 0.5


def test_berth_forecast_shape_interval_order_and_determinism() -> None:
    y = seasonal_series(days=21, seed=2)
    a = BerthModel().fit(y).forecast(24)
    b = BerthModel().fit(y).forecast(24)
    assert len(a.point) == 24
    assert list(a.index) == list(pd.date_range(y.index[-1] + pd.Timedelta(hours=1), periods=24, freq="h"))
    assert (a.lower <= a.point).all()
    assert (a.point <= a.upper).all()
    assert (a.lower >= 0).all()  # demand is never negative
    np.testing.assert_array_equal(a.point, b.point)


def test_berth_does_not_peek_at_future_data() -> None:
    y = seasonal_series(days=21, seed=3)
    origin = len(y) - 48
    altered = y.copy()
    altered.iloc[origin:] *= 10.0  # wildly different future
    a = BerthModel().fit(y.iloc[:origin]).forecast(24)
    b = BerthModel().fit(altered.iloc[:origin]).forecast(24)
    np.testing.assert_array_equal(a.point, b.point)
    np.testing.assert_array_equal(a.upper, b.upper)


def test_berth_short_history_and_outage_gap() -> None:
    short = seasonal_series(days=1)
    fc = BerthModel().fit(short).forecast(24)
    assert np.isfinite(fc.point).all()
    y = seasonal_series(days=14, noise=0.5, seed=4)
    y.iloc[-60:-40] = 0.0  # a 20-hour monitoring gap two days ago
    fc = BerthModel().fit(y).forecast(24)
    # The gap is masked: tomorrow is forecast near the usual level, not near zero.
    assert fc.point.mean() > 0.6 * y.iloc[-24 * 7 :].replace(0.0, np.nan).mean()


def test_make_model_knows_contract_names_and_ablations() -> None:
    for name in (*MODEL_NAMES, *ABLATION_NAMES):
        assert make_model(name).name == name
    with pytest.raises(KeyError):
        make_model("arima")


@pytest.mark.slow
def test_event_calendar_moves_the_forecast_on_event_days() -> None:
    y = seasonal_series(days=35, trend_per_day=0.0, seed=5)
    event_days = [pd.Timestamp("2024-01-10"), pd.Timestamp("2024-01-24"), pd.Timestamp("2024-02-05")]
    for day in event_days:
        y[day : day + pd.Timedelta(hours=23)] += 30.0
    events = [Event(name="deadline", start=d) for d in event_days]
    history = y[: pd.Timestamp("2024-02-04 23:00")]
    with_events = ProphetModel(events=events).fit(history).forecast(24)
    without = ProphetModel().fit(history).forecast(24)
    assert with_events.point.mean() - without.point.mean() > 15.0


@pytest.mark.slow
def test_berth_intervals_cover_roughly_and_beat_naive_on_seasonal_series() -> None:
    from forecasting.core.backtest import backtest

    y = seasonal_series(days=35, noise=3.0, seed=6)
    results = {
        r.model: r
        for r in backtest(y, [lambda: make_model("berth"), lambda: make_model("seasonal_naive_24")], days=5)
    }
    assert 0.6 <= results["berth"].coverage_80 <= 1.0
    assert results["berth"].mase < results["seasonal_naive_24"].mase


def test_prophet_helper_survives_a_history_without_data() -> None:
    from forecasting.core.models import prophet_fit_predict

    y = pd.Series(np.nan, index=pd.date_range("2024-01-01", periods=48, freq="h"))
    y.iloc[5] = 3.0
    fit = prophet_fit_predict(y, horizon_h=24)
    assert fit.future.tolist() == [3.0] * 24
