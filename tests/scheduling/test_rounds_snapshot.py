"""The engine's frozen snapshot built from the database (scheduling.snapshots)."""

from __future__ import annotations

from datetime import datetime

import pytest

from scheduling.models import GpuType, Job, Preemption
from scheduling.services import booking_create
from scheduling.snapshots import booking_engine_id, cluster_snapshot_build, policy_config_for_cluster
from tests.factories import JobFactory, QuotaFactory
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, submit

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db]


def test_snapshot_carries_predictions_shares_quotas_bookings_and_grace(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    a100 = GpuType.objects.get(name="A100")
    QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2, borrow_limit_gpus=1)
    # History: this user's "train" jobs ask for an hour and run ten minutes.
    for day in range(1, 6):
        start = later(t0, -day * 86_400)
        JobFactory(
            user=user,
            project=project,
            cluster=cluster,
            name="train",
            gpu_count=1,
            requested_s=3600,
            submitted_at=start,
            started_at=start,
            ended_at=later(start, 600),
            status=Job.Status.COMPLETED,
        )
    pending = submit(user, project, cluster, gpus=1, runtime_s=600, requested_s=3600, now=t0, name="train")
    own = submit(user, project, cluster, gpus=1, runtime_s=60, now=t0, name="other")
    Job.objects.filter(pk=own.pk).update(predicted_p50_s=42.0, predicted_p90_s=84.0)
    booking = booking_create(
        user,
        project=project,
        gpu_type=a100,
        gpu_count=1,
        start_at=later(t0, 7200),
        end_at=later(t0, 10800),
        cluster=cluster,
        now=t0,
    )
    lent = submit(user, project, cluster, gpus=1, runtime_s=9000, now=t0, is_preemptible=True, name="lent")
    run_round(cluster, t0)
    lent.refresh_from_db()
    assert lent.status == Job.Status.RUNNING
    signal = Preemption.objects.create(
        job=lent, signalled_at=later(t0, 10), kill_at=later(t0, 40), reason="test"
    )

    policy = policy_config_for_cluster(cluster=cluster)
    snapshot = cluster_snapshot_build(cluster=cluster, now=later(t0, 20), policy=policy)

    by_id = {r.id: r for r in snapshot.pending} | {r.job.id: r.job for r in snapshot.running}
    predicted = by_id[str(pending.pk)]
    assert predicted.predicted_p50_s is not None
    assert 300 <= predicted.predicted_p50_s <= 1200  # learned from the history, not the 3600 s asked
    assert predicted.predicted_p50_s <= predicted.predicted_p90_s <= 3600
    assert by_id[str(own.pk)].predicted_p50_s == 42.0  # a stored prediction wins
    (share,) = [p for p in snapshot.projects if p.name == project.slug]
    assert share.decayed_usage > 0
    assert share.guaranteed == (("A100", 2),)
    assert share.borrow_limit == 1
    (engine_booking,) = snapshot.bookings
    assert engine_booking.id == booking_engine_id(booking.pk)
    assert len(engine_booking.gpu_ids) == 1
    (running,) = [r for r in snapshot.running if r.job.id == str(lent.pk)]
    assert running.grace_until == signal.kill_at.timestamp()  # so it is not signalled twice


def test_policy_from_cluster_settings(settings) -> None:
    settings.BERTH_ENGINE_POLICY = "easy"
    cluster = make_cluster(settings={"policy": "fifo"})
    assert policy_config_for_cluster(cluster=cluster).name == "fifo"
    cluster.settings = {"policy": {"grace_s": 5, "interactive_headroom": [["A100", 2]], "bogus": 1}}
    policy = policy_config_for_cluster(cluster=cluster)
    assert policy.name == "easy"
    assert policy.grace_s == 5
    assert policy.interactive_headroom == (("A100", 2),)


def test_snapshot_queries_do_not_grow_with_the_queue(engine_redis_url, t0: datetime) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user, project = make_member()
    policy = policy_config_for_cluster(cluster=cluster)

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            cluster_snapshot_build(cluster=cluster, now=t0, policy=policy)
        return len(ctx.captured_queries)

    submit(user, project, cluster, gpus=1, runtime_s=60, now=t0)
    count()  # warms the per-process runtime predictor cache (forecasting.selectors)
    few = count()
    for i in range(20):
        submit(user, project, cluster, gpus=1 + i % 4, runtime_s=60, now=t0, name=f"q{i}")
    # One more query when jobs changed since the last snapshot: their whole rows (snapshots._open_jobs).
    assert count() == few + 1
    assert count() == few
    for i in range(20):
        submit(user, project, cluster, gpus=1 + i % 4, runtime_s=60, now=t0, name=f"r{i}")
    assert count() == few + 1
    assert few <= 20


def test_berth_policy_holds_the_forecast_headroom(monkeypatch: pytest.MonkeyPatch, t0: datetime) -> None:
    """The forecast itself is the forecasting app's (tested there); here only how the round uses it."""
    import forecasting.selectors

    asked: list[tuple[int, datetime]] = []

    def headroom(*, cluster_id: int, at: datetime) -> tuple[tuple[str, int], ...]:
        asked.append((cluster_id, at))
        return (("A100", 2),)

    monkeypatch.setattr(forecasting.selectors, "interactive_headroom_policy", headroom)
    cluster = make_cluster()
    assert policy_config_for_cluster(cluster=cluster, at=t0).interactive_headroom == (("A100", 2),)
    assert asked == [(cluster.pk, t0)]
    cluster.settings = {"policy": {"name": "berth", "interactive_headroom": [["A100", 1]]}}
    assert policy_config_for_cluster(cluster=cluster, at=t0).interactive_headroom == (("A100", 1),)
    cluster.settings = {"policy": "easy"}
    assert policy_config_for_cluster(cluster=cluster, at=t0).interactive_headroom == ()

    def broken(**kwargs: object) -> None:
        raise RuntimeError("no forecasts table")

    monkeypatch.setattr(forecasting.selectors, "interactive_headroom_policy", broken)
    cluster.settings = {}
    assert policy_config_for_cluster(cluster=cluster, at=t0).interactive_headroom == ()  # rounds go on


def test_snapshot_carries_the_claims_of_pending_jobs_work_was_reclaimed_for(
    engine_redis_url, run_round, t0: datetime
) -> None:
    """A preemption for a job is a claim (the engine ranks the evicted job behind the claimant)
    from the signal until ``claim_hold_s`` past the stop: the planned kill, or the real one if later."""
    cluster = make_cluster(nodes=1, gpus_per_node=2)
    user, project = make_member()
    victim = submit(user, project, cluster, gpus=2, runtime_s=9000, now=t0, is_preemptible=True)
    run_round(cluster, t0)
    victim.refresh_from_db()
    assert victim.status == Job.Status.RUNNING
    claimant = submit(user, project, cluster, gpus=2, runtime_s=600, now=later(t0, 5))
    signal = Preemption.objects.create(
        job=victim, for_job=claimant, signalled_at=later(t0, 10), kill_at=later(t0, 40), reason="test"
    )
    policy = policy_config_for_cluster(cluster=cluster)

    def claims(at_s: float) -> tuple[tuple[str, str, float], ...]:
        return cluster_snapshot_build(cluster=cluster, now=later(t0, at_s), policy=policy).claims

    kill = signal.kill_at.timestamp()
    claim = (str(claimant.pk), str(victim.pk))
    assert claims(20) == ((*claim, kill),)  # in the grace
    assert claims(40 + policy.claim_hold_s) == ((*claim, kill),)
    assert claims(41 + policy.claim_hold_s) == ()  # past its hold
    # the backend stopped the work late: the claim runs from the real stop
    Preemption.objects.filter(pk=signal.pk).update(killed_at=later(t0, 100))
    assert claims(41 + policy.claim_hold_s) == ((*claim, later(t0, 100).timestamp()),)
    # a booking's reclaim is not a job's claim
    Preemption.objects.filter(pk=signal.pk).update(for_job=None)
    assert claims(20) == ()
