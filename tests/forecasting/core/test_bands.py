"""BerthModel's bands: signed conformal quantiles and the few-days correction (real Prophet fits)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting.core.models import BerthConfig, BerthModel
from tests.forecasting.conftest import seasonal_series


def _with_spikes(sign: float, seed: int) -> pd.Series:
    """Four weeks of seasonal demand with one-sided bursts: up (``sign`` 1) or down (-1) in
    30% of the hours, exponential with mean 6 on a level of about 50."""
    y = seasonal_series(days=28, trend_per_day=0.0, noise=1.0, seed=seed)
    rng = np.random.default_rng(seed)
    return y + sign * rng.exponential(6.0, len(y)) * (rng.random(len(y)) < 0.3)


def _gaps(config: BerthConfig, series: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point - lower, upper - point, upper_95 - point) in log1p space."""
    fc = BerthModel(config).fit(series).forecast(24)
    z = np.log1p(fc.point)
    return z - np.log1p(fc.lower), np.log1p(fc.upper) - z, np.log1p(fc.upper_95_or_upper) - z


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_signed_band_puts_the_width_on_the_side_the_errors_fall(sign: float) -> None:
    series = _with_spikes(sign, seed=0)
    sym_lo, sym_hi, _ = _gaps(BerthConfig(signed_band=False, conformal_correction=False), series)
    lo, hi, hi95 = _gaps(BerthConfig(conformal_correction=False), series)
    np.testing.assert_allclose(sym_lo, sym_hi, atol=1e-6)  # the |error| band is symmetric
    # Bursts upward: more room above the point than below it; bursts downward: the reverse.
    assert sign * (np.median(hi) - np.median(lo)) > 0.005
    assert sign * (np.median(hi) - np.median(sym_hi)) > 0.0
    assert (hi95 >= hi - 1e-12).all()


def test_few_calibration_days_widen_every_bound() -> None:
    series = _with_spikes(-1.0, seed=2)
    plain = _gaps(BerthConfig(conformal_correction=False), series)
    corrected = _gaps(BerthConfig(), series)
    for before, after in zip(plain, corrected, strict=True):
        assert (after >= before - 1e-9).all()
    # The correction moves the quantile levels outwards, so some bound is strictly wider.
    assert any((after > before + 1e-6).any() for before, after in zip(plain, corrected, strict=True))
