"""A job that can never start: accepted with a warning (API and form), stored with its reason
and no ETA by the round (real PostgreSQL, real Redis for the live simulator)."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.urls import reverse

from portal.accounts.models import Quota
from scheduling.models import GpuType, Job
from scheduling.selectors import job_warnings
from tests.factories import QuotaFactory
from tests.integration import loop
from tests.integration.loop import make_cluster, make_member, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db]


def _one_a100(project) -> Quota:
    """Guaranteed 1 A100 and no borrowing: the project never runs more than 1 A100 at once."""
    return QuotaFactory(
        project=project, gpu_type=GpuType.objects.get(name="A100"), guaranteed_gpus=1, borrow_limit_gpus=0
    )


def _borrowing_a100(project) -> Quota:
    """Guaranteed 1 A100, up to 1 more borrowed (as preemptible work)."""
    return QuotaFactory(
        project=project, gpu_type=GpuType.objects.get(name="A100"), guaranteed_gpus=1, borrow_limit_gpus=1
    )


def test_round_stores_the_reason_and_no_eta_and_submit_warns(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user, project = make_member()
    _borrowing_a100(project)
    # 3 A100 > guarantee 1 + borrowing 1: never, preemptible or not
    solid = submit(user, project, cluster, gpus=3, runtime_s=600, now=t0, name="solid", is_preemptible=True)
    # 2 A100, not preemptible, above the guarantee: it borrows (Kueue), no warning
    lent = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0, name="lent")
    # at submit already: the reason, what unblocks it, no ETA
    solid.refresh_from_db()
    assert solid.pending_reason == Job.PendingReason.QUOTA
    assert "borrowing limit" in solid.pending_sentence
    assert job_warnings(solid)
    assert "Cannot start" in job_warnings(solid)[0]
    assert job_warnings(lent) == []

    result = run_round(cluster, t0)
    assert result.status == "ok"
    solid.refresh_from_db()
    lent.refresh_from_db()
    assert lent.status == Job.Status.RUNNING  # above its guarantee it runs on borrowed GPUs
    assert solid.status == Job.Status.PENDING
    assert solid.pending_reason == Job.PendingReason.QUOTA
    assert solid.pending_sentence.startswith("Cannot start:")
    assert "Expected start" not in solid.pending_sentence
    assert solid.eta_p50_at is None
    assert solid.eta_p90_at is None


def test_api_answers_201_with_warnings_and_requires_a_command(engine_redis_url, t0: datetime) -> None:
    from rest_framework.test import APIClient

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    _one_a100(project)
    client = APIClient()
    client.force_authenticate(user)
    body = {
        "name": "era5",
        "project": project.slug,
        "cluster": cluster.name,
        "gpu_count": 2,
        "gpu_type": "A100",
        "payload": {"command": "python train.py"},
    }
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["warnings"]
    assert "borrowing limit" in data["warnings"][0]
    assert data["eta_p50_at"] is None
    assert data["pending_reason"] == "quota"
    # preemptible does not help past a borrowing limit of 0; within the guarantee it is fine
    still = client.post("/api/v1/jobs/", {**body, "is_preemptible": True}, format="json")
    assert still.status_code == 201
    assert still.json()["warnings"]
    ok = client.post("/api/v1/jobs/", {**body, "gpu_count": 1}, format="json")
    assert ok.status_code == 201
    assert ok.json()["warnings"] == []
    # no command: refused like the form refuses it
    for payload in ({}, {"command": "  "}):
        missing = client.post("/api/v1/jobs/", {**body, "payload": payload}, format="json")
        assert missing.status_code == 400, missing.content
        assert "command" in str(missing.json()["fields"])
    no_payload = {k: v for k, v in body.items() if k != "payload"}
    assert client.post("/api/v1/jobs/", no_payload, format="json").status_code == 400


def test_form_warns_after_submitting_a_never_startable_job(engine_redis_url, client) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    _one_a100(project)
    client.force_login(user)
    form = {
        "project": project.slug,
        "name": "era5",
        "gpu_count": "2",
        "gpu_type": "A100",
        "requested_h": "1",
        "command": "python train.py",
    }
    response = client.post(reverse("job-new"), form, follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    assert "cannot start as it is" in text
    assert "borrowing limit" in text
    assert Job.objects.filter(name="era5", cluster=cluster).exists()
