"""Batch-still rounds (`scheduling.sim.replay_sides`): under static a round whose batch side
would plan what the last full round planned there plans only the interactive partition, and the
replay's results are the same as when every round is planned in full (shipped KTH sample with
the overlay: sessions, bookings on either side, static's partition; real engine)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from scheduling.engine import plan_round
from scheduling.engine.types import ClusterSnapshot, JobRequest, PolicyConfig
from scheduling.sim import replay_sides
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import OverlayConfig, build_overlay
from scheduling.sim.replay import Replay, ReplayOptions
from scheduling.sim.trace import load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"
_MECHANISM = {"round_ms_p99", "wall_s"}  # what may differ
_COUNTS = {"rounds", "rounds_skipped"}  # planned rounds and still ticks (none without skipping)


def _replay(
    policy: str = "static", *, skip: bool = True, verify: bool = False, cluster: str = "100x1"
) -> tuple[dict[str, Any], Replay]:
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=600)
    inventory = parse_cluster_spec(cluster)
    overlay = build_overlay(
        trace, OverlayConfig(interactive_share=0.15, booking_share=0.10, seed=1), inventory=inventory
    )
    options = ReplayOptions(skip_still_ticks=skip, verify_still_ticks=verify)
    replay = Replay(trace, inventory, overlay, policy=policy, plan_fn=plan_round, options=options, seed=1)
    return compute_metrics(replay.run()), replay


def test_batch_still_rounds_change_no_result() -> None:
    full, planned = _replay(skip=False)
    split, replay = _replay(verify=True)  # verify: every split round planned in full and compared
    assert planned._rounds_split == 0
    assert replay._rounds_split > 1_000  # a third of this workload's rounds
    # split rounds are planned rounds: the same ticks are still as without splitting
    still, _ = _replay()
    assert still["rounds_skipped"] > 0
    assert split["rounds"] + split["rounds_skipped"] == full["rounds"]
    assert {k: v for k, v in split.items() if k not in _MECHANISM} == {
        k: v for k, v in still.items() if k not in _MECHANISM
    }
    assert {k: v for k, v in split.items() if k not in _MECHANISM | _COUNTS} == {
        k: v for k, v in full.items() if k not in _MECHANISM | _COUNTS
    }


def _without(monkeypatch: pytest.MonkeyPatch, test: str) -> None:
    """Take one test out of `_is_batch_still` (the others stay)."""
    original = replay_sides.BatchSideRule._is_batch_still

    def relaxed(self: Any, side: Any, snapshot: ClusterSnapshot, t: float) -> bool:
        if original(self, side, snapshot, t):
            return True
        if side.until == -math.inf and test != "overdue":
            return False
        if t >= side.until and test not in ("thresholds", "overdue"):
            return False
        if sum(self._batch_widths.values()) != side.count and test != "count":
            return False
        running = tuple(r for r in snapshot.running if r.job.kind == replay_sides._BATCH)
        if running != side.running and test != "running":
            return False
        bookings = replay_sides._batch_bookings(snapshot, self._partition_gpus)
        return bookings == side.bookings or test == "bookings"

    monkeypatch.setattr(replay_sides.BatchSideRule, "_is_batch_still", relaxed)


@pytest.mark.parametrize("test", ["order", "count", "running", "bookings", "thresholds", "overdue"])
def test_each_part_of_the_batch_still_test_is_needed(monkeypatch: pytest.MonkeyPatch, test: str) -> None:
    # without any one of them some round of this workload is split when its batch side would
    # plan differently (a start, another reservation or other idle reasons), and verify says so
    _without(monkeypatch, test)
    with pytest.raises(AssertionError, match="batch-still round"):
        _replay(verify=True)


def test_only_static_on_single_gpu_nodes_of_one_type_splits() -> None:
    assert _replay("easy")[1]._rounds_split == 0
    assert _replay("berth")[1]._rounds_split == 0
    assert _replay(cluster="50x2")[1]._rounds_split == 0  # a session could wait on fragments
    assert _replay(skip=False)[1]._rounds_split == 0  # `--still-ticks plan`: every round in full


def test_the_order_is_kept_per_snapshot_not_per_instant() -> None:
    # two rounds can share an instant (an event the first caused); the second's order is its own
    _result, replay = _replay(skip=False)
    inventory = parse_cluster_spec("4x1")
    jobs = [JobRequest(id=f"j{i}", user="u", project="p", gpu_count=1, submit_at=float(i)) for i in range(3)]
    first = ClusterSnapshot(
        cluster="c", gpu_types=inventory.gpu_types, nodes=inventory.nodes, pending=tuple(jobs)
    )
    second = ClusterSnapshot(
        cluster="c", gpu_types=inventory.gpu_types, nodes=inventory.nodes, pending=tuple(jobs[1:])
    )
    replay.config = PolicyConfig(name="static")
    assert [j.id for j in replay._order_at(first, 100.0)] == ["j0", "j1", "j2"]
    assert [j.id for j in replay._order_at(second, 100.0)] == ["j1", "j2"]
