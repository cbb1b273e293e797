"""Rolling-origin backtests: origin placement, no peeking, scores on a known case."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from forecasting.core.backtest import backtest, origins_for
from forecasting.core.models import Forecast, SeasonalNaiveModel


class SpyModel:
    """Records the last timestamp of every history it is fitted on; forecasts zeros."""

    name = "spy"
    seen: list[pd.Timestamp] = []

    def fit(self, history: pd.Series) -> SpyModel:
        self.seen.append(history.index[-1])
        self._end = history.index[-1]
        return self

    def forecast(self, horizon_h: int) -> Forecast:
        index = pd.date_range(self._end + pd.Timedelta(hours=1), periods=horizon_h, freq="h")
        zeros = np.zeros(horizon_h)
        return Forecast(index, zeros, zeros, zeros)


def _series(days: int) -> pd.Series:
    index = pd.date_range("2024-01-01", periods=24 * days, freq="h")
    return pd.Series(np.tile(np.arange(24.0), days), index=index)


def test_origins_are_daily_and_end_with_the_series() -> None:
    y = _series(10)
    origins = origins_for(y, days=3, horizon_h=24)
    assert origins == [len(y) - 72, len(y) - 48, len(y) - 24]
    assert origins_for(_series(2), days=28) == [24]  # never less than a day of training


def test_models_only_see_data_before_each_origin() -> None:
    y = _series(10)
    SpyModel.seen = []
    backtest(y, [SpyModel], days=4)
    origins = origins_for(y, days=4)
    # the first call is only the name lookup (no fit); every fit ends just before its origin
    assert SpyModel.seen == [y.index[o - 1] for o in origins]


def test_perfect_periodic_series_scores_zero_error_full_coverage() -> None:
    (result,) = backtest(_series(10), [lambda: SeasonalNaiveModel(period=24)], days=3)
    assert result.mase == 0.0
    assert result.smape == 0.0
    assert result.coverage_80 == 1.0
    assert result.origins == 3
    assert result.fit_s_mean >= 0.0


def test_spy_forecasting_zero_scores_mase_against_naive_scale() -> None:
    y = _series(10) + 1.0
    y.iloc[::24] += 24.0  # every midnight jumps: seasonal-naive scale stays 0 -> fallback 1
    (result,) = backtest(y, [SpyModel], days=2)
    assert result.mase == pytest.approx(float(np.mean(np.abs(y.iloc[-48:].to_numpy()))))


class ChildBurnerModel(SpyModel):
    """Fits by running a child process that burns CPU, as Prophet's CmdStan child does."""

    name = "child_burner"

    def fit(self, history: pd.Series) -> ChildBurnerModel:
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
        subprocess.run([sys.executable, "-c", burn], check=True)
        super().fit(history)
        return self


def test_fit_cpu_counts_the_child_processes() -> None:
    (result,) = backtest(_series(4), [ChildBurnerModel], days=2)
    # 0.2 s of CPU per fit happen in the child: the process time alone would miss them
    assert result.fit_child_cpu_s_mean >= 0.18
    assert result.fit_cpu_s_mean >= result.fit_child_cpu_s_mean
    assert result.as_dict()["fit_child_cpu_s_mean"] == result.fit_child_cpu_s_mean
