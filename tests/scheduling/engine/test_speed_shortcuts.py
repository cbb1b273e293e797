"""The engine's exact shortcuts for long queues give the plans of the long way round.

* backfill candidates are admitted once per shape between two starts (`backfill.Admitted`), those
  with fewer free GPUs than they need are told so without a placement attempt, and the jobs
  behind the backfill window share one verdict (`backfill.backfill`);
* static's wide-job test is kept per job shape on the shared topology, per partition
  (`partition.open_span`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from scheduling.engine import plan_round
from scheduling.engine.stages import backfill
from scheduling.engine.stages.backfill_verdicts import explain_blocked
from scheduling.engine.types import (
    GpuType,
    JobKind,
    JobRequest,
    PendingReason,
    PolicyConfig,
    ProjectShare,
)
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

if TYPE_CHECKING:
    from scheduling.engine.round import Round

NOW = 10_000.0


def _long_way(rnd: Round, rest: Sequence[JobRequest]) -> None:
    """What `backfill.backfill` replaces: every candidate admitted, tried and explained in turn."""
    composition = rnd.composition
    admit = composition.admit
    reclaim = composition.reclaim
    scanned = 0
    depth = rnd.policy.backfill_depth
    for request in rest:
        if not admit(rnd, request):
            continue
        scanned += 1
        if scanned > depth:
            rnd.out.wait(
                request.id,
                PendingReason.PRIORITY,
                f"{depth} other jobs are considered first; it is beyond this round's backfill window.",
            )
            continue
        types = rnd.types_for(request)
        estimate = rnd.state.estimate(request)
        if composition.place.try_start(rnd, request, types, estimate):
            continue
        if request.id in rnd.out.verdicts:
            continue
        if (
            reclaim is not None
            and request.kind == JobKind.INTERACTIVE
            and reclaim.for_demand(
                rnd, request, types, estimate, single=rnd.is_single_node(types, request.gpu_count)
            )
        ):
            continue
        explain_blocked(rnd, request, types, estimate)


def _queue(rng: random.Random, count: int) -> list[JobRequest]:
    """Jobs of every kind admit can refuse: no such type, wider than the inventory, over the
    project's limit, plus plain ones and sessions, on several projects."""
    jobs = []
    for i in range(count):
        roll = rng.random()
        extra: dict[str, object] = {}
        if roll < 0.1:
            extra["gpu_type"] = "H100"  # not in the cluster
        elif roll < 0.2:
            extra["gpu_type"] = "V100"
        jobs.append(
            job(
                f"j{i}",
                rng.choice(
                    (1, 1, 2, 4, 8, 16, 40)
                ),  # 16: wider than static's batch side, 40: than the cluster
                submit_at=rng.uniform(0, NOW),
                project=rng.choice(("capped", "free", "guaranteed")),
                user=rng.choice(("a", "b", "c")),
                kind=JobKind.INTERACTIVE if rng.random() < 0.1 else JobKind.BATCH,
                is_preemptible=rng.random() < 0.5,
                is_checkpointable=rng.random() < 0.3,
                **extra,
            )
        )
    return jobs


@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
@pytest.mark.parametrize("seed", range(10))
def test_behind_the_window_matches_admitting_each_job(
    policy: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(4, 4) + make_nodes(2, 4, gpu_type="V100", first_gpu=16, prefix="v")
    busy = [running(job(f"r{i}", 2, project="capped"), (2 * i, 2 * i + 1)) for i in range(rng.randint(3, 7))]
    snap = snapshot(
        nodes,
        running_jobs=busy,
        pending=_queue(rng, 120),
        gpu_types=(GpuType(name="A100"), GpuType(name="V100")),
        projects=(
            ProjectShare(name="capped", borrow_limit=4),
            ProjectShare(name="guaranteed", guaranteed=(("A100", 2),), borrow_limit=2),
            ProjectShare(name="free"),
        ),
    )
    config = PolicyConfig(
        name=policy,
        backfill_depth=rng.choice((0, 1, 3, 10, 40, 1_000)),
        interactive_partition=("n0",) if policy == "static" else (),
        interactive_headroom=(("*", 2),) if policy == "berth" else (),
    )
    shortcut = plan_round(snap, config, NOW)
    monkeypatch.setattr(backfill, "backfill", _long_way)
    long_way = plan_round(snap, config, NOW)
    assert shortcut == long_way
    # the shortcuts had work to do: jobs refused by admit, blocked for want of free GPUs, and
    # (with a short window) behind the window
    assert {PendingReason.CONSTRAINT, PendingReason.QUOTA} <= {p.reason for p in long_way.pending}
    if config.backfill_depth >= 10:
        assert any(" are free; the next free GPUs go to" in p.sentence for p in long_way.pending)
    if config.backfill_depth < 40:
        assert any("backfill window" in p.sentence for p in long_way.pending)


def test_window_sentence_and_refusals_behind_the_window() -> None:
    """Behind the window each job keeps its own reason: admit's refusal, else the window's."""
    nodes = make_nodes(2, 2)
    pending = [
        job("top", 4, submit_at=0),
        job("seen", 1, submit_at=1, requested_s=600.0),
        job("behind", 1, submit_at=2),
        job("nowhere", 1, submit_at=3, gpu_type="H100"),
        job("too-wide", 9, submit_at=4),
        job("behind-2", 1, submit_at=5),
    ]
    snap = snapshot(nodes, running_jobs=[running(job("r", 1), (0,), started_at=NOW)], pending=pending)
    plan = plan_round(snap, PolicyConfig(name="easy", backfill_depth=1), NOW)
    by_id = {p.job_id: p for p in plan.pending}
    assert {s.job_id for s in plan.starts} == {"seen"}
    assert by_id["behind"].reason == PendingReason.PRIORITY
    assert "beyond this round's backfill window" in by_id["behind"].sentence
    assert "beyond this round's backfill window" in by_id["behind-2"].sentence
    assert by_id["nowhere"].reason == PendingReason.CONSTRAINT
    assert by_id["too-wide"].eta_p50_at is None
    assert "backfill window" not in by_id["too-wide"].sentence


def test_wide_jobs_follow_the_partition_on_one_inventory() -> None:
    """The wide-job memo is per partition: the same nodes with a smaller partition make a job
    no longer wide (it starts on the batch side alone), and back again."""
    nodes = make_nodes(4, 1)
    snap = snapshot(nodes, pending=[job("b", 3)])
    wide = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n0", "n1")), NOW)
    narrow = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n0",)), NOW)
    again = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n0", "n1")), NOW)
    # wider than the batch side (2 GPUs): as the head of the batch queue it spans both sides
    assert [s.gpu_ids for s in wide.starts] == [(0, 1, 2)]
    # 3 batch GPUs: not wide, so never on the partition's node
    assert [s.gpu_ids for s in narrow.starts] == [(1, 2, 3)]
    assert again.starts == wide.starts


def test_a_wide_job_behind_the_top_job_waits_for_the_head_of_the_queue() -> None:
    nodes = make_nodes(4, 1)
    pending = [
        job("head", 3, submit_at=0),
        job("next", 3, submit_at=1),
        job("wide", 3, submit_at=2),
        job("small", 1, submit_at=3),
        job("wide-2", 3, submit_at=4, user="v"),
    ]
    snap = snapshot(nodes, running_jobs=[running(job("r", 1), (3,), started_at=NOW)], pending=pending)
    plan = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n0", "n1")), NOW)
    by_id = {p.job_id: p for p in plan.pending}
    # the 3-GPU jobs are wider than the batch side (2 GPUs): the first spans both sides, the
    # next is the top job, the third waits for the head of the queue
    assert [s.job_id for s in plan.starts] == ["head"]
    assert by_id["next"].reason == PendingReason.RESOURCES
    assert "more than the batch partition has" in by_id["wide"].sentence
    assert "top job now: next" in by_id["wide"].sentence
    # the same verdict for the next wide job of that size (its ETA is its own)
    assert by_id["wide-2"].sentence.split(" Expected")[0] == by_id["wide"].sentence.split(" Expected")[0]
    # the 1-GPU job is not wide: it is explained as blocked, not refused as wide
    assert "more than the batch partition" not in by_id["small"].sentence
    assert "0 are free" in by_id["small"].sentence


@pytest.mark.parametrize("policy", ["easy", "berth"])
def test_a_start_in_backfill_brings_its_project_to_its_limit(policy: str) -> None:
    """Two backfill candidates of one shape from a project with a limit: the first start fills
    the limit, so the second is refused (what the project runs is in the memo's key), while a
    project without a limit shares one answer whatever it starts."""
    nodes = make_nodes(2, 4)
    busy = [running(job("r", 2, project="capped", requested_s=7_200.0), (0, 1), started_at=NOW - 60)]
    wide = job("wide", 8, project="other", submit_at=0.0, requested_s=3_600.0)
    small = [
        job(f"{project}{i}", 2, project=project, submit_at=100.0 + i, requested_s=60.0)
        for project in ("capped", "free")
        for i in range(2)
    ]
    snap = snapshot(
        nodes,
        running_jobs=busy,
        pending=[wide, *small],
        projects=(ProjectShare(name="capped", borrow_limit=4), ProjectShare(name="free")),
    )
    plan = plan_round(snap, PolicyConfig(name=policy), NOW)
    started = {start.job_id for start in plan.starts}
    assert "wide" not in started
    assert len(started & {"capped0", "capped1"}) == 1
    refused = next(p for p in plan.pending if p.job_id in {"capped0", "capped1"})
    assert refused.reason == PendingReason.QUOTA
    assert {"free0", "free1"} <= started
