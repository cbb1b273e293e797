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

A fit is a pure function of its history, origin, model, horizon and calendar phase and of the
forecasting code, so ``cache_dir`` keeps each fit's band in a file named by the hash of all of
them (`FitCache`: the sources of ``forecasting.core`` and this module, and the versions of the
libraries the model calls): a replay of the same workload again (another policy set, the
bounds, a re-run after an engine change) reads its 300+ fits instead of redoing them.  The
JSON's ``forecast`` says how many fits came from the cache.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.metadata
import json
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    cached: int = 0  # fits read from the cache (`FitCache`) instead of being fitted
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
        return {
            "fits": self.fits,
            "cached_fits": self.cached,
            "fit_wall_s": self.fit_s,
            "fit_cpu_s": self.fit_cpu_s,
            "key": self.key,
        }


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


# libraries whose versions a fit's result may depend on (the model's own code is hashed)
_FIT_LIBRARIES = ("prophet", "cmdstanpy", "numpy", "pandas", "scipy", "statsmodels", "holidays")


class FitCache:
    """Fitted upper bands on disk, one small JSON file per fit, named by the hash of the fit's
    inputs and of the code that computes it (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._code = self._code_version()

    @staticmethod
    def _code_version() -> str:
        import forecasting.core

        digest = hashlib.sha256()
        sources = [*sorted(Path(forecasting.core.__file__).parent.glob("*.py")), Path(__file__)]
        for path in sources:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        for name in _FIT_LIBRARIES:
            try:
                digest.update(f"{name}={importlib.metadata.version(name)};".encode())
            except importlib.metadata.PackageNotFoundError:
                digest.update(f"{name}=-;".encode())
        return digest.hexdigest()

    def key(self, job: tuple[np.ndarray, int, str, int, float]) -> str:
        history, origin_h, model_name, horizon_h, week_phase_s = job
        digest = hashlib.sha256(self._code.encode())
        digest.update(np.ascontiguousarray(history, dtype=np.float64).tobytes())
        digest.update(f"|{origin_h}|{model_name}|{horizon_h}|{float(week_phase_s)!r}".encode())
        return digest.hexdigest()

    def get(self, key: str) -> tuple[float, ...] | None:
        try:
            with open(self.directory / f"{key}.json", encoding="utf-8") as fh:
                return tuple(float(v) for v in json.load(fh)["upper"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent or unreadable: fitted again

    def put(self, key: str, upper: tuple[float, ...]) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{key}.json"
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({"upper": list(upper)}), encoding="utf-8")
            partial.replace(path)  # atomic: a concurrent run reads a whole file or none
        except OSError:
            pass  # a cache that cannot be written only costs the next run its fits


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
    cache_dir: str | Path | None = None,
) -> SessionForecast:
    """Fit the forecaster at every refit origin up to ``end_at`` (fits in parallel processes;
    with ``cache_dir``, fits already in `FitCache` are read instead)."""
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
    cache = FitCache(cache_dir) if cache_dir else None
    keys = [cache.key(job) for job in jobs] if cache is not None else []
    uppers: list[tuple[float, ...] | None] = (
        [cache.get(k) for k in keys] if cache is not None else [None] * len(jobs)
    )
    todo = [i for i, upper in enumerate(uppers) if upper is None]
    workers = workers if workers is not None else len(os.sched_getaffinity(0))
    is_parallel = workers > 1 and len(todo) > 1 and "fork" in multiprocessing.get_all_start_methods()
    if is_parallel:
        with multiprocessing.get_context("fork").Pool(min(workers, len(todo))) as pool:
            results = pool.map(
                _fit_one, [jobs[i] for i in todo], chunksize=max(1, len(todo) // (4 * workers))
            )
    else:
        results = [_fit_one(jobs[i]) for i in todo]
    for i, (upper, _) in zip(todo, results, strict=True):
        uppers[i] = upper
        if cache is not None:
            cache.put(keys[i], upper)
    child_cpu = sum(cpu for _, cpu in results)
    own_cpu = time.process_time() - cpu_started
    return SessionForecast(
        key=key,
        capacity=capacity,
        max_fraction=max_fraction,
        origins_h=tuple(origins),
        uppers=tuple(upper for upper in uppers if upper is not None),
        fit_s=time.perf_counter() - started,
        fit_cpu_s=child_cpu if is_parallel else own_cpu,
        fits=len(jobs),
        cached=len(jobs) - len(todo),
    )
