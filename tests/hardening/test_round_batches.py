"""Reconcile writes preempted, finished and lost jobs set-wise (issue 13, bench.round): the same
rows and audit events as one job at a time, in a number of queries that does not grow per job.

Real PostgreSQL and the live simulator on a real Redis (tests.integration.loop).
"""

from __future__ import annotations

from datetime import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.engine.types import Plan, PreemptAction
from scheduling.models import Allocation, AuditEvent, Cluster, Job, Preemption
from scheduling.rounds.common import RoundResult
from scheduling.snapshots import epoch
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, sim_backend, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = pytest.mark.django_db


def _started(cluster: Cluster, count: int, *, at: datetime, run_round, **kwargs) -> list[Job]:
    user, project = make_member()
    jobs = [
        submit(user, project, cluster, gpus=1, runtime_s=7_200, now=at, is_preemptible=True, **kwargs)
        for _ in range(count)
    ]
    assert run_round(cluster, at).started == count
    return jobs


def _preempt_on_the_cluster(cluster: Cluster, jobs: list[Job], *, at: datetime) -> None:
    """The backend preempts the jobs itself (no Preemption row exists in the database yet)."""
    plan = Plan(
        preemptions=tuple(
            PreemptAction(job_id=str(j.pk), signal_at=epoch(at), kill_at=epoch(at), reason="test")
            for j in jobs
        )
    )
    results = sim_backend(cluster, at=at).apply(plan)
    assert all(r.is_ok for r in results), results


def _requeue_round(
    cluster: Cluster, count: int, *, t0: datetime, run_round
) -> tuple[list[Job], RoundResult, int]:
    jobs = _started(cluster, count, at=t0, run_round=run_round)
    _preempt_on_the_cluster(cluster, jobs, at=later(t0, 600))
    with CaptureQueriesContext(connection) as queries:
        result = run_round(cluster, later(t0, 615))
    return jobs, result, len(queries.captured_queries)


def test_jobs_the_cluster_preempted_are_requeued_with_their_work_lost_recorded(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    jobs, result, _ = _requeue_round(cluster, 6, t0=t0, run_round=run_round)
    assert result.requeued == 6
    killed_at = later(t0, 600)
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert job.attempt == 1
        assert job.first_submitted_at == t0
        requeue = AuditEvent.objects.get(entity_type="job", entity_id=job.pk, verb="job.requeue")
        assert requeue.before["status"] == Job.Status.RUNNING
        assert requeue.after == {**requeue.before, "status": "pending", "started_at": None, "attempt": 1}
        # the first run's allocations ended at the kill, none left blocking the GPUs
        first_run = list(job.allocations.filter(period__startswith=t0))
        assert first_run
        assert {a.state for a in first_run} == {Allocation.State.ENDED}
        assert {a.period.upper for a in first_run} == {killed_at}
        preemption = Preemption.objects.get(job=job)
        assert preemption.reason == "Preempted by the cluster itself."
        assert preemption.killed_at == killed_at
        assert preemption.lost_gpu_s == pytest.approx(600.0)  # not checkpointing: all 600 s on 1 GPU
        assert AuditEvent.objects.filter(
            entity_type="preemption", entity_id=preemption.pk, verb="preemption.kill"
        ).exists()
        assert AuditEvent.objects.filter(
            entity_type="allocation", entity_id__in=[a.pk for a in first_run], verb="allocation.end"
        ).count() == len(first_run)
    # The requeued jobs are planned again in that same round (their GPUs are free).
    assert result.started == 6
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)) == {
        "running"
    }


def test_requeueing_many_jobs_costs_no_query_per_job(engine_redis_url, run_round, t0: datetime) -> None:
    few = make_cluster(nodes=1, gpus_per_node=8)
    _, small, small_queries = _requeue_round(few, 2, t0=t0, run_round=run_round)
    many = make_cluster(nodes=1, gpus_per_node=8)
    _, large, large_queries = _requeue_round(many, 8, t0=t0, run_round=run_round)
    assert (small.requeued, large.requeued) == (2, 8)
    # Six more requeues (and six more restarts) in the same handful of statements.
    assert large_queries - small_queries <= 3, (small_queries, large_queries)


def test_finished_and_lost_jobs_in_one_round(engine_redis_url, run_round, t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=8)
    user, project = make_member()
    short = [submit(user, project, cluster, gpus=1, runtime_s=300, now=t0) for _ in range(3)]
    gone = [submit(user, project, cluster, gpus=1, runtime_s=7_200, now=t0) for _ in range(2)]
    assert run_round(cluster, t0).started == 5
    backend = sim_backend(cluster, at=t0)
    for job in gone:  # the cluster forgets them
        backend._redis.hdel(backend._jobs_key, str(job.pk))
    result = run_round(cluster, later(t0, 900))
    assert (result.finished, result.lost) == (3, 2)
    for job in Job.objects.filter(pk__in=[j.pk for j in short]):
        assert job.status == Job.Status.COMPLETED
        assert job.exit_code == 0
        assert job.ended_at is not None
        assert job.ended_at <= later(t0, 900)
        assert {a.state for a in job.allocations.all()} == {Allocation.State.ENDED}
        assert {a.period.upper for a in job.allocations.all()} == {job.ended_at}
        assert AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.completed").exists()
    for job in Job.objects.filter(pk__in=[j.pk for j in gone]):
        assert job.attempt == 1
        lost = AuditEvent.objects.get(entity_type="job", entity_id=job.pk, verb="job.lost")
        assert lost.after["status"] == Job.Status.PENDING
        assert lost.after["attempt"] == 1
        # requeued, then started again by the same round on the GPUs it freed
        assert job.status == Job.Status.RUNNING


@pytest.mark.django_db
def test_node_states_follow_the_backend_and_only_changed_nodes_are_written():
    """`reconcile._sync_nodes`: the cluster's node states read as values, only the nodes whose
    state the backend reports differently are saved (a node of another cluster with the same
    name is left alone)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduling.backends.base import ObservedCluster
    from scheduling.engine.types import Node as EngineNode
    from scheduling.engine.types import NodeStatus
    from scheduling.models import Node
    from scheduling.rounds.reconcile import _sync_nodes
    from tests.factories import ClusterFactory, NodeFactory

    cluster, other = ClusterFactory(name="here"), ClusterFactory(name="there")
    nodes = [NodeFactory(cluster=cluster, name=f"n{i}", gpu_count=1) for i in range(4)]
    twin = NodeFactory(cluster=other, name="n1", gpu_count=1)
    observed = ObservedCluster(
        at=0.0,
        nodes=(
            EngineNode(id="n0", gpu_type="A100", gpu_ids=(), status=NodeStatus.UP),
            EngineNode(id="n1", gpu_type="A100", gpu_ids=(), status=NodeStatus.DRAINING),
            EngineNode(id="n2", gpu_type="A100", gpu_ids=(), status=NodeStatus.DOWN),
        ),
        jobs=(),
    )
    with CaptureQueriesContext(connection) as captured:
        _sync_nodes(cluster, observed)
    states = dict(Node.objects.filter(cluster=cluster).values_list("name", "status"))
    assert states == {"n0": "up", "n1": "draining", "n2": "down", "n3": "up"}  # n3 unreported: kept
    assert Node.objects.get(pk=twin.pk).status == "up"
    assert sum("UPDATE" in q["sql"] for q in captured.captured_queries) == 2
    with CaptureQueriesContext(connection) as again:
        _sync_nodes(cluster, observed)
    assert len(again.captured_queries) == 1  # nothing changed: one read, no write
    assert nodes[0].status == "up"


def test_requeued_jobs_keep_their_prediction_less_what_their_checkpoint_saved(
    engine_redis_url, run_round, t0: datetime
) -> None:
    """A preempted job keeps the runtime prediction stored at its submission; a checkpointing one
    is predicted to need only the work its checkpoint did not save (`inputs.resumed_prediction`),
    set-wise for many jobs in the one requeue statement."""
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    restartable = [
        submit(user, project, cluster, gpus=1, runtime_s=7_200, now=t0, is_preemptible=True) for _ in range(2)
    ]
    checkpointing = [
        submit(
            user,
            project,
            cluster,
            gpus=1,
            runtime_s=7_200,
            now=t0,
            is_preemptible=True,
            is_checkpointable=True,
            checkpoint_interval_s=250,
        )
        for _ in range(2)
    ]
    jobs = restartable + checkpointing
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(predicted_p50_s=5_000.0, predicted_p90_s=9_000.0)
    assert run_round(cluster, t0).started == 4
    _preempt_on_the_cluster(cluster, jobs, at=later(t0, 600))
    # a job without a stored prediction keeps none (the next round asks the predictor)
    Job.objects.filter(pk=restartable[1].pk).update(predicted_p50_s=None, predicted_p90_s=None)

    assert run_round(cluster, later(t0, 615)).requeued == 4

    by_pk = Job.objects.in_bulk([j.pk for j in jobs])
    assert (by_pk[restartable[0].pk].predicted_p50_s, by_pk[restartable[0].pk].predicted_p90_s) == (
        5_000.0,
        9_000.0,
    )
    assert by_pk[restartable[1].pk].predicted_p50_s is None
    for job in checkpointing:
        # a 600 s run killed at its signal, where it checkpoints: nothing lost, 600 s saved
        assert Preemption.objects.get(job=job).lost_gpu_s == pytest.approx(0.0)
        assert by_pk[job.pk].predicted_p50_s == pytest.approx(4_400.0)
        assert by_pk[job.pk].predicted_p90_s == pytest.approx(8_400.0)
