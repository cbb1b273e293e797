"""The demo lab's cluster through real engine rounds on the live simulator (what `make demo` runs)."""

from __future__ import annotations

from datetime import datetime

import pytest

from scheduling.management.demo_lab import CLUSTER_NAME, demo_lab_build
from scheduling.models import Allocation, Cluster, EngineRound, Job
from tests.integration import loop
from tests.integration.loop import later

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def test_demo_lab_queue_is_placed_explained_and_run(engine_redis_url, run_round, t0: datetime) -> None:
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
