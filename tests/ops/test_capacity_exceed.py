""" "When does demand exceed capacity" as the staff page shows it: the button POSTs a
`CapacityExceedRun` (the fits run on a worker), every state is said in words while htmx polls,
a GET only reads (it never fits a model), and other users never see or start one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from forecasting.models import CapacityExceedRun
from forecasting.services import capacity_exceed_run_create, capacity_exceed_run_execute
from scheduling.models import Cluster, Node
from tests.factories import ClusterFactory
from tests.ops.ops_helpers import csv_rows

pytestmark = pytest.mark.django_db


def _fragment(client: Client, cluster: Cluster, run: CapacityExceedRun) -> str:
    response = client.get(
        reverse("ops:capacity-exceed"), {"cluster": cluster.pk, "run": run.pk}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="capacity-exceed"')
    return body


def test_each_state_is_said_in_words(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False)
    runs = CapacityExceedRun.objects.filter(pk=run.pk)
    body = _fragment(staff_web, cluster, run)
    assert "Progress: queued, waiting for a worker." in body
    assert 'hx-trigger="every 1s"' in body
    assert "disabled>Compute for the next 28 days" in body  # one run at a time

    runs.update(created_at=run.created_at - timedelta(minutes=5))
    assert "queued for 5 min: no worker has started it yet" in _fragment(staff_web, cluster, run)

    runs.update(status="running", started_at=timezone.now())
    assert "Progress: running, reading the demand history." in _fragment(staff_web, cluster, run)
    runs.update(types_total=3, types_done=1)
    body = _fragment(staff_web, cluster, run)
    assert "Progress: running, fitting GPU type 2 of 3." in body
    assert 'max="3" value="1"' in body
    assert 'hx-trigger="every 1s"' in body

    # Past the task's hard time limit nothing is running it any more: said, not polled in silence.
    runs.update(started_at=timezone.now() - timedelta(hours=2))
    assert "running for 120 min, longer than these fits may run" in _fragment(staff_web, cluster, run)

    runs.update(status="failed", message="The forecast fit failed: boom")
    body = _fragment(staff_web, cluster, run)
    assert "Progress: failed." in body
    assert 'class="notice error">The forecast fit failed: boom<' in body
    assert "every 1s" not in body
    assert "disabled" not in body  # it can be asked for again

    done = capacity_exceed_run_execute(run_id=run.pk)  # a failed run starts again
    assert done.status == CapacityExceedRun.Status.DONE
    body = _fragment(staff_web, cluster, run)
    assert "Progress: done: 1 GPU type fitted with prophet" in body
    assert "every 1s" not in body
    assert "not within the horizon" in body
    assert f"run={run.pk}&amp;csv=capacity-exceed" in body


def test_the_button_posts_a_run_queued_after_commit(
    staff_web: Client,
    staff: User,
    cluster: Cluster,
    nodes: list[Node],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from forecasting import tasks

    queued: list[int] = []
    monkeypatch.setattr(tasks.capacity_exceed_run, "delay", queued.append)
    page = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).content.decode()
    action = f"{reverse('ops:capacity-exceed')}?cluster={cluster.pk}"
    assert f'<form method="post" action="{action}' in page
    assert "Compute for the next 28 days" in page

    with django_capture_on_commit_callbacks(execute=True):
        response = staff_web.post(action, {"horizon_days": 28}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    run = CapacityExceedRun.objects.get()
    assert (run.cluster, run.horizon_days, run.status, run.requested_by) == (cluster, 28, "queued", staff)
    assert queued == [run.pk]
    assert "Progress: queued, waiting for a worker." in response.content.decode()

    # A second click while it is queued shows the same run instead of queuing another.
    with django_capture_on_commit_callbacks(execute=True):
        again = staff_web.post(action, {"horizon_days": 28})
    assert again.status_code == 303
    assert again["Location"].startswith(reverse("ops:capacity"))
    assert CapacityExceedRun.objects.count() == 1
    assert queued == [run.pk]
    # The capacity page itself shows the cluster's newest run, and polls it.
    page = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).content.decode()
    assert "Progress: queued, waiting for a worker." in page
    assert f"run={run.pk}" in page

    # An unknown cluster is refused, not replaced by the first one.
    bad = staff_web.post(f"{reverse('ops:capacity-exceed')}?cluster=999999", HTTP_HX_REQUEST="true")
    assert bad.status_code == 422
    assert "Choose a cluster from the capacity page." in bad.content.decode()
    assert CapacityExceedRun.objects.count() == 1


def test_a_get_never_fits_a_model(
    staff_web: Client, cluster: Cluster, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    from forecasting import capacity
    from forecasting.capacity import exceed
    from forecasting.core import models as core_models

    def no_fit(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a GET fitted a forecast model")

    for module, name in ((capacity, "capacity_exceed_when"), (exceed, "capacity_exceed_when")):
        monkeypatch.setattr(module, name, no_fit)
    monkeypatch.setattr(core_models, "make_model", no_fit)
    url = reverse("ops:capacity-exceed")
    assert staff_web.get(url, {"cluster": cluster.pk}, HTTP_HX_REQUEST="true").status_code == 200
    assert staff_web.get(url, {"cluster": cluster.pk, "horizon_days": 28}).status_code == 200
    assert staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).status_code == 200
    # The POST only queues a run (no fit in the request either).
    assert staff_web.post(f"{url}?cluster={cluster.pk}", HTTP_HX_REQUEST="true").status_code == 200
    run = CapacityExceedRun.objects.get()
    assert staff_web.get(url, {"cluster": cluster.pk, "run": run.pk}).status_code == 200
    # No table (so no CSV) before the run is done.
    assert (
        staff_web.get(url, {"cluster": cluster.pk, "run": run.pk, "csv": "capacity-exceed"}).status_code
        == 404
    )
    assert CapacityExceedRun.objects.get().status == "queued"
    # Only the worker's half fits (here it fails on the patched fit, and says so).
    failed = capacity_exceed_run_execute(run_id=run.pk)
    assert failed.status == "failed"
    assert "a GET fitted a forecast model" in failed.message


def test_done_run_csv_and_other_clusters_runs_are_404(
    staff_web: Client, cluster: Cluster, nodes: list[Node]
) -> None:
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=7, enqueue=False)
    capacity_exceed_run_execute(run_id=run.pk)
    url = reverse("ops:capacity-exceed")
    rows = csv_rows(staff_web.get(url, {"cluster": cluster.pk, "run": run.pk, "csv": "capacity-exceed"}))
    assert rows[0][:2] == ["GPU type", "Capacity GPUs"]
    assert rows[1] == ["A100", "8", "not within the horizon", "not within the horizon", "0.0", "0.0"]
    other = ClusterFactory()
    assert staff_web.get(url, {"cluster": other.pk, "run": run.pk}).status_code == 404
    assert staff_web.get(url, {"cluster": cluster.pk, "run": "x"}).status_code == 404


def test_staff_only(member: User, cluster: Cluster, nodes: list[Node]) -> None:
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=28, enqueue=False)
    url = reverse("ops:capacity-exceed")
    researcher = Client()
    researcher.force_login(member)
    assert researcher.get(url, {"cluster": cluster.pk, "run": run.pk}).status_code == 403
    assert researcher.post(f"{url}?cluster={cluster.pk}").status_code == 403
    anonymous = Client()
    assert anonymous.get(url, {"cluster": cluster.pk}).status_code == 302
    response = anonymous.post(f"{url}?cluster={cluster.pk}")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    assert CapacityExceedRun.objects.count() == 1


def test_the_post_needs_its_csrf_token(staff: User, cluster: Cluster, nodes: list[Node]) -> None:
    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(staff)
    url = f"{reverse('ops:capacity-exceed')}?cluster={cluster.pk}"
    assert guarded.post(url, {"horizon_days": 28}).status_code == 403
    assert not CapacityExceedRun.objects.exists()
