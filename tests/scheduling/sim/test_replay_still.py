"""Still ticks (`scheduling.sim.replay_still`): a tick that would plan what the last round
planned is not planned, and the replay's results are the same as when every tick is planned
(shipped KTH sample with the overlay: sessions, bookings, static's partition; real engine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from scheduling.engine import plan_round
from scheduling.engine.types import Booking, ClusterSnapshot, JobRequest, PolicyConfig, RunningJob
from scheduling.sim import replay_still
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import OverlayConfig, build_overlay
from scheduling.sim.replay import Replay, ReplayOptions
from scheduling.sim.trace import load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"
_MECHANISM = {"rounds", "rounds_skipped", "round_ms_p99", "wall_s"}  # what may differ


def _replay(policy: str, *, skip: bool, verify: bool = False, plan_fn: Any = plan_round) -> dict[str, Any]:
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=600)
    inventory = parse_cluster_spec("100x1")
    overlay = build_overlay(
        trace, OverlayConfig(interactive_share=0.15, booking_share=0.10, seed=1), inventory=inventory
    )
    options = ReplayOptions(skip_still_ticks=skip, verify_still_ticks=verify)
    record = Replay(trace, inventory, overlay, policy=policy, plan_fn=plan_fn, options=options, seed=1).run()
    return compute_metrics(record)


@pytest.mark.parametrize("policy", ["easy", "static"])
def test_skipping_still_ticks_changes_no_result(policy: str) -> None:
    planned = _replay(policy, skip=False)
    skipped = _replay(policy, skip=True, verify=True)  # verify: every skipped tick planned and checked
    assert planned["rounds_skipped"] == 0
    assert skipped["rounds_skipped"] > 1_000  # most ticks of this workload are still
    assert skipped["rounds"] + skipped["rounds_skipped"] == planned["rounds"]
    assert {k: v for k, v in skipped.items() if k not in _MECHANISM} == {
        k: v for k, v in planned.items() if k not in _MECHANISM
    }


def test_a_fit_that_time_ends_is_a_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # without the instants at which a job stops fitting before a booking or the top job's
    # shadow, some tick of this workload is taken for still when its plan differs
    monkeypatch.setattr(replay_still, "_next_fit_change", lambda *_args, **_kwargs: float("inf"))
    with pytest.raises(AssertionError, match="was not still"):
        _replay("easy", skip=True, verify=True)


def test_a_changed_queue_order_is_not_still(monkeypatch: pytest.MonkeyPatch) -> None:
    # the order is compared (job by job, or where the round reads it: `replay_still_order`):
    # taking any tick within the thresholds for still (whatever its order) plans some tick
    # differently
    monkeypatch.setattr(replay_still.StillTickRule, "_order_at", lambda self, snapshot, t: [])
    monkeypatch.setattr(replay_still, "decides_alike", lambda *_args, **_kwargs: True)
    with pytest.raises(AssertionError, match="was not still"):
        _replay("static", skip=True, verify=True)


def test_fifo_does_not_skip() -> None:
    # fifo has no still-tick rule (berth's: test_replay_still_berth.py)
    assert _replay("fifo", skip=True)["rounds_skipped"] == 0


def test_another_engine_is_planned_every_tick() -> None:
    def other_engine(snapshot: Any, policy: Any, now: float) -> Any:
        return plan_round(snapshot, policy=policy, now=now)

    assert _replay("easy", skip=True, plan_fn=other_engine)["rounds_skipped"] == 0


def test_an_overdue_end_passing_an_active_bookings_end_is_a_threshold() -> None:
    # the case the whole-trace KTH overlay found under easy: while a job is overdue (seen ending
    # 60 s from now), the instant that moving end passes an active booking's end changes which
    # GPUs come free first, so which ones the top job's reservation takes
    inventory = parse_cluster_spec("4x1")
    config = PolicyConfig(name="easy")
    overdue = RunningJob(
        job=JobRequest(id="j1", user="u", project="p", gpu_count=1, submit_at=0.0, requested_s=100.0),
        gpu_ids=(0,),
        started_at=0.0,
        is_preemptible=False,
    )
    later = RunningJob(
        job=JobRequest(id="j2", user="u", project="p", gpu_count=1, submit_at=0.0, requested_s=5_000.0),
        gpu_ids=(1,),
        started_at=0.0,
        is_preemptible=False,
    )
    booking = Booking(
        id="bk-1", user="v", project="p", gpu_count=1, start_at=500.0, end_at=1_400.0, gpu_ids=(2,)
    )
    snapshot = ClusterSnapshot(
        cluster="c", gpu_types=inventory.gpu_types, nodes=inventory.nodes, running=(overdue, later)
    )
    # without the booking: the overdue end (now + 60) passes j2's end (5,000 s) at 4,940 s
    assert replay_still._next_overdue(snapshot, config, 1_000.0) == pytest.approx(4_940.0, abs=0.01)
    booked = dataclasses.replace(snapshot, bookings=(booking,))
    assert replay_still._next_overdue(booked, config, 1_000.0) == pytest.approx(1_340.0, abs=0.01)
    # with nothing overdue only a job passing its own estimate counts
    on_time = dataclasses.replace(booked, running=(later,))
    assert replay_still._next_overdue(on_time, config, 1_000.0) == pytest.approx(5_000.0, abs=0.01)


def test_the_order_is_kept_per_snapshot_not_per_instant() -> None:
    # two rounds can share an instant (an event the first caused): the second's order is its own
    inventory = parse_cluster_spec("4x1")
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=10)
    overlay = build_overlay(trace, OverlayConfig(), inventory=inventory)
    replay = Replay(trace, inventory, overlay, policy="easy", plan_fn=plan_round, seed=1)
    jobs = [JobRequest(id=f"j{i}", user="u", project="p", gpu_count=1, submit_at=float(i)) for i in range(3)]
    first = ClusterSnapshot(
        cluster="c", gpu_types=inventory.gpu_types, nodes=inventory.nodes, pending=tuple(jobs)
    )
    second = dataclasses.replace(first, pending=tuple(jobs[1:]))
    assert [job.id for job in replay._order_at(first, 100.0)] == ["j0", "j1", "j2"]
    assert [job.id for job in replay._order_at(second, 100.0)] == ["j1", "j2"]
