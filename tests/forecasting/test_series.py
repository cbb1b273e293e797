"""Demand series helpers: resampling, exact interval demand, bookings, outage masking."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting.core.series import demand_from_intervals, demand_from_jobs, mask_outages, to_hourly

EPOCH = pd.Timestamp("2024-01-01")


def test_to_hourly_sum_and_mean_with_added_targets() -> None:
    frame = pd.DataFrame(
        {
            "ds": ["2024-01-01 00:00", "2024-01-01 00:30", "2024-01-01 01:10", "2024-01-01 00:00"],
            "group": ["a", "a", "a", "b"],
            "x": [1.0, 2.0, 4.0, 10.0],
            "z": [1.0, 1.0, 1.0, 0.0],
        }
    )
    total = to_hourly(frame, value_cols=["x", "z"], agg="sum")["all"]
    assert total.tolist() == [15.0, 5.0]  # (1+1)+(2+1)+(10+0), then 4+1
    per_group = to_hourly(frame, value_cols=["x"], agg="mean", by="group")
    assert per_group["a"].tolist() == [1.5, 4.0]
    assert per_group["b"].tolist() == [10.0]


def test_to_hourly_rejects_unknown_agg_and_columns() -> None:
    frame = pd.DataFrame({"ds": ["2024-01-01"], "x": [1.0]})
    with pytest.raises(ValueError, match="agg"):
        to_hourly(frame, value_cols=["x"], agg="max")
    with pytest.raises(KeyError):
        to_hourly(frame, value_cols=["nope"])


def test_demand_from_intervals_is_exact_hourly_mean() -> None:
    # 4 GPUs from 00:30 to 02:00, 2 GPUs from 01:00 to 01:15
    s = demand_from_intervals(
        np.array([1800.0, 3600.0]), np.array([7200.0, 4500.0]), np.array([4.0, 2.0]), epoch=EPOCH
    )
    assert list(s.index) == [EPOCH, EPOCH + pd.Timedelta(hours=1)]
    assert s.tolist() == pytest.approx([2.0, 4.0 + 0.5])


def test_demand_from_jobs_counts_queue_and_bookings_per_group() -> None:
    jobs = pd.DataFrame(
        {
            "submit_time": [0.0, 0.0],
            "start_time": [3600.0, 0.0],
            "end_time": [7200.0, 3600.0],
            "num_gpus": [8, 1],
            "group": ["p1", "p2"],
        }
    )
    bookings = pd.DataFrame({"start_time": [3600.0], "end_time": [7200.0], "num_gpus": [2], "group": ["p2"]})
    out = demand_from_jobs(jobs, epoch=EPOCH, by=("group",), bookings=bookings)
    assert out[("p1",)].tolist() == [8.0, 8.0]  # queued the first hour, running the second
    assert out[("p2",)].tolist() == [1.0, 2.0]
    assert out[()].tolist() == [9.0, 10.0]
    running_only = demand_from_jobs(jobs, epoch=EPOCH, include_queued=False)
    assert running_only[()].tolist() == [1.0, 8.0]


def test_mask_outages_only_in_busy_series() -> None:
    index = pd.date_range("2024-01-01", periods=120, freq="h")
    busy = pd.Series(10.0, index=index)
    busy.iloc[10:17] = 0.0  # 7-hour gap
    busy.iloc[30:32] = 0.0  # 2 quiet hours are real
    masked = mask_outages(busy, min_run_h=6)
    assert masked.iloc[10:17].isna().all()
    assert (masked.iloc[30:32] == 0.0).all()
    assert masked.notna().sum() == 120 - 7
    # a team idle every night for 12 hours keeps its zeros
    nightly = pd.Series(np.where(index.hour < 12, 0.0, 8.0), index=index)
    assert mask_outages(nightly).equals(nightly)
