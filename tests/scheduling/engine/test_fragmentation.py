"""Berth's fragmentation-aware node choice (engine/fragmentation.py) and --arrival-scale."""

from __future__ import annotations

import pytest

from scheduling.engine import plan_round
from scheduling.engine.fragmentation import cost_class
from scheduling.engine.types import GpuType, IdleReason, Plan, PolicyConfig, RunningJob
from scheduling.sim.arrivals import scale_arrivals
from scheduling.sim.trace import Trace, TraceJob
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0


def started(plan: Plan) -> dict[str, tuple[int, ...]]:
    return {s.job_id: s.gpu_ids for s in plan.starts}


def test_berth_puts_a_small_job_on_the_partly_used_node_and_keeps_the_empty_one_whole() -> None:
    nodes = make_nodes(2, 8)  # GPUs 0-7 and 8-15
    busy = [running(job("long", 2, requested_s=10 * 86_400.0), (8, 9), started_at=NOW - 3_600.0)]
    snap = snapshot(nodes, running_jobs=busy, pending=[job("one", 1)])
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    assert started(plan)["one"][0] in range(10, 16)


def test_berth_keeps_a_whole_node_for_the_wide_job_queued_behind_small_ones() -> None:
    nodes = make_nodes(2, 8)
    busy = [running(job("long", 4, requested_s=10 * 86_400.0), (8, 9, 10, 11), started_at=NOW - 60.0)]
    pending = [job("one", 1), job("two", 2, submit_at=1.0), job("eight", 8, submit_at=2.0)]
    plan = plan_round(snapshot(nodes, running_jobs=busy, pending=pending), PolicyConfig(name="berth"), NOW)
    gpus = started(plan)
    assert gpus["eight"] == tuple(range(8))
    assert all(g >= 12 for g in gpus["one"] + gpus["two"])


def test_berth_breaks_no_empty_node_of_a_cheap_type_while_a_partly_used_node_fits() -> None:
    cheap = make_nodes(1, 8, gpu_type="T4")
    dear = make_nodes(1, 8, gpu_type="A100", first_gpu=8, prefix="m")
    types = [GpuType(name="T4", value=0.2), GpuType(name="A100", value=1.0)]
    busy = [running(job("long", 4, requested_s=10 * 86_400.0), (8, 9, 10, 11), started_at=NOW - 60.0)]
    snap = snapshot(cheap + dear, running_jobs=busy, pending=[job("one", 1)], gpu_types=types)
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    assert started(plan)["one"][0] in range(12, 16)


def test_berth_puts_short_work_on_the_node_pinned_by_long_work_not_the_one_about_to_drain() -> None:
    nodes = make_nodes(2, 8)
    pinned = job(
        "pinned", 1, requested_s=30 * 86_400.0, predicted_p50_s=20 * 86_400.0, predicted_p90_s=25 * 86_400.0
    )
    ending = job("ending", 1, requested_s=3_600.0, predicted_p50_s=3_000.0, predicted_p90_s=3_500.0)
    busy = [running(ending, (0,), started_at=NOW - 2_900.0), running(pinned, (8,), started_at=NOW - 86_400.0)]
    short = job("short", 1, requested_s=7_200.0, predicted_p50_s=3_600.0, predicted_p90_s=7_000.0)
    plan = plan_round(snapshot(nodes, running_jobs=busy, pending=[short]), PolicyConfig(name="berth"), NOW)
    assert started(plan)["short"][0] in range(9, 16)
    # easy is plain best fit (the two nodes tie), unchanged by berth's drain awareness
    easy = plan_round(snapshot(nodes, running_jobs=busy, pending=[short]), PolicyConfig(name="easy"), NOW)
    assert len(started(easy)["short"]) == 1


def test_cost_classes_are_monotone_and_zero_only_without_cost() -> None:
    assert cost_class(0.0) == 0
    assert cost_class(-5.0) == 0
    values = [1.0, 3_600.0, 7_200.0, 36_000.0, 3_600.0 * 1_000]
    classes = [cost_class(v) for v in values]
    assert classes == sorted(classes)
    assert all(c >= 1 for c in classes)


def _trace(submits: list[float]) -> Trace:
    jobs = tuple(
        TraceJob(
            id=f"j{i}",
            user="u",
            project="p",
            submit_at=at,
            runtime_s=100.0 + i,
            gpu_count=1 + i % 2,
            gpu_type=None,
            requested_s=None,
            status="completed",
        )
        for i, at in enumerate(submits)
    )
    return Trace(name="t", jobs=jobs, skipped_no_runtime=0, skipped_no_gpus=0, week_phase_s=0.0)


def test_arrival_scale_divides_the_gaps_and_keeps_everything_else() -> None:
    trace = _trace([0.0, 100.0, 400.0, 1_000.0])
    fast = scale_arrivals(trace, 4.0)
    assert [j.submit_at for j in fast.jobs] == [0.0, 25.0, 100.0, 250.0]
    for before, after in zip(trace.jobs, fast.jobs, strict=True):
        assert (before.id, before.runtime_s, before.gpu_count) == (after.id, after.runtime_s, after.gpu_count)
    assert scale_arrivals(trace, 1.0) is trace
    with pytest.raises(ValueError, match="arrival scale"):
        scale_arrivals(trace, 0.0)


def test_berth_starts_preemptible_work_that_pins_a_node_lent_and_keeps_fixed_work_together() -> None:
    nodes = make_nodes(2, 8)
    fixed = running(job("fixed", 1, requested_s=86_400.0), (0,), started_at=NOW - 600.0)
    pending = [job("lendable", 1, is_preemptible=True), job("fixed2", 1, submit_at=1.0)]
    plan = plan_round(snapshot(nodes, running_jobs=[fixed], pending=pending), PolicyConfig(name="berth"), NOW)
    starts = {s.job_id: s for s in plan.starts}
    assert starts["fixed2"].gpu_ids[0] in range(1, 8)  # with the other non-preemptible work
    assert starts["lendable"].is_preemptible  # it delays some node's drain: lent
    # easy never lends
    easy = plan_round(snapshot(nodes, running_jobs=[fixed], pending=pending), PolicyConfig(name="easy"), NOW)
    assert not any(s.is_preemptible for s in easy.starts)


def _fixed_and_lent(lent_id: str) -> tuple[RunningJob, RunningJob]:
    """Two nodes' month-long work, a day old: a non-preemptible job on GPU 0 and a lent
    (preemptible) one on GPU 8, so each node has 7 free GPUs and a wide job must reclaim."""
    fixed = running(job("fixed", 1, requested_s=30 * 86_400.0), (0,), started_at=NOW - 86_400.0)
    lent = running(
        job(lent_id, 1, requested_s=30 * 86_400.0, is_preemptible=True),
        (8,),
        started_at=NOW - 86_400.0,
        is_preemptible=True,
    )
    return fixed, lent


def test_berth_wide_job_reclaims_lent_work_past_its_minimum_runtime_only() -> None:
    nodes = make_nodes(2, 8)
    fixed, lent_old = _fixed_and_lent("lent-old")
    wide = job("wide", 8, submit_at=NOW - 60.0)
    snap = snapshot(nodes, running_jobs=[fixed, lent_old], pending=[wide])
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    assert [p.job_id for p in plan.preemptions] == ["lent-old"]
    (preemption,) = plan.preemptions
    assert preemption.for_id == "wide"
    assert preemption.kill_at >= NOW + PolicyConfig().grace_s
    # a young lent job is not taken before its minimum runtime; non-preemptible work never
    young = running(lent_old.job, (8,), started_at=NOW - 10.0, is_preemptible=True)
    plan = plan_round(
        snapshot(nodes, running_jobs=[fixed, young], pending=[wide]), PolicyConfig(name="berth"), NOW
    )
    assert plan.preemptions == ()
    # easy never preempts
    assert plan_round(snap, PolicyConfig(name="easy"), NOW).preemptions == ()


def test_berth_wide_job_reclaims_no_lent_work_while_a_smaller_job_could_use_the_free_gpus() -> None:
    # the free GPUs next to the lent job would not idle until the node drains: the small job
    # waiting behind the wide one takes one of them, so nothing is worth evicting
    nodes = make_nodes(2, 8)
    fixed, lent = _fixed_and_lent("lent")
    wide = job("wide", 8, submit_at=NOW - 60.0)
    small = job("small", 1, submit_at=NOW - 30.0, requested_s=30 * 86_400.0)
    policy = PolicyConfig(name="berth")
    plan = plan_round(snapshot(nodes, running_jobs=[fixed, lent], pending=[wide, small]), policy, NOW)
    assert plan.preemptions == ()
    assert "small" in started(plan)
    # a small job that needs another GPU type, or one as wide as the wide job, is no reason
    typed = job("typed", 1, submit_at=NOW - 30.0, gpu_type="H100")
    as_wide = job("as-wide", 8, submit_at=NOW - 30.0)
    for other in (typed, as_wide):
        plan = plan_round(snapshot(nodes, running_jobs=[fixed, lent], pending=[wide, other]), policy, NOW)
        assert [(p.job_id, p.for_id) for p in plan.preemptions] == [("lent", "wide")]


def test_berth_wide_job_reclaims_while_the_smaller_job_cannot_use_the_free_gpus() -> None:
    # the free GPUs are A100s (40 GiB); the small jobs behind the wide one need a T4, whose
    # node is full of work that cannot be taken, or 80 GiB of memory: the free GPUs would
    # idle until the node drains, so the lent job is reclaimed for the wide one
    a100 = make_nodes(2, 8)
    t4 = make_nodes(1, 8, gpu_type="T4", first_gpu=16, prefix="t")
    types = [GpuType(name="A100", memory_gib=40.0), GpuType(name="T4", memory_gib=16.0, value=0.2)]
    fixed, lent = _fixed_and_lent("lent")
    month = job("t4-full", 8, requested_s=30 * 86_400.0)
    full = running(month, tuple(range(16, 24)), started_at=NOW - 86_400.0)
    wide = job("wide", 8, submit_at=NOW - 60.0)
    needs_t4 = job("needs-t4", 1, submit_at=NOW - 30.0, gpu_type="T4")
    needs_memory = job("needs-80g", 1, submit_at=NOW - 30.0, min_memory_gib=80.0)
    policy = PolicyConfig(name="berth")
    for other in (needs_t4, needs_memory):
        snap = snapshot(a100 + t4, running_jobs=[fixed, lent, full], pending=[wide, other], gpu_types=types)
        plan = plan_round(snap, policy, NOW)
        assert [(p.job_id, p.for_id) for p in plan.preemptions] == [("lent", "wide")], other.id
    # a small job the free A100s do suit is still a reason not to reclaim
    fits = job("fits", 1, submit_at=NOW - 30.0, min_memory_gib=32.0)
    snap = snapshot(a100 + t4, running_jobs=[fixed, lent, full], pending=[wide, fits], gpu_types=types)
    assert plan_round(snap, policy, NOW).preemptions == ()


def test_idle_gpus_are_fragmentation_only_while_enough_gpus_stay_free_in_total() -> None:
    nodes = make_nodes(2, 8)
    soon = running(job("soon", 1, requested_s=3_600.0), (0,), started_at=NOW)
    late = running(job("late", 7, requested_s=36_000.0), tuple(range(8, 15)), started_at=NOW)
    wide = job("wide", 8)
    # 8 GPUs free in total but at most 7 on one node: fragmentation
    plan = plan_round(
        snapshot(nodes, running_jobs=[soon, late], pending=[wide]), PolicyConfig(name="easy"), NOW
    )
    assert {reason for _gpu, reason in plan.idle} == {IdleReason.FRAGMENTATION}
    # a long job backfills onto GPU 15: 7 GPUs are left, held for the wide job, which now waits
    # for resources, so they are reserved, not fragmented
    filler = job("filler", 1, submit_at=1.0, requested_s=18_000.0)
    snap = snapshot(nodes, running_jobs=[soon, late], pending=[wide, filler])
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert started(plan) == {"filler": (15,)}
    assert dict(plan.idle) == dict.fromkeys(range(1, 8), IdleReason.RESERVED_UNUSED)
