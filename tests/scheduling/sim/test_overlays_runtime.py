"""Seeded overlays and the replay's runtime predictor."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecasting.core.runtime import HistoryRuntimePredictor
from scheduling.engine.types import JobRequest
from scheduling.sim.overlays import HOUR_S, OverlayConfig, activity_weight, build_overlay, demand_series
from scheduling.sim.runtime import RuntimePredictor, default_predictor
from scheduling.sim.trace import Trace, load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"


@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=600)


def test_overlay_totals_and_shapes(trace: Trace) -> None:
    overlay = build_overlay(trace, OverlayConfig(interactive_share=0.15, booking_share=0.10, seed=7))
    stats = overlay.stats()
    target = trace.gpu_hours
    # Drawn until the total is reached: at most one item (<= 8 GPUs x 8 h) over.
    assert 0.15 * target <= stats["interactive_gpu_hours"] <= 0.15 * target + 8
    assert 0.10 * target <= stats["booking_reserved_gpu_hours"] <= 0.10 * target + 64
    span_end = max(job.submit_at for job in trace.jobs)
    for session in overlay.sessions:
        assert session.gpu_count in (1, 2)
        assert 0.5 * HOUR_S <= session.duration_s <= 4 * HOUR_S
        assert session.requested_s >= session.duration_s
        assert 0 <= session.submit_at <= span_end
    for booking in overlay.bookings:
        assert 1 <= booking.gpu_count <= 8
        assert HOUR_S <= booking.end_at - booking.start_at <= 8 * HOUR_S
        assert booking.start_at - booking.created_at <= 72 * HOUR_S
        if booking.use_start_at is not None and booking.use_end_at is not None:
            assert booking.start_at <= booking.use_start_at < booking.use_end_at <= booking.end_at
    # Owners leave part of the reserved time unused, so lending has something to lend.
    assert 0.05 < stats["booking_unused_share"] < 0.6


def test_overlay_is_deterministic_and_flags_do_not_depend_on_shares(trace: Trace) -> None:
    a = build_overlay(trace, OverlayConfig(interactive_share=0.1, booking_share=0.1, seed=1))
    b = build_overlay(trace, OverlayConfig(interactive_share=0.1, booking_share=0.1, seed=1))
    c = build_overlay(trace, OverlayConfig(seed=1))
    d = build_overlay(trace, OverlayConfig(interactive_share=0.1, booking_share=0.1, seed=2))
    assert a == b
    assert a.preemptible == c.preemptible
    assert a.checkpointable == c.checkpointable
    assert a.sessions != d.sessions
    assert a.checkpointable <= a.preemptible
    assert 0.35 < len(a.preemptible) / len(trace.jobs) < 0.65
    assert c.sessions == ()
    assert c.bookings == ()


def test_sessions_follow_office_hours(trace: Trace) -> None:
    overlay = build_overlay(trace, OverlayConfig(interactive_share=0.3, seed=3))
    weights = [activity_weight(s.submit_at, week_phase_s=trace.week_phase_s) for s in overlay.sessions]
    office = sum(1 for w in weights if w == 1.0)
    night = sum(1 for w in weights if w < 0.1)
    assert office > 3 * night


def test_demand_series_counts_sessions_and_bookings(trace: Trace) -> None:
    overlay = build_overlay(trace, OverlayConfig(interactive_share=0.1, booking_share=0.1, seed=4))
    series = demand_series(overlay, step_s=600.0)
    assert series
    assert all(level >= 0 for _, level in series)
    peak_possible = sum(s.gpu_count for s in overlay.sessions) + sum(b.gpu_count for b in overlay.bookings)
    assert max(level for _, level in series) <= peak_possible


def _job(
    job_id: str, *, user: str = "u1", project: str = "p1", requested: float | None = 3600.0
) -> JobRequest:
    return JobRequest(
        id=job_id, user=user, project=project, gpu_count=1, submit_at=0.0, requested_s=requested
    )


def test_default_predictor_implements_the_protocol() -> None:
    predictor = default_predictor()
    assert isinstance(predictor, RuntimePredictor)
    assert isinstance(predictor, HistoryRuntimePredictor)  # the predictor the portal ships
    p50, p90 = predictor.predict(_job("q"))
    assert 0 < p50 <= p90
