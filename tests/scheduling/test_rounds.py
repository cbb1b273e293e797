"""The engine round service end to end on the live simulator backend (real PostgreSQL and Redis)."""

from __future__ import annotations

from datetime import datetime

import pytest

from scheduling.engine.types import Plan, StartAction
from scheduling.models import Allocation, AuditEvent, Booking, EngineRound, Gpu, GpuType, Job, Preemption
from scheduling.services import booking_create, job_cancel
from tests.integration import loop
from tests.integration.loop import (
    later,
    make_cluster,
    make_member,
    sim_backend,
    submit,
)

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db]


def _active_gpus(job: Job) -> list[int]:
    return sorted(job.allocations.filter(state=Allocation.State.ACTIVE).values_list("gpu_id", flat=True))


def test_jobs_start_finish_and_free_their_gpus(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user, project = make_member()
    short = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0, name="short")
    long = submit(user, project, cluster, gpus=4, runtime_s=1200, now=t0, name="long")

    first = run_round(cluster, t0)
    wide = submit(user, project, cluster, gpus=8, runtime_s=300, now=later(t0, 1), name="wide")
    run_round(cluster, later(t0, 1))

    assert first.status == "ok", first
    assert first.started == 2
    for job in (short, long, wide):
        job.refresh_from_db()
    assert short.status == long.status == Job.Status.RUNNING
    assert len(_active_gpus(short)) == 2
    assert len(_active_gpus(long)) == 4
    assert not set(_active_gpus(short)) & set(_active_gpus(long))
    # What the database says runs is what the backend runs.
    running = sim_backend(cluster, at=t0).running_on()
    assert sorted(g for g, j in running.items() if j == str(short.pk)) == _active_gpus(short)
    # The 8-GPU job cannot start while the others run, and says why, with an ETA.
    assert wide.status == Job.Status.PENDING
    assert wide.pending_reason
    assert wide.pending_sentence
    assert wide.eta_p50_at is not None
    assert EngineRound.objects.filter(cluster=cluster, error="").count() == 2

    run_round(cluster, later(t0, 700))  # short ended at t0 + 600

    short.refresh_from_db()
    assert short.status == Job.Status.COMPLETED
    assert short.ended_at == later(t0, 600)
    ended = list(short.allocations.all())
    assert {a.state for a in ended} == {Allocation.State.ENDED}
    assert {(a.period.lower, a.period.upper) for a in ended} == {(t0, later(t0, 600))}

    run_round(cluster, later(t0, 1300))  # long ended at t0 + 1200: all 8 GPUs are free

    long.refresh_from_db()
    wide.refresh_from_db()
    assert long.status == Job.Status.COMPLETED
    assert wide.status == Job.Status.RUNNING
    assert len(_active_gpus(wide)) == 8
    verbs = set(AuditEvent.objects.filter(actor_label=AuditEvent.Actor.ENGINE).values_list("verb", flat=True))
    assert {"job.start", "job.run", "job.completed", "allocation.create", "allocation.end"} <= verbs
    # Every job state change of the engine is audited against that job.
    assert AuditEvent.objects.filter(entity_type="job", entity_id=short.pk, verb="job.completed").count() == 1


def test_round_is_idempotent(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0)

    run_round(cluster, t0)
    run_round(cluster, later(t0, 1))
    run_round(cluster, later(t0, 2))

    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert job.allocations.count() == 2  # no second start, no duplicated allocation
    assert AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.start").count() == 1


def test_booking_gets_its_gpus_by_preempting_lent_work(engine_redis_url, run_round, t0: datetime) -> None:
    """A preemptible job borrows booked GPUs and is reclaimed (signal, grace, requeue) before the start."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    booking_start = later(t0, 3600)
    booking = booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=4,
        start_at=booking_start,
        end_at=later(booking_start, 3600),
        cluster=cluster,
        now=t0,
    )
    # Checkpointable work may borrow booked GPUs for its minimum runtime (the engine's berth policy).
    lent = submit(
        user,
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

    # Its runtime prediction as stored at submission (the submission task's, written here).
    Job.objects.filter(pk=lent.pk).update(predicted_p50_s=3 * 3600.0, predicted_p90_s=4 * 3600.0)

    run_round(cluster, t0)

    lent.refresh_from_db()
    assert lent.status == Job.Status.RUNNING
    allocations = list(lent.allocations.all())
    assert all(a.is_preemptible for a in allocations)
    # The lent allocation ends where the booking begins: the database never double-books.
    assert {a.period.upper for a in allocations} == {booking_start}

    # Rounds now and then, then every 15 s near the start: a grace signal first, then the kill.
    for minutes in (10, 30, 50):
        run_round(cluster, later(t0, minutes * 60))
    at = later(booking_start, -120)
    while at < booking_start:
        at = later(at, 15)
        run_round(cluster, at)
    lent.refresh_from_db()
    booking.refresh_from_db()
    preemption = Preemption.objects.get(job=lent)
    assert preemption.for_booking_id == booking.pk
    assert preemption.signalled_at < preemption.kill_at <= booking_start
    assert preemption.killed_at == preemption.kill_at
    # Work since the last checkpoint (every 700 s, and at the grace signal) is lost, on 4 GPUs.
    run_s = (preemption.killed_at - t0).total_seconds()
    grace_s = (preemption.killed_at - preemption.signalled_at).total_seconds()
    assert preemption.lost_gpu_s == pytest.approx(4 * min(run_s % 700, grace_s))
    assert preemption.lost_gpu_s > 0
    assert lent.status == Job.Status.PENDING
    assert lent.attempt == 1
    assert lent.first_submitted_at == t0
    assert {a.state for a in lent.allocations.all()} == {Allocation.State.ENDED}
    assert booking.status == Booking.Status.ACTIVE
    assert not sim_backend(cluster, at=at).running_on()
    assert AuditEvent.objects.filter(entity_type="job", entity_id=lent.pk, verb="job.requeue").exists()
    # It is predicted to need only what its checkpoint did not save (the replay does the same).
    saved_s = run_s - preemption.lost_gpu_s / 4
    assert saved_s > 3000
    assert lent.predicted_p50_s == pytest.approx(3 * 3600 - saved_s)
    assert lent.predicted_p90_s == pytest.approx(4 * 3600 - saved_s)

    # The booking ends; the requeued job gets the GPUs back and resumes from its checkpoint.
    booking_end = later(booking_start, 3600)
    run_round(cluster, later(booking_end, 1))
    booking.refresh_from_db()
    lent.refresh_from_db()
    assert booking.status == Booking.Status.COMPLETED
    assert {a.state for a in booking.allocations.all()} == {Allocation.State.ENDED}
    assert lent.status == Job.Status.RUNNING
    assert lent.attempt == 1
    record = sim_backend(cluster, at=booking_end).records()[str(lent.pk)]
    assert record["work_left_s"] == pytest.approx(3 * 3600 - (preemption.signalled_at - t0).total_seconds())


def test_overlap_at_persist_rolls_back_only_that_start(
    engine_redis_url, run_round, t0: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A booking committed between the snapshot and the persist: the exclusion constraint wins."""
    from scheduling import rounds

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=4, runtime_s=600, now=t0)
    real_plan_round = rounds.plan_round

    def plan_then_book(snapshot, policy, now):
        plan = real_plan_round(snapshot, policy, now)
        booking_create(
            user,
            project=project,
            gpu_type=GpuType.objects.get(name="A100"),
            gpu_count=4,
            start_at=later(t0, -60),
            end_at=later(t0, 3600),
            cluster=cluster,
            now=t0,
        )
        return plan

    monkeypatch.setattr(rounds, "plan_round", plan_then_book)
    result = run_round(cluster, t0)

    job.refresh_from_db()
    assert result.status == "ok"
    assert result.start_conflicts == 1
    assert result.started == 0
    assert job.status == Job.Status.PENDING
    assert job.pending_reason == Job.PendingReason.RESOURCES
    assert job.pending_sentence
    assert not job.allocations.exists()
    assert not sim_backend(cluster, at=t0).running_on()


def test_cancelled_job_is_stopped_on_the_backend(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=3600, now=t0)
    run_round(cluster, t0)
    job_cancel(job, user=user, now=later(t0, 60))  # the service frees the GPUs in the database only

    result = run_round(cluster, later(t0, 75))

    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert not sim_backend(cluster, at=later(t0, 75)).running_on()
    round_row = EngineRound.objects.get(pk=result.round_id)
    assert round_row.decisions["apply"]["cancelled"] == [str(job.pk)]


def test_work_the_backend_runs_unknown_to_the_database_is_adopted(
    engine_redis_url, run_round, t0: datetime
) -> None:
    """A start the database rolled back although the backend did it (e.g. a timeout) is adopted."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=3600, now=t0)
    gpus = tuple(Gpu.objects.filter(node__cluster=cluster).order_by("id").values_list("id", flat=True)[:2])
    sim_backend(cluster, at=t0).apply(
        Plan(starts=(StartAction(str(job.pk), gpus, ("n0",), False, 0.0),)),
        payloads={str(job.pk): {"sim_runtime_s": 3600}},
    )

    run_round(cluster, later(t0, 30))

    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert job.started_at == t0
    assert tuple(sorted(job.allocations.values_list("gpu_id", flat=True))) == gpus
    assert sim_backend(cluster, at=later(t0, 30)).running_on() == {g: str(job.pk) for g in gpus}


def test_running_allocations_are_extended_when_a_job_outlives_its_estimate(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=1000, requested_s=600, now=t0)
    run_round(cluster, t0)
    (allocation,) = job.allocations.all()
    assert allocation.period.upper == later(t0, 600)

    run_round(cluster, later(t0, 590))

    allocation.refresh_from_db()
    assert allocation.period.upper > later(t0, 1000)  # still blocks bookings while it really runs
    run_round(cluster, later(t0, 1010))
    allocation.refresh_from_db()
    assert allocation.state == Allocation.State.ENDED
    assert allocation.period.upper == later(t0, 1000)


def test_booking_blocked_by_non_preemptible_work_tells_its_owner(
    engine_redis_url, run_round, t0: datetime
) -> None:
    """Invariant 2: a booking gets its GPUs at its start or its owner is told why."""
    cluster = make_cluster(nodes=1, gpus_per_node=2)
    user, project = make_member()
    # Asks for 10 minutes, really runs 2 hours, and may not be preempted.
    stubborn = submit(
        user, project, cluster, gpus=2, runtime_s=7200, requested_s=600, now=t0, name="stubborn"
    )
    run_round(cluster, t0)
    stubborn.refresh_from_db()
    assert stubborn.status == Job.Status.RUNNING
    booking = booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=2,
        start_at=later(t0, 1800),
        end_at=later(t0, 9000),
        cluster=cluster,
        now=later(t0, 700),  # the job's allocation lapsed at t0 + 600: the GPUs look free
    )

    run_round(cluster, later(t0, 1800))

    booking.refresh_from_db()
    assert booking.status_message.startswith("Engine: ")
    assert str(stubborn.pk) in booking.status_message
    assert not Preemption.objects.filter(job=stubborn).exists()  # never preempts non-preemptible work
    run_round(cluster, later(t0, 7300))  # the job ended at t0 + 7200; the booking has its GPUs now
    booking.refresh_from_db()
    assert booking.status_message == ""
