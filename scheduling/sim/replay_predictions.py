"""Runtime predictions in the replay, made when the portal makes them.

`Replay` (``scheduling.sim.replay``) mixes this in.  The portal stores a batch job's predicted
runtime when the job is submitted (``forecasting.services.job_runtime_predict``) and refreshes
every pending job's prediction once an hour, at minute 2
(``forecasting.tasks.forecast_refresh_dispatch``, ``BERTH_FORECAST_REFRESH_MINUTE``); a round
plans with what is stored.  The replay does the same: a job is predicted when it is queued (or
requeued), and at each hour's refresh instant every pending batch job is predicted again from
what the predictor has learned by then.  The replay applies a refresh before anything else at
the first event at or after its instant: no job finished or arrived in between (each would
have been an event), so the predictor and the queue are exactly what they were at the instant.
Like the portal's, a refresh starts no round by itself.  Only policies that get predictions
(``ReplayOptions.predict_for``) are affected; the others never read them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from scheduling.engine.types import JobKind, JobRequest

if TYPE_CHECKING:
    from scheduling.sim.replay_setup import ReplayOptions
    from scheduling.sim.runtime import RuntimePredictor

# the portal's refresh instant within each hour (crontab minute 2), on the replay's clock
REFRESH_OFFSET_S = 120.0
# a restarted job's prediction is its remaining work, at least this
_MIN_REMAINING_S = 60.0


class PredictionRule:
    """The prediction half of `Replay` (module docstring); the attributes are `Replay`'s."""

    options: ReplayOptions
    predictor: RuntimePredictor | None
    _pending: dict[str, JobRequest]
    _refreshed_slot: float
    _predictions_refreshed: int

    def _saved_s(self, job_id: str) -> float:
        raise NotImplementedError  # `Replay._saved_s`

    def _init_predictions(self) -> None:
        self._refreshed_slot = -math.inf
        self._predictions_refreshed = 0

    def _with_prediction(self, request: JobRequest, p50: float, p90: float) -> JobRequest:
        """``request`` with the predicted quantiles of its remaining work."""
        saved = self._saved_s(request.id)
        if saved:
            # A restarted job only has its remaining work to do.
            p50, p90 = max(p50 - saved, _MIN_REMAINING_S), max(p90 - saved, _MIN_REMAINING_S)
        return dataclasses.replace(request, predicted_p50_s=p50, predicted_p90_s=p90)

    def _predicted(self, request: JobRequest) -> JobRequest:
        """A batch job being queued, with its prediction (as stored at submission)."""
        if self.predictor is None or request.kind != JobKind.BATCH:
            return request
        p50, p90 = self.predictor.predict(request)
        return self._with_prediction(request, p50, p90)

    def _refresh_predictions(self, t: float) -> None:
        """The hourly refresh, if one fell due since the last event: every pending batch job
        predicted again (what changed is counted in ``predictions_refreshed``)."""
        period = self.options.prediction_refresh_s
        if self.predictor is None or period <= 0:
            return
        slot = math.floor((t - REFRESH_OFFSET_S) / period)
        if slot <= self._refreshed_slot:
            return
        self._refreshed_slot = slot
        batch = [r for r in self._pending.values() if r.kind == JobKind.BATCH]
        if not batch:
            return
        predict_many = getattr(self.predictor, "predict_many", None)
        predictor = self.predictor
        answers = predict_many(batch) if predict_many is not None else [predictor.predict(r) for r in batch]
        for request, (p50, p90) in zip(batch, answers, strict=True):
            fresh = self._with_prediction(request, p50, p90)
            if (fresh.predicted_p50_s, fresh.predicted_p90_s) != (
                request.predicted_p50_s,
                request.predicted_p90_s,
            ):
                self._pending[request.id] = fresh
                self._predictions_refreshed += 1
