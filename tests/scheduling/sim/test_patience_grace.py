"""The overlay's owner behaviour in the replay: a session abandons after its patience and a
booking whose owner never comes is released after the no-show grace (simulator backend, real
engine)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.engine import plan_round
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import BookingPlan, InteractiveSession, Overlay, OverlayConfig
from scheduling.sim.replay import Replay
from scheduling.sim.trace import Trace, TraceJob

PATIENCE_S = 900.0
GRACE_S = 300.0


def _job(job_id: str, submit_at: float, runtime_s: float) -> TraceJob:
    return TraceJob(
        id=job_id,
        user="u",
        project="p",
        submit_at=submit_at,
        runtime_s=runtime_s,
        gpu_count=1,
        gpu_type=None,
        requested_s=runtime_s,
        status="completed",
    )


def _replay(policy: str, *, is_no_show: bool) -> tuple[dict[str, Any], dict[str, float]]:
    # GPU 0 runs a long non-preemptible job; GPU 1 is booked [1000, 9000) by an owner who
    # never comes (or comes on time); a session arrives at 100 and a 1-GPU batch job at 900
    # that would run into the booking.
    trace = Trace(
        name="tiny",
        jobs=(_job("long", 0.0, 20_000.0), _job("waiter", 900.0, 4_000.0)),
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=0.0,
    )
    booking = BookingPlan(
        id="bk-000000",
        user="owner",
        project="p",
        created_at=0.0,
        start_at=1_000.0,
        end_at=9_000.0,
        gpu_count=1,
        use_start_at=None if is_no_show else 1_000.0,
        use_end_at=None if is_no_show else 9_000.0,
        gpu_ids=(1,),
    )
    session = InteractiveSession(
        id="int-000000",
        user="v",
        project="p",
        submit_at=100.0,
        duration_s=3_600.0,
        gpu_count=1,
        requested_s=3_600.0,
    )
    overlay = Overlay(
        sessions=(session,),
        bookings=(booking,),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1_800.0,
        config=OverlayConfig(session_patience_s=PATIENCE_S, booking_grace_s=GRACE_S),
    )
    replay = Replay(trace, parse_cluster_spec("2x1"), overlay, policy=policy, plan_fn=plan_round)
    record = replay.run()
    # a batch job is never preempted here, so it started at its end minus its work
    return compute_metrics(record), {j.id: j.end_at - j.runtime_s for j in record.jobs if j.end_at}


@pytest.mark.parametrize("policy", ["easy", "berth"])
def test_a_session_abandons_after_its_patience_and_a_no_show_is_released_after_the_grace(
    policy: str,
) -> None:
    metrics, started = _replay(policy, is_no_show=True)
    # GPU 0 runs non-preemptible work for hours and GPU 1 is booked from 1000 (the session's
    # 3,600 s would run into it): the session is never served and gives up after its patience
    assert metrics["sessions_abandoned"] == 1
    assert metrics["interactive_wait_p95_s"] == pytest.approx(PATIENCE_S, abs=1.0)
    assert metrics["interactive_over_60s_share"] == 1.0
    # the owner never came: the booking is released at start + grace and the waiting job
    # starts then, not at the booking's end
    assert metrics["bookings_released_no_show"] == 1
    assert 1_000.0 + GRACE_S <= started["waiter"] <= 1_000.0 + GRACE_S + 60.0


def test_an_owner_who_comes_keeps_the_booking_to_its_end() -> None:
    metrics, started = _replay("easy", is_no_show=False)
    assert metrics["bookings_released_no_show"] == 0
    assert metrics["bookings_honored"] == 1.0
    assert started["waiter"] >= 9_000.0


@pytest.mark.parametrize("overlay_pick", [(0,), (1,)])
@pytest.mark.parametrize("policy", ["easy", "berth"])
def test_a_booking_made_while_work_runs_avoids_its_gpus(policy: str, overlay_pick: tuple[int, ...]) -> None:
    """As `booking_create` does, the replay books GPUs no running job's allocation holds over
    the window: a booking made while a long preemptible job runs goes to the other GPU, so
    the job is not restarted from scratch for it (whichever GPU the overlay's admission,
    which sees no running work, had picked)."""
    trace = Trace(
        name="tiny",
        jobs=(_job("long", 0.0, 20_000.0),),
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=0.0,
    )
    booking = BookingPlan(
        id="bk-000000",
        user="owner",
        project="p",
        created_at=100.0,
        start_at=3_600.0,
        end_at=7_200.0,
        gpu_count=1,
        use_start_at=3_600.0,
        use_end_at=7_200.0,
        gpu_ids=overlay_pick,
    )
    overlay = Overlay(
        sessions=(),
        bookings=(booking,),
        preemptible=frozenset({"long"}),
        checkpointable=frozenset(),
        checkpoint_interval_s=1_800.0,
        config=OverlayConfig(booking_grace_s=GRACE_S),
    )
    record = Replay(trace, parse_cluster_spec("2x1"), overlay, policy=policy, plan_fn=plan_round).run()
    metrics = compute_metrics(record)
    assert metrics["preemptions"] == 0
    assert metrics["lost_gpu_hours"] == 0.0
    assert metrics["bookings_honored"] == 1.0
    assert record.jobs[0].end_at == pytest.approx(20_000.0)
