"""Capacity planning on real PostgreSQL: forecast crossings (real Prophet fits) and what-if
replays of the lab's own jobs in the simulator (the real engine)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from forecasting.capacity import (
    capacity_exceed_when,
    peak_concurrent_gpus,
    wait_replay,
    wait_trace_get,
)
from scheduling.models import Cluster, GpuType, Job, Node
from tests.factories import ClusterFactory, MembershipFactory, NodeFactory

pytestmark = pytest.mark.django_db

ISSUED = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)


def _hourly_jobs(cluster: Cluster, gpu_type: GpuType, *, days: int, gpus: object) -> None:
    """One job per hour over ``days`` days before ``ISSUED``, each running that hour."""
    user = MembershipFactory().user
    project = user.memberships.get().project
    start = ISSUED - timedelta(days=days)
    Job.objects.bulk_create(
        Job(
            cluster=cluster,
            user=user,
            project=project,
            gpu_type=gpu_type,
            name="grow",
            gpu_count=gpus(h),  # type: ignore[operator]
            status=Job.Status.COMPLETED,
            submitted_at=start + timedelta(hours=h),
            started_at=start + timedelta(hours=h),
            ended_at=start + timedelta(hours=h + 1),
        )
        for h in range(24 * days)
    )


def test_capacity_exceed_when_finds_the_crossing_of_growing_demand(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    # Demand steps from 1 to 6 GPUs over three weeks (about +0.29 GPUs a day); 8 GPUs exist.
    _hourly_jobs(cluster, a100, days=21, gpus=lambda h: 1 + h // 84)

    found = capacity_exceed_when(cluster_id=cluster.pk, horizon_days=21, at=ISSUED + timedelta(minutes=5))

    crossing = found["A100"]
    assert crossing.capacity_gpus == 8
    assert crossing.issued_at == ISSUED
    assert crossing.yhat_exceeds_at is not None
    assert crossing.upper80_exceeds_at is not None
    # The trend reaches 8 GPUs some days out, never right away; the upper bound gets there first.
    assert ISSUED + timedelta(days=2) <= crossing.yhat_exceeds_at <= ISSUED + timedelta(days=18)
    assert crossing.upper80_exceeds_at <= crossing.yhat_exceeds_at
    assert crossing.peak_yhat > 8
    assert crossing.as_dict()["yhat_exceeds_at"].startswith(str(crossing.yhat_exceeds_at.date()))

    # Within one day nothing crosses yet.
    soon = capacity_exceed_when(cluster_id=cluster.pk, horizon_days=1, at=ISSUED)["A100"]
    assert soon.yhat_exceeds_at is None
    assert soon.peak_yhat < 8


def test_capacity_exceed_when_flat_demand_never_crosses(a100: GpuType) -> None:
    flat = ClusterFactory(name="flat")
    NodeFactory(cluster=flat, gpu_type=a100, name="f0", gpu_count=8)
    NodeFactory(cluster=flat, gpu_type=a100, name="f1", gpu_count=8, status=Node.Status.DOWN)  # not capacity
    _hourly_jobs(flat, a100, days=14, gpus=lambda h: 2 + (h % 24 >= 12))

    crossing = capacity_exceed_when(cluster_id=flat.pk, horizon_days=14, at=ISSUED)["A100"]

    assert crossing.capacity_gpus == 8
    assert crossing.yhat_exceeds_at is None
    assert crossing.upper80_exceeds_at is None
    assert 1.5 < crossing.peak_yhat < 5


def _bursts(cluster: Cluster, gpu_type: GpuType, *, bursts: int = 6) -> None:
    """Every two hours a burst of 12 jobs (1-2 GPUs, 1-1.5 h) arrives within 12 minutes."""
    users = [MembershipFactory().user for _ in range(3)]
    start = ISSUED - timedelta(days=1)
    rows = []
    for b in range(bursts):
        for i in range(12):
            user = users[i % 3]
            submitted = start + timedelta(hours=2 * b, minutes=i)
            runtime = timedelta(seconds=3600 + 600 * (i % 4))
            rows.append(
                Job(
                    cluster=cluster,
                    user=user,
                    project=user.memberships.get().project,
                    gpu_type=gpu_type,
                    name=f"burst-{i % 4}",
                    gpu_count=2 if i % 3 == 0 else 1,
                    status=Job.Status.COMPLETED,
                    submitted_at=submitted,
                    started_at=submitted + timedelta(minutes=30),  # what happened does not matter
                    ended_at=submitted + timedelta(minutes=30) + runtime,
                )
            )
    Job.objects.bulk_create(rows)


def test_wait_trace_is_the_types_finished_jobs_from_their_arrival(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    _bursts(cluster, a100, bursts=2)
    other = MembershipFactory().user
    Job.objects.create(
        cluster=cluster, user=other, project=other.memberships.get().project, name="open", gpu_count=1,
        gpu_type=a100, status=Job.Status.RUNNING, submitted_at=ISSUED - timedelta(hours=3),
        started_at=ISSUED - timedelta(hours=3),
    )  # fmt: skip

    trace = wait_trace_get(
        cluster_id=cluster.pk,
        gpu_type="A100",
        start_at=ISSUED - timedelta(days=2),
        end_at=ISSUED,
        max_jobs=100,
    )

    assert len(trace.jobs) == 24  # the running job has no runtime yet
    assert trace.jobs[0].submit_at == 0.0
    assert trace.jobs[-1].submit_at == 2 * 3600 + 11 * 60
    assert {j.runtime_s for j in trace.jobs} == {3600.0, 4200.0, 4800.0, 5400.0}
    assert peak_concurrent_gpus(trace) == 16


def test_wait_replay_is_monotone_in_gpus(cluster: Cluster, nodes: list[Node], a100: GpuType) -> None:
    _bursts(cluster, a100)
    trace = wait_trace_get(
        cluster_id=cluster.pk,
        gpu_type="A100",
        start_at=ISSUED - timedelta(days=2),
        end_at=ISSUED,
        max_jobs=500,
    )
    curve = [wait_replay(trace, gpu_type="A100", nodes=n, gpus_per_node=4).wait_p95_s for n in range(1, 6)]
    # More GPUs never make the p95 wait worse, and enough GPUs remove the wait.
    assert all(a >= b for a, b in itertools.pairwise(curve))
    assert curve[0] > curve[-1] == 0.0
