"""Every event kind is emitted by the code path that makes the state change, once, to the right people.

Rounds run on the live simulator (real PostgreSQL, real Redis); the deliveries written in the round's
transaction are asserted (channel, recipient, key, payload).  Sending is not part of these tests
(see test_delivery.py, which sends over real SMTP and HTTP on loopback)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from notifications.models import Delivery, EventKind
from notifications.scan import bookings_scan
from notifications.services import preference_update, webhook_create
from portal.accounts.models import Membership
from scheduling.backends.base import ActionResult
from scheduling.models import Booking, GpuType, Job, Preemption
from scheduling.services import booking_create
from tests.factories import MembershipFactory, QuotaFactory
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db]


def _events(user: Any, kind: str, channel: str = Delivery.Channel.EMAIL) -> list[Delivery]:
    return list(Delivery.objects.filter(user=user, event=kind, channel=channel).order_by("id"))


def _book(user: Any, project: Any, cluster: Any, *, start: datetime, hours: float, now: datetime) -> Booking:
    return booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=4,
        start_at=start,
        end_at=later(start, hours * 3600),
        cluster=cluster,
        now=now,
    )


def test_job_started_and_finished_are_told_once_with_the_exit_code(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0, name="train")

    run_round(cluster, t0)
    run_round(cluster, later(t0, 5))  # a second round re-sees the running job: no second notice
    started = _events(user, EventKind.JOB_STARTED)
    assert len(started) == 1
    assert started[0].recipient == user.email
    assert started[0].event_key == f"job:{job.pk}:started:0"
    assert f"job {job.pk} (train) started on 2 GPU(s)" in started[0].payload["text"]
    assert started[0].status == Delivery.Status.PENDING  # sent by the Celery task after the commit

    run_round(cluster, later(t0, 700))
    run_round(cluster, later(t0, 710))
    finished = _events(user, EventKind.JOB_FINISHED)
    assert len(finished) == 1
    assert finished[0].payload["job"]["exit_code"] == 0
    assert finished[0].payload["job"]["url"].endswith(f"/jobs/{job.pk}/")
    assert not _events(user, EventKind.JOB_FAILED)


def test_job_failed_is_told_with_its_message(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4, settings={"fail_rate": 1.0})
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=300, now=t0, name="crashy")

    run_round(cluster, t0)
    run_round(cluster, later(t0, 400))

    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    failed = _events(user, EventKind.JOB_FAILED)
    assert len(failed) == 1
    assert failed[0].subject == f"Berth: job {job.pk} (crashy) failed"
    assert failed[0].payload["job"]["status"] == "failed"
    assert not _events(user, EventKind.JOB_FINISHED)


def test_a_never_startable_job_is_told_once_per_attempt(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    QuotaFactory(
        project=project, gpu_type=GpuType.objects.get(name="A100"), guaranteed_gpus=0, borrow_limit_gpus=1
    )
    # Above the guarantee + borrowing limit (0 + 1): it can never start; the 1-GPU job borrows.
    job = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0, name="solid")
    fine = submit(user, project, cluster, gpus=1, runtime_s=600, now=t0, name="fine", is_preemptible=True)

    for seconds in (0, 15, 30):
        run_round(cluster, later(t0, seconds))

    told = _events(user, EventKind.JOB_CANNOT_START)
    assert [d.event_key for d in told] == [f"job:{job.pk}:cannot_start:0"]
    assert told[0].payload["job"]["reason"] == "quota"
    assert told[0].payload["job"]["sentence"].startswith("Cannot start:")
    assert "borrowing limit" in told[0].payload["text"]
    assert not Delivery.objects.filter(event=EventKind.JOB_CANNOT_START, event_key__contains=f":{fine.pk}:")


def test_preemption_tells_grace_and_lost_work_and_the_booking_owner_is_told_of_the_reclaim(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    owner, project = make_member()
    borrower = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    booking_start = later(t0, 3600)
    booking = _book(owner, project, cluster, start=booking_start, hours=1, now=t0)
    lent = submit(
        borrower,
        project,
        cluster,
        gpus=4,
        runtime_s=3 * 3600,
        now=t0,
        is_preemptible=True,
        is_checkpointable=True,
        checkpoint_interval_s=700,
        name="lent",
    )
    run_round(cluster, t0)
    for minutes in (10, 30, 50):
        run_round(cluster, later(t0, minutes * 60))
    at = later(booking_start, -120)
    while at < booking_start:
        at = later(at, 15)
        run_round(cluster, at)

    preemption = Preemption.objects.get(job=lent)
    notices = _events(borrower, EventKind.JOB_PREEMPTED)
    assert len(notices) == 1  # the preemption is re-sent to the backend each round, told once
    data = notices[0].payload["preemption"]
    assert data["id"] == preemption.pk
    assert data["grace_s"] == (preemption.kill_at - preemption.signalled_at).total_seconds()
    assert data["grace_s"] > 0
    assert data["lost_gpu_s"] > 0
    assert data["is_checkpointable"] is True
    assert "resumes from its last checkpoint" in notices[0].payload["text"]
    reclaimed = _events(owner, EventKind.BOOKING_RECLAIMED)
    assert [d.event_key for d in reclaimed] == [f"booking:{booking.pk}:reclaimed"]
    started = _events(owner, EventKind.BOOKING_STARTED)
    assert len(started) == 1
    assert started[0].payload["access"]["backend"] == "simulator"
    assert "no real GPUs" in started[0].payload["text"]
    # The lent job's owner hears nothing of the booking; the booking's owner nothing of the job.
    assert not _events(owner, EventKind.JOB_PREEMPTED)
    assert not _events(borrower, EventKind.BOOKING_RECLAIMED)


def test_a_booking_blocked_at_its_start_tells_its_owner(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=2)
    user, project = make_member()
    stubborn = submit(user, project, cluster, gpus=2, runtime_s=7200, requested_s=600, now=t0)
    run_round(cluster, t0)
    booking = booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=2,
        start_at=later(t0, 1800),
        end_at=later(t0, 9000),
        cluster=cluster,
        now=later(t0, 700),
    )
    run_round(cluster, later(t0, 1800))
    run_round(cluster, later(t0, 1815))

    at_risk = _events(user, EventKind.BOOKING_AT_RISK)
    assert len(at_risk) == 1
    assert at_risk[0].event_key == f"booking:{booking.pk}:at_risk"
    assert str(stubborn.pk) in at_risk[0].payload["booking"]["detail"]


def test_a_reservation_refused_by_the_cluster_tells_the_booking_owner(
    engine_redis_url, t0: datetime, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling import rounds

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    booking = _book(user, project, cluster, start=later(t0, 600), hours=1, now=t0)
    real_apply = rounds._call_apply

    def refuse_reservations(backend, plan, payloads):  # type: ignore[no-untyped-def]
        results = [r for r in real_apply(backend, plan, payloads) if r.action != "reserve"]
        refused = [
            ActionResult("reserve", r.holder_id, False, "Requested nodes are busy") for r in plan.reservations
        ]
        return [*results, *refused]

    monkeypatch.setattr(rounds, "_call_apply", refuse_reservations)
    with django_capture_on_commit_callbacks(execute=True):
        rounds.engine_round_run(cluster_id=cluster.pk, now=t0)

    told = _events(user, EventKind.BOOKING_AT_RISK)
    assert len(told) == 1, "the simulator plans a reservation for a booking in its horizon"
    assert "refused to hold its GPUs (Requested nodes are busy)" in told[0].payload["text"]
    assert told[0].payload["booking"]["id"] == booking.pk


def test_scan_tells_start_and_end_within_each_owners_lead_once(t0: datetime) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    early, project = make_member()
    late = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    preference_update(user=early, booking_start_lead_min=60)  # late keeps the default 15 min
    now = timezone.now().replace(microsecond=0)
    start = now + timedelta(minutes=30)
    early_booking = _book(early, project, cluster, start=start, hours=1, now=now)
    _book(late, project, cluster, start=start, hours=1, now=now)

    with transaction.atomic():
        assert bookings_scan(now=now) == 1
        assert bookings_scan(now=now + timedelta(minutes=1)) == 1  # emitted again, delivered once
    starting = _events(early, EventKind.BOOKING_STARTING)
    assert len(starting) == 1
    assert starting[0].subject == f"Berth: your booking {early_booking.pk} starts in 30 min"
    assert starting[0].payload["access"]["backend"] == "simulator"
    assert not _events(late, EventKind.BOOKING_STARTING)

    with transaction.atomic():
        bookings_scan(now=start - timedelta(minutes=10))
    assert len(_events(late, EventKind.BOOKING_STARTING)) == 1

    # Ending: an active booking within the default 10-minute end lead.
    Booking.objects.filter(pk=early_booking.pk).update(status=Booking.Status.ACTIVE)
    with transaction.atomic():
        bookings_scan(now=early_booking.end_at - timedelta(minutes=8))
    ending = _events(early, EventKind.BOOKING_ENDING)
    assert len(ending) == 1
    assert "ends in 8 min" in ending[0].subject
    assert "extend" in ending[0].payload["text"]


def test_project_webhooks_hear_all_project_work_and_own_webhooks_only_their_owners(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    member, project = make_member()
    manager = MembershipFactory(project=project, role=Membership.Role.MANAGER).user
    other, _ = make_member()
    project_hook = webhook_create(owner=manager, url="https://hooks.example.org/p", project=project)
    own_hook = webhook_create(owner=member, url="https://hooks.example.org/m", events=["job.finished"])
    others_hook = webhook_create(owner=other, url="https://hooks.example.org/o")
    submit(member, project, cluster, gpus=1, runtime_s=300, now=t0)

    run_round(cluster, t0)

    hooks = Delivery.objects.filter(channel=Delivery.Channel.WEBHOOK)
    assert set(hooks.values_list("webhook_id", "event")) == {(project_hook.pk, EventKind.JOB_STARTED)}
    assert hooks.get().user == manager  # the delivery log is the webhook owner's
    assert not hooks.filter(webhook__in=[own_hook, others_hook]).exists()


def test_mail_preferences_and_a_missing_address_send_no_mail(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    quiet, project = make_member()
    preference_update(user=quiet, is_email_enabled=False)
    nameless = MembershipFactory(project=project, role=Membership.Role.MEMBER, user__email="").user
    submit(quiet, project, cluster, gpus=1, runtime_s=300, now=t0)
    submit(nameless, project, cluster, gpus=1, runtime_s=300, now=t0)

    run_round(cluster, t0)

    assert Job.objects.filter(status=Job.Status.RUNNING).count() == 2
    assert not Delivery.objects.exists()


def test_a_job_path_is_what_reverse_writes_under_any_script_prefix() -> None:
    from django.urls import reverse, set_script_prefix

    from notifications.events import _job_path

    try:
        for prefix in ("/", "/berth/", "/a b/"):
            set_script_prefix(prefix)
            for job_id in (1, 7, 10, 123_456_789, 2**62):
                assert _job_path(job_id) == reverse("job-detail", args=[job_id])
    finally:
        set_script_prefix("/")
