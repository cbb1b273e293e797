"""Runtime prediction plug point for replays: the protocol and the predictor the portal ships.

A predictor sees jobs only through `predict` (at submission) and `observe` (when a job has
finished), so a replay can never leak future information into a prediction.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from scheduling.engine.types import JobRequest


@runtime_checkable
class RuntimePredictor(Protocol):
    """Online runtime quantiles: the same protocol as ``forecasting.core.runtime``."""

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """(p50_s, p90_s) for a job about to be queued."""
        ...

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Record a finished job's true runtime (seconds)."""
        ...


def default_predictor() -> RuntimePredictor:
    """The runtime predictor the portal ships (``forecasting.core.runtime.HistoryRuntimePredictor``)."""
    from forecasting.core.runtime import HistoryRuntimePredictor

    predictor: RuntimePredictor = HistoryRuntimePredictor()
    return predictor
