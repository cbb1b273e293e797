"""DESIGN §3.6: every state change of a booking, job or allocation is an audit event with its cause.

Each service, and the engine's round (its write path for starts, finishes, preemptions and
booking status changes), is driven; before and after, the state of every booking, job and allocation
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
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, submit

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

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
    Booking.objects.filter(pk=running.pk).update(status=Booking.Status.ACTIVE)  # as a round would
    with Audited(actor=user, label="user"):
        services.booking_end_early(
            Booking.objects.get(pk=running.pk), user=user, now=now + timedelta(minutes=2)
        )


def test_job_services_are_audited(lab):
    user = lab["user"]
    with Audited(actor=user, label="user"):
        job = services.job_submit(user, project=lab["project"], name="train", gpu_count=2)
    with Audited(actor=lab["manager"], label="api"):
        services.job_cancel(job, user=lab["manager"], actor_label="api")


def test_engine_rounds_audit_every_change_they_make(engine_redis_url, run_round, t0):
    """The engine's write path (scheduling.rounds): starts, finishes and booking status changes."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    submit(user, project, cluster, gpus=2, runtime_s=60, now=t0, name="short")
    with Audited(actor=None, label="engine"):
        run_round(cluster, t0)  # starts the job: status, allocations
    assert Job.objects.get(name="short").status in (Job.Status.STARTING, Job.Status.RUNNING)
    booking = services.booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=1,
        start_at=t0,
        end_at=later(t0, 3600),
        now=t0,
    )
    with Audited(actor=None, label="engine"):
        run_round(cluster, later(t0, 300))  # the job has finished; the booking has begun
    assert Job.objects.get(name="short").status == Job.Status.COMPLETED
    assert Booking.objects.get(pk=booking.pk).status == Booking.Status.ACTIVE


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


@pytest.mark.django_db(transaction=True)
def test_deferred_events_are_written_as_recorded():
    """`audit_events_deferred` writes its events when the block ends: every column reads back as
    given (JSON objects, SQL NULL for a missing state, the actor, the instant), and a block that
    raises writes nothing."""
    from django.db import transaction

    from scheduling.services import audit_event_record, audit_events_deferred

    user = UserFactory()
    at = timezone.now().replace(microsecond=123456)
    with transaction.atomic(), audit_events_deferred():
        audit_event_record(
            actor=user,
            actor_label="api",
            verb="job.cancel",
            entity_type="job",
            entity_id=7,
            before={"status": "running", "note": 'a "quoted"\ttab\\slash, ünïcode'},
            after=None,
            at=at,
        )
        audit_event_record(
            actor=None,
            actor_label="engine",
            verb="allocation.create",
            entity_type="allocation",
            entity_id=2**40,
            before=None,
            after={"gpu_id": 3, "lower": at.isoformat(), "upper": None, "is_preemptible": True},
            at=at + timedelta(seconds=1),
        )
        assert AuditEvent.objects.count() == 0  # collected, not written yet
    rows = list(
        AuditEvent.objects.order_by("at").values_list(
            "actor_id", "actor_label", "verb", "entity_type", "entity_id", "before", "after", "at"
        )
    )
    assert rows == [
        (
            user.pk,
            "api",
            "job.cancel",
            "job",
            7,
            {"status": "running", "note": 'a "quoted"\ttab\\slash, ünïcode'},
            None,
            at,
        ),
        (
            None,
            "engine",
            "allocation.create",
            "allocation",
            2**40,
            None,
            {"gpu_id": 3, "lower": at.isoformat(), "upper": None, "is_preemptible": True},
            at + timedelta(seconds=1),
        ),
    ]
    assert AuditEvent.objects.filter(before__isnull=True).count() == 1  # SQL NULL, not JSON null

    def fails() -> None:
        with transaction.atomic(), audit_events_deferred():
            audit_event_record(
                actor=None,
                actor_label="engine",
                verb="x",
                entity_type="job",
                entity_id=1,
                before=None,
                after=None,
                at=at,
            )
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fails()
    assert AuditEvent.objects.count() == 2
