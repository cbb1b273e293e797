"""Unit tests of the policies' semantics on small hand-built clusters (no database)."""

from __future__ import annotations

import dataclasses

import pytest

from scheduling.engine import plan_round
from scheduling.engine.policies.berth import BERTH
from scheduling.engine.round import Round
from scheduling.engine.types import (
    Booking,
    GpuType,
    IdleReason,
    JobKind,
    JobRequest,
    Node,
    NodeStatus,
    PendingReason,
    Plan,
    PolicyConfig,
    ProjectShare,
    RunningJob,
)
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 10_000.0


def started(plan: Plan) -> dict[str, tuple[int, ...]]:
    return {s.job_id: s.gpu_ids for s in plan.starts}


def reason_of(plan: Plan, job_id: str) -> PendingReason:
    (explanation,) = [e for e in plan.pending if e.job_id == job_id]
    return explanation.reason


# ---- fifo ----


def test_fifo_stops_at_the_first_job_that_does_not_fit() -> None:
    nodes = make_nodes(4, 1)
    busy = running(job("r", 2, requested_s=1_000), (0, 1), started_at=NOW - 100)
    snap = snapshot(
        nodes,
        running_jobs=[busy],
        pending=[job("big", 4, submit_at=1), job("small", 1, submit_at=2, requested_s=10)],
    )
    plan = plan_round(snap, PolicyConfig(name="fifo"), NOW)
    assert plan.starts == ()
    assert reason_of(plan, "small") == PendingReason.PRIORITY
    # easy backfills the short job around the same head job
    easy = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert "small" in started(easy)


# ---- EASY ----


def _easy_case(backfill_s: float) -> Plan:
    # 4 single-GPU nodes; two GPUs busy until NOW + 900 (user estimate); the top job needs all 4.
    nodes = make_nodes(4, 1)
    busy = running(job("r", 2, requested_s=1_000), (0, 1), started_at=NOW - 100)
    snap = snapshot(
        nodes,
        running_jobs=[busy],
        pending=[
            job("top", 4, submit_at=0, requested_s=3_600),
            job("candidate", 2, submit_at=5, requested_s=backfill_s),
        ],
    )
    return plan_round(snap, PolicyConfig(name="easy"), NOW)


def test_easy_backfills_a_job_that_ends_before_the_shadow_time() -> None:
    plan = _easy_case(backfill_s=600)
    assert started(plan) == {"candidate": (2, 3)}
    (reservation,) = [r for r in plan.reservations if r.holder_id == "top"]
    assert reservation.start_at == pytest.approx(NOW + 900)
    assert reservation.gpu_ids == (0, 1, 2, 3)
    assert max(s.expected_end_at for s in plan.starts) <= reservation.start_at


def test_easy_does_not_backfill_a_job_that_would_delay_the_top_job() -> None:
    plan = _easy_case(backfill_s=1_200)
    assert plan.starts == ()
    assert reason_of(plan, "candidate") == PendingReason.RESERVATION
    assert reason_of(plan, "top") == PendingReason.RESOURCES
    idle = dict(plan.idle)
    assert idle[2] == idle[3] == IdleReason.RESERVED_UNUSED


def test_easy_backfills_long_work_on_gpus_the_top_job_does_not_need() -> None:
    nodes = make_nodes(8, 1)
    busy = running(job("r", 3, requested_s=1_000), (0, 1, 2), started_at=NOW - 100)
    snap = snapshot(
        nodes,
        running_jobs=[busy],
        pending=[job("top", 6, submit_at=0), job("long", 2, submit_at=5, requested_s=100_000)],
    )
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    # at the shadow time 8 GPUs are free and the top job needs 6: two free ones are "extra"
    assert "long" in started(plan)
    (reservation,) = [r for r in plan.reservations if r.holder_id == "top"]
    assert not set(started(plan)["long"]) & set(reservation.gpu_ids)


def test_easy_sees_an_overdue_job_as_ending_soon_and_never_preempts() -> None:
    nodes = make_nodes(2, 1)
    overdue = running(job("r", 1, requested_s=100, is_preemptible=True), (0,), started_at=NOW - 1_000)
    snap = snapshot(nodes, running_jobs=[overdue], pending=[job("top", 2), job("c", 1, submit_at=1)])
    policy = PolicyConfig(name="easy", overdue_epsilon_s=60)
    plan = plan_round(snap, policy, NOW)
    (reservation,) = [r for r in plan.reservations if r.holder_id == "top"]
    assert reservation.start_at == pytest.approx(NOW + 60)
    assert plan.preemptions == ()
    assert "c" not in started(plan)  # a one-hour job would delay the top job


# ---- placement ----


def test_placement_is_best_fit_and_keeps_whole_nodes_for_big_jobs() -> None:
    nodes = make_nodes(3, 4)
    # node 0: 1 free, node 1: 4 free, node 2: 2 free
    busy = [
        running(job("a", 3), (0, 1, 2)),
        running(job("b", 2), (8, 9)),
    ]
    snap = snapshot(nodes, running_jobs=busy, pending=[job("one", 1), job("two", 2, submit_at=1)])
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert started(plan)["one"] == (3,)
    assert started(plan)["two"] == (10, 11)


def test_gang_is_all_or_nothing_on_one_node() -> None:
    nodes = make_nodes(2, 4)
    busy = [running(job("a", 2), (0, 1)), running(job("b", 2), (4, 5))]
    snap = snapshot(nodes, running_jobs=busy, pending=[job("three", 3)])
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert plan.starts == ()
    assert reason_of(plan, "three") == PendingReason.FRAGMENTATION  # 4 free, never 3 on one node
    fifo_idle = dict(plan_round(snap, PolicyConfig(name="berth"), NOW).idle)
    assert set(fifo_idle) == {2, 3, 6, 7}


def test_large_job_spans_whole_nodes() -> None:
    nodes = make_nodes(3, 4)
    snap = snapshot(nodes, running_jobs=[running(job("a", 1), (0,))], pending=[job("eight", 8)])
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert started(plan)["eight"] == tuple(range(4, 12))
    assert set(plan.starts[0].node_ids) == {"n1", "n2"}


def test_type_memory_and_precision_constraints() -> None:
    types = (
        GpuType("T4", memory_gib=16, precisions=frozenset({"fp16", "fp32"}), value=0.3),
        GpuType("H100", memory_gib=80, precisions=frozenset({"fp8", "bf16", "fp16", "fp32"}), value=3.0),
    )
    nodes = make_nodes(1, 2, gpu_type="T4") + make_nodes(1, 2, gpu_type="H100", first_gpu=2, prefix="h")
    snap = snapshot(
        nodes,
        gpu_types=types,
        pending=[
            job("fp8", 1, precisions=frozenset({"fp8"})),
            job("mem", 1, submit_at=1, min_memory_gib=40),
            job("any", 1, submit_at=2),
            job("nowhere", 1, submit_at=3, min_memory_gib=200),
        ],
    )
    for name in ("easy", "berth"):
        plan = plan_round(snap, PolicyConfig(name=name), NOW)
        gpus = started(plan)
        assert set(gpus["fp8"]) <= {2, 3}
        assert set(gpus["mem"]) <= {2, 3}
        assert reason_of(plan, "nowhere") == PendingReason.CONSTRAINT
    # berth keeps the valuable H100s for jobs that need them: "any" goes to a T4
    assert set(started(plan_round(snap, PolicyConfig(name="berth"), NOW))["any"]) <= {0, 1}


# ---- fair share and priority ----


def test_fair_share_orders_the_light_project_first() -> None:
    nodes = make_nodes(1, 1)
    projects = (ProjectShare("heavy", decayed_usage=1_000.0), ProjectShare("light", decayed_usage=10.0))
    snap = snapshot(
        nodes,
        pending=[job("h", 1, project="heavy", submit_at=0), job("l", 1, project="light", submit_at=50)],
        projects=projects,
    )
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert list(started(plan)) == ["l"]
    # with weights the heavy project may be entitled to more: weight 1000x flips the order
    weighted = (ProjectShare("heavy", weight=1_000.0, decayed_usage=1_000.0), projects[1])
    plan = plan_round(
        snapshot(nodes, pending=snap.pending, projects=weighted), PolicyConfig(name="easy"), NOW
    )
    assert list(started(plan)) == ["h"]


def test_interactive_sessions_go_first_without_preemption_in_easy() -> None:
    nodes = make_nodes(2, 1)
    lent = running(job("lent", 1, is_preemptible=True), (0,), started_at=0.0, is_preemptible=True)
    snap = snapshot(
        nodes,
        running_jobs=[lent],
        pending=[job("batch", 1, submit_at=0), job("session", 2, submit_at=100, kind=JobKind.INTERACTIVE)],
    )
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert plan.preemptions == ()
    assert plan.starts == ()  # the batch job would delay the session's reservation (1 h vs 1 h)
    assert reason_of(plan, "session") == PendingReason.RESOURCES


# ---- berth: lending and reclaim ----


def test_berth_interactive_session_reclaims_lent_work_losing_least() -> None:
    nodes = make_nodes(1, 2)
    old = running(job("old", 1, is_preemptible=True), (0,), started_at=NOW - 5_000, is_preemptible=True)
    young = running(job("young", 1, is_preemptible=True), (1,), started_at=NOW - 600, is_preemptible=True)
    snap = snapshot(nodes, running_jobs=[old, young], pending=[job("s", 1, kind=JobKind.INTERACTIVE)])
    policy = PolicyConfig(name="berth", grace_s=30, min_runtime_s=300)
    plan = plan_round(snap, policy, NOW)
    (preemption,) = plan.preemptions
    assert preemption.job_id == "young"
    assert preemption.for_id == "s"
    assert preemption.kill_at == pytest.approx(NOW + 30)
    assert reason_of(plan, "s") == PendingReason.PREEMPTING
    # a checkpointed job loses less than the young one: it goes first
    ckpt = running(
        job("ckpt", 1, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=1_000),
        (0,),
        started_at=NOW - 5_100,
        is_preemptible=True,
    )
    plan = plan_round(snapshot(nodes, running_jobs=[ckpt, young], pending=snap.pending), policy, NOW)
    assert [p.job_id for p in plan.preemptions] == ["ckpt"]


def test_berth_never_preempts_non_preemptible_work_or_jobs_in_grace() -> None:
    nodes = make_nodes(1, 2)
    solid = running(job("solid", 1), (0,), started_at=0.0)
    leaving = running(job("leaving", 1, is_preemptible=True), (1,), started_at=0.0, is_preemptible=True)
    leaving = type(leaving)(
        job=leaving.job, gpu_ids=leaving.gpu_ids, started_at=0.0, is_preemptible=True, grace_until=NOW + 20
    )
    snap = snapshot(nodes, running_jobs=[solid, leaving], pending=[job("s", 1, kind=JobKind.INTERACTIVE)])
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    assert plan.preemptions == ()
    assert reason_of(plan, "s") == PendingReason.PREEMPTING  # waits for the GPU already in grace


def test_berth_respects_the_minimum_runtime() -> None:
    """A session waits at most the grace (its minimum runtime is capped by it); a batch top job
    never suspends work inside the (longer) batch minimum runtime."""
    nodes = make_nodes(1, 1)
    fresh = running(job("fresh", 1, is_preemptible=True), (0,), started_at=NOW - 10, is_preemptible=True)
    snap = snapshot(nodes, running_jobs=[fresh], pending=[job("s", 1, kind=JobKind.INTERACTIVE)])
    plan = plan_round(snap, PolicyConfig(name="berth", min_runtime_s=300, grace_s=30), NOW)
    (preemption,) = plan.preemptions
    assert preemption.kill_at == pytest.approx(NOW + 30)
    # grace shorter than the time since the start: the session's minimum runtime is the grace
    plan = plan_round(snap, PolicyConfig(name="berth", min_runtime_s=300, grace_s=5), NOW)
    (preemption,) = plan.preemptions
    assert preemption.kill_at == pytest.approx(NOW + 5)
    young = job(
        "young", 1, requested_s=50_000, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=600
    )
    batch = snapshot(
        nodes,
        running_jobs=[running(young, (0,), started_at=NOW - 100)],
        pending=[job("top", 1, submit_at=NOW - 3_000, requested_s=600)],
    )
    assert plan_round(batch, PolicyConfig(name="berth", min_runtime_s=300, grace_s=30), NOW).preemptions == ()


def test_berth_lends_the_top_jobs_reservation_to_preemptible_work() -> None:
    nodes = make_nodes(4, 1)
    busy = running(job("r", 2, requested_s=10_000), (0, 1), started_at=NOW - 100)
    pending = [
        job("top", 4, submit_at=0, requested_s=3_600),
        job("lendable", 2, submit_at=5, requested_s=20_000, is_preemptible=True, is_checkpointable=True),
        job("solid", 2, submit_at=6, requested_s=20_000),
    ]
    snap = snapshot(nodes, running_jobs=[busy], pending=pending)
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    (start,) = plan.starts
    assert start.job_id == "lendable"
    assert start.is_preemptible
    assert "solid" not in started(plan)  # non-preemptible work may not borrow the reservation
    easy = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert easy.starts == ()


def test_berth_booking_reclaims_lent_work_in_time_and_asks_for_a_round() -> None:
    nodes = make_nodes(1, 2)
    lent = running(job("lent", 1, is_preemptible=True), (0,), started_at=0.0, is_preemptible=True)
    booking = Booking(
        id="b1", user="v", project="q", gpu_count=2, start_at=NOW + 100, end_at=NOW + 3_700, gpu_ids=(0, 1)
    )
    policy = PolicyConfig(name="berth", grace_s=30)
    early = plan_round(snapshot(nodes, running_jobs=[lent], bookings=(booking,)), policy, NOW - 1_000)
    assert early.preemptions == ()
    assert early.next_round_at == pytest.approx(NOW + 100 - 30)
    due = plan_round(snapshot(nodes, running_jobs=[lent], bookings=(booking,)), policy, NOW + 70)
    (preemption,) = due.preemptions
    assert preemption.for_id == "b1"
    assert preemption.kill_at <= booking.start_at


def test_booking_gpus_are_not_given_to_work_that_overlaps_the_window() -> None:
    nodes = make_nodes(1, 2)
    booking = Booking(id="b", user="v", project="q", gpu_count=2, start_at=NOW + 1_000, end_at=NOW + 5_000)
    snap = snapshot(
        nodes,
        pending=[job("long", 1, requested_s=2_000), job("short", 1, submit_at=1, requested_s=500)],
        bookings=(booking,),
    )
    for name in ("fifo", "easy", "berth"):
        plan = plan_round(snap, PolicyConfig(name=name), NOW)
        assert "long" not in started(plan)
    assert "short" in started(plan_round(snap, PolicyConfig(name="easy"), NOW))
    (reserve,) = [
        r for r in plan_round(snap, PolicyConfig(name="easy"), NOW).reservations if r.holder_id == "b"
    ]
    assert reserve.gpu_ids == (0, 1)


# ---- static ----


def test_static_keeps_batch_off_the_interactive_partition() -> None:
    nodes = make_nodes(2, 2)
    snap = snapshot(
        nodes,
        pending=[job("b1", 2), job("b2", 2, submit_at=1), job("s", 1, submit_at=2, kind=JobKind.INTERACTIVE)],
    )
    plan = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n1",)), NOW)
    gpus = started(plan)
    assert gpus["b1"] == (0, 1)
    assert "b2" not in gpus
    assert set(gpus["s"]) <= {2, 3}
    assert dict(plan.idle) == {3: IdleReason.RESERVED_UNUSED}


# ---- idle reasons ----


def test_idle_reason_precedence() -> None:
    nodes = (
        Node(id="down", gpu_type="A100", gpu_ids=(0,), status=NodeStatus.DOWN),
        Node(id="drain", gpu_type="A100", gpu_ids=(1,), status=NodeStatus.DRAINING),
        Node(id="t4", gpu_type="T4", gpu_ids=(2,)),
        Node(id="a", gpu_type="A100", gpu_ids=(3, 4)),
        Node(id="b", gpu_type="A100", gpu_ids=(5, 6)),
    )
    busy = [running(job("x", 1), (3,)), running(job("y", 1), (5,))]
    snap = snapshot(
        nodes, running_jobs=busy, pending=[job("pair", 2, gpu_type="A100")], gpus_in_use_idle=frozenset({5})
    )
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    idle = dict(plan.idle)
    assert idle[0] == IdleReason.DOWN
    assert idle[1] == IdleReason.DRAINING
    assert idle[2] == IdleReason.CONSTRAINT_MISMATCH
    assert idle[4] == idle[6] == IdleReason.FRAGMENTATION
    assert idle[5] == IdleReason.ALLOCATED_BUT_IDLE
    assert reason_of(plan, "pair") == PendingReason.FRAGMENTATION
    empty = plan_round(snapshot(nodes, running_jobs=busy), PolicyConfig(name="berth"), NOW)
    assert dict(empty.idle)[4] == IdleReason.NO_DEMAND


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        plan_round(snapshot(make_nodes(1, 1)), PolicyConfig(name="lottery"), NOW)


def test_berth_top_job_suspends_only_long_checkpointing_work_in_its_way() -> None:
    """The top job suspends checkpointing work predicted to run on for more than `SUSPEND_RATIO`
    times its own runtime, however that work started (owner's consent is enough); not work
    barely longer than itself, and never work that would restart from scratch."""
    nodes = make_nodes(4, 1)
    top = job("top", 4, submit_at=NOW - 3_000, requested_s=3_600)
    ckpt = job(
        "ckpt", 2, requested_s=50_000, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=600
    )
    lent = running(ckpt, (2, 3), started_at=NOW - 2_000, is_preemptible=True)
    plan = plan_round(snapshot(nodes, running_jobs=[lent], pending=[top]), PolicyConfig(name="berth"), NOW)
    (preemption,) = plan.preemptions
    assert preemption.job_id == "ckpt"
    assert preemption.for_id == "top"
    assert reason_of(plan, "top") == PendingReason.PREEMPTING
    assert dict(plan.idle) == {0: IdleReason.SCHEDULER_LATENCY, 1: IdleReason.SCHEDULER_LATENCY}
    # consent is enough: started normally (not lent), before the top job was queued
    normal = running(ckpt, (2, 3), started_at=NOW - 4_000)
    plan = plan_round(snapshot(nodes, running_jobs=[normal], pending=[top]), PolicyConfig(name="berth"), NOW)
    assert [p.job_id for p in plan.preemptions] == ["ckpt"]
    # not work that is only a little longer than the top job: it is better left to finish
    close = job(
        "close", 2, requested_s=8_000, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=600
    )
    near = running(close, (2, 3), started_at=NOW - 2_000)
    plan = plan_round(snapshot(nodes, running_jobs=[near], pending=[top]), PolicyConfig(name="berth"), NOW)
    assert plan.preemptions == ()
    # work with three times the top job's runtime left is suspended (the ratio is 2)
    triple = job(
        "triple", 2, requested_s=12_800, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=60
    )
    three = running(triple, (2, 3), started_at=NOW - 2_000)
    plan = plan_round(snapshot(nodes, running_jobs=[three], pending=[top]), PolicyConfig(name="berth"), NOW)
    assert [p.job_id for p in plan.preemptions] == ["triple"]
    # nor work that would restart from scratch
    scratch = job("scratch", 2, requested_s=50_000, is_preemptible=True)
    plain = running(scratch, (2, 3), started_at=NOW - 2_000, is_preemptible=True)
    plan = plan_round(snapshot(nodes, running_jobs=[plain], pending=[top]), PolicyConfig(name="berth"), NOW)
    assert plan.preemptions == ()
    assert reason_of(plan, "top") == PendingReason.RESOURCES


def test_berth_backfills_shortest_predicted_work_first() -> None:
    nodes = make_nodes(3, 1)
    busy = running(job("r", 2, requested_s=10_000), (0, 1), started_at=NOW - 100)
    pending = [
        job("top", 3, submit_at=0),
        job("long", 1, submit_at=1, requested_s=5_000, predicted_p50_s=4_000, predicted_p90_s=5_000),
        job("short", 1, submit_at=2, requested_s=5_000, predicted_p50_s=300, predicted_p90_s=600),
    ]
    plan = plan_round(snapshot(nodes, running_jobs=[busy], pending=pending), PolicyConfig(name="berth"), NOW)
    assert list(started(plan)) == ["short"]
    easy = plan_round(snapshot(nodes, running_jobs=[busy], pending=pending), PolicyConfig(name="easy"), NOW)
    assert list(started(easy)) == ["long"]  # priority order: the older job backfills first


def test_berth_runs_work_above_the_guarantee_preemptible_and_reclaims_it_for_a_guarantee() -> None:
    nodes = make_nodes(1, 4)
    projects = (
        ProjectShare("owner", guaranteed=(("A100", 2),), borrow_limit=2),
        ProjectShare("borrower", guaranteed=(("A100", 1),), borrow_limit=3),
    )
    # the borrower runs 1 guaranteed GPU and asks for 3 more: above its guarantee
    own = running(job("own", 1, project="borrower"), (0,), started_at=NOW - 5_000)
    more = job("more", 3, project="borrower", is_preemptible=True)
    plan = plan_round(
        snapshot(nodes, running_jobs=[own], pending=[more], projects=projects),
        PolicyConfig(name="berth"),
        NOW,
    )
    (start,) = plan.starts
    assert start.is_preemptible
    # a job its owner did not mark preemptible borrows too, as preemptible work (Kueue)
    solid = job("solid", 3, project="borrower")
    plan = plan_round(
        snapshot(nodes, running_jobs=[own], pending=[solid], projects=projects),
        PolicyConfig(name="berth"),
        NOW,
    )
    (start,) = plan.starts
    assert start.job_id == "solid"
    assert start.is_preemptible
    # ... within the project's limit (guarantee 1 + borrowing 3): one more GPU waits on quota
    plan = plan_round(
        snapshot(nodes, running_jobs=[own], pending=[job("solid", 4, project="borrower")], projects=projects),
        PolicyConfig(name="berth"),
        NOW,
    )
    assert plan.starts == ()
    assert reason_of(plan, "solid") == PendingReason.QUOTA
    # the owner claims its guarantee back from the borrowed work
    borrowed = running(more, (1, 2, 3), started_at=NOW - 1_000, is_preemptible=True)
    claim = job("claim", 2, project="owner")
    plan = plan_round(
        snapshot(nodes, running_jobs=[own, borrowed], pending=[claim], projects=projects),
        PolicyConfig(name="berth"),
        NOW,
    )
    (preemption,) = plan.preemptions
    assert preemption.job_id == "more"
    assert preemption.for_id == "claim"
    assert (
        plan_round(
            snapshot(nodes, running_jobs=[own, borrowed], pending=[claim], projects=projects),
            PolicyConfig(name="easy"),
            NOW,
        ).preemptions
        == ()
    )


def test_berth_guarantee_claim_takes_only_borrowed_work_and_never_more_than_it_asks_for() -> None:
    """Kueue reclaim: the owner's claim takes another project's borrowed work, not its
    consenting work within its own guarantee, and not restartable borrowed work whose lost work
    exceeds the claim's GPU-time."""
    nodes = make_nodes(1, 2)
    projects = (
        ProjectShare("owner", guaranteed=(("A100", 1),)),
        ProjectShare("other", guaranteed=(("A100", 1),)),
    )
    claim = job("claim", 1, project="owner", requested_s=3_600)
    within = running(job("within", 1, project="other", is_preemptible=True), (0,), started_at=NOW - 600)
    borrowed = running(job("borrowed", 1, project="other"), (1,), started_at=NOW - 600, is_preemptible=True)

    def preempted(*runs) -> list[str]:  # type: ignore[no-untyped-def]
        plan = plan_round(
            snapshot(nodes, running_jobs=list(runs), pending=[claim], projects=projects),
            PolicyConfig(name="berth"),
            NOW,
        )
        return [p.job_id for p in plan.preemptions]

    assert preempted(within, borrowed) == ["borrowed"]
    old = running(job("borrowed", 1, project="other"), (1,), started_at=NOW - 36_000, is_preemptible=True)
    assert preempted(within, old) == []


def _evicted_borrower_case() -> tuple[tuple[Node, ...], tuple[ProjectShare, ...], RunningJob, JobRequest]:
    """Two 2-GPU nodes, a project with a guarantee of 2 ("owner") and a borrowing one: node 1
    runs the borrower's guaranteed GPU and one more of its own, node 0 is free (the borrowing
    job's own eviction just freed it); the evicted job, requeued, is starved by its first submit."""
    projects = (
        ProjectShare("owner", guaranteed=(("A100", 2),)),
        ProjectShare("borrower", guaranteed=(("A100", 1),), borrow_limit=4),
    )
    own = running(job("own", 2, project="borrower"), (2, 3), started_at=NOW - 600)
    victim = job(
        "victim",
        2,
        project="borrower",
        submit_at=NOW - 5,
        first_submit_at=NOW - 2 * 86_400.0,
        attempt=1,
        is_preemptible=True,
        is_checkpointable=True,
    )
    return make_nodes(2, 2), projects, own, victim


def test_berth_a_starved_job_within_its_guarantee_goes_before_starved_borrowing_work() -> None:
    """Both waited past the starvation bound: the job within its project's guarantee starts on
    the free GPUs, not the older borrowing job, which the guarantee would claim back at once.

    Ranked by age alone the borrowing job started there and the claimant took the GPUs back a
    grace later, round after round (Alibaba 2 % x8, seed 6: one job preempted 3,363 times).
    """
    nodes, projects, own, victim = _evicted_borrower_case()
    day = 86_400.0
    claim = job("claim", 2, project="owner", submit_at=NOW - 1.5 * day)
    plan = plan_round(
        snapshot(nodes, running_jobs=[own], pending=[victim, claim], projects=projects),
        PolicyConfig(name="berth"),
        NOW,
    )
    assert started(plan) == {"claim": (0, 1)}
    assert plan.preemptions == ()
    # without a guarantee in the way, the older starved job still goes first
    plan = plan_round(
        snapshot(
            nodes,
            running_jobs=[own],
            pending=[victim, job("plain", 2, project="borrower", submit_at=NOW - 1.5 * day)],
            projects=projects,
        ),
        PolicyConfig(name="berth"),
        NOW,
    )
    assert set(started(plan)) == {"victim"}


def test_berth_the_gpus_freed_for_a_claim_go_to_the_claimant_not_back_to_the_evicted_work() -> None:
    """While a claim (`ClusterSnapshot.claims`) lives (``claim_hold_s`` past the kill), the
    evicted, requeued job (starved here, so ranked by age before a claimant that waited
    minutes) ranks behind its claimant and does not retake the GPUs its eviction freed.

    Without it the victim restarted there and the claimant evicted it again a grace later,
    round after round (Alibaba 2 % x8, seed 2: one job preempted 424 times for one claimant).
    """
    nodes, projects, own, victim = _evicted_borrower_case()
    claimant = job("claim", 2, project="owner", submit_at=NOW - 1_000)
    policy = PolicyConfig(name="berth")

    def starts(claims: tuple[tuple[str, str, float], ...]) -> dict[str, tuple[int, ...]]:
        pending = [victim, claimant]
        snap = snapshot(nodes, running_jobs=[own], pending=pending, projects=projects, claims=claims)
        return started(plan_round(snap, policy, NOW))

    # the victim's grace ended 5 s ago: the claim lives
    assert starts((("claim", "victim", NOW - 5),)) == {"claim": (0, 1)}
    # no claim, or one past its hold: the starved victim goes first again
    assert set(starts(())) == {"victim"}
    assert set(starts((("claim", "victim", NOW - policy.claim_hold_s - 1),))) == {"victim"}
    # a claim of a job that is not pending (it started, or left) changes nothing, nor does a
    # claim on other work
    assert set(starts((("gone", "victim", NOW - 5),))) == {"victim"}
    assert set(starts((("claim", "other", NOW - 5),))) == {"victim"}
    # two evicted jobs behind one claimant
    twin = dataclasses.replace(victim, id="twin")
    pending = [victim, twin, claimant]
    claims = (("claim", "victim", NOW - 5), ("claim", "twin", NOW - 5))
    snap = snapshot(nodes, running_jobs=[own], pending=pending, projects=projects, claims=claims)
    assert started(plan_round(snap, policy, NOW)) == {"claim": (0, 1)}


def test_berth_starved_jobs_of_one_project_are_judged_within_its_guarantee_by_their_own_size() -> None:
    """The order asks whether a starved job is within its project's guarantee once per
    (project, size, type constraints) per round: the project's 2-GPU job is covered and goes
    first, its 4-GPU job and its job asking for a type it has no guarantee of are not and rank
    by age, behind another project's older starved job."""
    day = 86_400.0
    projects = (
        ProjectShare("owner", guaranteed=(("A100", 2),)),
        ProjectShare("other", guaranteed=(("A100", 1),), borrow_limit=8),
    )
    pending = [
        job("old", 2, project="other", submit_at=NOW - 3 * day),
        job("wide", 4, project="owner", submit_at=NOW - 2 * day),
        job("fits", 2, project="owner", submit_at=NOW - 1.5 * day),
        job("h100", 2, project="owner", submit_at=NOW - 2.5 * day, gpu_type="H100"),
        job("fits_too", 2, project="owner", submit_at=NOW - 1.2 * day),
    ]
    snap = snapshot(make_nodes(2, 4), pending=pending, projects=projects)
    rnd = Round(snap, PolicyConfig(name="berth"), NOW, BERTH)
    queue, _backfill = BERTH.order(rnd)
    assert [j.id for j in queue] == ["fits", "fits_too", "old", "h100", "wide"]
