"""Hourly demand forecasting models with one interface.

``model.fit(history)`` takes an hourly ``pd.Series`` (regular ``DatetimeIndex``; NaN means
unknown) and returns the model; ``model.forecast(horizon_h)`` returns a :class:`Forecast`:
point forecast, an 80% interval and a 95% upper bound for the next ``horizon_h`` hours.  A model only ever
sees the history it was fitted on, so rolling-origin backtests cannot peek.

Models:

* ``seasonal_naive_24`` / ``seasonal_naive_168``: repeat the last day / week; intervals
  from the empirical 10%/90% quantiles of the in-sample seasonal differences.
* ``prophet``: Prophet with daily and weekly seasonality (weekly only from two weeks of
  history on) and an optional event calendar; intervals from in-sample residual
  quantiles (Prophet's own sampling costs about 1 s per fit; ``uncertainty_samples=0``).
* ``autoets`` / ``mstl``: the standard statistical baselines
  (:mod:`forecasting.core.statsbaselines`, statsmodels).
* ``berth``: the model the portal ships, see :class:`BerthModel`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecasting.core.basemodels import (
    _LOWER_Q,
    _UPPER_95_Q,
    _UPPER_Q,
    NO_SIGNAL,
    FloatArray,
    Forecast,
    ForecastModel,
    ProphetFit,
    ProphetModel,
    SeasonalNaiveModel,
    _check_history,
    _future_index,
    _nan_quantile,
    _simplex_grid,
    _smoothing_states,
    prophet_fit_predict,
)
from forecasting.core.events import Event
from forecasting.core.series import mask_outages

__all__ = [
    "MODEL_NAMES",
    "NO_SIGNAL",
    "BerthConfig",
    "BerthModel",
    "Forecast",
    "ForecastModel",
    "ProphetModel",
    "SeasonalNaiveModel",
    "make_model",
    "prophet_fit_predict",
]

# ---- berth ----


@dataclass(frozen=True, slots=True)
class BerthConfig:
    """Switches of the shipped model; each one is an ablation in docs/forecasting.md."""

    clean_outages: bool = True  # long zero runs in a busy series are gaps, not demand
    log_transform: bool = True  # fit log1p(y): bursty counts, multiplicative seasons
    # Carry the recent Prophet residual forward (direct, per h).  Off: with the last value
    # and the median in the blend it did not earn its place (docs/forecasting.md).
    level_correction: bool = False
    median_component: bool = True  # the blend may use the median of the last 24 hours
    smoothing_component: bool = True  # ... and exponential smoothing (level + daily season)
    # Level gains tried for the smoothing component; the one with the smallest one-step
    # error on the history before the calibration window is used (like ETS's fitted alpha).
    smoothing_alphas: tuple[float, ...] = (0.2, 0.5, 0.9)
    smoothing_gamma: float = 0.1  # season gain
    ensemble: bool = True  # blend with seasonal naive 24/168, weights from recent errors
    conformal: bool = True  # intervals from recent h-step errors, not in-sample residuals
    signed_band: bool = True  # 80% band from signed error quantiles (off: symmetric |error|)
    conformal_correction: bool = True  # quantile levels corrected for the few calibration days
    holdout_fit: bool = True  # calibrate on a second Prophet fit that did not see the last days
    changepoint_prior_scale: float = 0.05
    changepoint_range: float = 0.8
    daily_order: int = 6
    max_history_days: int = 56
    calibration_days: int = 14  # pseudo-origins used for weights and intervals
    level_hours: int = 3  # residual window of the level correction
    weight_step: float = 0.1  # grid step of the blend weights
    # The weights are the mean of every grid blend whose calibration MAE is within this
    # share of the best one (0: the best blend alone).  A fixed 0.05 helps the Earth total
    # but hurts Venus, the teams and session demand (docs/forecasting.md), so by default
    # the share is chosen per fit instead (``near_best_cv``); ``near_best`` only applies
    # with ``near_best_cv=()``.
    near_best: float = 0.0
    # Choose ``near_best`` among 0 and these values on the fitted history: weights from the
    # older half of the calibration window's pseudo-origins, scored on the newer half (a
    # forward inner backtest; ``near_best_cv_forward=False`` also scores the other way).
    near_best_cv: tuple[float, ...] = (0.02, 0.05, 0.1)
    near_best_cv_forward: bool = True
    # No value of the forecast exceeds this multiple of the fitted history's maximum: a
    # log-space band (or a Prophet trend) on a near-zero series can otherwise explode.
    ceiling_factor: float = 2.0
    # Fewer non-zero hours than this (or a smaller share of the history) is no signal to
    # model: the forecast is the empirical distribution of the last week, flagged.
    min_signal_hours: int = 48
    min_signal_share: float = 0.02
    signal_window_h: int = 168
    events: tuple[Event, ...] = field(default=())


class BerthModel:
    """Prophet blended with naive forecasts, calibrated on a holdout, conformal intervals.

    1. Outage runs are masked (:func:`~forecasting.core.series.mask_outages`) and the
       series is fitted as ``log1p(y)``, where bursts are tame and seasons multiply.
    2. Prophet (daily + weekly + events) gives the structural path ``P``.
    3. *Blend* (in log space) of ``P``, the 24 h and 168 h seasonal naives, the last value,
       the median of the last 24 hours and exponential smoothing (level + daily season,
       its gain chosen by one-step error before the calibration window), with weights on
       a simplex grid, one set for hours 1-6 and one for 7-24, minimising the
       original-scale MAE of the forecasts made from every hour of the last
       ``calibration_days`` days (pseudo-origins; no refits), or the mean of the grid
       blends within a share ``near_best`` of the smallest MAE; that share (0, i.e. the
       best blend alone, or one of ``near_best_cv``) is chosen per fit by a forward inner
       backtest: weights from the older half of the pseudo-origins, scored on the newer.
    4. *Conformal interval*: the 10%/90% quantiles of the signed pseudo-origin errors per
       horizon (pooled over h +- 3; ``signed_band=False``: the 80% quantile of their size,
       symmetric), each miss rate scaled by d / (d + 1) for d calibration days
       (``conformal_correction``); while the calibration window is shorter than
       ``calibration_days`` (a young series), widened to the 10%/90% quantiles of
       day-over-day changes of the whole history where those are wider.  Added in log
       space and transformed back, so the band is as wide as the model's recent multi-step
       errors (not its one-step noise).  The 95% upper bound is the (signed) 95% quantile
       of the same errors, at least the 80% upper bound.  A band that is still zero-wide
       opens to the spread of the blended components.

    Prophet's in-sample residuals flatter it (its trend bends to the data it saw), so steps
    3-4 use a second Prophet fit that ends ``calibration_days`` days earlier and are scored
    on hours that fit did not see (``holdout_fit``).  Optional (``level_correction``, off
    by default): Prophet's residual of the last ``level_hours`` hours carried ``h`` hours
    ahead with a slope ``beta_h`` regressed on past residuals.  Everything comes from the
    history passed to :meth:`fit`: two Prophet fits and some numpy.
    """

    name = "berth"
    _BUCKETS: tuple[tuple[int, int], ...] = ((0, 6), (6, 24))
    # prophet(+level), seasonal naive 24, seasonal naive 168, last value, median of last
    # day, exponential smoothing
    _N_COMPONENTS = 6

    def __init__(self, config: BerthConfig | None = None, *, name: str = "berth") -> None:
        self.config = config or BerthConfig()
        self.name = name
        self._state: dict[str, Any] = {}

    # transforms
    def _fwd(self, y: FloatArray) -> FloatArray:
        return np.log1p(np.maximum(y, 0.0)) if self._state["log"] else y

    def _inv(self, z: FloatArray) -> FloatArray:
        return np.expm1(z) if self._state["log"] else z

    def _prophet(self, series: pd.Series, *, horizon_h: int) -> ProphetFit:
        cfg = self.config
        return prophet_fit_predict(
            series,
            horizon_h=horizon_h,
            events=cfg.events,
            daily_order=cfg.daily_order,
            changepoint_prior_scale=cfg.changepoint_prior_scale,
            changepoint_range=cfg.changepoint_range,
        )

    def fit(self, history: pd.Series) -> BerthModel:
        """Fit every part on ``history`` only (see the class docstring)."""
        cfg = self.config
        history = _check_history(history).iloc[-24 * cfg.max_history_days :]
        raw = history.to_numpy(dtype=float)
        nonneg = bool(np.nanmin(raw) >= 0)
        clean = mask_outages(history) if cfg.clean_outages else history
        if not np.isfinite(clean.to_numpy(dtype=float)).any():
            clean = history
        finite = raw[np.isfinite(raw)]
        self._state = {
            "log": cfg.log_transform and nonneg, "nonneg": nonneg, "history": history,
            "ceiling": cfg.ceiling_factor * float(np.max(np.abs(finite))),
        }  # fmt: skip
        nonzero = int(np.count_nonzero(finite))
        self._state["no_signal"] = nonneg and (
            nonzero < cfg.min_signal_hours or nonzero < cfg.min_signal_share * len(finite)
        )
        if self._state["no_signal"]:
            self._state["short"] = True
            return self
        z = self._fwd(clean.to_numpy(dtype=float))
        n = len(z)
        self._state["short"] = n < 48 or np.isfinite(z).sum() < 24
        if self._state["short"]:
            return self
        zs = pd.Series(z, index=history.index)
        pf = self._prophet(zs, horizon_h=24 * 7)
        cal_h = min(24 * cfg.calibration_days, n // 2)
        # A conformal quantile from fewer days than the full window is noisy: then the
        # bands are widened by the day-over-day spread (see _interval_offsets).
        self._state["full_calibration"] = cal_h >= 24 * cfg.calibration_days
        cut = n - cal_h
        if cfg.holdout_fit and cut >= 48 and cal_h >= 48 and np.isfinite(z[:cut]).sum() >= 48:
            hold = self._prophet(zs.iloc[:cut], horizon_h=cal_h)
            cal_path = np.concatenate([hold.fitted, hold.future])
            can_calibrate = True
        else:
            # In-sample calibration is what the ablation tests; the full model would
            # rather not calibrate than trust it.
            can_calibrate = not cfg.holdout_fit
            cut = n - 24 * cfg.calibration_days - 23
            cal_path = pf.fitted
        self._state["alpha"] = self._pick_alpha(z[: max(cut, 48)])
        cal_resid = z - cal_path
        cal_level = self._level_series(cal_resid)
        origins = np.arange(max(24, cut), n - 23)
        beta = np.zeros(24)
        if cfg.level_correction:
            beta = self._level_slopes(cal_resid, cal_level, origins)
        available = [
            True,
            cfg.ensemble,
            cfg.ensemble and n >= 168 + 24,
            cfg.ensemble,
            cfg.ensemble and cfg.median_component,
            cfg.ensemble and cfg.smoothing_component,
        ]
        # Too little history to calibrate: an equal blend is the robust default.
        weights = np.tile(np.array(available, dtype=float) / sum(available), (len(self._BUCKETS), 1))
        errors = np.empty((0, 24))
        if len(origins) >= 5 and can_calibrate:
            idx = origins[:, None] + np.arange(24)[None, :]
            path = cal_path[idx] + beta[None, :] * cal_level[origins][:, None]
            comps = self._components(z, idx, path)
            target = z[idx]
            if cfg.ensemble:
                near_best = self._pick_near_best(comps, target, available)
                self._state["near_best"] = near_best
                weights = self._blend_weights(comps, target, available, near_best=near_best)
            errors = target - self._blend(comps, weights)
        self._state.update(
            z=z, future=pf.future, fitted=pf.fitted, resid=z - pf.fitted, beta=beta,
            weights=weights, errors=errors,
        )  # fmt: skip
        return self

    def _pick_alpha(self, z: FloatArray) -> float:
        """The smoothing level gain with the smallest one-step error on ``z``."""
        cfg = self.config
        errors = [_smoothing_states(z, alpha=a, gamma=cfg.smoothing_gamma)[2] for a in cfg.smoothing_alphas]
        return cfg.smoothing_alphas[int(np.argmin(errors))]

    def _level_series(self, resid: FloatArray) -> FloatArray:
        """level[o] = mean residual of the ``level_hours`` hours before index o (NaN-aware)."""
        k = self.config.level_hours
        level = pd.Series(resid).rolling(k, min_periods=1).mean().shift(1)
        # After a gap the last known level is still the best guess, for a day at most.
        out: FloatArray = level.ffill(limit=24).fillna(0.0).to_numpy(dtype=float)
        return out

    @staticmethod
    def _level_slopes(resid: FloatArray, level: FloatArray, origins: npt.NDArray[np.int_]) -> FloatArray:
        """beta_h = sum(s_o r_{o+h-1}) / sum(s_o^2) over pseudo-origins, clipped to [0, 1]."""
        if len(origins) < 5:
            return np.zeros(24)
        idx = origins[:, None] + np.arange(24)[None, :]
        s = np.broadcast_to(level[origins][:, None], idx.shape)
        r = resid[idx]
        ok = np.isfinite(r) & np.isfinite(s)
        num = np.where(ok, s * r, 0.0).sum(axis=0)
        den = np.where(ok, s * s, 0.0).sum(axis=0)
        beta: FloatArray = np.clip(np.divide(num, den, out=np.zeros(24), where=den > 0), 0.0, 1.0)
        return beta

    def _components(self, z: FloatArray, idx: npt.NDArray[np.int_], path: FloatArray) -> FloatArray:
        """(component, origin, h) array; a component with no data falls back to ``path``."""
        n = len(z)
        step = idx - idx[:, :1] + 1
        out = np.empty((self._N_COMPONENTS, *idx.shape))
        out[0] = path
        for k, period in ((1, 24), (2, 168)):
            src = idx - period * np.ceil(step / period).astype(int)
            vals = np.where(src >= 0, z[np.clip(src, 0, n - 1)], np.nan)
            out[k] = np.where(np.isfinite(vals), vals, path)
        last = pd.Series(z).ffill().to_numpy(dtype=float)
        before = idx[:, :1] - 1
        vals = np.where(before >= 0, last[np.clip(before, 0, n - 1)], np.nan)
        out[3] = np.where(np.isfinite(vals), np.broadcast_to(vals, idx.shape), path)
        # Median of the last 24 known hours: robust to the one-off drops and bursts that
        # the last value and the seasonal naives copy forward.
        med = pd.Series(z).rolling(24, min_periods=1).median().ffill().to_numpy(dtype=float)
        vals = np.where(before >= 0, med[np.clip(before, 0, n - 1)], np.nan)
        out[4] = np.where(np.isfinite(vals), np.broadcast_to(vals, idx.shape), path)
        # Exponential smoothing's state at each origin (forecast() appends unknown hours
        # after the history: the state stays at the last known one).
        alpha = self._state.get("alpha", self.config.smoothing_alphas[-1])
        level, season, _ = _smoothing_states(z, alpha=alpha, gamma=self.config.smoothing_gamma)
        origin = np.minimum(idx[:, 0], n)
        out[5] = level[origin][:, None] + season[origin[:, None], idx % 24]
        return out

    def _blend(self, comps: FloatArray, weights: FloatArray) -> FloatArray:
        out = np.empty(comps.shape[1:])
        for b, (lo, hi) in enumerate(self._BUCKETS):
            out[:, lo:hi] = np.tensordot(weights[b], comps[:, :, lo:hi], axes=1)
        return out

    def _pick_near_best(self, comps: FloatArray, target: FloatArray, available: list[bool]) -> float:
        """``config.near_best``, or with ``near_best_cv`` the candidate (0 included) whose
        weights, fitted on one half of the pseudo-origins, forecast the other half best
        (original-scale MAE summed over both directions; ties to the smallest)."""
        cands = self.config.near_best_cv
        n = comps.shape[1]
        if not cands or n < 48:
            return self.config.near_best
        # Halves split by time with a day's gap, so no origin's 24 hours overlap the other half.
        half = n // 2
        folds: tuple[tuple[slice, slice], ...] = (
            (slice(0, half - 12), slice(half + 12, n)),
            (slice(half + 12, n), slice(0, half - 12)),
        )
        if self.config.near_best_cv_forward:
            folds = folds[:1]
        options = (0.0, *cands)
        err = np.zeros(len(options))
        for fit_on, score_on in folds:
            t = target[score_on]
            ok = np.isfinite(t)
            if not ok.any():
                continue
            actual = self._inv(t[ok])
            sets = self._blend_weight_sets(comps[:, fit_on], target[fit_on], available, options)
            for k, w in enumerate(sets):
                err[k] += float(np.abs(self._inv(self._blend(comps[:, score_on], w)[ok]) - actual).mean())
        # Ties (and float noise) go to the first option, the best blend alone.
        return float(options[int(np.flatnonzero(err <= err.min() * (1 + 1e-9))[0])])

    def _blend_weights(
        self, comps: FloatArray, target: FloatArray, available: list[bool], *, near_best: float | None = None
    ) -> FloatArray:
        """The blend weights (bucket, component) minimising the calibration MAE."""
        nb = self.config.near_best if near_best is None else near_best
        return self._blend_weight_sets(comps, target, available, (nb,))[0]

    def _blend_weight_sets(
        self, comps: FloatArray, target: FloatArray, available: list[bool], near_bests: Sequence[float]
    ) -> list[FloatArray]:
        """One set of blend weights per ``near_bests`` value from one screening of the grid."""
        grid = _simplex_grid(self._N_COMPONENTS, round(1.0 / self.config.weight_step))
        grid = grid[(grid[:, ~np.array(available)] == 0).all(axis=1)]
        out = [np.zeros((len(self._BUCKETS), self._N_COMPONENTS)) for _ in near_bests]
        for b, (lo, hi) in enumerate(self._BUCKETS):
            t = target[:, lo:hi]
            ok = np.isfinite(t)
            actual = self._inv(t[ok])
            flat = comps[:, :, lo:hi][:, ok]  # (component, points)
            # Screen the whole grid in float32 (back-transforming every blend of every point
            # is most of the fit's time outside Prophet), then score the few rows within
            # 0.1% of the best exactly: the same choice as an all-float64 search.  In log
            # space |expm1(a) - expm1(b)| = |exp(a) - exp(b)|, and exp is vectorised.
            # In place: the (grid rows x points) array is the fit's largest allocation.
            blend32 = grid.astype(np.float32) @ flat.astype(np.float32)
            if self._state["log"]:
                np.exp(blend32, out=blend32)
                blend32 -= np.exp(t[ok].astype(np.float32))
            else:
                blend32 -= actual.astype(np.float32)
            errs32 = np.abs(blend32, out=blend32).mean(axis=1).astype(np.float64)
            cand = np.flatnonzero(errs32 <= errs32.min() * (1 + 1e-3) + 1e-6)
            errs = np.abs(self._inv(grid[cand] @ flat) - actual[None, :]).mean(axis=1)
            # Ties (a flat or all-zero calibration window: nothing changed lately) go to the
            # most weight on the last value, since what runs now is the best guess for a
            # level nobody has moved; then to the blend closest to equal weights.
            tied = cand[errs <= errs.min() * (1 + 1e-9) + 1e-12]
            uniform = np.array(available, dtype=float) / sum(available)
            score = -10.0 * grid[tied, 3] + ((grid[tied] - uniform) ** 2).sum(axis=1)
            single = grid[tied[int(np.argmin(score))]]
            for weights, nb in zip(out, near_bests, strict=True):
                weights[b] = single
                if nb > 0 and errs.min() > 1e-9:
                    # Two weeks of errors pick a noisy winner among near-equal blends; their
                    # mean is steadier.  (A window without error keeps the tie rule above.)
                    near = np.flatnonzero(errs32 <= errs32.min() * (1 + nb))
                    weights[b] = grid[near].mean(axis=0)
        return out

    def forecast(self, horizon_h: int) -> Forecast:
        """Point and 80% interval for the next ``horizon_h`` hours (at most one week)."""
        st = self._state
        if not st:
            raise RuntimeError("fit() first")
        history: pd.Series = st["history"]
        floor = 0.0 if st["nonneg"] else None
        if st["no_signal"]:
            return _no_signal_forecast(history, horizon_h, window_h=self.config.signal_window_h)
        if st["short"]:
            return _short_history_forecast(history, horizon_h).bounded(st["ceiling"], floor=floor)
        if horizon_h > len(st["future"]):
            raise ValueError("berth forecasts at most one week ahead")
        z = st["z"]
        n = len(z)
        beta = np.concatenate([st["beta"], np.full(max(0, horizon_h - 24), st["beta"][-1])])
        last_level = float(self._level_series(np.append(st["resid"], np.nan))[-1])
        path = st["future"][:horizon_h] + beta[:horizon_h] * last_level
        zf = np.empty(horizon_h)
        comp_lo = np.empty(horizon_h)
        comp_hi = np.empty(horizon_h)
        used = st["weights"].max(axis=0) > 0
        for start in range(0, horizon_h, 24):
            # One day at a time: the blend was calibrated on 24-hour paths.
            width = min(24, horizon_h - start)
            idx = (n + start + np.arange(24))[None, :]
            day_path = np.append(path[start : start + width], np.zeros(24 - width))[None, :]
            comps = self._components(np.append(z, np.full(start, np.nan)), idx, day_path)
            zf[start : start + width] = self._blend(comps, st["weights"])[0, :width]
            comp_lo[start : start + width] = comps[used, 0, :width].min(axis=0)
            comp_hi[start : start + width] = comps[used, 0, :width].max(axis=0)
        lo_q, hi_q, hi95_q = self._interval_offsets(horizon_h)
        # A zero-width band means the calibration window saw no error at all (a flat or
        # all-zero series); then the disagreement of the blended components is the only
        # uncertainty known, and it keeps e.g. exact zeros inside a band around 0.004.
        flat = hi_q - lo_q <= 1e-9
        lo_q = np.where(flat, np.minimum(lo_q, comp_lo - zf), lo_q)
        hi_q = np.where(flat, np.maximum(hi_q, comp_hi - zf), hi_q)
        hi95_q = np.maximum(hi95_q, hi_q)
        point, lower, upper = self._inv(zf), self._inv(zf + lo_q), self._inv(zf + hi_q)
        upper_95 = self._inv(zf + hi95_q)
        if st["nonneg"]:
            point, lower, upper, upper_95 = (np.maximum(a, 0.0) for a in (point, lower, upper, upper_95))
        index = _future_index(history, horizon_h)
        # expm1(log1p(8)) is not exactly 8: pad by float noise so a flat series at its cap
        # is inside its own zero-width band.
        lower = np.minimum(lower, point) - 1e-9 * (1.0 + np.abs(lower))
        upper = np.maximum(upper, point) + 1e-9 * (1.0 + np.abs(upper))
        upper_95 = np.maximum(upper_95, upper)
        if st["nonneg"]:
            lower = np.maximum(lower, 0.0)
        return Forecast(index, point, lower, upper, upper_95).bounded(st["ceiling"], floor=floor)

    def _interval_offsets(self, horizon_h: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Offsets (log space) of the 80% lower/upper bounds and of the 95% upper bound."""
        st = self._state
        errors: FloatArray = st["errors"]
        lo = np.empty(horizon_h)
        hi = np.empty(horizon_h)
        hi95 = np.empty(horizon_h)
        z = st["z"]
        diffs = z[24:] - z[:-24]
        if errors.shape[0] < 5:
            # No calibration errors: the spread of day-over-day changes is an honest
            # stand-in for a day-ahead error.
            lo[:] = _nan_quantile(diffs, _LOWER_Q, 0.0)
            hi[:] = _nan_quantile(diffs, _UPPER_Q, 0.0)
            hi95[:] = _nan_quantile(diffs, _UPPER_95_Q, 0.0)
            return lo, hi, hi95
        if not self.config.conformal:
            resid = z - st["fitted"]
            lo[:] = _nan_quantile(resid, _LOWER_Q, 0.0)
            hi[:] = _nan_quantile(resid, _UPPER_Q, 0.0)
            hi95[:] = _nan_quantile(resid, _UPPER_95_Q, 0.0)
            return lo, hi, hi95
        day_lo = _nan_quantile(diffs, _LOWER_Q, 0.0)
        day_hi = _nan_quantile(diffs, _UPPER_Q, 0.0)
        widen = not st.get("full_calibration", False)
        cfg = self.config
        # Split-conformal correction with each calibration day as one exchangeable unit
        # (the hours of a day are far from independent): miss rates alpha * d / (d + 1).
        days = errors.shape[0] / 24.0
        shrink = days / (days + 1.0) if cfg.conformal_correction else 1.0
        for h in range(horizon_h):
            hh = min(h, 23)
            pool = errors[:, max(0, hh - 3) : hh + 4].ravel()
            if cfg.signed_band:
                # The 10% / 90% quantiles of the signed errors: demand that mostly falls
                # below the forecast (a level series winding down) gets its band there,
                # instead of an upper bound that is almost never reached.
                lo[h] = _nan_quantile(pool, _LOWER_Q * shrink, 0.0)
                hi[h] = _nan_quantile(pool, 1.0 - (1.0 - _UPPER_Q) * shrink, 0.0)
            else:
                # Symmetric: the size of the recent errors, not their sign.
                q = _nan_quantile(np.abs(pool), 1.0 - 2.0 * (1.0 - _UPPER_Q) * shrink, 0.0)
                lo[h], hi[h] = -q, q
            # One-sided: log-space demand errors are right-skewed (bursts), and the upper
            # tail is what sizes headroom.  forecast() keeps it above the 80% upper bound.
            hi95[h] = _nan_quantile(pool, 1.0 - (1.0 - _UPPER_95_Q) * shrink, 0.0)
            if widen:
                # Under the full calibration window the quantile rests on a few days; the
                # day-over-day changes of the whole history are then the safer width.
                lo[h] = min(lo[h], day_lo)
                hi[h] = max(hi[h], day_hi)
        return lo, hi, hi95


def _no_signal_forecast(history: pd.Series, horizon_h: int, *, window_h: int) -> Forecast:
    """A near-empty series: the mean and empirical quantiles of its last ``window_h`` hours.

    Flagged :data:`NO_SIGNAL`; bounded by what the whole history ever reached, since a
    handful of non-zero hours say nothing about a rise beyond it.
    """
    y = history.to_numpy(dtype=float)
    recent = y[-window_h:]
    recent = recent[np.isfinite(recent)]
    if not len(recent):
        recent = y[np.isfinite(y)]
    point = np.full(horizon_h, float(recent.mean()))
    lower = np.full(horizon_h, float(np.quantile(recent, _LOWER_Q)))
    upper = np.full(horizon_h, float(np.quantile(recent, _UPPER_Q)))
    upper_95 = np.full(horizon_h, float(np.quantile(recent, _UPPER_95_Q)))
    fc = Forecast(_future_index(history, horizon_h), point, lower, upper, upper_95, NO_SIGNAL)
    return fc.bounded(float(np.nanmax(y)))


def _short_history_forecast(history: pd.Series, horizon_h: int) -> Forecast:
    """Under two days of data: repeat the mean with the spread of what was seen."""
    y = history.to_numpy(dtype=float)
    point = np.full(horizon_h, float(np.nanmean(y)))
    lower = np.full(horizon_h, _nan_quantile(y, _LOWER_Q, float(point[0])))
    upper = np.full(horizon_h, _nan_quantile(y, _UPPER_Q, float(point[0])))
    upper_95 = np.maximum(np.full(horizon_h, _nan_quantile(y, _UPPER_95_Q, float(point[0]))), upper)
    return Forecast(_future_index(history, horizon_h), point, lower, upper, upper_95)


# ---- registry ----

_ABLATIONS: dict[str, dict[str, Any]] = {
    "berth_no_clean": {"clean_outages": False},
    "berth_no_log": {"log_transform": False},
    "berth_plus_level": {"level_correction": True},
    "berth_no_median": {"median_component": False},
    "berth_no_smoothing": {"smoothing_component": False},
    "berth_plus_near_best": {"near_best": 0.05, "near_best_cv": ()},
    "berth_no_near_best_cv": {"near_best_cv": ()},
    "berth_cv2_near_best": {"near_best_cv_forward": False},
    "berth_no_blend": {"ensemble": False},
    "berth_no_conformal": {"conformal": False},
    "berth_symmetric_band": {"signed_band": False, "conformal_correction": False},
    "berth_no_holdout": {"holdout_fit": False},
}

MODEL_NAMES: tuple[str, ...] = (
    "prophet", "seasonal_naive_24", "seasonal_naive_168", "mstl", "autoets", "berth",
)  # fmt: skip


def _statsbaseline(cls_name: str) -> Callable[[], ForecastModel]:
    """A factory for a model of :mod:`forecasting.core.statsbaselines` (imported on use)."""

    def factory() -> ForecastModel:
        from forecasting.core import statsbaselines

        model: ForecastModel = getattr(statsbaselines, cls_name)()
        return model

    return factory


def make_model(name: str, *, events: Sequence[Event] = ()) -> ForecastModel:
    """A fresh, unfitted model by name (``MODEL_NAMES`` plus the ``berth_no_*`` ablations)."""
    factories: dict[str, Callable[[], ForecastModel]] = {
        "prophet": lambda: ProphetModel(events=events),
        "seasonal_naive_24": lambda: SeasonalNaiveModel(period=24),
        "seasonal_naive_168": lambda: SeasonalNaiveModel(period=168),
        "berth": lambda: BerthModel(BerthConfig(events=tuple(events))),
        "mstl": _statsbaseline("MSTLModel"),
        "autoets": _statsbaseline("AutoETSModel"),
    }
    if name in factories:
        return factories[name]()
    if name in _ABLATIONS:
        return BerthModel(BerthConfig(events=tuple(events), **_ABLATIONS[name]), name=name)
    raise KeyError(f"unknown model {name!r}; known: {sorted([*factories, *_ABLATIONS])}")


ABLATION_NAMES: tuple[str, ...] = tuple(_ABLATIONS)
