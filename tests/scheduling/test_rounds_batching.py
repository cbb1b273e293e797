"""The round's batched writes (issue 13, bench.round): same outcome as one write per row, fewer queries.

Real PostgreSQL and the live simulator on a real Redis (tests.integration.loop).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.test.utils import CaptureQueriesContext

from scheduling import rounds
from scheduling.engine.startability import enforces_guarantees, unstartable_jobs
from scheduling.models import Allocation, AuditEvent, Job
from scheduling.snapshots import cluster_snapshot_build, policy_config_for_cluster
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = pytest.mark.django_db


def test_many_starts_in_one_round_are_written_in_a_bounded_number_of_queries(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=4, gpus_per_node=4)
    user, project = make_member()
    jobs = [submit(user, project, cluster, gpus=1, runtime_s=3_600, now=t0) for _ in range(12)]
    with CaptureQueriesContext(connection) as few:
        result = run_round(cluster, t0)
    assert result.started == 12
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert job.status == Job.Status.RUNNING
        assert job.allocations.filter(state=Allocation.State.ACTIVE).count() == 1
        verbs = set(
            AuditEvent.objects.filter(entity_type="job", entity_id=job.pk).values_list("verb", flat=True)
        )
        assert {"job.start", "job.run"} <= verbs
    assert AuditEvent.objects.filter(verb="allocation.create").count() == 12
    assert set(result.phases_ms) == {
        "backend_snapshot",
        "reconcile",
        "snapshot_build",
        "plan",
        "persist",
        "apply",
    }
    # Twelve starts cost about as many queries as a handful would: no query per start.
    assert len(few.captured_queries) < 80, len(few.captured_queries)


def test_a_conflicting_start_is_undone_alone(engine_redis_url, run_round, t0: datetime, monkeypatch) -> None:
    """One planned GPU is taken between the plan and the insert: the batch falls back to one
    savepoint per start and only that start is left pending."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    first, second = (submit(user, project, cluster, gpus=2, runtime_s=3_600, now=t0) for _ in range(2))
    real_plan = rounds.plan_round

    def plan_then_take(snapshot, policy, now):
        plan = real_plan(snapshot, policy, now)
        taken = next(s for s in plan.starts if s.job_id == str(second.pk)).gpu_ids[0]
        Allocation.objects.create(
            gpu_id=taken,
            booking=loop_booking(cluster, user, project, t0),
            period=DateTimeTZRange(t0, t0 + timedelta(hours=2), "[)"),
            state=Allocation.State.PLANNED,
        )
        return plan

    monkeypatch.setattr(rounds, "plan_round", plan_then_take)
    result = run_round(cluster, t0)
    assert result.started == 1
    assert result.start_conflicts == 1
    assert Job.objects.get(pk=first.pk).status == Job.Status.RUNNING
    second.refresh_from_db()
    assert second.status == Job.Status.PENDING
    assert "taken" in second.pending_sentence
    assert not second.allocations.exists()


def loop_booking(cluster, user, project, at):
    from scheduling.models import Booking

    return Booking.objects.create(
        user=user,
        project=project,
        cluster=cluster,
        gpu_type=cluster.nodes.first().gpu_type,
        gpu_count=1,
        start_at=at,
        end_at=at + timedelta(hours=2),
    )


def test_pending_etas_are_kept_while_they_barely_move(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    submit(user, project, cluster, gpus=4, runtime_s=7_200, now=t0)
    waiting = submit(user, project, cluster, gpus=4, runtime_s=600, now=t0)
    run_round(cluster, t0)
    waiting.refresh_from_db()
    assert waiting.status == Job.Status.PENDING
    stored = waiting.eta_p50_at
    assert stored is not None
    # 15 s later the engine's ETA is within the slack: the row is not rewritten.
    run_round(cluster, later(t0, 15))
    waiting.refresh_from_db()
    assert waiting.eta_p50_at == stored
    # A far move is written: the ETA the stored value is compared with is the engine's.
    assert not rounds._eta_close(stored + timedelta(hours=1), stored, now=t0)
    assert rounds._eta_close(stored + timedelta(seconds=30), stored, now=t0)
    assert not rounds._eta_close(None, stored, now=t0)


def test_startability_by_shape_matches_asking_per_job(t0: datetime) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user, project = make_member()
    for gpus in (1, 2, 4, 8, 8, 1, 2):
        submit(user, project, cluster, gpus=gpus, runtime_s=600, now=t0)
    cluster.nodes.filter(name="n1").update(status="down")  # 4 usable GPUs left
    policy = policy_config_for_cluster(cluster=cluster)
    snapshot = cluster_snapshot_build(cluster=cluster, now=t0, policy=policy)
    enforced = enforces_guarantees(policy.name)
    per_job = unstartable_jobs(snapshot, snapshot.pending, is_guarantee_enforced=enforced)
    by_shape = rounds._unstartable_by_shape(snapshot, snapshot.pending, is_guarantee_enforced=enforced)
    assert by_shape == per_job
    assert len(per_job) == 2  # the two 8-GPU jobs, with 4 GPUs up
