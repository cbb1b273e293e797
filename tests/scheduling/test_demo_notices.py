"""Replayed preemptions of the demo history store the work they lost and say it in words, in the
portal's one clock (the history's timeline is wall-clock time shifted to end now)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from scheduling.management.demo_history import lost_work_s, preemption_notice
from scheduling.management.demo_lab import CLUSTER_NAME
from scheduling.models import Allocation, Preemption

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_lost_work_is_everything_since_the_last_checkpoint() -> None:
    assert lost_work_s(run_s=7560, gpu_count=2, checkpoint_interval_s=None) == 15_120
    # 2 h 6 min with a checkpoint every 30 min: the last 6 min are lost, on each GPU
    assert lost_work_s(run_s=7560, gpu_count=2, checkpoint_interval_s=1800) == pytest.approx(720)
    assert lost_work_s(run_s=-5, gpu_count=1, checkpoint_interval_s=None) == 0


def test_preemption_notice_names_jobs_and_says_how_long_it_ran() -> None:
    names = {"t22284.3": "language-22284.3", "int-001284": "session-int-001284"}
    text = preemption_notice(
        reason="Preempted for top job t22284.3: it ran 2.1 h on lent GPUs; grace until +30 s.",
        run_s=7560,
        names=names,
    )
    assert text == "Preempted for top job language-22284.3: it ran 2.1 h on lent GPUs; grace until +30 s."
    short = preemption_notice(reason="Preempted for interactive session int-001284.", run_s=1200, names=names)
    assert short == "Preempted for interactive session session-int-001284. It ran 20 min."
    assert preemption_notice(reason="", run_s=7560, names={}) == "Preempted. It ran 2.1 h."


@pytest.fixture
def sim_state() -> Iterator[None]:
    from django.conf import settings
    from django.db import connection

    from scheduling.backend_registry import engine_redis

    client = engine_redis(settings.BERTH_ENGINE_REDIS_URL)
    yield
    keys = list(client.scan_iter(match=f"berth:livesim:{connection.settings_dict['NAME']}:*", count=500))
    if keys:
        client.delete(*keys)


@pytest.mark.django_db
@pytest.mark.slow
def test_replayed_preemptions_store_their_lost_work_in_one_clock(
    tmp_path: Path, settings: Any, sim_state: None
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    args = ["--traces", str(tmp_path), "--scale", "0.01", "--history-days", "7", "--forecasts", "skip"]
    call_command(
        "demo_lab",
        *args,
        "--now",
        NOW.isoformat(),
        "--no-queue",
        "--no-bookings",
        stdout=open(tmp_path / "o.txt", "w"),  # noqa: SIM115
    )
    preemptions = list(Preemption.objects.filter(job__cluster__name=CLUSTER_NAME).select_related("job"))
    if not preemptions:
        pytest.skip("this replay preempted nothing")
    ran = re.compile(r"\b[Ii]t ran \d+(\.\d)? (s|min|h|d)\b")
    for p in preemptions:
        assert ran.search(p.reason), p.reason
        assert not re.search(r"\bt\d+", p.reason), p.reason  # job names, not replay keys
        assert p.killed_at is not None
        # the run that was cut: its allocations end at the kill, on the same clock
        run = Allocation.objects.filter(job=p.job, period__endswith=p.killed_at).first()
        assert run is not None, p
        run_s = (p.killed_at - run.period.lower).total_seconds()
        gpus = Allocation.objects.filter(job=p.job, period=run.period).count()
        interval = p.job.checkpoint_interval_s if p.job.is_checkpointable else None
        assert p.lost_gpu_s == pytest.approx(
            lost_work_s(run_s=run_s, gpu_count=gpus, checkpoint_interval_s=interval), abs=1.0
        )
    assert any(p.lost_gpu_s > 0 for p in preemptions)
