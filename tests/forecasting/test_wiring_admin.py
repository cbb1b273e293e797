"""The forecasting admin: stored runs and studies are viewable by staff and never editable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from forecasting.models import CapacityStudy, ForecastPoint, ForecastRun
from scheduling.models import Cluster, GpuType, Node
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_run_change_page_shows_points_read_only(cluster: Cluster, nodes: list[Node], a100: GpuType) -> None:
    issued = datetime(2026, 11, 20, 10, tzinfo=UTC)
    run = ForecastRun.objects.create(
        cluster=cluster, kind="gpu_type", key="A100", gpu_type=a100, model_name="berth", issued_at=issued,
        train_start_at=issued - timedelta(days=3), train_end_at=issued, horizon_h=2,
    )  # fmt: skip
    ForecastPoint.objects.bulk_create(
        ForecastPoint(run=run, ts=issued + timedelta(hours=h), yhat=2.5, lower80=1.25, upper80=3.75)
        for h in range(2)
    )
    study = CapacityStudy.objects.create(
        cluster=cluster, gpu_type=a100, gpu_delta=4, policy="fifo", baseline_policy="berth", current_gpus=8,
        gpus_per_node=4,
    )  # fmt: skip
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))

    page = client.get(reverse("admin:forecasting_forecastrun_change", args=[run.pk]))
    assert page.status_code == 200
    assert b"3.75" in page.content
    assert b'name="_save"' not in page.content
    assert client.get(reverse("admin:forecasting_capacitystudy_change", args=[study.pk])).status_code == 200
    assert client.get(reverse("admin:forecasting_forecastrun_add")).status_code == 403
    listing = client.get(reverse("admin:forecasting_forecastrun_changelist"), {"q": "A100"})
    assert listing.status_code == 200
    assert b"A100" in listing.content
