"""Job services: submit, cancel, and the lifecycle the engine drives (start, finish, preempt, requeue)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from scheduling.models import Allocation, AuditEvent, Booking, Gpu, Job, Preemption
from scheduling.services import (
    AllocationConflictError,
    PendingExplanation,
    booking_create,
    booking_statuses_advance,
    engine_round_record,
    job_allocations_extend,
    job_cancel,
    job_explanations_set,
    job_finish,
    job_preempt_signal,
    job_requeue,
    job_start,
    job_submit,
)
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


def test_start_finish_frees_the_gpus(job):
    start = timezone.now()
    job = job_start(job, gpu_ids=_gpus(2), started_at=start, backend_ref="sim-1")
    assert job.status == Job.Status.RUNNING
    allocations = list(job.allocations.all())
    assert all(a.period.upper is None and a.state == Allocation.State.ACTIVE for a in allocations)
    end = start + timedelta(minutes=30)
    job = job_finish(job, status=Job.Status.COMPLETED, ended_at=end, exit_code=0)
    assert job.status == Job.Status.COMPLETED
    for allocation in job.allocations.all():
        assert allocation.state == Allocation.State.ENDED
        assert allocation.period.upper == end
    # Idempotent: the reconciler may report the same completion twice.
    assert job_finish(job, status=Job.Status.COMPLETED, ended_at=end).status == Job.Status.COMPLETED
    verbs = list(
        AuditEvent.objects.filter(entity_type="job", entity_id=job.pk)
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs == ["job.submit", "job.start", "job.completed"]
    assert AuditEvent.objects.filter(entity_type="job", verb="job.start").get().actor_label == "engine"


def test_running_job_blocks_bookings_on_its_gpus(job, member, project, a100, soon):
    job_start(job, gpu_ids=_gpus(2), started_at=timezone.now())
    # The open-ended job holds two GPUs of node a0: a whole-node booking must go to a1.
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=4, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    assert set(booking.allocations.values_list("gpu__node__name", flat=True)) == {"a1"}


def test_start_refuses_taken_or_wrong_gpus(job, member, project, a100, nodes):
    now = timezone.now()
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=now, end_at=now + timedelta(hours=1)
    )
    with pytest.raises(AllocationConflictError):
        job_start(job, gpu_ids=_gpus(2), started_at=now)
    job.refresh_from_db()
    assert job.status == Job.Status.PENDING
    assert not job.allocations.exists()
    with pytest.raises(ValidationError) as info:
        job_start(job, gpu_ids=_gpus(3), started_at=now)
    assert "gpu_ids" in info.value.message_dict


def test_cancel_running_job_truncates_its_allocations(job, member):
    start = timezone.now() - timedelta(minutes=10)
    job_start(job, gpu_ids=_gpus(2), started_at=start, expected_end_at=start + timedelta(hours=1))
    now = timezone.now()
    job = job_cancel(job, user=member, now=now)
    assert job.status == Job.Status.CANCELLED
    assert {a.period.upper for a in job.allocations.all()} == {now}
    with pytest.raises(ValidationError):
        job_cancel(job, user=member)


def test_preempt_then_requeue_keeps_the_job(job):
    start = timezone.now() - timedelta(hours=1)
    job_start(job, gpu_ids=_gpus(2), started_at=start, is_preemptible=True)
    signal = timezone.now()
    preemption = job_preempt_signal(
        job, signalled_at=signal, kill_at=signal + timedelta(seconds=30), reason="booking 7 starts"
    )
    # Repeating the signal is success, not a second preemption.
    assert job_preempt_signal(job, signalled_at=signal, kill_at=signal, reason="again") == preemption
    stopped = signal + timedelta(seconds=30)
    job = job_requeue(job, stopped_at=stopped, lost_gpu_s=1200.0)
    assert job.status == Job.Status.PENDING
    assert job.attempt == 1
    assert job.first_submitted_at < job.submitted_at == stopped
    preemption.refresh_from_db()
    assert preemption.killed_at == stopped
    assert preemption.lost_gpu_s == 1200.0
    assert {a.period.upper for a in job.allocations.all()} == {stopped}
    # It can start again later, on other GPUs.
    job_start(job, gpu_ids=_gpus(2, node_index=1), started_at=stopped + timedelta(minutes=1))


def test_non_preemptible_job_is_never_preempted(member, project, a100, nodes):
    job = job_submit(member, project=project, name="eval", gpu_count=1, gpu_type=a100, is_preemptible=False)
    job_start(job, gpu_ids=_gpus(1), started_at=timezone.now())
    with pytest.raises(ValidationError) as info:
        job_preempt_signal(job, signalled_at=timezone.now(), kill_at=timezone.now(), reason="x")
    assert "job" in info.value.message_dict
    assert not Preemption.objects.exists()


def test_extend_expected_end_stops_at_the_next_booking(job, member, project, a100):
    now = timezone.now()
    job_start(job, gpu_ids=_gpus(2), started_at=now, expected_end_at=now + timedelta(hours=1))
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=8,
        start_at=now + timedelta(hours=2),
        end_at=now + timedelta(hours=3),
    )
    job_allocations_extend(job, until=now + timedelta(hours=2))
    with pytest.raises(AllocationConflictError):
        job_allocations_extend(job, until=now + timedelta(hours=3))
    assert {a.period.upper for a in job.allocations.all()} == {now + timedelta(hours=2)}


def test_explanations_only_touch_pending_jobs(job, member, project, a100):
    running = job_submit(member, project=project, name="r", gpu_count=1, gpu_type=a100)
    job_start(running, gpu_ids=_gpus(1, node_index=1), started_at=timezone.now())
    eta = timezone.now() + timedelta(hours=1)
    updated = job_explanations_set(
        [
            PendingExplanation(job.pk, "resources", "Waiting for 2 A100s.", eta, eta + timedelta(hours=1)),
            PendingExplanation(running.pk, "quota", "ignored", None, None),
        ]
    )
    assert updated == 1
    job.refresh_from_db()
    assert (job.pending_reason, job.pending_sentence, job.eta_p50_at) == (
        "resources",
        "Waiting for 2 A100s.",
        eta,
    )
    with pytest.raises(ValidationError):
        job_explanations_set([PendingExplanation(job.pk, "bored", "", None, None)])


def test_booking_statuses_advance(member, project, a100, nodes, cluster):
    now = timezone.now()
    hour = timedelta(hours=1)
    running = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=now, end_at=now + hour
    )
    later = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=now + 2 * hour, end_at=now + 3 * hour
    )
    assert booking_statuses_advance(now=now + timedelta(minutes=1)) == (1, 0)
    running.refresh_from_db()
    assert running.status == Booking.Status.ACTIVE
    assert set(running.allocations.values_list("state", flat=True)) == {Allocation.State.ACTIVE}
    assert booking_statuses_advance(now=now + 4 * hour) == (0, 2)
    later.refresh_from_db()
    assert later.status == Booking.Status.COMPLETED
    assert set(later.allocations.values_list("state", flat=True)) == {Allocation.State.ENDED}
    assert AuditEvent.objects.filter(verb="booking.complete", actor_label="engine").count() == 2
    assert booking_statuses_advance(now=now + 5 * hour) == (0, 0)
    engine_round_record(cluster, started_at=now, duration_ms=3.5, policy="berth", decisions={"starts": 0})
