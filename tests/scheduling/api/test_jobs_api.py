"""Jobs through the REST API."""

from __future__ import annotations

import pytest

from scheduling.models import AuditEvent, Job
from tests.factories import GpuTypeFactory, NodeFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"


def _body(**overrides):
    body = {
        "name": "resnet-sweep",
        "project": "vision",
        "gpu_count": 4,
        "gpu_type": "A100",
        "requested_s": 7200,
        "is_preemptible": True,
        "is_checkpointable": True,
        "checkpoint_interval_s": 600,
        "priority": "high",
        "payload": {"command": "python train.py", "image": "lab/train:1.2", "env": {"SEED": "1"}},
    }
    body.update(overrides)
    return body


def test_submit_retrieve_cancel(member_client, member, project, nodes):
    response = member_client.post(URL, _body(), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["status"] == "pending"
    assert data["priority"] == "high"
    assert data["cluster"] == "alpha"
    assert data["pending_sentence"]
    assert data["payload"]["command"] == "python train.py"
    job = Job.objects.get(pk=data["id"])
    assert job.priority == Job.Priority.HIGH
    assert job.user == member

    assert member_client.get(f"{URL}{job.pk}/").json()["id"] == job.pk
    cancelled = member_client.post(f"{URL}{job.pk}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert member_client.delete(f"{URL}{job.pk}/").status_code == 400  # already cancelled
    verbs = list(
        AuditEvent.objects.filter(entity_type="job", entity_id=job.pk)
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs == ["job.submit", "job.cancel"]


def test_any_type_that_fits_the_constraints(member_client, project, nodes, cluster):
    small = GpuTypeFactory(name="T4", memory_gib=16, precisions=["fp32", "fp16"])
    NodeFactory(cluster=cluster, gpu_type=small, name="t0", gpu_count=8)
    body = _body(gpu_type=None, min_memory_gib=40, precisions=["bf16"], gpu_count=8)
    # Only the A100s have 40 GiB and bf16, and there are 8 of them: accepted.
    assert member_client.post(URL, body, format="json").status_code == 201
    too_many = member_client.post(URL, {**body, "gpu_count": 9}, format="json")
    assert too_many.status_code == 400
    assert "gpu_count" in too_many.json()["fields"]
    impossible = member_client.post(URL, {**body, "precisions": ["fp4"]}, format="json")
    assert impossible.status_code == 400
    assert "gpu_type" in impossible.json()["fields"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": ""}, "name"),
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu_count": 99999}, "gpu_count"),
        ({"gpu_type": "TPUv9"}, "gpu_type"),
        ({"requested_s": -5}, "requested_s"),
        ({"requested_s": 10**9}, "requested_s"),  # beyond the maximum runtime
        ({"priority": "urgent"}, "priority"),
        ({"kind": "daemon"}, "kind"),
        ({"is_checkpointable": False}, "checkpoint_interval_s"),
        ({"payload": "rm -rf /"}, "payload"),
        ({"payload": {"env": {"A": {"nested": 1}}}}, "payload"),
        ({"min_memory_gib": "lots"}, "min_memory_gib"),
        ({"precisions": "bf16"}, "precisions"),
        ({"project": "nope"}, "project"),
    ],
)
def test_bad_job_input_is_400(member_client, project, nodes, overrides, field):
    response = member_client.post(URL, _body(**overrides), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert not Job.objects.exists()
    assert not AuditEvent.objects.exists()


def test_list_filters(member_client, project, nodes):
    first = member_client.post(URL, _body(name="a"), format="json").json()
    member_client.post(URL, _body(name="b"), format="json")
    member_client.post(f"{URL}{first['id']}/cancel/")
    pending = member_client.get(URL, {"status": "pending"}).json()["results"]
    assert [j["name"] for j in pending] == ["b"]
    assert member_client.get(URL, {"status": "lost"}).status_code == 400
