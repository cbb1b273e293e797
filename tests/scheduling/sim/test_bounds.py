"""`busy_util_ceiling` is an upper bound on every policy's ``busy_utilization`` (its proof is in
`scheduling.sim.bounds`); the greedy packing estimate is not one."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from forecasting.core.runtime import HistoryRuntimePredictor
from scheduling.sim import bounds
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import OverlayConfig, build_overlay
from scheduling.sim.replay import Replay
from scheduling.sim.trace import Trace, TraceJob, load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"


def test_instant_fill_is_the_best_subset_sum() -> None:
    rng = random.Random(7)
    for _ in range(200):
        sizes = [rng.choice([1, 2, 3, 5, 8, 13, 40]) for _ in range(rng.randint(0, 7))]
        free = rng.randint(0, 50)
        best = max(
            (
                sum(c)
                for r in range(len(sizes) + 1)
                for c in itertools.combinations(sizes, r)
                if sum(c) <= free
            ),
            default=0,
        )
        assert bounds.instant_fill(free, Counter(sizes)) == best, (free, sizes)


def _replay_all(trace: Trace, spec: str, share: float, policies: tuple[str, ...]) -> dict[str, Any]:
    from scheduling.engine import plan_round

    inventory = parse_cluster_spec(spec)
    overlay = build_overlay(
        trace, OverlayConfig(interactive_share=share, booking_share=share * 0.6, seed=3), inventory=inventory
    )
    out: dict[str, Any] = {
        "packing": bounds.busy_util_packing(
            trace, overlay, capacity_by_type={inventory.nodes[0].gpu_type: inventory.capacity_gpus}
        )
    }
    for policy in policies:
        record = Replay(
            trace, inventory, overlay, policy=policy, plan_fn=plan_round, predictor=HistoryRuntimePredictor()
        ).run()
        out[policy] = compute_metrics(record)
    return out


@pytest.fixture(scope="module")
def kth() -> Trace:
    return load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=500)


@pytest.mark.parametrize(
    ("first", "count", "spec", "share"),
    [
        (0, 300, "100x1", 0.0),  # easy and berth both exceed the packing estimate here
        (300, 200, "100x1", 0.0),
        (0, 150, "64x1", 0.0),
        (0, 150, "100x1", 0.15),  # sessions and bookings
    ],
)
def test_every_policy_is_within_its_ceiling(
    kth: Trace, first: int, count: int, spec: str, share: float
) -> None:
    trace = dataclasses.replace(kth, jobs=kth.jobs[first : first + count])
    results = _replay_all(trace, spec, share, ("fifo", "easy", "static", "berth"))
    for policy in ("fifo", "easy", "static", "berth"):
        m = results[policy]
        assert 0.0 < m["busy_utilization"] <= m["busy_util_ceiling"] + 1e-9 <= 1.0 + 1e-9, policy
    if first == 0 and count == 300:
        # the old "ceiling" (greedy packing of the workload) was exceeded: it is an estimate
        assert max(results[p]["busy_utilization"] for p in ("easy", "berth")) > results["packing"]


def test_ceiling_separates_idle_no_waiting_job_fits() -> None:
    """Two GPUs: a 1-GPU job runs 1 h; a 2-GPU job arrives at 10 s and a 1-GPU 10 min job at
    20 s.  The idle GPU fits no waiting job but the small one, so the ceiling counts it exactly
    while the small one waits: easy backfills it and reaches its ceiling; fifo keeps it
    waiting behind the wide job and stays below."""
    from scheduling.engine import plan_round

    def job(i: int, submit: float, gpus: int, runtime: float) -> TraceJob:
        return TraceJob(f"j{i}", "u", "p", submit, runtime, gpus, None, runtime, "completed")

    trace = Trace(
        name="two",
        jobs=(job(0, 0.0, 1, 3600.0), job(1, 10.0, 2, 3600.0), job(2, 20.0, 1, 600.0)),
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=0.0,
    )
    inventory = parse_cluster_spec("2x1")
    overlay = build_overlay(trace, OverlayConfig(), inventory=inventory)
    metrics = {
        policy: compute_metrics(Replay(trace, inventory, overlay, policy=policy, plan_fn=plan_round).run())
        for policy in ("fifo", "easy")
    }
    easy, fifo = metrics["easy"], metrics["fifo"]
    # easy: j2 backfills at once; while j1 waits alone the idle GPU fits nothing
    assert easy["busy_utilization"] == pytest.approx(easy["busy_util_ceiling"])
    assert easy["busy_utilization"] == pytest.approx((10 + 600 * 2 + 2980) / (2 * 3590))
    # fifo: j2 waits until j1 is done; over [20 s, 1 h) one idle GPU would have fitted it
    assert fifo["busy_utilization"] == pytest.approx((3590 + 3600 * 2) / (2 * 7190))
    assert fifo["busy_util_ceiling"] == pytest.approx((10 + 3580 * 2 + 3600 * 2) / (2 * 7190))
