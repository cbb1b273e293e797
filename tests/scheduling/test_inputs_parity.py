"""The portal's round and the replay build the same projects (decayed usage and quotas) from
the same history: real PostgreSQL on the portal's side (`snapshots.project_shares`), the
replay's incremental ledger (`inputs.UsageLedger`, what `sim.replay` keeps) on the other."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduling import inputs, snapshots
from scheduling.models import Job
from tests.factories import ClusterFactory, GpuTypeFactory, JobFactory, ProjectFactory, QuotaFactory

pytestmark = [pytest.mark.django_db]

HALF_LIFE_S = 7 * 86_400.0


def test_portal_and_replay_build_the_same_project_shares_from_the_same_history() -> None:
    now = datetime(2026, 3, 2, 12, tzinfo=UTC)
    a100 = GpuTypeFactory(name="A100", value=1.0)
    t4 = GpuTypeFactory(name="T4", value=0.25)
    cluster = ClusterFactory()
    vision = ProjectFactory(slug="vision", fair_share_weight=2.0)
    climate = ProjectFactory(slug="climate", fair_share_weight=1.0)
    QuotaFactory(project=vision, gpu_type=a100, guaranteed_gpus=2, borrow_limit_gpus=1)
    QuotaFactory(project=vision, gpu_type=t4, guaranteed_gpus=1, borrow_limit_gpus=0)
    QuotaFactory(project=climate, gpu_type=a100, guaranteed_gpus=0, borrow_limit_gpus=None)
    # (project, GPU type, GPUs, started hours ago, ended hours ago or None: still running)
    history = [
        (vision, a100, 2, 72.0, 48.0),
        (vision, t4, 4, 30.0, 1.0),
        (climate, a100, 1, 24.0, None),
        (climate, t4, 2, 200.0, 150.0),
        (vision, a100, 1, 5.0, None),
    ]
    for project, gpu_type, gpus, started_h, ended_h in history:
        JobFactory(
            project=project,
            cluster=cluster,
            gpu_type=gpu_type,
            gpu_count=gpus,
            status=Job.Status.RUNNING if ended_h is None else Job.Status.COMPLETED,
            started_at=now - timedelta(hours=started_h),
            ended_at=None if ended_h is None else now - timedelta(hours=ended_h),
        )
    portal = snapshots.project_shares(cluster=cluster, now=now, half_life_s=HALF_LIFE_S)

    # The replay: finished runs enter its ledger as they end, running ones are passed each round.
    at = snapshots.epoch(now)
    ledger = inputs.UsageLedger(half_life_s=HALF_LIFE_S)
    running: list[tuple[str, float, float]] = []
    for project, gpu_type, gpus, started_h, ended_h in sorted(history, key=lambda h: -(h[4] or 0.0)):
        value = gpus * gpu_type.value
        if ended_h is None:
            running.append((project.slug, value, at - started_h * 3_600.0))
        else:
            ledger.add(
                project.slug,
                gpu_value=value,
                start_at=at - started_h * 3_600.0,
                end_at=at - ended_h * 3_600.0,
            )
    specs = [
        inputs.ProjectSpec(
            name="vision",
            weight=2.0,
            guaranteed=(("A100", 2), ("T4", 1)),
            borrow_limit=1,
            borrow_limits=(("A100", 1), ("T4", 0)),
        ),
        inputs.ProjectSpec(name="climate", weight=1.0, guaranteed=(("A100", 0),), borrow_limit=None),
    ]
    replay = inputs.project_shares(specs, usage=ledger.usage_at(at, running=running))

    assert [s.name for s in portal] == [s.name for s in replay] == ["climate", "vision"]
    for mine, theirs in zip(portal, replay, strict=True):
        assert mine.weight == theirs.weight
        assert mine.guaranteed == theirs.guaranteed
        assert mine.borrow_limit == theirs.borrow_limit
        assert mine.borrow_limits == theirs.borrow_limits
        assert mine.decayed_usage == pytest.approx(theirs.decayed_usage, rel=1e-9)
        assert mine.decayed_usage > 0
    # decay is real: vision's old A100 run counts less than its GPU-hours
    assert portal[1].decayed_usage < 2 * 24 + 4 * 0.25 * 29 + 5
