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


def test_every_model_gives_an_upper_95_at_or_above_its_80_band() -> None:
    y = seasonal_series(days=30, noise=3.0, seed=4)
    for name in MODEL_NAMES:
        fc = make_model(name).fit(y).forecast(24)
        assert fc.upper_95 is not None, name
        assert (fc.upper_95 >= fc.upper - 1e-9).all(), name
        assert (fc.upper >= fc.point - 1e-9).all(), name
        assert (fc.lower <= fc.point + 1e-9).all(), name
        assert "upper_95" in fc.to_frame().columns


def test_autoets_and_mstl_track_a_clean_daily_season() -> None:
    # Both are standard models of exactly this shape: they must beat repeating yesterday's
    # noise.  AutoETS's analytic band must hold most of the next day; MSTL's comes from the
    # deseasonalised rest only (as in statsforecast), so it is narrower but never empty.
    y = seasonal_series(days=35, trend_per_day=0.0, noise=2.0, seed=2)
    history, future = y.iloc[:-24], y.iloc[-24:]
    naive = SeasonalNaiveModel(period=24).fit(history).forecast(24)
    for name in ("autoets", "mstl"):
        fc = make_model(name).fit(history).forecast(24)
        assert fc.index[0] == history.index[-1] + pd.Timedelta(hours=1)
        assert mae(future, fc.point) < mae(future, naive.point), name
        assert coverage(future, fc.lower, fc.upper) >= (0.6 if name == "autoets" else 0.3), name
        assert (fc.upper - fc.lower > 0.5).all(), name


def test_statistical_baselines_handle_gaps_and_short_history() -> None:
    y = seasonal_series(days=10, seed=3)
    y.iloc[30:40] = np.nan
    for name in ("autoets", "mstl"):
        fc = make_model(name).fit(y).forecast(24)
        assert np.isfinite(fc.point).all(), name
        short = make_model(name).fit(y.iloc[:6]).forecast(5)
        assert len(short.point) == 5, name
        assert np.isfinite(short.upper_95_or_upper).all(), name


def _session_demand(days: int, seed: int) -> pd.Series:
    """Hourly mean GPUs of interactive sessions: Poisson arrivals in office hours, 0.5-4 h, 1-2 GPUs."""
    rng = np.random.default_rng(seed)
    index = pd.date_range("2024-01-01", periods=24 * days, freq="h")
    hour = index.hour.to_numpy()
    rate = np.where((hour >= 9) & (hour < 18), 3.0, np.where((hour >= 8) & (hour < 22), 1.3, 0.25))
    rate = rate * np.where(index.day_of_week.to_numpy() >= 5, 0.3, 1.0)
    minutes = np.zeros(24 * days * 60 + 6 * 60)
    for h, lam in enumerate(rate):
        for _ in range(rng.poisson(lam)):
            start = h * 60 + int(rng.integers(60))
            minutes[start : start + int(rng.uniform(30, 240))] += 1 if rng.random() < 0.7 else 2
    return pd.Series(minutes[: 24 * days * 60].reshape(-1, 60).mean(axis=1), index=index)


@pytest.mark.slow
def test_berth_bands_are_calibrated_on_session_demand() -> None:
    # The interactive pool is sized from berth's upper band: over 14 daily origins of a
    # diurnal session series the 80% band and the 95% upper bound must hold what they say.
    from forecasting.core.backtest import backtest

    (result,) = backtest(_session_demand(70, seed=5), [lambda: make_model("berth")], days=14)
    assert 0.72 <= result.coverage_80 <= 0.88
    assert 0.90 <= result.coverage_upper_95 <= 0.99


def test_a_prophet_fit_logs_no_error_about_plotting() -> None:
    """Importing Prophet logs "Importing plotly failed" at ERROR (plotly is not installed, and
    plots are not used): the fit silences it, so a worker's log shows no ERROR for a normal fit.
    A fresh interpreter, because this process may have imported Prophet already."""
    import subprocess
    import sys

    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "import numpy as np, pandas as pd\n"
        "from forecasting.core.basemodels import prophet_fit_predict\n"
        "h = pd.Series(np.arange(200.0) % 24, index=pd.date_range('2026-01-01', periods=200, freq='h'))\n"
        "print(len(prophet_fit_predict(h, horizon_h=24).future))\n"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "24"
    assert "ERROR" not in done.stderr, done.stderr
