"""The ports through which scheduling reaches what sits above or beside it (issue 14): the
forecasting app's predictions, and the task queue's round trigger.

``scheduling`` never imports ``forecasting``'s app (an import-linter contract says so); what it
needs of it (runtime predictions, interactive headroom and pool, demand forecasts for the
outlook, the forecast-refresh state) reaches it as plain data through `PredictionPort`.  The
forecasting app registers its implementation at start-up (``forecasting.apps.ready`` →
`set_prediction_port`); callers ask `prediction_port()` at call time.  Pure: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from scheduling.engine.types import JobRequest


@dataclass(frozen=True, slots=True)
class DemandPoint:
    """One hour of a stored demand forecast: the hour's start, the forecast and its 80% interval (GPUs)."""

    ts: datetime
    yhat: float
    lower80: float
    upper80: float


@dataclass(frozen=True, slots=True)
class ForecastFit:
    """What fitting a cluster's forecasts now did: series stored and series that failed to fit."""

    created: int
    failed: int


class PredictionPort(Protocol):
    """What scheduling asks of the forecasting app.  Every method takes ids and returns data."""

    # ---- runtime predictions ----

    def runtime_predict(
        self, *, cluster_id: int, requests: Sequence[JobRequest]
    ) -> list[tuple[float, float]]:
        """(p50_s, p90_s) per request from the cluster's runtime predictor."""
        ...

    def job_engine_request(
        self,
        *,
        job_id: int,
        username: str,
        project_slug: str,
        name: str,
        gpu_count: int,
        submitted_at: datetime,
        requested_s: int | None,
        kind: str,
        gpu_type: str | None,
    ) -> JobRequest:
        """The request the predictor keys on for a job that is not stored (the submit page's preview)."""
        ...

    def job_runtime_predict_enqueue(self, *, job_id: int) -> None:
        """Ask a worker to store a job's predicted runtime (may raise when the broker is down)."""
        ...

    def runtime_predictions_store(self, *, cluster_id: int, only_missing: bool) -> int:
        """Store predictions on the cluster's waiting jobs now; how many were stored."""
        ...

    def runtime_predictor_forget(self, *, cluster_id: int) -> None:
        """Drop the cluster's cached predictor (its history changed): the next prediction rebuilds it."""
        ...

    # ---- interactive demand (the engine's headroom and pool) ----

    def interactive_headroom(self, *, cluster_id: int, at: datetime) -> dict[str, int]:
        """GPUs per type to hold idle for interactive demand in the hour from ``at``."""
        ...

    def interactive_headroom_policy(self, *, cluster_id: int, at: datetime) -> tuple[tuple[str, int], ...]:
        """`interactive_headroom` as ``PolicyConfig.interactive_headroom`` (sorted, zeros left out)."""
        ...

    def interactive_pool(self, *, cluster_id: int, at: datetime) -> tuple[tuple[float, str, int], ...]:
        """``PolicyConfig.interactive_pool`` for the coming hours."""
        ...

    def interactive_forecast_issued_latest(self, *, cluster_ids: Sequence[int]) -> dict[int, datetime]:
        """Cluster id -> issue time of its newest stored interactive forecast (none: left out)."""
        ...

    # ---- demand forecasts ----

    def demand_forecast_points(self, *, cluster_id: int, gpu_type: str, at: datetime) -> list[DemandPoint]:
        """The hours of the newest demand forecast of a GPU type issued at or before ``at`` (empty: none)."""
        ...

    def forecast_is_stored(self, *, cluster_id: int, at: datetime) -> bool:
        """Whether forecasts issued in the hour of ``at`` are stored for the cluster."""
        ...

    def forecast_refresh_run_now(self, *, cluster_id: int) -> ForecastFit:
        """Fit and store the cluster's missing forecasts for this hour now (in this process)."""
        ...

    def forecast_refresh_request(self, *, cluster_id: int) -> None:
        """Queue a fit of this hour's forecasts for a worker (after the commit)."""
        ...

    def forecast_refresh_state(self, *, cluster_id: int) -> dict[str, Any] | None:
        """The latest refresh of a cluster (``status``: queued, running, done, failed), or None."""
        ...


class PredictionPortUnsetError(RuntimeError):
    """No forecasting app registered a `PredictionPort` (``forecasting`` not in INSTALLED_APPS?)."""


_port: PredictionPort | None = None


def set_prediction_port(port: PredictionPort | None) -> None:
    """Register the port (``forecasting.apps.ForecastingConfig.ready``); None unregisters it."""
    global _port  # the one registry, set once at start-up
    _port = port


def prediction_port() -> PredictionPort:
    """The registered port; `PredictionPortUnsetError` when the forecasting app did not register one."""
    if _port is None:
        raise PredictionPortUnsetError(
            "no prediction port is registered: the forecasting app registers one in "
            "ForecastingConfig.ready(); is 'forecasting' in INSTALLED_APPS and Django set up?"
        )
    return _port


# ---- the round trigger: how a service asks for an engine round without importing the tasks ----

RoundTrigger = Callable[[int], None]
_round_trigger: RoundTrigger | None = None


def set_round_trigger(trigger: RoundTrigger | None) -> None:
    """Register what asks for a round of a cluster soon (``scheduling.apps.ready`` registers
    ``scheduling.tasks.engine_round_trigger``: debounced, after the commit)."""
    global _round_trigger  # the one registry, set once at start-up
    _round_trigger = trigger


def round_trigger(cluster_id: int) -> None:
    """Ask for an engine round of ``cluster_id`` soon (a service calls this after a write the
    engine should react to)."""
    if _round_trigger is None:
        raise RuntimeError("no round trigger is registered (scheduling.apps registers one at start-up)")
    _round_trigger(cluster_id)
