"""The demo lab's cluster through real engine rounds on the live simulator (what `make demo` runs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from scheduling.management.demo_lab import CLUSTER_NAME, demo_lab_build
from scheduling.models import Allocation, Cluster, EngineRound, Job
from tests.integration import loop
from tests.integration.loop import later

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _last_week_at(weekday: int, hour: int, minute: int) -> datetime:
    """The latest past moment at this UTC time of week.

    The demo's history keeps every trace job's hour of day and day of week
    (`demo_traces._trace_window`), so what runs at "now" depends on the time of week: at a
    fixed time of week the history, and so the first round, is the same on every run.
    """
    now = timezone.now().astimezone(UTC)
    at = (now - timedelta(days=(now.weekday() - weekday) % 7)).replace(
        hour=hour, minute=minute, second=0, microsecond=0
    )
    return at if at < now else at - timedelta(weeks=1)


def test_demo_lab_queue_is_placed_explained_and_run(engine_redis_url, run_round) -> None:
    # Monday 04:30 UTC: the history leaves a third of the GPUs free at "now".
    t0 = _last_week_at(0, 4, 30)
    # The fast path: a few days of history and no forecast fit (the e2e demo test fits them).
    demo_lab_build(traces_dir=None, history_days=3, now=t0, make_forecasts=False)
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    queued = list(Job.objects.filter(cluster=cluster, status=Job.Status.PENDING))
    assert queued

    first = run_round(cluster, t0)

    assert first.status == "ok", first
    assert first.started >= 1
    for job in Job.objects.filter(pk__in=[j.pk for j in queued]):
        if job.status == Job.Status.PENDING:
            assert job.pending_reason
            assert job.pending_sentence
        else:
            assert job.status == Job.Status.RUNNING
            assert job.allocations.filter(state=Allocation.State.ACTIVE).count() == job.gpu_count
    # A day later every queued job has run or is running; none was lost or dropped.
    for hours in range(1, 25):
        run_round(cluster, later(t0, hours * 3600))
    statuses = set(Job.objects.filter(pk__in=[j.pk for j in queued]).values_list("status", flat=True))
    assert statuses <= {Job.Status.RUNNING, Job.Status.COMPLETED, Job.Status.PENDING}
    assert Job.Status.COMPLETED in statuses
    assert not EngineRound.objects.filter(cluster=cluster).exclude(error="").exists()
    # The live rounds (the replayed history's rounds carry the replay's plan times, not these).
    live = EngineRound.objects.filter(cluster=cluster).exclude(decisions__has_key="replayed")
    assert live.count() == 25
    durations = list(live.order_by("started_at", "id").values_list("duration_ms", flat=True))
    # The first round places the queue the history left at "now" (dozens of starts persisted in
    # one transaction); the later ones are the steady state.
    assert durations[0] < 15_000, durations[0]
    assert max(durations[1:]) < 5_000, durations


def test_demo_lab_on_a_full_cluster_explains_the_wait(engine_redis_url, run_round) -> None:
    # Monday 11:58 UTC: the history leaves every GPU busy at "now" and none ends then (a CI run
    # met this when the test took the wall clock's time of week), so nothing can start.
    t0 = _last_week_at(0, 11, 58)
    demo_lab_build(traces_dir=None, history_days=3, now=t0, make_forecasts=False)
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    gpus = sum(cluster.nodes.values_list("gpu_count", flat=True))
    busy = Allocation.objects.filter(job__cluster=cluster, state=Allocation.State.ACTIVE).count()
    assert busy == gpus

    first = run_round(cluster, t0)

    assert first.status == "ok", first
    assert first.started == 0
    pending = Job.objects.filter(cluster=cluster, status=Job.Status.PENDING)
    assert pending.exists()
    for job in pending:
        # Each waiting job says why: no free GPU of its types (or its project's limit).
        assert job.pending_reason in {"priority", "resources", "quota"}, (job.name, job.pending_reason)
        assert job.pending_sentence
    smoke = pending.get(name="smoke-test-notebook")
    assert "0 are free" in smoke.pending_sentence
