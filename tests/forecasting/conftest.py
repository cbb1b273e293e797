"""Fixtures for the pure forecasting core: no database, no network."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "forecasting" / "core" / "samples"


def seasonal_series(
    *, days: int = 28, trend_per_day: float = 0.5, noise: float = 1.0, seed: int = 0
) -> pd.Series:
    """Hourly demand: level 50, daily swing 20, weekday bump 10, linear trend, Gaussian noise."""
    rng = np.random.default_rng(seed)
    index = pd.date_range("2024-01-01", periods=24 * days, freq="h")
    t = np.arange(len(index))
    hour = index.hour.to_numpy()
    weekday = (index.day_of_week.to_numpy() < 5).astype(float)
    y = (
        50.0
        + 20.0 * np.sin(2 * np.pi * (hour - 6) / 24)
        + 10.0 * weekday
        + trend_per_day * t / 24
        + rng.normal(0.0, noise, len(t))
    )
    return pd.Series(y, index=index, name="y")


@pytest.fixture
def samples_dir() -> Path:
    return SAMPLES
