"""The replay overlay's session demand through bench.forecast: the path that sizes the pool.

``bench.replay --dump-demand`` writes the overlay's hourly session demand; ``bench.forecast
--series`` on that CSV reports the shipped model's band coverage.  Here both run on the
shipped KTH sample and the coverages in the JSON are recomputed from fresh fits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import forecast as bench_forecast
from bench import replay
from forecasting.core.backtest import origins_for
from forecasting.core.models import make_model

SAMPLES = Path(__file__).resolve().parents[2] / "forecasting" / "core" / "samples"
SAMPLE = SAMPLES / "kth_sp2_jobs_sample.csv.gz"
# The dump is written before any policy runs, so a stand-in policy keeps the replay cheap.
STANDIN = "tests.scheduling.sim.standin:standin_plan"


def test_session_demand_dump_is_forecast_with_its_bands(tmp_path: Path) -> None:
    demand_csv = tmp_path / "sessions.csv"
    code = replay.main(
        [
            "--trace", str(SAMPLE), "--cluster", "100x1", "--policies", "fifo",
            "--interactive-share", "0.15", "--booking-share", "0.10", "--seed", "0",
            "--limit-jobs", "800", "--no-bounds", "--workers", "1", "--engine", STANDIN,
            "--dump-demand", str(demand_csv), "--out", str(tmp_path / "replay.json"),
        ]
    )  # fmt: skip
    assert code == 0
    frame = pd.read_csv(demand_csv, parse_dates=["ds"])
    assert list(frame.columns) == ["ds", "demand_gpus"]
    assert (frame["ds"].diff().dropna() == pd.Timedelta(hours=1)).all()
    assert (frame["demand_gpus"] >= 0).all()
    assert (frame["demand_gpus"] > 0).mean() > 0.2
    assert len(frame) >= 24 * 5  # room for two daily origins after three days of history

    out = tmp_path / "sessions.json"
    models = "berth,seasonal_naive_24"
    args = ["--series", str(demand_csv), "--days", "2", "--models", models, "--out", str(out)]
    assert bench_forecast.main(args) == 0
    berth = json.loads(out.read_text())["models"]["berth"]

    # The same backtest by hand: fresh berth fits at the same origins, bands scored hour by hour.
    series = frame.set_index("ds")["demand_gpus"].asfreq("h")
    inside80, below95 = [], []
    for o in origins_for(series, days=2):
        fc = make_model("berth").fit(series.iloc[:o]).forecast(24)
        actual = series.to_numpy(dtype=float)[o : o + 24]
        assert np.all(fc.upper_95 >= fc.upper)
        assert np.all(fc.upper >= fc.point)
        assert np.all(fc.point >= fc.lower)
        inside80.append((actual >= fc.lower) & (actual <= fc.upper))
        below95.append(actual <= fc.upper_95)
    assert berth["origins"] == 2.0
    assert berth["coverage_80"] == pytest.approx(float(np.concatenate(inside80).mean()))
    assert berth["coverage_upper_95"] == pytest.approx(float(np.concatenate(below95).mean()))
