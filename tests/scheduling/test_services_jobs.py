"""Job services: submit and cancel.

The lifecycle the engine drives (start, finish, preempt, requeue) is written by
`scheduling.rounds` and tested in tests/scheduling/test_rounds*.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from scheduling.models import Allocation, AuditEvent, Gpu, Job
from scheduling.services import job_cancel, job_submit
from tests.factories import GpuTypeFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(member, project, a100, nodes) -> Job:
    return job_submit(member, project=project, name="train", gpu_count=2, gpu_type=a100, is_preemptible=True)


def _gpus(n: int, node_index: int = 0) -> list[int]:
    return list(
        Gpu.objects.filter(node__name=f"a{node_index}").order_by("index").values_list("id", flat=True)[:n]
    )


def test_submit_records_and_audits(job, member):
    assert job.status == Job.Status.PENDING
    assert job.first_submitted_at == job.submitted_at
    event = AuditEvent.objects.get(entity_type="job", entity_id=job.pk)
    assert (event.verb, event.actor_id, event.actor_label) == ("job.submit", member.pk, "user")


def test_submit_requires_membership(outsider, project, nodes):
    with pytest.raises(PermissionDenied):
        job_submit(outsider, project=project, name="x", gpu_count=1)
    assert not Job.objects.exists()


def test_submit_picks_the_cluster_that_can_run_it(member, project, nodes):
    big = GpuTypeFactory(name="H200", memory_gib=141)
    other_node = NodeFactory(gpu_type=big, gpu_count=8, name="h0")
    job = job_submit(member, project=project, name="llm", gpu_count=4, min_memory_gib=100)
    assert job.cluster_id == other_node.cluster_id


def test_cancel_running_job_truncates_its_allocations(job, member):
    start = timezone.now() - timedelta(minutes=10)
    for gpu_id in _gpus(2):
        Allocation.objects.create(
            gpu_id=gpu_id,
            job=job,
            period=DateTimeTZRange(start, start + timedelta(hours=1), "[)"),
            state=Allocation.State.ACTIVE,
        )
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=start)
    now = timezone.now()
    job = job_cancel(job, user=member, now=now)
    assert job.status == Job.Status.CANCELLED
    assert {a.period.upper for a in job.allocations.all()} == {now}
    assert AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.cancel").exists()
    with pytest.raises(ValidationError):
        job_cancel(job, user=member)


def test_cancel_pending_job_by_another_user_is_refused(job, outsider):
    with pytest.raises((PermissionDenied, Job.DoesNotExist)):
        job_cancel(job, user=outsider)
    assert Job.objects.get(pk=job.pk).status == Job.Status.PENDING


def test_cancel_audits_the_same_job_state_as_the_round(job, member):
    """One job state for every writer: a cancel's ``before`` keeps why the job was waiting,
    as the engine round's events do (the services' copy used to drop it)."""
    Job.objects.filter(pk=job.pk).update(pending_reason=Job.PendingReason.QUOTA)
    job.refresh_from_db()
    job_cancel(job, user=member)
    event = AuditEvent.objects.get(entity_type="job", entity_id=job.pk, verb="job.cancel")
    assert event.before["pending_reason"] == "quota"
    assert set(event.before) == {"status", "started_at", "ended_at", "attempt", "pending_reason"}
