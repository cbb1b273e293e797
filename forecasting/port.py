"""The forecasting app's implementation of scheduling's `PredictionPort` (``scheduling.ports``).

Registered at start-up by ``ForecastingConfig.ready``.  Each method is one call into the
forecasting selectors, services or tasks, imported when called (pandas and Prophet load only
when a prediction is asked for) and looked up at call time (from ``forecasting.selectors``, where the
callers found them before the port), so a test that replaces one of them replaces what the port
calls.  Results are plain data: no forecasting model leaves this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from scheduling.engine.types import JobRequest
from scheduling.ports import DemandPoint, ForecastFit


class ForecastingPredictionPort:
    """`scheduling.ports.PredictionPort` over the forecasting app."""

    # ---- runtime predictions ----

    def runtime_predict(
        self, *, cluster_id: int, requests: Sequence[JobRequest]
    ) -> list[tuple[float, float]]:
        from forecasting import selectors

        return selectors.runtime_predict(cluster_id=cluster_id, requests=requests)

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
        from forecasting import selectors

        request: JobRequest = selectors.job_engine_request(
            job_id=job_id,
            username=username,
            project_slug=project_slug,
            name=name,
            gpu_count=gpu_count,
            submitted_at=submitted_at,
            requested_s=requested_s,
            kind=kind,
            gpu_type=gpu_type,
        )
        return request

    def job_runtime_predict_enqueue(self, *, job_id: int) -> None:
        from forecasting import tasks

        tasks.job_runtime_predict.delay(job_id)

    def runtime_predictions_store(self, *, cluster_id: int, only_missing: bool) -> int:
        from forecasting import services

        return services.jobs_runtime_predict(cluster_id=cluster_id, only_missing=only_missing)

    def runtime_predictor_forget(self, *, cluster_id: int) -> None:
        from forecasting import selectors

        selectors.runtime_predictor_forget(cluster_id=cluster_id)

    # ---- interactive demand ----

    def interactive_headroom(self, *, cluster_id: int, at: datetime) -> dict[str, int]:
        from forecasting import selectors

        return selectors.interactive_headroom_get(cluster_id=cluster_id, at=at)

    def interactive_headroom_policy(self, *, cluster_id: int, at: datetime) -> tuple[tuple[str, int], ...]:
        from forecasting import selectors

        return tuple(selectors.interactive_headroom_policy(cluster_id=cluster_id, at=at))

    def interactive_pool(self, *, cluster_id: int, at: datetime) -> tuple[tuple[float, str, int], ...]:
        from forecasting import selectors

        return selectors.interactive_pool_get(cluster_id=cluster_id, at=at)

    def interactive_forecast_issued_latest(self, *, cluster_ids: Sequence[int]) -> dict[int, datetime]:
        from django.db.models import Max

        from forecasting.models import ForecastRun

        return dict(
            ForecastRun.objects.filter(cluster_id__in=list(cluster_ids), kind=ForecastRun.Kind.INTERACTIVE)
            .values_list("cluster_id")
            .annotate(latest=Max("issued_at"))
        )

    # ---- demand forecasts ----

    def demand_forecast_points(self, *, cluster_id: int, gpu_type: str, at: datetime) -> list[DemandPoint]:
        from forecasting import selectors
        from forecasting.models import ForecastRun

        run = selectors.forecast_run_latest(
            cluster_id=cluster_id, kind=ForecastRun.Kind.GPU_TYPE, key=gpu_type, at=at
        )
        if run is None:
            return []
        return [
            DemandPoint(ts=p.ts, yhat=p.yhat, lower80=p.lower80, upper80=p.upper80)
            for p in selectors.forecast_points_list(run=run)
        ]

    def forecast_is_stored(self, *, cluster_id: int, at: datetime) -> bool:
        from forecasting import selectors
        from forecasting.models import ForecastRun

        return ForecastRun.objects.filter(cluster_id=cluster_id, issued_at=selectors.hour_floor(at)).exists()

    def forecast_refresh_run_now(self, *, cluster_id: int) -> ForecastFit:
        from forecasting import services

        result = services.forecast_refresh_run_now(cluster_id=cluster_id, replace=False)
        return ForecastFit(created=result.created, failed=result.failed)

    def forecast_refresh_request(self, *, cluster_id: int) -> None:
        from forecasting import services

        services.forecast_refresh_request(cluster_id=cluster_id)

    def forecast_refresh_state(self, *, cluster_id: int) -> dict[str, Any] | None:
        from forecasting import services

        return services.forecast_refresh_state_get(cluster_id=cluster_id)
