"""Standard statistical baselines for the demand benchmark: AutoETS and MSTL (statsmodels).

Both follow statsforecast's published recipes for hourly load, built on statsmodels
(statsforecast 2 pins pandas below 3):

* ``autoets``: additive-error ETS with a 24 h season, the trend chosen by AICc among none,
  additive and damped additive (multiplicative forms are left out: demand series have
  exact zeros).  Intervals are the model's own analytic prediction intervals.
* ``mstl``: MSTL decomposition with daily and weekly periods (weekly only with three weeks
  of history), the seasonal components repeated from their last cycle, and the
  deseasonalised rest (trend + remainder) forecast by a non-seasonal AutoETS, whose
  intervals are the band (statsforecast's ``MSTL(trend_forecaster=AutoETS(model="ZZN"))``).

Both see the last ``max_history_days`` days (8 weeks, like ``prophet`` and ``berth``).
Unknown hours (NaN) are interpolated for fitting: ETS cannot skip them.  A non-negative
history gives non-negative forecasts.  statsmodels is imported lazily (about 2 s).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecasting.core.basemodels import Forecast, _check_history, _future_index

__all__ = ["AutoETSModel", "MSTLModel", "ets_auto_fit"]

FloatArray = npt.NDArray[np.float64]

# One-sided normal quantiles used by the analytic bands: 80% central and 95% upper.
_ALPHA_80, _ALPHA_UPPER_95 = 0.2, 0.1


def _filled(history: pd.Series) -> pd.Series:
    y = history.astype(float).interpolate(limit_direction="both")
    return y.fillna(0.0).reset_index(drop=True)


def ets_auto_fit(y: pd.Series, *, seasonal_periods: int | None) -> Any:
    """Fit additive-error ETS candidates (trend none/add/damped) and return the best by AICc.

    ``seasonal_periods=None`` fits non-seasonal models.  Heuristic initial states keep a
    fit at a few hundredths of a second on 8 weeks of hourly data.
    """
    from statsmodels.tsa.exponential_smoothing.ets import ETSModel

    seasonal = "add" if seasonal_periods else None
    candidates: list[dict[str, Any]] = [
        {"trend": None},
        {"trend": "add", "damped_trend": False},
        {"trend": "add", "damped_trend": True},
    ]
    best: Any = None
    best_aicc = np.inf
    with warnings.catch_warnings():
        # Convergence and "no frequency" warnings on every fit; the AICc decides anyway.
        warnings.simplefilter("ignore")
        for cand in candidates:
            try:
                model = ETSModel(
                    y,
                    error="add",
                    seasonal=seasonal,
                    seasonal_periods=seasonal_periods,
                    initialization_method="heuristic" if seasonal else "estimated",
                    **cand,
                )
                res = model.fit(disp=False)
            except (ValueError, np.linalg.LinAlgError):
                continue
            aicc = float(res.aicc)
            if best is None or (np.isfinite(aicc) and aicc < best_aicc):
                best, best_aicc = res, aicc
    return best


def _ets_bands(res: Any, n: int, horizon_h: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Point, 80% lower/upper and 95% upper of a fitted ETS for the next ``horizon_h`` steps."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = res.get_prediction(start=n, end=n + horizon_h - 1)
        f80 = pred.summary_frame(alpha=_ALPHA_80)
        f90 = pred.summary_frame(alpha=_ALPHA_UPPER_95)
    return (
        f80["mean"].to_numpy(dtype=float),
        f80["pi_lower"].to_numpy(dtype=float),
        f80["pi_upper"].to_numpy(dtype=float),
        f90["pi_upper"].to_numpy(dtype=float),
    )


def _finish(
    history: pd.Series, horizon_h: int, parts: tuple[FloatArray, FloatArray, FloatArray, FloatArray]
) -> Forecast:
    point, lower, upper, upper_95 = (np.nan_to_num(a, nan=0.0) for a in parts)
    if bool(np.nanmin(history.to_numpy(dtype=float)) >= 0):
        point, lower, upper, upper_95 = (np.maximum(a, 0.0) for a in (point, lower, upper, upper_95))
    upper = np.maximum(upper, point)
    upper_95 = np.maximum(upper_95, upper)
    return Forecast(_future_index(history, horizon_h), point, np.minimum(lower, point), upper, upper_95)


def _naive(history: pd.Series, horizon_h: int) -> Forecast:
    """Too little data for a model: the last value, banded by the spread seen."""
    y = history.to_numpy(dtype=float)
    finite = y[np.isfinite(y)]
    last = float(finite[-1])
    point = np.full(horizon_h, last)
    lo, hi, hi95 = (float(np.quantile(finite, q)) for q in (0.1, 0.9, 0.95))
    return _finish(
        history,
        horizon_h,
        (point, np.full(horizon_h, min(lo, last)), np.full(horizon_h, hi), np.full(horizon_h, hi95)),
    )


class AutoETSModel:
    """Additive ETS with a daily season, trend chosen by AICc (see the module docstring)."""

    name = "autoets"

    def __init__(self, *, max_history_days: int = 56, season_h: int = 24) -> None:
        self.max_history_days = max_history_days
        self.season_h = season_h
        self._history: pd.Series | None = None
        self._res: Any = None

    def fit(self, history: pd.Series) -> AutoETSModel:
        """Fit on the last ``max_history_days`` days."""
        history = _check_history(history).iloc[-24 * self.max_history_days :]
        self._history = history
        y = _filled(history)
        season = self.season_h if len(y) >= 2 * self.season_h + 2 else None
        self._res = ets_auto_fit(y, seasonal_periods=season) if len(y) >= 10 else None
        return self

    def forecast(self, horizon_h: int) -> Forecast:
        """ETS point and analytic bands for the next ``horizon_h`` hours."""
        if self._history is None:
            raise RuntimeError("fit() first")
        if self._res is None:
            return _naive(self._history, horizon_h)
        return _finish(self._history, horizon_h, _ets_bands(self._res, len(self._res.model.endog), horizon_h))


class MSTLModel:
    """MSTL (24 h, 168 h) with a non-seasonal AutoETS on the rest (see the module docstring)."""

    name = "mstl"

    def __init__(self, *, max_history_days: int = 56) -> None:
        self.max_history_days = max_history_days
        self._history: pd.Series | None = None
        self._seasonal: FloatArray | None = None
        self._periods: tuple[int, ...] = ()
        self._res: Any = None

    def fit(self, history: pd.Series) -> MSTLModel:
        """Decompose the last ``max_history_days`` days and fit the rest."""
        from statsmodels.tsa.seasonal import MSTL

        history = _check_history(history).iloc[-24 * self.max_history_days :]
        self._history = history
        y = _filled(history)
        n = len(y)
        self._periods = tuple(p for p in (24, 168) if n >= 3 * p)
        if n < 10:
            self._res = None
            return self
        if self._periods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dec = MSTL(y.to_numpy(dtype=float), periods=self._periods).fit()
            seasonal = np.asarray(dec.seasonal, dtype=float).reshape(n, -1)
            self._seasonal = seasonal
            rest = y.to_numpy(dtype=float) - seasonal.sum(axis=1)
        else:
            self._seasonal = np.zeros((n, 0))
            rest = y.to_numpy(dtype=float)
        self._res = ets_auto_fit(pd.Series(rest), seasonal_periods=None)
        return self

    def forecast(self, horizon_h: int) -> Forecast:
        """Last seasonal cycles repeated plus the ETS forecast of the rest, with its bands."""
        if self._history is None:
            raise RuntimeError("fit() first")
        if self._res is None or self._seasonal is None:
            return _naive(self._history, horizon_h)
        n = self._seasonal.shape[0]
        season = np.zeros(horizon_h)
        for k, period in enumerate(self._periods):
            last_cycle = self._seasonal[n - period :, k]
            season += last_cycle[np.arange(horizon_h) % period]
        point, lower, upper, upper_95 = _ets_bands(self._res, n, horizon_h)
        return _finish(
            self._history, horizon_h, (point + season, lower + season, upper + season, upper_95 + season)
        )
