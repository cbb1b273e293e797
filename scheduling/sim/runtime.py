"""Runtime prediction plug point for replays, and a simple history-based predictor.

A predictor sees jobs only through `predict` (at submission) and `observe` (when a job has
finished), so a replay can never leak future information into a prediction.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, runtime_checkable

from scheduling.engine.types import JobRequest
from scheduling.stats import quantile


@runtime_checkable
class RuntimePredictor(Protocol):
    """Online runtime quantiles: the same protocol as ``forecasting.core.runtime``."""

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """(p50_s, p90_s) for a job about to be queued."""
        ...

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Record a finished job's true runtime (seconds)."""
        ...


class SimpleHistoryPredictor:
    """Recent-history quantiles per user, falling back to project, then global.

    With a requested time it predicts ``requested * ratio`` where ratio is the quantile of
    recent ``runtime / requested`` ratios (users over-request by a fairly stable factor);
    without one it uses recent runtimes of jobs of the same key directly.  A key is used once
    it has ``min_samples`` finished jobs.  p90 is never below p50.
    """

    def __init__(self, *, window: int = 32, min_samples: int = 3, default_s: float = 3_600.0) -> None:
        self._window = window
        self._min_samples = min_samples
        self._default_s = default_s
        self._ratios: dict[str, deque[float]] = {}
        self._runtimes: dict[str, deque[float]] = {}

    @staticmethod
    def _keys(job: JobRequest) -> tuple[str, str, str]:
        return (f"u:{job.user}", f"p:{job.project}", "*")

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """(p50_s, p90_s) from the most specific key with enough history."""
        store = self._ratios if job.requested_s else self._runtimes
        for key in self._keys(job):
            history = store.get(key)
            if history is not None and len(history) >= self._min_samples:
                values = list(history)
                p50, p90 = quantile(values, 0.5, method="nearest"), quantile(values, 0.9, method="nearest")
                if job.requested_s:
                    p50, p90 = p50 * job.requested_s, p90 * job.requested_s
                p50 = max(p50, 1.0)
                return p50, max(p90, p50)
        if job.requested_s:
            # No history at all: trust the user's estimate as the p90, half of it as the p50.
            return max(job.requested_s / 2, 1.0), job.requested_s
        return self._default_s, self._default_s * 4

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Add a finished job's runtime to its user, project and global history."""
        for key in self._keys(job):
            if job.requested_s:
                self._ratios.setdefault(key, deque(maxlen=self._window)).append(runtime_s / job.requested_s)
            self._runtimes.setdefault(key, deque(maxlen=self._window)).append(runtime_s)


def default_predictor() -> RuntimePredictor:
    """The runtime predictor the portal ships (``forecasting.core.runtime.HistoryRuntimePredictor``)."""
    try:
        from forecasting.core.runtime import HistoryRuntimePredictor
    except ImportError:
        return SimpleHistoryPredictor()
    predictor: RuntimePredictor = HistoryRuntimePredictor()
    return predictor
