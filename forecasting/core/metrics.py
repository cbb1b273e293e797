"""Forecast accuracy metrics (pure numpy).

Conventions: arrays of equal length, NaN actuals are ignored, sMAPE is in percent
(0-200) with 0/0 counted as a perfect forecast.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["coverage", "mae", "mase", "seasonal_naive_scale", "smape"]

FloatArray = npt.NDArray[np.float64]


def _pair(actual: npt.ArrayLike, forecast: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    a = np.asarray(actual, dtype=float)
    f = np.asarray(forecast, dtype=float)
    if a.shape != f.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {f.shape}")
    keep = np.isfinite(a)
    return a[keep], f[keep]


def mae(actual: npt.ArrayLike, forecast: npt.ArrayLike) -> float:
    """Mean absolute error; NaN when there is nothing to score."""
    a, f = _pair(actual, forecast)
    return float(np.mean(np.abs(a - f))) if len(a) else float("nan")


def seasonal_naive_scale(history: npt.ArrayLike, *, period: int = 24) -> float:
    """In-sample MAE of the seasonal naive forecast y[t] = y[t - period] (the MASE scale)."""
    h = np.asarray(history, dtype=float)
    if len(h) <= period:
        return float("nan")
    diff = np.abs(h[period:] - h[:-period])
    diff = diff[np.isfinite(diff)]
    return float(np.mean(diff)) if len(diff) else float("nan")


def mase(actual: npt.ArrayLike, forecast: npt.ArrayLike, *, scale: float) -> float:
    """MAE divided by ``scale`` (from :func:`seasonal_naive_scale` on the training data).

    A zero scale (a constant history) falls back to 1 so the value stays finite.
    """
    s = scale if np.isfinite(scale) and scale > 0 else 1.0
    return mae(actual, forecast) / s


def smape(actual: npt.ArrayLike, forecast: npt.ArrayLike) -> float:
    """Symmetric MAPE in percent: mean of 200 |a - f| / (|a| + |f|), 0/0 counted as 0."""
    a, f = _pair(actual, forecast)
    if not len(a):
        return float("nan")
    denom = np.abs(a) + np.abs(f)
    terms = np.divide(2.0 * np.abs(a - f), denom, out=np.zeros_like(denom), where=denom > 0)
    return float(100.0 * np.mean(terms))


def coverage(actual: npt.ArrayLike, lower: npt.ArrayLike, upper: npt.ArrayLike) -> float:
    """Fraction of actuals inside the closed interval [lower, upper]."""
    a = np.asarray(actual, dtype=float)
    lo = np.asarray(lower, dtype=float)
    hi = np.asarray(upper, dtype=float)
    keep = np.isfinite(a)
    if not keep.any():
        return float("nan")
    return float(np.mean((a[keep] >= lo[keep]) & (a[keep] <= hi[keep])))
