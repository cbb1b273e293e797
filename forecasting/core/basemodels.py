"""The forecast interface and the plain models: seasonal naive and Prophet.

Split from :mod:`forecasting.core.models` (which re-exports everything here); see that
module's docstring for the model list and the ``fit``/``forecast`` contract.
"""

from __future__ import annotations

import functools
import itertools
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecasting.core.events import Event, events_to_holidays

FloatArray = npt.NDArray[np.float64]
HOUR = pd.Timedelta(hours=1)
_LOWER_Q, _UPPER_Q = 0.1, 0.9  # an 80% central interval
_UPPER_95_Q = 0.95  # a one-sided 95% upper bound (what sizes headroom)
NO_SIGNAL = "no_signal"  # Forecast.flag: too few non-zero hours to model


@dataclass(frozen=True, slots=True)
class Forecast:
    """Point forecast, 80% interval and 95% upper bound, one value per future hour.

    ``upper_95`` is the level the actual should stay at or below 95% of the time (one-sided);
    a model that has none leaves it ``None`` and :attr:`upper_95_or_upper` falls back to
    the 80% upper bound.  ``flag`` is ``None`` for a normal forecast, or a reason the
    forecast is a stand-in (:data:`NO_SIGNAL`: the history had too few non-zero hours to
    model, so it is the empirical distribution of what was seen).
    """

    index: pd.DatetimeIndex
    point: FloatArray
    lower: FloatArray
    upper: FloatArray
    upper_95: FloatArray | None = None
    flag: str | None = None

    def bounded(self, ceiling: float | None, *, floor: float | None = 0.0) -> Forecast:
        """The same forecast with every value clipped to ``[floor, ceiling]`` (``None``: open).

        The order ``lower <= point <= upper <= upper_95`` is kept.  Demand cannot be
        negative, and a pool cannot run more than it holds; a band past either says
        nothing and breaks whatever is sized from it.
        """
        hi = np.inf if ceiling is None or not np.isfinite(ceiling) else float(ceiling)
        lo = -np.inf if floor is None else float(floor)
        hi = max(hi, lo)

        def clip(a: FloatArray) -> FloatArray:
            out: FloatArray = np.clip(np.nan_to_num(a, nan=lo if np.isfinite(lo) else 0.0), lo, hi)
            return out

        point = clip(self.point)
        lower = np.minimum(clip(self.lower), point)
        upper = np.maximum(clip(self.upper), point)
        upper_95 = None if self.upper_95 is None else np.maximum(clip(self.upper_95), upper)
        return Forecast(self.index, point, lower, upper, upper_95, self.flag)

    @property
    def upper_95_or_upper(self) -> FloatArray:
        """``upper_95`` when the model gives one, else ``upper``."""
        return self.upper if self.upper_95 is None else self.upper_95

    def to_frame(self) -> pd.DataFrame:
        """The forecast as a frame with columns ``point, lower, upper, upper_95``."""
        return pd.DataFrame(
            {
                "point": self.point,
                "lower": self.lower,
                "upper": self.upper,
                "upper_95": self.upper_95_or_upper,
            },
            index=self.index,
        )


class ForecastModel(Protocol):
    name: str

    def fit(self, history: pd.Series) -> ForecastModel:
        """Learn from an hourly series; returns self."""
        ...

    def forecast(self, horizon_h: int) -> Forecast:
        """Forecast the ``horizon_h`` hours after the end of the fitted history."""
        ...


def _check_history(history: pd.Series) -> pd.Series:
    if not isinstance(history.index, pd.DatetimeIndex):
        raise TypeError("history needs a DatetimeIndex")
    if len(history) == 0 or not np.isfinite(history.to_numpy(dtype=float)).any():
        raise ValueError("history has no finite values")
    if len(history) > 1 and (history.index[1:] - history.index[:-1] != HOUR).any():
        raise ValueError("history must be hourly and regular (resample it first)")
    return history.astype(float)


def _future_index(history: pd.Series, horizon_h: int) -> pd.DatetimeIndex:
    start = history.index[-1] + HOUR
    return pd.date_range(start, periods=horizon_h, freq="h")


def _nan_quantile(values: FloatArray, q: float, default: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.quantile(finite, q)) if len(finite) else default


# ---- seasonal naive ----


class SeasonalNaiveModel:
    """y[T + h] = y[T + h - period * ceil(h / period)]; NaNs fall back to the last value."""

    def __init__(self, *, period: int) -> None:
        self.period = period
        self.name = f"seasonal_naive_{period}"
        self._history: pd.Series | None = None
        self._q: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def fit(self, history: pd.Series) -> SeasonalNaiveModel:
        """Store the history and the quantiles of its seasonal differences."""
        self._history = _check_history(history)
        y = self._history.to_numpy(dtype=float)
        period = min(self.period, max(len(y) - 1, 1))
        diffs = y[period:] - y[:-period] if len(y) > period else np.zeros(1)
        self._q = tuple(_nan_quantile(diffs, q, 0.0) for q in (_LOWER_Q, _UPPER_Q, _UPPER_95_Q))  # type: ignore[assignment]
        return self

    def forecast(self, horizon_h: int) -> Forecast:
        """Repeat the last season; the interval widens with sqrt(seasons ahead)."""
        if self._history is None:
            raise RuntimeError("fit() first")
        y = self._history.to_numpy(dtype=float)
        n = len(y)
        last = float(pd.Series(y).ffill().iloc[-1])
        period = self.period if n >= self.period else 24 if n >= 24 else n
        steps = np.arange(1, horizon_h + 1)
        seasons = np.ceil(steps / period)
        src = (n - 1 + steps - period * seasons).astype(int)
        point = np.where(src >= 0, y[np.clip(src, 0, n - 1)], last)
        point = np.where(np.isfinite(point), point, last)
        widen = np.sqrt(seasons)
        return Forecast(
            index=_future_index(self._history, horizon_h),
            point=point,
            lower=point + self._q[0] * widen,
            upper=point + self._q[1] * widen,
            upper_95=point + self._q[2] * widen,
        )


# ---- Prophet ----


def _quiet_prophet() -> None:
    # cmdstanpy logs two INFO lines per fit; prophet logs its seasonality choices.
    logging.getLogger("cmdstanpy").setLevel(logging.WARNING)
    logging.getLogger("prophet").setLevel(logging.WARNING)


@dataclass(frozen=True, slots=True)
class ProphetFit:
    """In-sample fitted values (aligned with the history) and the future path."""

    fitted: FloatArray
    future: FloatArray


def prophet_fit_predict(
    history: pd.Series,
    *,
    horizon_h: int,
    events: Sequence[Event] = (),
    daily_order: int = 6,
    weekly_order: int = 3,
    changepoint_prior_scale: float = 0.05,
    changepoint_range: float = 0.8,
    min_weekly_days: int = 14,
) -> ProphetFit:
    """Fit Prophet (MAP, no sampling) on ``history`` and predict history + horizon.

    NaN values are left out of the fit.  Daily seasonality needs two days of data, weekly
    seasonality two weeks: less makes Prophet fit noise as season.
    """
    # before the import, which logs "Importing plotly failed" at ERROR (plots are not used here)
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)
    from prophet import Prophet  # heavy (about 0.6 s); only where a fit happens

    _quiet_prophet()  # after the import: cmdstanpy sets its own level when imported

    values = history.to_numpy(dtype=float)
    if np.isfinite(values).sum() < 2:
        # Prophet refuses; a flat line at the known value (or 0) is all there is to say.
        known = values[np.isfinite(values)]
        level = float(known[0]) if len(known) else 0.0
        return ProphetFit(fitted=np.full(len(values), level), future=np.full(horizon_h, level))

    span_days = (history.index[-1] - history.index[0]) / pd.Timedelta(days=1)
    model = Prophet(
        growth="linear",
        yearly_seasonality=False,
        weekly_seasonality=weekly_order if span_days >= min_weekly_days else False,
        daily_seasonality=daily_order if span_days >= 2 else False,
        holidays=events_to_holidays(events),
        changepoint_prior_scale=changepoint_prior_scale,
        changepoint_range=changepoint_range,
        uncertainty_samples=0,
    )
    frame = pd.DataFrame({"ds": history.index, "y": history.to_numpy(dtype=float)})
    with warnings.catch_warnings():
        # prophet 1.5 on pandas 3 warns on every predict (DataFrame.drop inplace).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model.fit(frame.dropna())
        future = pd.DataFrame({"ds": history.index.append(_future_index(history, horizon_h))})
        yhat = model.predict(future)["yhat"].to_numpy(dtype=float)
    n = len(history)
    return ProphetFit(fitted=yhat[:n], future=yhat[n:])


class ProphetModel:
    """Plain Prophet on the raw series, intervals from in-sample residual quantiles."""

    name = "prophet"

    def __init__(self, *, events: Sequence[Event] = (), max_history_days: int = 56) -> None:
        self.events = tuple(events)
        self.max_history_days = max_history_days
        self._history: pd.Series | None = None
        self._fit: ProphetFit | None = None
        self._q: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._nonneg = True

    def fit(self, history: pd.Series) -> ProphetModel:
        """Fit on the last ``max_history_days`` days of ``history``."""
        history = _check_history(history).iloc[-24 * self.max_history_days :]
        self._history = history
        self._nonneg = bool(np.nanmin(history.to_numpy(dtype=float)) >= 0)
        self._fit = prophet_fit_predict(history, horizon_h=168, events=self.events)
        resid = history.to_numpy(dtype=float) - self._fit.fitted
        self._q = tuple(_nan_quantile(resid, q, 0.0) for q in (_LOWER_Q, _UPPER_Q, _UPPER_95_Q))  # type: ignore[assignment]
        return self

    def forecast(self, horizon_h: int) -> Forecast:
        """Prophet's path for the next hours (up to one week, fitted once)."""
        if self._history is None or self._fit is None:
            raise RuntimeError("fit() first")
        if horizon_h > len(self._fit.future):
            self._fit = prophet_fit_predict(self._history, horizon_h=horizon_h, events=self.events)
        point = self._fit.future[:horizon_h].copy()
        lower, upper, upper_95 = point + self._q[0], point + self._q[1], point + self._q[2]
        if self._nonneg:
            point, lower, upper, upper_95 = (np.maximum(a, 0.0) for a in (point, lower, upper, upper_95))
        return Forecast(_future_index(self._history, horizon_h), point, lower, upper, upper_95)


# ---- numeric helpers of the berth blend (forecasting.core.models) ----


def _smoothing_states(
    z: FloatArray, *, alpha: float, gamma: float, period: int = 24
) -> tuple[FloatArray, FloatArray, float]:
    """Additive level + seasonal exponential smoothing (Holt-Winters without trend) of ``z``.

    Returns (level, season, one-step MAE): entry ``t`` is the state *before* ``z[t]`` was
    seen (``t = len(z)``: after all of it), so the forecast from origin ``t`` for position
    ``u >= t`` is ``level[t] + season[t, u % period]``.  Unknown values (NaN) leave the
    state unchanged.  The MAE counts the one-step errors after the first period.
    """
    n = len(z)
    level = np.empty(n + 1)
    season = np.empty((n + 1, period))
    first = z[:period]
    lvl = float(np.nanmean(first)) if np.isfinite(first).any() else 0.0
    seas = np.zeros(period)
    seas[: len(first)] = np.where(np.isfinite(first), first - lvl, 0.0)
    abs_err, counted = 0.0, 0
    for t in range(n):
        level[t] = lvl
        season[t] = seas
        zt = z[t]
        if zt == zt:  # not NaN; a scalar test is cheaper than np.isfinite in this loop
            k = t % period
            err = zt - lvl - seas[k]
            lvl += alpha * err
            seas[k] += gamma * err
            if t >= period:
                abs_err += abs(err)
                counted += 1
    level[n] = lvl
    season[n] = seas
    return level, season, abs_err / counted if counted else np.inf


@functools.cache
def _simplex_grid(k: int, steps: int) -> FloatArray:
    """All weight vectors of length ``k`` with entries in multiples of 1/steps summing to 1.

    The first row puts everything on component 0.
    """
    rows = []
    for bars in itertools.combinations(range(steps + k - 1), k - 1):
        edges = (-1, *bars, steps + k - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(k)])
    grid = np.array(rows, dtype=float)[::-1] / steps
    grid.setflags(write=False)
    return grid
