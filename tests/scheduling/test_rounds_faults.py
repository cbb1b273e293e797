"""Fault tests of the round service: apply failures after commit, an unreachable backend, racing rounds.

The backend is the live simulator with its fault switches (``refuse_starts``, ``fail_apply``,
``is_unreachable``, ``block_in``); a real dead slurmctld is tested in ``test_rounds_slurm.py``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

from scheduling.models import Allocation, AuditEvent, Booking, Cluster, EngineRound, Gpu, GpuType, Job
from scheduling.rounds import RoundResult, engine_round_run
from scheduling.services import booking_create, job_submit
from tests.integration import loop
from tests.integration.loop import (
    later,
    make_cluster,
    make_member,
    set_cluster_settings,
    sim_backend,
    submit,
)

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0


@pytest.mark.django_db
@pytest.mark.parametrize("fault", ["refuse_starts", "fail_apply"])
def test_apply_failure_after_commit_rolls_the_start_back(
    engine_redis_url, run_round, t0: datetime, fault: str
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4, settings={fault: True})
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0)

    result = run_round(cluster, t0)

    job.refresh_from_db()
    cluster.refresh_from_db()
    # Never half-started: pending again with the backend's reason, its allocations released.
    assert job.status == Job.Status.PENDING
    assert job.pending_reason == Job.PendingReason.BACKEND
    assert "refused" in job.pending_sentence
    assert job.allocations.count() == 2
    assert set(job.allocations.values_list("state", flat=True)) == {Allocation.State.RELEASED}
    assert result.failed_starts == 1
    assert result.started == 0
    assert not sim_backend(cluster, at=t0).running_on()
    assert AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.start_rollback").exists()
    if fault == "fail_apply":  # the whole apply raised: recorded on the round and the cluster
        assert result.status == "apply_failed"
        assert cluster.is_degraded
        assert "apply failed" in EngineRound.objects.get(pk=result.round_id).error
    else:
        assert result.status == "ok"
        failed = EngineRound.objects.get(pk=result.round_id).decisions["apply"]["failed"]
        assert failed[0]["target"] == str(job.pk)

    # The backend works again: the next round starts the job, on fresh allocations.
    set_cluster_settings(cluster, **{fault: False})
    again = run_round(cluster, later(t0, 15))

    job.refresh_from_db()
    cluster.refresh_from_db()
    assert again.status == "ok"
    assert again.started == 1
    assert job.status == Job.Status.RUNNING
    assert job.allocations.filter(state=Allocation.State.ACTIVE).count() == 2
    assert not cluster.is_degraded


@pytest.mark.django_db
def test_unreachable_backend_degrades_and_the_next_good_round_reconciles(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    running = submit(user, project, cluster, gpus=2, runtime_s=300, now=t0, name="runs")
    run_round(cluster, t0)
    running.refresh_from_db()
    assert running.status == Job.Status.RUNNING

    set_cluster_settings(cluster, is_unreachable=True)
    down = run_round(cluster, later(t0, 60))

    cluster.refresh_from_db()
    running.refresh_from_db()
    assert down.status == "backend_error"
    assert cluster.is_degraded
    assert "unreachable" in cluster.status_message
    assert "unreachable" in EngineRound.objects.get(pk=down.round_id).error
    assert running.status == Job.Status.RUNNING  # nothing is concluded from a backend we cannot read
    # Bookings and submissions keep working while the cluster is degraded.
    booking = booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=2,
        start_at=later(t0, 7200),
        end_at=later(t0, 10800),
        cluster=cluster,
        now=later(t0, 61),
    )
    queued = submit(user, project, cluster, gpus=1, runtime_s=100, now=later(t0, 62), name="queued")
    assert booking.status == Booking.Status.CONFIRMED
    assert queued.status == Job.Status.PENDING

    # The job finished during the outage (at t0 + 300); the next good round sees it and clears the flag.
    set_cluster_settings(cluster, is_unreachable=False)
    back = run_round(cluster, later(t0, 400))

    cluster.refresh_from_db()
    running.refresh_from_db()
    queued.refresh_from_db()
    assert back.status == "ok"
    assert not cluster.is_degraded
    assert cluster.status_message == ""
    assert running.status == Job.Status.COMPLETED
    assert running.ended_at == later(t0, 300)
    assert queued.status == Job.Status.RUNNING
    verbs = list(AuditEvent.objects.filter(entity_type="cluster").values_list("verb", flat=True))
    assert sorted(verbs) == ["cluster.degraded", "cluster.recovered"]


@pytest.mark.django_db
def test_backend_losing_a_running_job_requeues_it(engine_redis_url, run_round, t0: datetime) -> None:
    """The database believes it runs, the backend does not know it: lost, requeued, never dropped."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=3600, now=t0)
    run_round(cluster, t0)
    sim = sim_backend(cluster, at=t0)
    sim._redis.hdel(sim._jobs_key, str(job.pk))  # the cluster forgets it (e.g. a node rebooted)

    result = run_round(cluster, later(t0, 120))

    job.refresh_from_db()
    assert result.lost == 1
    # Requeued and, the GPUs being free, started again in the same round as attempt 1.
    assert job.attempt == 1
    assert job.first_submitted_at == t0
    ended = job.allocations.filter(state=Allocation.State.ENDED)
    assert {(a.period.lower, a.period.upper) for a in ended} == {(t0, later(t0, 120))}
    assert job.status == Job.Status.RUNNING
    assert job.allocations.filter(state=Allocation.State.ACTIVE).count() == 2
    assert AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.lost").exists()


def _run_in_thread(cluster_id: int, out: list[tuple[RoundResult, float]]) -> None:
    started = time.monotonic()
    try:
        out.append((engine_round_run(cluster_id=cluster_id), time.monotonic() - started))
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_racing_rounds_on_one_cluster_run_one_at_a_time(engine_redis_url, tmp_path: Path) -> None:
    marker = tmp_path / "blocked"
    cluster: Cluster = make_cluster(
        nodes=1,
        gpus_per_node=4,
        settings={"block_in": "snapshot", "block_s": 3.0, "block_marker": str(marker)},
    )
    user, project = make_member()
    job = job_submit(
        user, project=project, cluster=cluster, name="j", gpu_count=2, payload={"sim_runtime_s": 60}
    )

    first: list[tuple[RoundResult, float]] = []
    second: list[tuple[RoundResult, float]] = []
    slow = threading.Thread(target=_run_in_thread, args=(cluster.pk, first))
    slow.start()
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:  # the first round holds the lock now
        time.sleep(0.05)
    assert marker.exists()
    fast = threading.Thread(target=_run_in_thread, args=(cluster.pk, second))
    fast.start()
    fast.join(timeout=10)
    slow.join(timeout=30)

    (locked, waited_s), (ran, _) = second[0], first[0]
    assert locked.status == "locked"
    assert waited_s < 1.0
    assert ran.status == "ok"
    assert ran.started == 1
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert job.allocations.count() == 2
    assert EngineRound.objects.filter(cluster=cluster).count() == 1
    # The lock is free again afterwards.
    assert engine_round_run(cluster_id=cluster.pk).status == "ok"


@pytest.mark.django_db
def test_engine_crash_is_recorded_on_the_round_and_changes_nothing(
    engine_redis_url, run_round, t0: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling import rounds

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=60, now=t0)

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("bug in the engine")

    monkeypatch.setattr(rounds, "plan_round", broken)
    result = run_round(cluster, t0)

    job.refresh_from_db()
    assert result.status == "engine_error"
    assert "ZeroDivisionError" in EngineRound.objects.get(pk=result.round_id).error
    assert job.status == Job.Status.PENDING
    assert not job.allocations.exists()


@pytest.mark.django_db
def test_allocations_follow_the_gpus_the_backend_really_gave(
    engine_redis_url, run_round, t0: datetime
) -> None:
    """Slurm chooses GPU indices on a node itself: the database follows what really runs."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=2, runtime_s=3600, now=t0)
    run_round(cluster, t0)
    planned = set(job.allocations.values_list("gpu_id", flat=True))
    others = sorted(set(Gpu.objects.filter(node__cluster=cluster).values_list("id", flat=True)) - planned)
    sim = sim_backend(cluster, at=t0)
    record = sim.records()[str(job.pk)]
    record["gpu_ids"] = others
    sim._save(str(job.pk), record)

    run_round(cluster, later(t0, 30))

    active = job.allocations.filter(state=Allocation.State.ACTIVE)
    assert sorted(active.values_list("gpu_id", flat=True)) == others
    assert {a.period.lower for a in active} == {t0}
    assert (
        set(job.allocations.filter(state=Allocation.State.RELEASED).values_list("gpu_id", flat=True))
        == planned
    )


def _book_in_thread(user_id: int, project_id: int, cluster_id: int, errors: list[BaseException]) -> None:
    from django.contrib.auth.models import User
    from django.utils import timezone

    from portal.accounts.models import Project
    from scheduling.services import BookingConflictError

    try:
        user, project = User.objects.get(pk=user_id), Project.objects.get(pk=project_id)
        cluster, a100 = Cluster.objects.get(pk=cluster_id), GpuType.objects.get(name="A100")
        for _ in range(12):
            time.sleep(0.1)
            now = timezone.now()
            with contextlib.suppress(BookingConflictError):
                booking_create(
                    user,
                    project=project,
                    gpu_type=a100,
                    gpu_count=1,
                    start_at=now,
                    end_at=later(now, 3600),
                    cluster=cluster,
                    now=now,
                )
    except BaseException as exc:  # reported to the test thread
        errors.append(exc)
    finally:
        connection.close()


def _rounds_in_thread(cluster_id: int, results: list[RoundResult], errors: list[BaseException]) -> None:
    try:
        for _ in range(10):
            results.append(engine_round_run(cluster_id=cluster_id))
            time.sleep(0.1)
    except BaseException as exc:
        errors.append(exc)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_rounds_racing_bookings_never_double_allocate(engine_redis_url) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user, project = make_member()
    # Jobs that end within a second, so GPUs keep coming free while bookings and rounds compete.
    jobs = [
        job_submit(
            user, project=project, cluster=cluster, name=f"j{i}", gpu_count=2, payload={"sim_runtime_s": 0.5}
        )
        for i in range(10)
    ]
    errors: list[BaseException] = []
    results: list[RoundResult] = []
    threads = [
        threading.Thread(target=_rounds_in_thread, args=(cluster.pk, results, errors)),
        threading.Thread(target=_book_in_thread, args=(user.pk, project.pk, cluster.pk, errors)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    assert {r.status for r in results} <= {"ok", "locked"}
    with connection.cursor() as cursor:  # no GPU is held twice at any instant, whoever wrote it
        cursor.execute(
            """SELECT count(*) FROM scheduling_allocation a JOIN scheduling_allocation b
               ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
               WHERE a.state <> 'released' AND b.state <> 'released'"""
        )
        assert cursor.fetchone()[0] == 0
    # One more round after the race, and the backend read at that round's instant (these jobs end
    # within a second, so "now" a moment later would already differ from what the round saw).
    from django.utils import timezone

    settled_at = timezone.now()
    assert engine_round_run(cluster_id=cluster.pk, now=settled_at).status == "ok"
    running = sim_backend(cluster, at=settled_at).running_on()
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        active = sorted(
            job.allocations.filter(state=Allocation.State.ACTIVE).values_list("gpu_id", flat=True)
        )
        # The database and the backend agree on every job: running on the same GPUs, or not at all.
        assert active == sorted(g for g, j in running.items() if j == str(job.pk))
        assert job.status in (Job.Status.RUNNING, Job.Status.PENDING, Job.Status.COMPLETED)
