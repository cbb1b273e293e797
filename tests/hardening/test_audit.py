"""DESIGN §3.6: every state change of a booking, job or allocation is an audit event with its cause.

Each service is driven once; before and after, the state of every booking, job and allocation
is fingerprinted, and every row that appeared or changed must have a new audit event naming
the actor (the user for people, the label ``engine`` for the engine).  Admin actions are in the
audit log too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from portal.accounts.models import Membership
from scheduling import services
from scheduling.models import Allocation, AuditEvent, Booking, Cluster, GpuType, Job
from tests.factories import ClusterFactory, GpuTypeFactory, MembershipFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db


def _fingerprint() -> dict[tuple[str, int], Any]:
    state: dict[tuple[str, int], Any] = {}
    for b in Booking.objects.all():
        state[("booking", b.pk)] = (b.status, b.start_at, b.end_at, b.ended_at)
    for j in Job.objects.all():
        # A grace signal changes no job field, but it is a step in the job's life: count them.
        signals = j.preemptions.count()
        state[("job", j.pk)] = (j.status, j.started_at, j.ended_at, j.attempt, j.is_preemptible, signals)
    for a in Allocation.objects.all():
        state[("allocation", a.pk)] = (a.state, a.period, a.is_preemptible)
    return state


class Audited:
    """Checks that a block's state changes each have an audit event by the expected actor."""

    def __init__(self, *, actor: Any, label: str) -> None:
        self.actor, self.label = actor, label

    def __enter__(self) -> Audited:
        self.before = _fingerprint()
        self.last_event = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        after = _fingerprint()
        changed = {key for key, value in after.items() if self.before.get(key) != value}
        assert changed, "the service changed nothing: the check would be vacuous"
        events = AuditEvent.objects.filter(id__gt=self.last_event)
        audited = {(e.entity_type, e.entity_id) for e in events}
        missing = sorted(changed - audited)
        assert not missing, f"state changes without an audit event: {missing}"
        for event in events.filter(entity_type__in=["booking", "job", "allocation"]):
            assert event.actor_label == self.label, event
            assert event.actor_id == (self.actor.pk if self.actor is not None else None), event


@pytest.fixture
def lab():
    a100 = GpuTypeFactory(name="A100")
    cluster = ClusterFactory(name="alpha")
    NodeFactory(cluster=cluster, gpu_type=a100, name="a0", gpu_count=4)
    membership = MembershipFactory(role=Membership.Role.MEMBER)
    manager = MembershipFactory(project=membership.project, role=Membership.Role.MANAGER).user
    return {
        "a100": a100,
        "cluster": cluster,
        "user": membership.user,
        "project": membership.project,
        "manager": manager,
    }


def test_every_booking_service_is_audited(lab):
    user, now = lab["user"], timezone.now()
    start = (now + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    with Audited(actor=user, label="user"):
        booking = services.booking_create(
            user,
            project=lab["project"],
            gpu_type=lab["a100"],
            gpu_count=2,
            start_at=start,
            end_at=start + timedelta(hours=1),
        )
    with Audited(actor=user, label="api"):
        booking = services.booking_extend(
            booking, user=user, end_at=start + timedelta(hours=2), actor_label="api"
        )
    with Audited(actor=lab["manager"], label="user"):
        services.booking_cancel(booking, user=lab["manager"])

    running = services.booking_create(
        user,
        project=lab["project"],
        gpu_type=lab["a100"],
        gpu_count=1,
        start_at=now,
        end_at=now + timedelta(hours=1),
        now=now,
    )
    with Audited(actor=None, label="engine"):
        services.booking_statuses_advance(now=now + timedelta(minutes=1))
    with Audited(actor=user, label="user"):
        services.booking_end_early(
            Booking.objects.get(pk=running.pk), user=user, now=now + timedelta(minutes=2)
        )


def test_every_job_service_is_audited(lab):
    user, now = lab["user"], timezone.now()
    gpus = list(lab["cluster"].nodes.get(name="a0").gpus.order_by("index").values_list("pk", flat=True))
    with Audited(actor=user, label="user"):
        job = services.job_submit(
            user, project=lab["project"], name="train", gpu_count=2, is_preemptible=True
        )
    with Audited(actor=None, label="engine"):
        job = services.job_start(
            job,
            gpu_ids=gpus[:2],
            started_at=now,
            expected_end_at=now + timedelta(hours=1),
            is_preemptible=True,
        )
    with Audited(actor=None, label="engine"):
        job = services.job_allocations_extend(
            job, until=now + timedelta(hours=2), at=now + timedelta(minutes=5)
        )
    with Audited(actor=None, label="engine"):
        services.job_preempt_signal(
            job, signalled_at=now + timedelta(minutes=10), kill_at=now + timedelta(minutes=12), reason="test"
        )
    with Audited(actor=None, label="engine"):
        job = services.job_requeue(Job.objects.get(pk=job.pk), stopped_at=now + timedelta(minutes=12))
    with Audited(actor=None, label="engine"):
        job = services.job_start(
            job,
            gpu_ids=gpus[2:4],
            started_at=now + timedelta(minutes=13),
            expected_end_at=now + timedelta(hours=1),
        )
    with Audited(actor=None, label="engine"):
        services.job_finish(
            job, status=Job.Status.COMPLETED, ended_at=now + timedelta(minutes=30), exit_code=0
        )

    other = services.job_submit(user, project=lab["project"], name="other", gpu_count=1)
    with Audited(actor=lab["manager"], label="api"):
        services.job_cancel(other, user=lab["manager"], actor_label="api")


def test_admin_actions_are_in_the_audit_log(lab):
    staff = UserFactory(is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    response = client.post(
        "/admin/scheduling/gputype/add/",
        {"name": "H100", "memory_gib": "80", "precisions": '["fp8"]', "relative_speed": "2", "value": "2"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    h100 = GpuType.objects.get(name="H100")
    added = AuditEvent.objects.get(verb="admin.add")
    assert (added.actor_id, added.actor_label, added.entity_type, added.entity_id) == (
        staff.pk,
        "admin",
        "gputype",
        h100.pk,
    )
    extra = [ClusterFactory(name=f"spare{i}") for i in range(2)]
    response = client.post(
        "/admin/scheduling/cluster/",
        {"action": "delete_selected", "_selected_action": [c.pk for c in extra], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Cluster.objects.filter(name__startswith="spare").exists()
    deleted = AuditEvent.objects.filter(verb="admin.delete", entity_type="cluster")
    assert sorted(deleted.values_list("entity_id", flat=True)) == sorted(c.pk for c in extra)
    assert all(e.actor_id == staff.pk for e in deleted)
