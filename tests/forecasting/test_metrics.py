"""Metrics on examples small enough to compute by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forecasting.core.metrics import coverage, mae, mase, seasonal_naive_scale, smape


def test_mae_ignores_nan_actuals() -> None:
    assert mae([1.0, 2.0, np.nan], [2.0, 4.0, 100.0]) == pytest.approx(1.5)


def test_seasonal_naive_scale_by_hand() -> None:
    # period 2: |3-1| + |4-2| + |1-3| = 6 over 3 differences
    assert seasonal_naive_scale([1.0, 2.0, 3.0, 4.0, 1.0], period=2) == pytest.approx(2.0)
    assert math.isnan(seasonal_naive_scale([1.0, 2.0], period=2))


def test_mase_divides_by_scale_and_survives_zero_scale() -> None:
    assert mase([2.0, 4.0], [1.0, 1.0], scale=2.0) == pytest.approx(1.0)  # MAE 2 / 2
    assert mase([2.0, 4.0], [1.0, 1.0], scale=0.0) == pytest.approx(2.0)


def test_smape_by_hand() -> None:
    # 200*|100-50|/150 = 66.67; 200*0/0 -> 0; 200*|0-10|/10 = 200 -> mean 88.89
    assert smape([100.0, 0.0, 0.0], [50.0, 0.0, 10.0]) == pytest.approx((200 * 50 / 150 + 0 + 200) / 3)


def test_coverage_counts_closed_interval() -> None:
    assert coverage([1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 3.5, 0.0], [1.0, 1.0, 4.0, 4.0]) == pytest.approx(0.5)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="shape"):
        mae([1.0, 2.0], [1.0])
