"""Still ticks under berth (`scheduling.sim.replay_still_berth`): the skipped ticks are the
no-op every tick is checked against (``verify_still_ticks``), the replay's results are those of
planning every tick, and each part of the rule is needed: without it some tick of the shipped
KTH sample is taken for still when its plan differs (real engine, no mocks)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from scheduling.engine import plan_round
from scheduling.sim import replay_still, replay_still_berth
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import OverlayConfig, build_overlay
from scheduling.sim.replay import Replay, ReplayOptions
from scheduling.sim.trace import load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"
_MECHANISM = {"rounds", "rounds_skipped", "round_ms_p99", "wall_s"}  # what may differ


def _replay(*, jobs: int, overlay_share: float, skip: bool = True, verify: bool = True) -> dict[str, Any]:
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=jobs)
    inventory = parse_cluster_spec("100x1")
    config = OverlayConfig(interactive_share=overlay_share, booking_share=overlay_share * 2 / 3, seed=1)
    overlay = build_overlay(trace, config, inventory=inventory)
    options = ReplayOptions(skip_still_ticks=skip, verify_still_ticks=verify)
    replay = Replay(trace, inventory, overlay, policy="berth", plan_fn=plan_round, options=options, seed=1)
    return compute_metrics(replay.run())


def test_berth_skips_still_ticks_and_changes_no_result() -> None:
    planned = _replay(jobs=600, overlay_share=0.15, skip=False, verify=False)
    skipped = _replay(jobs=600, overlay_share=0.15)  # every skipped tick planned and checked
    assert planned["rounds_skipped"] == 0
    assert skipped["rounds_skipped"] > 100
    assert skipped["rounds"] + skipped["rounds_skipped"] == planned["rounds"]
    assert {k: v for k, v in skipped.items() if k not in _MECHANISM} == {
        k: v for k, v in planned.items() if k not in _MECHANISM
    }


def test_reclaimable_work_bounds_the_stillness(monkeypatch: pytest.MonkeyPatch) -> None:
    # checkpointing work the top job may suspend once it passes its minimum runtime, or once its
    # predicted remaining time passes twice the top job's: without those instants some tick
    # taken for still preempts
    monkeypatch.setattr(replay_still_berth, "_reclaim_until", lambda *_args, **_kwargs: float("inf"))
    with pytest.raises(AssertionError, match="was not still"):
        _replay(jobs=2_000, overlay_share=0.15)


def test_a_fit_that_time_ends_is_a_threshold_under_berth(monkeypatch: pytest.MonkeyPatch) -> None:
    # without the instants at which a p50, p90, limit or lent run stops fitting before a hold
    # (the shadow, a booking, a pool hour), some tick is taken for still when its plan differs
    monkeypatch.setattr(replay_still_berth, "_durations", lambda *_args, **_kwargs: [])
    with pytest.raises(AssertionError, match="was not still"):
        _replay(jobs=2_000, overlay_share=0.15)


def test_the_thresholds_are_needed_under_berth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_still, "berth_until", lambda *_args, **_kwargs: float("inf"))
    with pytest.raises(AssertionError, match="was not still"):
        _replay(jobs=2_000, overlay_share=0.15)


def test_berths_order_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    # berth's slowdown order moves with every waiting job's wait (no overlay: batch only)
    # (the still order is the still round's own queue: taken as the tick's too, the order is
    # not compared)
    monkeypatch.setattr(replay_still.StillTickRule, "_order_at", lambda self, snapshot, t: self._still.order)
    with pytest.raises(AssertionError, match="was not still"):
        _replay(jobs=2_000, overlay_share=0.0)


def test_another_policy_object_is_not_still() -> None:
    # the replay rebuilds berth's policy from its forecast (the pool of the coming hours, the
    # headroom less what is booked): a tick under another policy is planned
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=200)
    inventory = parse_cluster_spec("100x1")
    overlay = build_overlay(trace, OverlayConfig(seed=1), inventory=inventory)
    replay = Replay(trace, inventory, overlay, policy="berth", plan_fn=plan_round, seed=1)
    snapshot = replay._snapshot(0.0)
    plan = replay._plan(snapshot, replay.config, 0.0)  # keeps its round for the still test
    replay._remember_still(snapshot, plan, 0.0, acted=False, free_gpus=100)
    assert replay._is_still(snapshot, 1.0)
    replay.config = dataclasses.replace(replay.config, interactive_headroom=(("*", 1),))
    assert not replay._is_still(snapshot, 1.0)
