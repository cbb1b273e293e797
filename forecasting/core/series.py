"""Hourly demand series: resampling, demand from job records, outage cleaning.

Every series here is a ``pd.Series`` of floats on a regular hourly ``DatetimeIndex``
(naive wall-clock time of the cluster, as Prophet wants it).  Demand is in GPUs: the
hourly *mean* of the number of GPUs that are running or queued (so 8 GPUs queued for half
an hour and running for the other half is 8.0 for that hour).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = [
    "demand_from_intervals",
    "demand_from_jobs",
    "mask_outages",
    "to_hourly",
]

HOUR = pd.Timedelta(hours=1)


def to_hourly(
    frame: pd.DataFrame,
    *,
    value_cols: Sequence[str],
    agg: str = "sum",
    ds_col: str = "ds",
    by: str | None = None,
) -> dict[str, pd.Series]:
    """Resample a long table of timestamped values to hourly series.

    ``value_cols`` are added together first (``running_gpus + pending_gpus``); the result
    is aggregated per hour with ``agg`` (``sum`` for event counts, ``mean`` for levels).
    Without ``by`` the rows are first combined per timestamp (summed: the cluster total of
    per-team levels) and one series named ``"all"`` is returned; with ``by`` there is one
    series per value of that column.  Hours with no rows inside the covered span become 0
    for ``sum`` and NaN for ``mean`` (unknown, not zero).
    """
    if agg not in ("sum", "mean"):
        raise ValueError(f"agg must be 'sum' or 'mean', not {agg!r}")
    missing = [c for c in (ds_col, *value_cols) if c not in frame.columns]
    if missing:
        raise KeyError(f"columns not in the table: {missing}")
    ds = pd.to_datetime(frame[ds_col])
    value = frame[list(value_cols)].astype(float).sum(axis=1, min_count=1)
    work = pd.DataFrame({"ds": ds, "y": value})
    if by is None:
        work = work.groupby("ds", sort=True)["y"].sum(min_count=1).reset_index()
        work["g"] = "all"
    else:
        work["g"] = frame[by].astype(str).to_numpy()
    out: dict[str, pd.Series] = {}
    for name, part in work.groupby("g", sort=True):
        s = part.set_index("ds")["y"].sort_index()
        hourly = s.resample("h").sum(min_count=1) if agg == "sum" else s.resample("h").mean()
        if agg == "sum":
            hourly = hourly.fillna(0.0)
        hourly.name = str(name)
        out[str(name)] = hourly.astype(float)
    return out


def demand_from_intervals(
    starts_s: np.ndarray,
    ends_s: np.ndarray,
    gpus: np.ndarray,
    *,
    epoch: pd.Timestamp,
    first_hour: pd.Timestamp | None = None,
    last_hour: pd.Timestamp | None = None,
) -> pd.Series:
    """Hourly mean of the sum of ``gpus`` over half-open intervals [start, end) in seconds.

    Exact (not sampled): the demand is a step function, so its integral is piecewise
    linear between events and is interpolated at the hour boundaries.  Seconds count from
    ``epoch``; intervals with end <= start contribute nothing.
    """
    starts = np.asarray(starts_s, dtype=float)
    ends = np.asarray(ends_s, dtype=float)
    weights = np.asarray(gpus, dtype=float)
    keep = np.isfinite(starts) & np.isfinite(ends) & (ends > starts)
    starts, ends, weights = starts[keep], ends[keep], weights[keep]
    epoch = pd.Timestamp(epoch)
    if first_hour is None:
        lo = starts.min() if len(starts) else 0.0
        first_hour = (epoch + pd.Timedelta(seconds=float(lo))).floor("h")
    if last_hour is None:
        hi = ends.max() if len(ends) else 0.0
        last_hour = (epoch + pd.Timedelta(seconds=float(hi))).ceil("h") - HOUR
    index = pd.date_range(first_hour, max(last_hour, first_hour), freq="h")
    edges = (index - epoch) / pd.Timedelta(seconds=1)
    edges_s = np.append(edges.to_numpy(dtype=float), float(edges[-1]) + 3600.0)
    if len(starts) == 0:
        return pd.Series(0.0, index=index, name="demand_gpus")
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([weights, -weights])
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    level = np.cumsum(deltas)  # demand right after each event
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])  # integral at events
    integral = np.interp(edges_s, times, area, left=0.0, right=float(area[-1]))
    return pd.Series(np.diff(integral) / 3600.0, index=index, name="demand_gpus")


def demand_from_jobs(
    jobs: pd.DataFrame,
    *,
    epoch: pd.Timestamp,
    by: Sequence[str] = (),
    bookings: pd.DataFrame | None = None,
    include_queued: bool = True,
) -> dict[tuple[str, ...], pd.Series]:
    """Hourly GPU demand (running + queued, plus booked windows) per group.

    ``jobs`` has the trace columns ``submit_time, start_time, end_time, num_gpus`` in
    seconds from ``epoch``.  A job counts as queued from submit to start and as running
    from start to end; a job that never started is queued until its end (when it was
    cancelled) and is otherwise ignored.  ``bookings`` (columns ``start_time, end_time,
    num_gpus`` and the same ``by`` columns) count as demand for their whole window: a
    booked GPU is wanted whether or not its owner uses it.  ``by`` names columns such as
    ``("cluster", "gpu_type")`` or ``("group",)``; the key ``()`` is the total.  All
    series share one hourly index.
    """
    parts: list[pd.DataFrame] = []
    begin = jobs["submit_time"] if include_queued else jobs["start_time"]
    parts.append(
        pd.DataFrame(
            {
                "a": pd.to_numeric(begin, errors="coerce"),
                "b": pd.to_numeric(jobs["end_time"], errors="coerce"),
                "g": pd.to_numeric(jobs["num_gpus"], errors="coerce").fillna(0.0),
                **{c: jobs[c].astype(str).fillna("") for c in by},
            }
        )
    )
    if bookings is not None and len(bookings):
        parts.append(
            pd.DataFrame(
                {
                    "a": pd.to_numeric(bookings["start_time"], errors="coerce"),
                    "b": pd.to_numeric(bookings["end_time"], errors="coerce"),
                    "g": pd.to_numeric(bookings["num_gpus"], errors="coerce").fillna(0.0),
                    **{c: bookings[c].astype(str).fillna("") for c in by},
                }
            )
        )
    table = pd.concat(parts, ignore_index=True).dropna(subset=["a", "b"])
    epoch = pd.Timestamp(epoch)
    first = (epoch + pd.Timedelta(seconds=float(table["a"].min()))).floor("h")
    last = (epoch + pd.Timedelta(seconds=float(table["b"].max()))).ceil("h") - HOUR
    out: dict[tuple[str, ...], pd.Series] = {
        (): demand_from_intervals(
            table["a"].to_numpy(),
            table["b"].to_numpy(),
            table["g"].to_numpy(),
            epoch=epoch,
            first_hour=first,
            last_hour=last,
        )
    }
    if by:
        for key, part in table.groupby(list(by), sort=True):
            out[tuple(str(k) for k in key)] = demand_from_intervals(
                part["a"].to_numpy(),
                part["b"].to_numpy(),
                part["g"].to_numpy(),
                epoch=epoch,
                first_hour=first,
                last_hour=last,
            )
    return out


def mask_outages(y: pd.Series, *, min_run_h: int = 6) -> pd.Series:
    """Replace long runs of exact zeros in an otherwise busy series by NaN.

    Monitoring gaps show up as hours of exact 0 in the traces (the collector was down, or
    the log ends); fitting them as real demand drags level and seasonality down and, in log
    space, creates huge outliers.  A run counts as an outage when it lasts at least
    ``min_run_h`` hours and the series is rarely zero at all (its 10th percentile, gaps
    included, is positive); a often idle team keeps its zeros.  Only for fitting: backtests score the
    recorded values.
    """
    values = y.to_numpy(dtype=float)
    is_zero = values == 0.0
    in_long_run = np.zeros(len(values), dtype=bool)
    run_start = -1
    for i in range(len(values) + 1):
        if i < len(values) and is_zero[i]:
            if run_start < 0:
                run_start = i
            continue
        if run_start >= 0 and i - run_start >= min_run_h:
            in_long_run[run_start:i] = True
        run_start = -1
    finite = values[np.isfinite(values)]
    # Judged on all hours, gaps included: a team that is idle a quarter of the time has
    # real zero runs (nights, weekends) and keeps them.
    if not in_long_run.any() or np.quantile(finite, 0.1) <= 0.0:
        return y
    out = values.copy()
    out[in_long_run] = np.nan
    return pd.Series(out, index=y.index, name=y.name)
