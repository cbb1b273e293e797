"""The v2 overlay and its parts: admission, calendar sessions, restore cost, shared usage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scheduling import admission, inputs
from scheduling.backends.simulator import SimulatorBackend, TransitionKind
from scheduling.engine.types import Node, Plan, PreemptAction, StartAction
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.overlays import OverlayConfig, build_overlay
from scheduling.sim.trace import load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"


def test_peak_and_cap_refuse_what_the_portal_refuses() -> None:
    windows = [(0.0, 10.0, 2), (5.0, 15.0, 3), (10.0, 20.0, 1)]
    assert admission.peak_concurrent(windows, start_at=0.0, end_at=20.0) == 5
    assert admission.peak_concurrent(windows, start_at=10.0, end_at=20.0) == 4  # [0,10) ended
    assert admission.booking_cap_error(project="p", gpu_type="A", max_gpus=6, peak=5, gpu_count=1) is None
    assert "at most 6" in admission.booking_cap_error(
        project="p", gpu_type="A", max_gpus=6, peak=5, gpu_count=2
    )


def test_admitted_bookings_never_share_a_gpu_or_pass_the_cap() -> None:
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=300)
    inventory = parse_cluster_spec("8x1")
    overlay = build_overlay(trace, OverlayConfig(booking_share=0.5, seed=3), inventory=inventory)
    assert overlay.bookings
    assert overlay.bookings_refused > 0
    for i, a in enumerate(overlay.bookings):
        assert len(a.gpu_ids) == a.gpu_count
        for b in overlay.bookings[i + 1 :]:
            if a.start_at < b.end_at and b.start_at < a.end_at:
                assert not set(a.gpu_ids) & set(b.gpu_ids)
    cap = {p.name: p.booking_cap for p in overlay.projects}
    for b in overlay.bookings:
        mine = [(o.start_at, o.end_at, o.gpu_count) for o in overlay.bookings if o.project == b.project]
        assert admission.peak_concurrent(mine, start_at=b.start_at, end_at=b.end_at) <= cap[b.project]


def test_sessions_do_not_follow_batch_submissions() -> None:
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=300)
    # The same jobs, all submitted in the first hour except the last one (same span, same GPU-h).
    last = trace.jobs[-1].submit_at
    bunched = dataclasses.replace(
        trace,
        jobs=(
            *tuple(dataclasses.replace(j, submit_at=min(j.submit_at, 3600.0)) for j in trace.jobs[:-1]),
            trace.jobs[-1],
        ),
    )
    assert max(j.submit_at for j in bunched.jobs) == last
    config = OverlayConfig(interactive_share=0.2, seed=4)
    a = build_overlay(trace, config)
    b = build_overlay(bunched, config)
    assert [s.submit_at for s in a.sessions] == [s.submit_at for s in b.sessions]


def test_a_resume_from_a_checkpoint_pays_the_restore_time() -> None:
    backend = SimulatorBackend((Node(id="n0", gpu_type="A", gpu_ids=(0,)),), strict=True)
    backend.register("j", work_s=4_000.0, is_preemptible=True, checkpoint_interval_s=1_000.0, restore_s=120.0)
    backend.apply(Plan(starts=(StartAction("j", (0,), ("n0",), True, 4_000.0),)))
    backend.apply(Plan(preemptions=(PreemptAction("j", 2_500.0, 2_500.0, "test"),)))
    (killed,) = backend.advance_to(2_500.0)
    assert killed.kind == TransitionKind.PREEMPTED
    assert killed.saved_s == 2_500.0
    backend.apply(Plan(starts=(StartAction("j", (0,), ("n0",), True, 1_500.0),)))
    (done,) = backend.advance_to(10_000.0)
    assert done.kind == TransitionKind.COMPLETED
    assert done.at == pytest.approx(2_500.0 + 120.0 + 1_500.0)
    assert done.lost_s == pytest.approx(120.0)
    assert done.saved_s == pytest.approx(1_500.0)


def test_the_ledger_the_replay_keeps_equals_the_portal_sum() -> None:
    runs = [("a", 2.0, 0.0, 3_600.0), ("b", 1.0, 1_000.0, 90_000.0), ("a", 4.0, 50_000.0, None)]
    now, half_life = 100_000.0, 7 * 86_400.0
    ledger = inputs.UsageLedger(half_life_s=half_life)
    for project, value, start, end in sorted(runs[:2], key=lambda r: r[3]):
        ledger.add(project, gpu_value=value, start_at=start, end_at=end)
    incremental = ledger.usage_at(now, running=[("a", 4.0, 50_000.0)])
    assert incremental == pytest.approx(inputs.project_usage(runs, now=now, half_life_s=half_life))
    fresh = 2.0 * 1.0 + 4.0 * (50_000.0 / 3_600.0)
    assert fresh * 0.9 < incremental["a"] < fresh  # decayed, but by less than 10 % in about a day
