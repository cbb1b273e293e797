"""Berth's time-aware interactive pool (`engine/pool.py`): forecast session demand per hour."""

from __future__ import annotations

from scheduling.engine import plan_round
from scheduling.engine.pool import PoolForecast, booked_windows
from scheduling.engine.types import Booking, JobKind, PendingReason, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 36_000.0  # 10:00 on the replay's clock
H = 3_600.0


def _pool(*levels: int, start: float = NOW) -> tuple[tuple[float, str, int], ...]:
    return tuple((start + i * H, "*", level) for i, level in enumerate(levels))


def _reason(plan, job_id: str) -> PendingReason | None:  # type: ignore[no-untyped-def]
    return next((e.reason for e in plan.pending if e.job_id == job_id), None)


def test_forecast_levels_peak_next_rise_and_low_window() -> None:
    policy = PolicyConfig(interactive_pool=(*_pool(1, 3, 2, 0), (NOW + H, "T4", 2)))
    forecast = PoolForecast.of(policy)
    assert forecast is not None
    assert forecast.level_at(["A100"], NOW + 10) == 1
    assert forecast.level_at(["T4"], NOW + H) == 5
    assert forecast.peak(["A100"], NOW, NOW + 1.5 * H) == 3
    assert forecast.peak(["T4"], NOW, NOW + 1.5 * H, only_named=True) == 2
    assert forecast.next_rise(["A100"], NOW) == NOW + H
    assert forecast.next_rise(["A100"], NOW + 2 * H) == NOW + 4 * H  # none: the forecast's end
    assert forecast.low_window(["A100"], NOW, H, 0) == NOW + 3 * H
    assert forecast.low_window(["A100"], NOW, H, -1) is None
    assert PoolForecast.of(PolicyConfig()) is None


def test_non_preemptible_work_is_kept_out_of_the_forecast_peak() -> None:
    """4 GPUs, sessions forecast to need 3 from the next hour: a 2-GPU non-preemptible job
    running 2 h would leave only 2 for them, so it waits (with the low-demand window as its
    ETA); marked preemptible it starts, restartable or checkpointing (sessions may take it
    back: `preemption.is_costly_start`), and so does a 1-GPU one."""
    nodes = make_nodes(4, 1)
    policy = PolicyConfig(name="berth", interactive_pool=_pool(0, 3, 3, 0, 0, 0))
    wide = job("wide", 2, requested_s=2 * H)
    plan = plan_round(snapshot(nodes, pending=[wide]), policy, NOW)
    assert plan.starts == ()
    assert _reason(plan, "wide") == PendingReason.HEADROOM
    (explanation,) = plan.pending
    assert explanation.eta_p50_at == NOW + 3 * H
    assert "Marking it preemptible lets it start now" in explanation.sentence
    restartable = job("wide", 2, requested_s=2 * H, is_preemptible=True)
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[restartable]), policy, NOW).starts] == [
        "wide"
    ]
    consenting = job("wide", 2, requested_s=2 * H, is_preemptible=True, is_checkpointable=True)
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[consenting]), policy, NOW).starts] == [
        "wide"
    ]
    narrow = job("narrow", 1, requested_s=2 * H)
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[narrow]), policy, NOW).starts] == ["narrow"]
    # running non-preemptible work counts: with one GPU pinned, the narrow job no longer fits
    pinned = running(job("pinned", 1, requested_s=10 * H), (0,), started_at=NOW - 100)
    plan = plan_round(snapshot(nodes, running_jobs=[pinned], pending=[narrow]), policy, NOW)
    assert plan.starts == ()
    # a short job that ends before the rise starts
    short = job("short", 2, requested_s=0.5 * H)
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[short]), policy, NOW).starts] == ["short"]
    # without a forecast over time, the old behaviour: it starts
    plain = PolicyConfig(name="berth")
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[wide]), plain, NOW).starts] == ["wide"]


def test_a_job_no_window_admits_is_not_held_back() -> None:
    nodes = make_nodes(4, 1)
    policy = PolicyConfig(name="berth", interactive_pool=_pool(2, 2, 2))
    whole = job("whole", 4, requested_s=H)
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[whole]), policy, NOW).starts] == ["whole"]


def test_restartable_work_borrows_the_pool_only_before_the_next_rise() -> None:
    """3 GPUs, one running non-preemptible work, the other two the pool now: restartable
    preemptible work may borrow them if it is predicted to be gone before demand rises,
    checkpointing work whenever."""
    nodes = make_nodes(3, 1)
    solid = running(job("solid", 1, requested_s=50_000), (2,), started_at=NOW - 5_000)
    restartable = job(
        "r", 1, requested_s=1_200, predicted_p50_s=600, predicted_p90_s=1_200, is_preemptible=True
    )
    early_rise = PolicyConfig(name="berth", interactive_pool=_pool(2, 3, start=NOW - 0.9 * H))
    late_rise = PolicyConfig(name="berth", interactive_pool=_pool(2, 2, 3, start=NOW - 0.5 * H))
    snap = snapshot(nodes, running_jobs=[solid], pending=[restartable])
    assert plan_round(snap, early_rise, NOW).starts == ()
    (start,) = plan_round(snap, late_rise, NOW).starts
    assert start.is_preemptible
    ckpt = job(
        "c", 1, requested_s=20_000, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=600
    )
    plan = plan_round(snapshot(nodes, running_jobs=[solid], pending=[ckpt]), early_rise, NOW)
    assert [s.job_id for s in plan.starts] == ["c"]
    # a session takes the restartable work back within the grace
    session = job("s", 1, kind=JobKind.INTERACTIVE, submit_at=NOW)
    lent = running(restartable, (0,), started_at=NOW - 10, is_preemptible=True)
    busy = running(job("b", 1, is_preemptible=True, requested_s=50_000), (1,), started_at=NOW - 5_000)
    plan = plan_round(snapshot(nodes, running_jobs=[lent, busy, solid], pending=[session]), late_rise, NOW)
    assert [p.job_id for p in plan.preemptions] == ["r"]  # it lost less work


def test_only_non_preemptible_work_is_held_back_for_the_peak() -> None:
    """4 GPUs, sessions forecast at 3 now and 5 later: a 2-GPU job leaves only 2, so
    non-preemptible work waits, short or long, while restartable consenting work starts
    however long it runs (sessions may take it back), and running restartable work does not
    count as pinned: a 1-GPU non-preemptible job next to it fits the forecast's room now."""
    nodes = make_nodes(4, 1)
    short = {"requested_s": 0.5 * H, "predicted_p50_s": 0.3 * H, "predicted_p90_s": 0.5 * H}
    wait_policy = PolicyConfig(name="berth", interactive_pool=_pool(3, 3, 5, 5, 0, 0, 0, 0))
    assert plan_round(snapshot(nodes, pending=[job("solid", 2, **short)]), wait_policy, NOW).starts == ()
    for restartable in (
        job("restartable", 2, is_preemptible=True, **short),
        job("restartable", 2, is_preemptible=True, requested_s=3 * H),
    ):
        (start,) = plan_round(snapshot(nodes, pending=[restartable]), wait_policy, NOW).starts
        assert start.job_id == "restartable"
    # running restartable consenting work is not pinned: with it on 2 of the 4 GPUs and the
    # forecast at 1 now and 3 from the next hour, a 1-GPU non-preemptible job running 2 h
    # leaves 4 - 1 = 3 GPUs free of such work; without consent it would leave 4 - 2 - 1 = 1
    rising = PolicyConfig(name="berth", interactive_pool=_pool(1, 3, 3, 0, 0, 0, 0, 0))
    solid = job("solid", 1, requested_s=2 * H)
    consenting = running(
        job("consenting", 2, is_preemptible=True, requested_s=10 * H), (0, 1), started_at=NOW - 100
    )
    (start,) = plan_round(snapshot(nodes, running_jobs=[consenting], pending=[solid]), rising, NOW).starts
    assert start.job_id == "solid"
    pinned = running(job("pinned", 2, requested_s=10 * H), (0, 1), started_at=NOW - 100)
    plan = plan_round(snapshot(nodes, running_jobs=[pinned], pending=[solid]), rising, NOW)
    assert plan.starts == ()
    assert _reason(plan, "solid") == PendingReason.HEADROOM


def test_booked_gpus_count_in_the_peak_that_non_preemptible_work_must_leave_free() -> None:
    """6 GPUs, sessions forecast to need 2 from +1 h, a 2-GPU booking from +1 h to +2 h: a
    3-GPU non-preemptible job running 2 h fits now beside the booking's GPUs, but at +1 h it
    would leave 1 GPU for 4 booked or session GPUs, so it waits until the booking is over; a
    1-GPU one fits beside both, and without the booking the 3-GPU one starts."""
    nodes = make_nodes(6, 1)
    policy = PolicyConfig(name="berth", interactive_pool=_pool(0, 2, 2, 2, 2))
    booking = Booking(id="b", user="u", project="p", gpu_count=2, start_at=NOW + H, end_at=NOW + 2 * H)
    forecast = PoolForecast.of(policy)
    assert forecast is not None
    booked = booked_windows([booking], NOW)
    assert forecast.peak(["A100"], NOW, NOW + 0.5 * H, booked=booked) == 0
    assert forecast.peak(["A100"], NOW, NOW + 1.5 * H, booked=booked) == 4
    assert forecast.peak(["A100"], NOW, NOW + 1.5 * H, only_named=True, booked=booked) == 0
    assert forecast.low_window(["A100"], NOW, 2 * H, 3, booked=booked) == NOW + 2 * H
    assert booked_windows([booking], NOW + 3 * H) == ()
    wide = job("wide", 3, requested_s=2 * H)
    plan = plan_round(snapshot(nodes, pending=[wide], bookings=[booking]), policy, NOW)
    assert plan.starts == ()
    assert _reason(plan, "wide") == PendingReason.HEADROOM
    explanation = next(e for e in plan.pending if e.job_id == "wide")
    assert explanation.eta_p50_at == NOW + 2 * H
    narrow = job("narrow", 1, requested_s=2 * H)
    plan = plan_round(snapshot(nodes, pending=[narrow], bookings=[booking]), policy, NOW)
    assert [s.job_id for s in plan.starts] == ["narrow"]
    assert [s.job_id for s in plan_round(snapshot(nodes, pending=[wide]), policy, NOW).starts] == ["wide"]


def test_a_non_preemptible_head_job_kept_out_of_the_peak_reserves_the_low_demand_window() -> None:
    """The 2-GPU non-preemptible job the forecast keeps out of the next hours heads the queue:
    it becomes the top job with GPUs reserved from the earliest low-demand window (+3 h), so
    work that starts later cannot keep taking that window from it."""
    nodes = make_nodes(4, 1)
    policy = PolicyConfig(name="berth", interactive_pool=_pool(0, 3, 3, 0, 0, 0))
    wide = job("wide", 2, requested_s=2 * H)
    plan = plan_round(snapshot(nodes, pending=[wide]), policy, NOW)
    assert plan.starts == ()
    (reservation,) = [r for r in plan.reservations if r.holder_id == "wide"]
    assert reservation.start_at == NOW + 3 * H
    assert len(reservation.gpu_ids) == 2
    (explanation,) = plan.pending
    assert explanation.eta_p50_at == NOW + 3 * H
