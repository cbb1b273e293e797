"""The live demo's load generator: off unless the demo turns it on, at the history's own rate,
through the ordinary services, bounded, and idempotent per tick (real PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from portal.accounts.models import Project
from scheduling import tasks
from scheduling.demo_load import HISTORY_SOURCE, LOAD_SOURCE, demo_load_tick
from scheduling.models import AuditEvent, Booking, Cluster, GpuType, Job, Node
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)  # a 14:00 hour


@pytest.fixture
def load_on(settings: Any) -> Any:
    settings.BERTH_DEMO_LOAD = True
    settings.BERTH_DEMO_LOAD_SCALE = 1.0
    settings.BERTH_DEMO_LOAD_MAX_PER_TICK = 50
    settings.BERTH_DEMO_LOAD_MAX_PENDING = 1000
    return settings


@pytest.fixture
def history(member: User, project: Project, cluster: Cluster, nodes: list[Node], a100: GpuType) -> list[Job]:
    """Ten days of history with 6 jobs in every 14:00 hour and none at other hours."""
    jobs = []
    for day in range(10):
        for k in range(6):
            at = NOW - timedelta(days=day + 1) + timedelta(minutes=5 * k)
            jobs.append(
                JobFactory(
                    user=member,
                    project=project,
                    cluster=cluster,
                    gpu_type=a100,
                    gpu_count=1 + k % 2,
                    requested_s=3600,
                    status=Job.Status.COMPLETED,
                    submitted_at=at,
                    first_submitted_at=at,
                    started_at=at,
                    ended_at=at + timedelta(minutes=20 + k),
                    payload={"source": HISTORY_SOURCE},
                )
            )
    return jobs


def _live() -> Any:
    return Job.objects.filter(payload__source=LOAD_SOURCE)


def test_off_by_default_submits_nothing(history: list[Job], cluster: Cluster) -> None:
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    assert not result.is_enabled
    assert not _live().exists()
    assert tasks.demo_load_dispatch() == []
    assert "demo-load" not in settings_module().CELERY_BEAT_SCHEDULE


def test_rate_follows_the_history_hour_by_hour(load_on: Any, history: list[Job], cluster: Cluster) -> None:
    # 60 jobs over 9 days of 14:00 hours: about 6.7 arrivals expected in an hour-long tick.
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    submitted = [j.first_submitted_at for j in history]
    days = (max(submitted) - min(submitted)).total_seconds() / 86_400
    assert result.expected == pytest.approx(60 / days)
    night = demo_load_tick(cluster_id=cluster.pk, now=NOW.replace(hour=3), tick_s=3600)
    assert night.expected == 0
    assert not night.jobs

    # Many ticks average out at the history's rate (Poisson draws, seeded per tick).
    total = len(result.jobs) + len(result.sessions)
    for hour in range(1, 30):
        tick = demo_load_tick(cluster_id=cluster.pk, now=NOW + timedelta(days=hour), tick_s=3600)
        total += len(tick.jobs) + len(tick.sessions)
    assert 0.6 * 30 * result.expected <= total <= 1.4 * 30 * result.expected


def test_submissions_go_through_job_submit_and_copy_the_history(
    load_on: Any, history: list[Job], cluster: Cluster
) -> None:
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    assert result.jobs
    shapes = {(j.user_id, j.project_id, j.gpu_type_id, j.gpu_count) for j in history}
    for job in Job.objects.filter(pk__in=result.jobs):
        assert job.status == Job.Status.PENDING
        assert (job.user_id, job.project_id, job.gpu_type_id, job.gpu_count) in shapes
        assert job.payload["command"]
        assert 20 * 60 <= job.payload["sim_runtime_s"] <= 26 * 60
        assert job.submitted_at == NOW
        # The service wrote the audit event, as for any submit.
        assert AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.submit").exists()


def test_a_repeated_tick_submits_nothing_new(load_on: Any, history: list[Job], cluster: Cluster) -> None:
    first = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    count = _live().count()
    bookings = Booking.objects.count()
    again = demo_load_tick(cluster_id=cluster.pk, now=NOW + timedelta(seconds=30), tick_s=3600)
    assert first.jobs
    assert again.jobs == []
    assert _live().count() == count
    assert Booking.objects.count() == bookings


def test_bounded_per_tick_and_by_the_queue(load_on: Any, history: list[Job], cluster: Cluster) -> None:
    load_on.BERTH_DEMO_LOAD_SCALE = 20.0
    load_on.BERTH_DEMO_LOAD_MAX_PER_TICK = 3
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    assert result.expected > 100
    assert len(result.jobs) + len(result.sessions) == 3

    load_on.BERTH_DEMO_LOAD_MAX_PER_TICK = 50
    load_on.BERTH_DEMO_LOAD_MAX_PENDING = 5
    capped = demo_load_tick(cluster_id=cluster.pk, now=NOW + timedelta(days=1), tick_s=3600)
    assert len(capped.jobs) + len(capped.sessions) == 2  # 3 pending already, room for 2
    full = demo_load_tick(cluster_id=cluster.pk, now=NOW + timedelta(days=2), tick_s=3600)
    assert full.is_full
    assert not full.jobs
    assert Job.objects.filter(cluster=cluster, status=Job.Status.PENDING).count() == 5


def test_beat_task_ticks_simulator_clusters_only(load_on: Any, history: list[Job], cluster: Cluster) -> None:
    out = tasks.demo_load_dispatch()
    assert [r["cluster_id"] for r in out] == (
        [cluster.pk] if cluster.backend == Cluster.Backend.SIMULATOR else []
    )


def settings_module() -> Any:
    """The settings as loaded from this process's environment (the beat schedule is built there)."""
    import importlib

    import portal.settings

    return importlib.import_module(portal.settings.__name__)


def test_beat_schedule_has_the_demo_load_only_when_it_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    monkeypatch.setenv("BERTH_DEMO_LOAD", "1")
    saved = sys.modules.pop("portal.settings")
    try:
        fresh = importlib.import_module("portal.settings")
        assert fresh.CELERY_BEAT_SCHEDULE["demo-load"]["task"] == "scheduling.tasks.demo_load_dispatch"
    finally:
        sys.modules["portal.settings"] = saved


def test_work_above_the_guarantee_is_submitted_preemptible(
    load_on: Any, history: list[Job], cluster: Cluster, project: Project, a100: GpuType
) -> None:
    from portal.accounts.models import Quota

    Quota.objects.create(project=project, gpu_type=a100, guaranteed_gpus=1, borrow_limit_gpus=8)
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    two = Job.objects.filter(pk__in=result.jobs, gpu_count=2)
    assert two.exists()
    assert all(job.is_preemptible for job in two)  # never a job the quota never lets start


def _queue(cluster: Cluster, gpu_type: GpuType, gpus: int, member: User, project: Project) -> None:
    JobFactory(
        user=member,
        project=project,
        cluster=cluster,
        gpu_type=gpu_type,
        gpu_count=gpus,
        status=Job.Status.PENDING,
        submitted_at=NOW - timedelta(minutes=5),
    )


def test_a_pool_whose_queue_is_as_large_as_it_sends_new_work_to_the_least_queued_pool(
    load_on: Any, history: list[Job], cluster: Cluster, member: User, project: Project, a100: GpuType
) -> None:
    """Work queues on every type in proportion to its size: the 8 A100s already have 8 GPUs
    queued, so copies of A100 jobs go to the 16 idle T4s, as the same share of that pool, until
    the T4s' queue is as large as they are.  (How many arrive is a draw seeded by the cluster's
    id: the test holds for any count.)"""
    from tests.factories import GpuTypeFactory, NodeFactory

    t4 = GpuTypeFactory(name="T4", memory_gib=16.0)
    for i in range(2):
        NodeFactory(cluster=cluster, gpu_type=t4, name=f"t{i}", gpu_count=8)
    _queue(cluster, a100, 8, member, project)
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    live = list(Job.objects.filter(pk__in=result.jobs).order_by("pk"))
    assert live
    t4_queued = 0
    for job in live:  # in submission order
        if t4_queued < 16:
            assert job.gpu_type_id == t4.pk
            # 1 or 2 of the 8 A100s -> 2 or 4 of the 16 T4s (the same share of the pool)
            assert job.gpu_count in (2, 4)
            t4_queued += job.gpu_count
        else:  # every pool's queue is as large as the pool: a copy keeps its own type
            assert job.gpu_type_id == a100.pk


def test_new_work_never_goes_to_a_type_its_project_may_not_use(
    load_on: Any, history: list[Job], cluster: Cluster, member: User, project: Project, a100: GpuType
) -> None:
    from portal.accounts.models import Quota
    from tests.factories import GpuTypeFactory, NodeFactory

    t4 = GpuTypeFactory(name="T4", memory_gib=16.0)
    NodeFactory(cluster=cluster, gpu_type=t4, name="t0", gpu_count=8)
    Quota.objects.create(project=project, gpu_type=t4, guaranteed_gpus=0, borrow_limit_gpus=0)
    _queue(cluster, a100, 8, member, project)
    result = demo_load_tick(cluster_id=cluster.pk, now=NOW, tick_s=3600)
    assert result.jobs
    assert not Job.objects.filter(pk__in=result.jobs, gpu_type=t4).exists()  # it stays on its own type
