"""Overlay behaviour of the policies: static's wide jobs, berth's interactive reclaim."""

from __future__ import annotations

from scheduling.engine import plan_round
from scheduling.engine.types import Booking, JobKind, PendingReason, Plan, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 10_000.0


def started(plan: Plan) -> dict[str, tuple[int, ...]]:
    return {s.job_id: s.gpu_ids for s in plan.starts}


def explanation(plan: Plan, job_id: str) -> tuple[PendingReason, float | None]:
    (found,) = [e for e in plan.pending if e.job_id == job_id]
    return found.reason, found.eta_p50_at


# ---- static: jobs wider than the batch partition ----


def test_static_runs_a_job_wider_than_its_batch_side_across_the_partition() -> None:
    snap = snapshot(make_nodes(4, 1), pending=[job("wide", 4), job("narrow", 1, submit_at=1)])
    plan = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n3",)), NOW)
    assert started(plan) == {"wide": (0, 1, 2, 3)}


def test_static_drains_the_partition_for_a_wide_head_job() -> None:
    session = job("s0", 1, kind=JobKind.INTERACTIVE, requested_s=1_000)
    snap = snapshot(
        make_nodes(4, 1),
        running_jobs=[running(session, (3,), started_at=NOW)],
        pending=[
            job("wide", 4),
            job("long-session", 1, submit_at=5, kind=JobKind.INTERACTIVE, requested_s=3_600),
        ],
    )
    plan = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n2", "n3")), NOW)
    assert started(plan) == {}
    assert explanation(plan, "wide") == (PendingReason.RESOURCES, NOW + 1_000)
    # the free partition GPU is reserved for the wide job; a long session would delay it
    # a session that ends before the wide job's start may still use it
    short = job("short-session", 1, submit_at=6, kind=JobKind.INTERACTIVE, requested_s=600)
    snap = snapshot(snap.nodes, running_jobs=snap.running, pending=[snap.pending[0], short])
    plan = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n2", "n3")), NOW)
    assert started(plan) == {"short-session": (2,)}


def test_static_wide_job_runs_only_at_the_head_of_the_batch_queue() -> None:
    busy = running(job("r", 1, requested_s=5_000), (0,), started_at=NOW - 100)
    snap = snapshot(
        make_nodes(4, 1),
        running_jobs=[busy],
        pending=[job("top", 2), job("wide", 3, submit_at=1, requested_s=60)],
    )
    plan = plan_round(snap, PolicyConfig(name="static", interactive_partition=("n2", "n3")), NOW)
    # it would fit on n1 + the partition before the top job's shadow time, but backfilling it
    # would take the partition from sessions without the drain a head job justifies
    assert started(plan) == {}
    assert explanation(plan, "wide")[0] == PendingReason.PRIORITY


# ---- berth: interactive sessions get GPUs within a grace ----


def test_berth_runs_consenting_checkpointing_work_reclaimable_and_other_work_not() -> None:
    snap = snapshot(
        make_nodes(3, 1),
        pending=[
            job("solid", 1),
            job("restartable", 1, submit_at=1, is_preemptible=True),
            job(
                "ckpt", 1, submit_at=2, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=600
            ),
        ],
    )
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    lent = {s.job_id: s.is_preemptible for s in plan.starts}
    assert lent == {"solid": False, "restartable": False, "ckpt": True}


def test_berth_session_on_a_full_cluster_starts_within_grace() -> None:
    """The cluster is full of work started normally; the session reclaims the preemptible job
    that loses least, and the GPU is back after one grace period."""
    policy = PolicyConfig(name="berth", grace_s=30, min_runtime_s=300)
    nodes = make_nodes(3, 1)
    pending = [
        job("solid", 1),
        job("old", 1, submit_at=1, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=3_600),
        job(
            "young", 1, submit_at=2, is_preemptible=True, is_checkpointable=True, checkpoint_interval_s=3_600
        ),
    ]
    plan = plan_round(snapshot(nodes, pending=pending), policy, NOW - 5_000)
    by_id = {j.id: j for j in pending}
    runs = [
        running(by_id[s.job_id], s.gpu_ids, started_at=NOW - (5_000 if s.job_id != "young" else 900))
        for s in plan.starts
    ]
    runs = [
        type(r)(job=r.job, gpu_ids=r.gpu_ids, started_at=r.started_at, is_preemptible=s.is_preemptible)
        for r, s in zip(runs, plan.starts, strict=True)
    ]
    session = job("s", 1, submit_at=NOW, kind=JobKind.INTERACTIVE)
    plan = plan_round(snapshot(nodes, running_jobs=runs, pending=[session]), policy, NOW)
    (preemption,) = plan.preemptions
    assert preemption.job_id == "young"  # loses 900 s of work, "old" 1,400 s since its checkpoint
    assert preemption.kill_at == NOW + 30
    assert explanation(plan, "s") == (PendingReason.PREEMPTING, NOW + 30)
    # once the victim is gone the session takes its GPU
    rest = [r for r in runs if r.job.id != "young"]
    plan = plan_round(snapshot(nodes, running_jobs=rest, pending=[session]), policy, NOW + 30)
    assert started(plan) == {"s": next(r.gpu_ids for r in runs if r.job.id == "young")}


def test_berth_headroom_counts_running_sessions_and_checkpointing_work_in_reach() -> None:
    """A forecast level of 3 session GPUs: one session runs and one lent checkpointing job can
    be reclaimed within a grace, so only one GPU is held idle and non-preemptible work gets the
    other."""
    policy = PolicyConfig(name="berth", grace_s=30, min_runtime_s=300, interactive_headroom=(("*", 3),))
    session = running(job("s0", 1, kind=JobKind.INTERACTIVE), (0,), started_at=NOW - 100)
    ckpt = {"is_preemptible": True, "is_checkpointable": True, "checkpoint_interval_s": 600.0}
    lent = running(job("lent", 1, **ckpt), (1,), started_at=NOW - 1_000, is_preemptible=True)
    snap = snapshot(
        make_nodes(4, 1),
        running_jobs=[session, lent],
        pending=[job("a", 1, requested_s=100_000), job("b", 1, submit_at=1, requested_s=100_000)],
    )
    plan = plan_round(snap, policy, NOW)
    assert len(plan.starts) == 1
    # a session's minimum runtime is at most the grace: a job that just started is in reach too
    fresh = running(job("lent", 1, **ckpt), (1,), started_at=NOW - 10, is_preemptible=True)
    plan = plan_round(snapshot(snap.nodes, running_jobs=[session, fresh], pending=snap.pending), policy, NOW)
    assert len(plan.starts) == 1
    # consent counts however the job started: preemptible by its owner, started normally
    consenting = running(job("lent", 1, **ckpt), (1,), started_at=NOW - 10)
    plan = plan_round(
        snapshot(snap.nodes, running_jobs=[session, consenting], pending=snap.pending), policy, NOW
    )
    assert len(plan.starts) == 1
    # work that is not preemptible is not in reach: both free GPUs are held
    pinned = running(job("lent", 1), (1,), started_at=NOW - 1_000)
    plan = plan_round(snapshot(snap.nodes, running_jobs=[session, pinned], pending=snap.pending), policy, NOW)
    assert plan.starts == ()


def test_berth_headroom_holds_idle_gpus_rather_than_count_on_restartable_work() -> None:
    """Restartable work would lose everything it did if a session took it back, so it is not
    capacity in reach: with it running, both free GPUs stay held for the forecast level."""
    policy = PolicyConfig(name="berth", grace_s=30, min_runtime_s=300, interactive_headroom=(("*", 3),))
    session = running(job("s0", 1, kind=JobKind.INTERACTIVE), (0,), started_at=NOW - 100)
    pending = [job("a", 1, requested_s=100_000), job("b", 1, submit_at=1, requested_s=100_000)]
    for restartable in (
        running(job("r", 1, is_preemptible=True), (1,), started_at=NOW - 1_000),
        running(job("r", 1, is_preemptible=True), (1,), started_at=NOW - 1_000, is_preemptible=True),
    ):
        plan = plan_round(
            snapshot(make_nodes(4, 1), running_jobs=[session, restartable], pending=pending), policy, NOW
        )
        assert plan.starts == ()
        assert {gpu for gpu, _reason in plan.idle} == {2, 3}


# ---- berth: future bookings waste least ----


def test_berth_books_gpus_of_lent_work_ending_before_the_booking_not_free_ones() -> None:
    """A booking in 10 h takes the GPU whose lent job ends shortly before it, not the free GPU,
    which goes to non-preemptible work now; the baselines hold the free GPU."""
    soon = running(
        job("soon", 1, is_preemptible=True, requested_s=10 * 3_600),
        (1,),
        started_at=NOW - 1_800,
        is_preemptible=True,
    )
    long = running(
        job("long", 1, is_preemptible=True, requested_s=100 * 3_600),
        (2,),
        started_at=NOW - 5_000,
        is_preemptible=True,
    )
    booking = Booking(id="b", user="v", project="q", gpu_count=1, start_at=NOW + 36_000, end_at=NOW + 40_000)
    snap = snapshot(
        make_nodes(3, 1),
        running_jobs=[soon, long],
        pending=[job("solid", 1, requested_s=20 * 3_600)],
        bookings=(booking,),
    )
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    (reserve,) = [r for r in plan.reservations if r.holder_id == "b"]
    assert reserve.gpu_ids == (1,)
    assert started(plan) == {"solid": (0,)}
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert started(plan) == {}


def test_berth_lets_a_head_job_wider_than_cluster_minus_headroom_use_the_headroom() -> None:
    """Headroom is held again every round: a gang that only fits with it would never start."""
    policy = PolicyConfig(name="berth", interactive_headroom=(("*", 2),))
    snap = snapshot(make_nodes(4, 1), pending=[job("wide", 3)])
    assert started(plan_round(snap, policy, NOW)) == {"wide": (0, 1, 2)}
    # a job that fits beside the headroom leaves it alone
    snap = snapshot(make_nodes(4, 1), pending=[job("a", 2), job("b", 2, submit_at=1)])
    assert len(plan_round(snap, policy, NOW).starts) == 1


def test_berth_session_never_throws_away_more_restartable_work_than_it_asks_for() -> None:
    """Every GPU busy: a 1-h session may evict checkpointing work, or restartable work that has
    run less than an hour; restartable work that ran 10 h is left alone (the session waits)."""
    policy = PolicyConfig(name="berth", grace_s=30, min_runtime_s=300)
    session = job("s", 1, submit_at=NOW - 5, kind=JobKind.INTERACTIVE, requested_s=3_600)
    old = running(job("old", 1, is_preemptible=True, requested_s=100_000), (0,), started_at=NOW - 36_000)
    plan = plan_round(snapshot(make_nodes(1, 1), running_jobs=[old], pending=[session]), policy, NOW)
    assert plan.preemptions == ()
    assert plan.starts == ()
    young = running(job("young", 1, is_preemptible=True, requested_s=100_000), (0,), started_at=NOW - 1_800)
    plan = plan_round(snapshot(make_nodes(1, 1), running_jobs=[young], pending=[session]), policy, NOW)
    assert [p.job_id for p in plan.preemptions] == ["young"]
    ckpt = {"is_preemptible": True, "is_checkpointable": True, "checkpoint_interval_s": 1_800.0}
    saved = running(job("saved", 1, requested_s=100_000, **ckpt), (0,), started_at=NOW - 36_000)
    plan = plan_round(snapshot(make_nodes(1, 1), running_jobs=[saved], pending=[session]), policy, NOW)
    assert [p.job_id for p in plan.preemptions] == ["saved"]
