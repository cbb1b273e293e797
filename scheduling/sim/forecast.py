"""Interactive headroom and pool for a replay, from the forecaster the portal ships.

The portal's forecast tasks fit ``BERTH_FORECAST_MODEL`` (``berth``: `forecasting.core.models.
BerthModel`) on the cluster's hourly on-demand session demand (GPUs asked by sessions, waiting
or running) and store its 80 % band for ``BERTH_FORECAST_HORIZON_H`` (48) hours; each round
reads the band for the coming hour (headroom) and the coming day (pool) through
`scheduling.inputs`.  The replay does the same on its own past demand:

* the demand series is the overlay's sessions counted from submission for their duration
  (`forecasting.core.series.demand_from_intervals`, the portal's series code), so it is the same
  for every policy and is fitted once, before the policies replay;
* a fit at every ``refit_every_h`` hours (default 24: the nightly refit) on the complete hours
  before it (at most the model's own history window), forecasting 48 h; between fits each
  hour reads the newest fit, as the portal's rounds read the newest stored run.  (The portal's
  hourly refresh refits every hour; a replay of a year would need 8,000+ fits, so it keeps the
  nightly cadence, and the JSON reports the fits and their cost.)

Demand is keyed by the cluster's GPU type when it has one, else ``"*"`` (sessions ask for any
type) with the whole capacity.
"""

from __future__ import annotations

import bisect
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduling import inputs
from scheduling.sim.inventory import Inventory
from scheduling.sim.overlays import HOUR_S, Overlay, session_demand_intervals

DEFAULT_MAX_FRACTION = 0.25  # the portal's BERTH_HEADROOM_MAX_FRACTION default
DEFAULT_HORIZON_H = 48  # the portal's BERTH_FORECAST_HORIZON_H default
_EPOCH = "2000-01-03"  # a Monday: an arbitrary calendar origin for the model's hourly index


@dataclass(frozen=True, slots=True)
class SessionForecast:
    """Forecast upper bands issued at ``origins_h`` (hours since t = 0), each for the next hours."""

    key: str  # GPU type name, or "*"
    capacity: int
    max_fraction: float
    origins_h: tuple[int, ...]
    uppers: tuple[tuple[float, ...], ...]  # parallel to origins_h: upper band from the origin on
    fit_s: float = 0.0  # total wall seconds spent fitting
    fit_cpu_s: float = 0.0
    fits: int = 0
    _cache: dict[int, tuple[int, tuple[tuple[float, str, int], ...]]] = field(default_factory=dict)

    def _upper(self, hour: int) -> tuple[int, tuple[float, ...]] | None:
        index = bisect.bisect_right(self.origins_h, hour) - 1
        if index < 0:
            return None
        return self.origins_h[index], self.uppers[index]

    def at(self, now: float, *, booked: int = 0) -> tuple[int, tuple[tuple[float, str, int], ...]]:
        """(headroom GPUs for the hour containing ``now``, the pool for the next 24 hours)."""
        hour = int(now // HOUR_S)
        cached = self._cache.get(hour)
        if cached is None:
            found = self._upper(hour)
            if found is None:
                cached = (0, ())
            else:
                origin, upper = found
                offset = hour - origin
                window = [
                    (float((hour + k) * HOUR_S), {self.key: upper[offset + k]})
                    for k in range(24)
                    if offset + k < len(upper)
                ]
                pool = inputs.interactive_pool(
                    window, capacity={self.key: self.capacity}, max_fraction=self.max_fraction
                )
                level = upper[offset] if offset < len(upper) else None
                cached = (
                    inputs.headroom_gpus(
                        upper=level, booked=0, capacity=self.capacity, max_fraction=self.max_fraction
                    ),
                    pool,
                )
            self._cache[hour] = cached
        if booked:
            found = self._upper(hour)
            level = None
            if found is not None and hour - found[0] < len(found[1]):
                level = found[1][hour - found[0]]
            headroom = inputs.headroom_gpus(
                upper=level, booked=booked, capacity=self.capacity, max_fraction=self.max_fraction
            )
            return headroom, cached[1]
        return cached

    def report(self) -> dict[str, float | str]:
        return {"fits": self.fits, "fit_wall_s": self.fit_s, "fit_cpu_s": self.fit_cpu_s, "key": self.key}


def hourly_demand(overlay: Overlay, *, hours: int) -> np.ndarray:
    """Mean session GPUs in demand in each hour ``[h, h + 1)`` from t = 0, for ``hours`` hours."""
    import pandas as pd

    from forecasting.core.series import demand_from_intervals

    if hours <= 0:
        return np.zeros(0)
    intervals = session_demand_intervals(overlay)
    epoch = pd.Timestamp(_EPOCH)
    series = demand_from_intervals(
        np.array([i[0] for i in intervals], dtype=float),
        np.array([i[1] for i in intervals], dtype=float),
        np.array([i[2] for i in intervals], dtype=float),
        epoch=epoch,
        first_hour=epoch,
        last_hour=epoch + pd.Timedelta(hours=hours - 1),
    )
    return np.asarray(series.to_numpy(dtype=float), dtype=float)


def _fit_one(args: tuple[np.ndarray, int, str, int, float]) -> tuple[tuple[float, ...], float]:
    """Fit the shipped model on ``history`` (hourly, ending at ``origin_h``); its upper band."""
    import pandas as pd

    from forecasting.core.models import make_model

    history, origin_h, model_name, horizon_h, week_phase_s = args
    started = time.process_time()
    # The model's calendar: hour 0 is the trace's t = 0 at its hour of the week.
    epoch = pd.Timestamp(_EPOCH) + pd.Timedelta(seconds=week_phase_s)
    index = pd.date_range(
        epoch.floor("h") + pd.Timedelta(hours=origin_h - len(history)), periods=len(history), freq="h"
    )
    y = pd.Series(history, index=index, dtype=float)
    if not bool(np.any(history > 0)):
        return tuple([0.0] * horizon_h), time.process_time() - started  # the portal skips empty series
    forecast = make_model(model_name).fit(y).forecast(horizon_h)
    upper = np.maximum(np.nan_to_num(forecast.upper, nan=0.0), np.maximum(np.nan_to_num(forecast.point), 0.0))
    return tuple(float(v) for v in upper), time.process_time() - started


def fit_session_forecast(
    overlay: Overlay,
    inventory: Inventory,
    *,
    end_at: float,
    week_phase_s: float = 0.0,
    refit_every_h: int = 24,
    model_name: str = "berth",
    horizon_h: int = DEFAULT_HORIZON_H,
    max_history_h: int = 56 * 24,
    max_fraction: float = DEFAULT_MAX_FRACTION,
    workers: int | None = None,
) -> SessionForecast:
    """Fit the forecaster at every refit origin up to ``end_at`` (fits in parallel processes)."""
    types = sorted({node.gpu_type for node in inventory.nodes})
    key = types[0] if len(types) == 1 else "*"
    capacity = inventory.capacity_gpus
    hours = math.ceil(end_at / HOUR_S) + 1
    demand = hourly_demand(overlay, hours=hours)
    origins = list(range(refit_every_h, hours, refit_every_h)) if overlay.sessions else []
    jobs: Sequence[tuple[np.ndarray, int, str, int, float]] = [
        (demand[max(0, h - max_history_h) : h], h, model_name, horizon_h, week_phase_s) for h in origins
    ]
    started = time.perf_counter()
    cpu_started = time.process_time()
    workers = workers if workers is not None else len(os.sched_getaffinity(0))
    if workers > 1 and len(jobs) > 1 and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(min(workers, len(jobs))) as pool:
            results = pool.map(_fit_one, jobs, chunksize=max(1, len(jobs) // (4 * workers)))
    else:
        results = [_fit_one(job) for job in jobs]
    child_cpu = sum(cpu for _, cpu in results)
    own_cpu = time.process_time() - cpu_started
    return SessionForecast(
        key=key,
        capacity=capacity,
        max_fraction=max_fraction,
        origins_h=tuple(origins),
        uppers=tuple(upper for upper, _ in results),
        fit_s=time.perf_counter() - started,
        fit_cpu_s=child_cpu if workers > 1 and len(jobs) > 1 else own_cpu,
        fits=len(jobs),
    )
