"""When forecast demand exceeds capacity: one forecast fit per GPU type, now.

Prophet's linear trend is what extrapolates growth over weeks, so the default model is
``prophet`` (``berth`` is sharper for the next day but forecasts at most one week and blends
towards last week).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.utils import timezone

from forecasting.models import ForecastRun
from forecasting.selectors import (
    cluster_capacity_by_type,
    demand_series_get,
    forecast_events,
    from_naive_utc,
    hour_floor,
)


@dataclass(frozen=True, slots=True)
class CapacityCrossing:
    gpu_type: str
    capacity_gpus: int
    yhat_exceeds_at: datetime | None  # first forecast hour with point demand > capacity
    upper80_exceeds_at: datetime | None  # first forecast hour with the 80% upper bound > capacity
    peak_yhat: float
    peak_upper80: float
    model_name: str
    issued_at: datetime
    horizon_h: int

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("yhat_exceeds_at", "upper80_exceeds_at", "issued_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


def capacity_exceed_when(
    *,
    cluster_id: int,
    horizon_days: int,
    at: datetime | None = None,
    model_name: str = "prophet",
    progress: Callable[[int, int], object] | None = None,
) -> dict[str, CapacityCrossing]:
    """Per GPU type of the cluster: the first hour within ``horizon_days`` when forecast demand
    exceeds its capacity (GPUs on nodes that are not down).  Types without demand history get
    no crossing.  Fits one model per type now (about a second each); nothing is stored.
    ``progress(done, total)`` is called before the first type and after each one (a Celery
    task stores it for the page: ``forecasting.services.capacity_exceed_run_execute``).
    """
    from forecasting.core.models import make_model

    if horizon_days < 1:
        raise ValueError("horizon_days must be at least 1")
    issued = hour_floor(at or timezone.now())
    horizon_h = 24 * horizon_days
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    series = demand_series_get(cluster_id=cluster_id, end_at=issued)
    out: dict[str, CapacityCrossing] = {}
    if progress is not None:
        progress(0, len(capacity))
    for type_name, total in sorted(capacity.items()):
        y = series.get((ForecastRun.Kind.GPU_TYPE, type_name))
        yhat_at = upper_at = None
        peak_point = peak_upper = 0.0
        if y is not None and bool(np.any(y.to_numpy() > 0)):
            fc = make_model(model_name, events=forecast_events()).fit(y).forecast(horizon_h)
            point = np.nan_to_num(fc.point, nan=0.0)
            upper = np.maximum(np.nan_to_num(fc.upper, nan=0.0), point)
            peak_point, peak_upper = float(point.max()), float(upper.max())
            over = np.flatnonzero(point > total)
            yhat_at = from_naive_utc(fc.index[over[0]]) if len(over) else None
            over = np.flatnonzero(upper > total)
            upper_at = from_naive_utc(fc.index[over[0]]) if len(over) else None
        out[type_name] = CapacityCrossing(
            gpu_type=type_name,
            capacity_gpus=total,
            yhat_exceeds_at=yhat_at,
            upper80_exceeds_at=upper_at,
            peak_yhat=peak_point,
            peak_upper80=peak_upper,
            model_name=model_name,
            issued_at=issued,
            horizon_h=horizon_h,
        )
        if progress is not None:
            progress(len(out), len(capacity))
    return out
