"""The one what-if (a `CapacityStudy` row, computed by a Celery task) as the staff page shows it:
every state says in words what is happening, failures are shown as errors, the capacity page
lists the cluster's newest what-ifs, and other users never see one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from forecasting.models import CapacityStudy
from forecasting.services import capacity_study_create
from scheduling.models import Cluster, GpuType, Node
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def _status(client: Client, study: CapacityStudy) -> str:
    response = client.get(reverse("ops:whatif", args=[study.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return response.content.decode()


def test_each_state_is_said_in_words(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    study = capacity_study_create(cluster=cluster, gpu_type="A100", gpu_delta=4, policy="fifo", enqueue=False)
    body = _status(staff_web, study)
    assert "Progress: queued, waiting for a worker." in body
    assert 'value="0"' in body
    assert "0 of 2 replays done" in body

    # Nobody picked it up for five minutes: the page says so instead of polling in silence.
    CapacityStudy.objects.filter(pk=study.pk).update(created_at=study.created_at - timedelta(minutes=5))
    body = _status(staff_web, study)
    assert "queued for 5 min: no worker has started it yet" in body
    assert 'hx-trigger="every 1s"' in body

    CapacityStudy.objects.filter(pk=study.pk).update(status="running")
    assert "running replay 1 of 2 (baseline, about 8 GPUs, policy berth)" in _status(staff_web, study)
    CapacityStudy.objects.filter(pk=study.pk).update(
        results={"baseline": {"gpus": 8, "nodes": 2, "policy": "berth"}}, progress=0.5
    )
    body = _status(staff_web, study)
    assert "running replay 2 of 2 (what-if, about 12 GPUs, policy fifo)" in body
    assert 'value="50"' in body

    # Past the task's hard time limit nothing is running it any more: said, not polled in silence.
    CapacityStudy.objects.filter(pk=study.pk).update(started_at=timezone.now() - timedelta(hours=2))
    assert "running for 120 min, longer than a what-if may run" in _status(staff_web, study)

    CapacityStudy.objects.filter(pk=study.pk).update(status="failed", message="The replay failed: boom")
    body = _status(staff_web, study)
    assert "Progress: failed." in body
    assert 'class="notice error">The replay failed: boom<' in body
    assert "every 1s" not in body  # a failed what-if is not polled


def test_capacity_page_lists_the_clusters_newest_whatifs(
    staff_web: Client, staff: User, cluster: Cluster, nodes: list[Node]
) -> None:
    mine = capacity_study_create(
        cluster=cluster, gpu_type="A100", gpu_delta=-4, policy="easy", requested_by=staff, enqueue=False
    )
    body = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).content.decode()
    assert "Recent what-ifs" in body
    assert f'href="{reverse("ops:whatif", args=[mine.pk])}">A100 -4 GPUs, policy easy</a>: queued' in body
    other = ClusterFactory()
    assert (
        "Recent what-ifs"
        not in staff_web.get(reverse("ops:capacity"), {"cluster": other.pk}).content.decode()
    )


def test_a_whatif_is_staff_only_and_unknown_ids_are_404(
    member: User, staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    study = capacity_study_create(cluster=cluster, gpu_type="A100", gpu_delta=4, policy="fifo", enqueue=False)
    url = reverse("ops:whatif", args=[study.pk])
    assert staff_web.get(url).status_code == 200
    assert staff_web.get(reverse("ops:whatif", args=[study.pk + 1000])).status_code == 404
    researcher = Client()
    researcher.force_login(member)
    assert researcher.get(url).status_code == 403
