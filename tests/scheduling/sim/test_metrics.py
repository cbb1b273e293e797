"""Replay metrics on hand-made tiny schedules."""

from __future__ import annotations

import pytest

from scheduling.sim.metrics import (
    BookingOutcome,
    JobOutcome,
    ReplayRecord,
    compute_metrics,
    jain_index,
    percentile,
    windows_overlap,
)

CONTRACT_KEYS = {
    "utilization", "busy_utilization", "wait_mean_s", "wait_p95_s", "jct_mean_s", "bounded_slowdown_mean",
    "interactive_wait_p95_s", "bookings_honored", "preemptions", "lost_gpu_hours", "jain_fairness",
    "idle_gpu_hours", "round_ms_p99", "wall_s",
}  # fmt: skip


def _tiny() -> ReplayRecord:
    """Two GPUs for 100 s.

    Job a (1 GPU) ran 0-40.  Job b (2 GPUs, 40 s of work) first ran 40-60 and was preempted
    with all 20 s lost, then ran again 60-100.  Both were submitted at 0, so the queue is
    non-empty during 0-60.
    """
    record = ReplayRecord(capacity_gpus=2, span_start=0.0, span_end=100.0)
    record.jobs = [
        JobOutcome("a", "u1", 1, submit_at=0.0, runtime_s=40.0, end_at=40.0),
        JobOutcome("b", "u2", 2, submit_at=0.0, runtime_s=40.0, end_at=100.0),
    ]
    record.segments = [(0.0, 40.0, 1), (40.0, 40.0, 2), (60.0, 100.0, 2)]
    record.queue_windows = [(0.0, 60.0)]
    record.preemptions = 1
    record.lost_gpu_s = 40.0
    record.idle_gpu_s = {"no_demand": 40.0, "fragmentation": 40.0}
    return record


def test_tiny_schedule_metrics() -> None:
    metrics = compute_metrics(_tiny())
    assert set(metrics) >= CONTRACT_KEYS
    # useful: 40 (a) + 80 (b's kept run) = 120 of 200 GPU-s
    assert metrics["utilization"] == pytest.approx(120 / 200)
    # queue window 0-60: a kept 40 GPU-s in it, b's lost 40-60 run is not useful -> 40/120
    assert metrics["busy_utilization"] == pytest.approx(40 / 120)
    # waits = jct - runtime: a 0, b 60
    assert metrics["wait_mean_s"] == pytest.approx(30.0)
    assert metrics["jct_mean_s"] == pytest.approx(70.0)
    assert metrics["bounded_slowdown_mean"] == pytest.approx((1.0 + 100 / 40) / 2)
    assert metrics["lost_gpu_hours"] == pytest.approx(40 / 3600)
    assert metrics["idle_gpu_hours"]["fragmentation"] == pytest.approx(40 / 3600)
    assert metrics["idle_gpu_hours"]["reserved_unused"] == 0.0
    assert "unexplained" not in metrics["idle_gpu_hours"]
    assert metrics["jain_fairness"] == pytest.approx(jain_index([1.0, 2.5]))


def test_slowdown_floor_and_bookings_and_interactive() -> None:
    record = ReplayRecord(capacity_gpus=1, span_end=10.0)
    record.jobs = [JobOutcome("s", "u", 1, submit_at=0.0, runtime_s=1.0, end_at=6.0)]
    record.interactive_waits_s = [float(i) for i in range(1, 21)]
    record.bookings = [
        BookingOutcome("b1", True),
        BookingOutcome("b2", False, 300.0),
        BookingOutcome("b3", None),  # no-show: not counted
        BookingOutcome("b4", True, 12.0),
    ]
    metrics = compute_metrics(record)
    assert metrics["bounded_slowdown_mean"] == pytest.approx(1.0)  # 6 s / max(1 s, 10 s) < 1 -> 1
    assert metrics["interactive_wait_p95_s"] == 19.0
    assert metrics["bookings_honored"] == pytest.approx(2 / 3)


def test_unfinished_jobs_count_with_a_censored_wait() -> None:
    record = ReplayRecord(capacity_gpus=1, span_end=100.0)
    record.jobs = [
        JobOutcome("done", "u", 1, submit_at=0.0, runtime_s=10.0, end_at=10.0),
        JobOutcome("stuck", "u", 2, submit_at=20.0, runtime_s=10.0, end_at=None),
    ]
    metrics = compute_metrics(record)
    assert metrics["unfinished_jobs"] == 1
    # "stuck" waited at least until the end of the replay: 100 - 20 - 10 (its work) = 70.
    assert metrics["wait_mean_s"] == pytest.approx(35.0)


def test_helpers() -> None:
    assert percentile([], 95) == 0.0
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile(list(map(float, range(100))), 99) == 98.0
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([]) == 1.0
    windows = [(0.0, 10.0), (20.0, 30.0)]
    assert windows_overlap(windows, 5.0, 25.0) == pytest.approx(10.0)
    assert windows_overlap(windows, 10.0, 20.0) == 0.0
    assert windows_overlap(windows, -5.0, 100.0) == pytest.approx(20.0)


def test_queue_windows_merge() -> None:
    record = ReplayRecord(capacity_gpus=1)
    record.add_queue_window(0.0, 5.0)
    record.add_queue_window(5.0, 7.0)
    record.add_queue_window(9.0, 9.0)
    record.add_queue_window(10.0, 11.0)
    assert record.queue_windows == [(0.0, 7.0), (10.0, 11.0)]


def test_wait_by_width_buckets_jobs_by_gpus_asked_and_shares_the_wait() -> None:
    record = ReplayRecord(capacity_gpus=100, span_start=0.0, span_end=10_000.0)
    record.jobs.extend(
        [
            JobOutcome("a", "u", 1, submit_at=0.0, runtime_s=100.0, end_at=200.0),  # waits 100
            JobOutcome("b", "u", 1, submit_at=0.0, runtime_s=100.0, end_at=400.0),  # waits 300
            JobOutcome("w", "u", 40, submit_at=0.0, runtime_s=100.0, end_at=1_700.0),  # waits 1,600
            JobOutcome("x", "u", 100, submit_at=0.0, runtime_s=100.0, end_at=100.0),  # no wait
        ]
    )
    by_width = compute_metrics(record)["wait_by_width"]
    assert set(by_width) == {"1", "33-64", "65+"}
    assert by_width["1"] == {"jobs": 2, "wait_mean_s": 200.0, "wait_max_s": 300.0, "wait_share": 0.2}
    assert by_width["33-64"]["wait_share"] == pytest.approx(0.8)
    assert by_width["65+"] == {"jobs": 1, "wait_mean_s": 0.0, "wait_max_s": 0.0, "wait_share": 0.0}
