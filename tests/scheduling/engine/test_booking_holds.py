"""A future booking's free GPUs are held in the pool they are free in, whichever side they lie
on and however many of its GPUs are busy (`reserve.hold_bookings` asks only the pools that have
one of them free)."""

from __future__ import annotations

import pytest

from scheduling.engine import plan_round
from scheduling.engine.types import Booking, JobKind, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0


@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
@pytest.mark.parametrize("booked_gpus", [(0, 1), (4, 5), (1, 6)])
def test_a_booking_partly_busy_holds_its_free_gpus(policy: str, booked_gpus: tuple[int, int]) -> None:
    # 8 one-GPU nodes; static's partition is n4-n7.  The booking's first GPU is busy until
    # long after it starts, its second is free: only that one can be held, and a long job that
    # would run into the booking must not take it.
    nodes = make_nodes(8, 1)
    busy, free = booked_gpus
    others = [g for g in range(8) if g not in booked_gpus]
    runs = [
        running(job(f"r{g}", 1, requested_s=90_000.0), (g,), started_at=NOW - 10.0) for g in [busy, *others]
    ]
    booking = Booking(
        id="bk",
        user="v",
        project="q",
        gpu_count=2,
        start_at=NOW + 7_200.0,
        end_at=NOW + 10_800.0,
        gpu_ids=booked_gpus,
    )
    # static: the free GPU's side decides who may use it (sessions on the partition)
    kind = JobKind.INTERACTIVE if policy == "static" and free >= 4 else JobKind.BATCH
    long_job = job("long", 1, requested_s=86_400.0, kind=kind)
    short_job = job("short", 1, requested_s=600.0, submit_at=1.0, kind=kind)
    snap = snapshot(nodes, running_jobs=runs, pending=[long_job, short_job], bookings=(booking,))
    config = PolicyConfig(
        name=policy, interactive_partition=("n4", "n5", "n6", "n7") if policy == "static" else ()
    )
    plan = plan_round(snap, config, NOW)
    started = {start.job_id: start.gpu_ids for start in plan.starts}
    assert "long" not in started  # it would run into the booking on its one free GPU
    assert started.get("short") == (free,)  # the short one fits before the booking's lead time
