"""Rolling-origin backtests of forecasting models.

Origins are daily: the last ``days`` days of the series each start one forecast of
``horizon_h`` hours, the last one ending at the series' last hour.  At every origin each
model is built fresh and fitted on the data *before* the origin only.  Scores per model:

* ``mase``: mean over origins of MAE / in-sample MAE of the 24 h seasonal naive on the
  same training data (one scale per origin, shared by all models);
* ``smape``: sMAPE in percent over all scored hours;
* ``coverage_80``: fraction of actual hours inside the 80% interval;
* ``coverage_upper_95``: fraction of actual hours at or below the 95% upper bound (the
  80% upper bound for a model without one);
* ``fit_s_mean``: mean wall time of fit + forecast per origin, in seconds;
* ``fit_cpu_s_mean``: the same in CPU time, this process's *plus its finished child
  processes'* (``RUSAGE_CHILDREN``: Prophet fits in a CmdStan child, whose CPU the process
  time alone misses); what one core spends, where the wall time on a loaded machine also
  counts waiting for a core;
* ``fit_child_cpu_s_mean``: the child processes' part of it.

Actual values are scored as recorded (outage zeros included): every model faces them.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forecasting.core.metrics import coverage, mae, seasonal_naive_scale, smape
from forecasting.core.models import ForecastModel

__all__ = ["BacktestResult", "backtest", "children_cpu_s", "origins_for"]


@dataclass(frozen=True, slots=True)
class BacktestResult:
    model: str
    mase: float
    smape: float
    coverage_80: float
    coverage_upper_95: float
    fit_s_mean: float
    fit_cpu_s_mean: float
    origins: int
    fit_child_cpu_s_mean: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """The contract keys of ``bench.forecast`` (plus the origin count)."""
        return {
            "mase": self.mase,
            "smape": self.smape,
            "coverage_80": self.coverage_80,
            "coverage_upper_95": self.coverage_upper_95,
            "fit_s_mean": self.fit_s_mean,
            "fit_cpu_s_mean": self.fit_cpu_s_mean,
            "fit_child_cpu_s_mean": self.fit_child_cpu_s_mean,
            "origins": float(self.origins),
        }


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's terminated, waited-for child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def origins_for(series: pd.Series, *, days: int = 28, horizon_h: int = 24) -> list[int]:
    """Integer positions of the forecast origins (first hour forecast), oldest first.

    The last origin is ``len - horizon_h``; earlier ones step back one day.  Origins that
    would leave less than one day of training data are dropped.
    """
    n = len(series)
    last = n - horizon_h
    return [o for o in (last - 24 * k for k in range(days - 1, -1, -1)) if o >= 24]


def backtest(
    series: pd.Series,
    factories: Sequence[Callable[[], ForecastModel]],
    *,
    days: int = 28,
    horizon_h: int = 24,
) -> list[BacktestResult]:
    """Score each model factory over rolling daily origins; see the module docstring."""
    origins = origins_for(series, days=days, horizon_h=horizon_h)
    if not origins:
        raise ValueError("series too short for a backtest")
    values = series.to_numpy(dtype=float)
    results: list[BacktestResult] = []
    for factory in factories:
        name = factory().name
        mases: list[float] = []
        actual_all: list[np.ndarray] = []
        point_all: list[np.ndarray] = []
        lower_all: list[np.ndarray] = []
        upper_all: list[np.ndarray] = []
        upper95_all: list[np.ndarray] = []
        fit_s: list[float] = []
        fit_cpu_s: list[float] = []
        child_cpu_s: list[float] = []
        for o in origins:
            train = series.iloc[:o]
            actual = values[o : o + horizon_h]
            t0, c0, k0 = time.perf_counter(), time.process_time(), children_cpu_s()
            fc = factory().fit(train).forecast(horizon_h)
            fit_s.append(time.perf_counter() - t0)
            child_cpu_s.append(children_cpu_s() - k0)
            fit_cpu_s.append(time.process_time() - c0 + child_cpu_s[-1])
            scale = seasonal_naive_scale(train.to_numpy(dtype=float), period=24)
            err = mae(actual, fc.point)
            mases.append(err / scale if np.isfinite(scale) and scale > 0 else err)
            actual_all.append(actual)
            point_all.append(fc.point)
            lower_all.append(fc.lower)
            upper_all.append(fc.upper)
            upper95_all.append(fc.upper_95_or_upper)
        a = np.concatenate(actual_all)
        results.append(
            BacktestResult(
                model=name,
                mase=float(np.nanmean(mases)),
                smape=smape(a, np.concatenate(point_all)),
                coverage_80=coverage(a, np.concatenate(lower_all), np.concatenate(upper_all)),
                coverage_upper_95=coverage(a, np.full(len(a), -np.inf), np.concatenate(upper95_all)),
                fit_s_mean=float(np.mean(fit_s)),
                fit_cpu_s_mean=float(np.mean(fit_cpu_s)),
                origins=len(origins),
                fit_child_cpu_s_mean=float(np.mean(child_cpu_s)),
            )
        )
    return results
