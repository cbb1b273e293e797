"""Engine v2 rules: restore cost in victim choice, the top job's drain lent to
checkpointing work, and a requeued job's slowdown counted from its requeue."""

from __future__ import annotations

from scheduling.engine import plan_round
from scheduling.engine.types import JobKind, PendingReason, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0


def test_victims_cost_the_restore_too() -> None:
    """A checkpointing job 100 s past its checkpoint loses 100 s plus the 120 s restore: more
    than a restartable job that started 200 s ago, so a session takes the restartable one;
    without a restore cost it would take the checkpointing one."""
    nodes = make_nodes(2, 1)
    ckpt = running(
        job(
            "ckpt",
            1,
            requested_s=50_000,
            is_preemptible=True,
            is_checkpointable=True,
            checkpoint_interval_s=1_000,
        ),
        (0,),
        started_at=NOW - 5_100,
    )
    young = running(job("young", 1, requested_s=50_000, is_preemptible=True), (1,), started_at=NOW - 200)
    snap = snapshot(nodes, running_jobs=[ckpt, young], pending=[job("s", 1, kind=JobKind.INTERACTIVE)])
    plan = plan_round(snap, PolicyConfig(name="berth", restore_s=120), NOW)
    assert [p.job_id for p in plan.preemptions] == ["young"]
    plan = plan_round(snap, PolicyConfig(name="berth", restore_s=0), NOW)
    assert [p.job_id for p in plan.preemptions] == ["ckpt"]


def test_the_top_jobs_drain_is_lent_to_checkpointing_work_and_taken_back() -> None:
    """The top job's other GPUs are back in 200 s, sooner than a lent job's minimum runtime:
    checkpointing work still borrows the free ones, and once the top job's other GPUs are free
    it is suspended for it (after its minimum runtime, with the grace)."""
    nodes = make_nodes(4, 1)
    policy = PolicyConfig(name="berth", min_runtime_s=300, grace_s=30)
    busy = running(job("r", 2, requested_s=300), (0, 1), started_at=NOW - 100)
    top = job("top", 4, submit_at=0, requested_s=3_600)
    lendable = job(
        "lendable",
        2,
        submit_at=5,
        requested_s=20_000,
        is_preemptible=True,
        is_checkpointable=True,
        checkpoint_interval_s=600,
    )
    plan = plan_round(snapshot(nodes, running_jobs=[busy], pending=[top, lendable]), policy, NOW)
    (start,) = plan.starts
    assert start.job_id == "lendable"
    assert start.is_preemptible
    later = NOW + 400
    lent = running(lendable, start.gpu_ids, started_at=NOW, is_preemptible=True)
    plan = plan_round(snapshot(nodes, running_jobs=[lent], pending=[top]), policy, later)
    (preemption,) = plan.preemptions
    assert preemption.job_id == "lendable"
    assert preemption.for_id == "top"
    assert preemption.kill_at == later + 30
    assert next(e.reason for e in plan.pending if e.job_id == "top") == PendingReason.PREEMPTING


def test_a_requeued_jobs_slowdown_counts_from_its_requeue() -> None:
    """A suspended long job requeued 10 s ago does not rank as if it had waited since its first
    submit (it ran most of that time): a short job that has waited a while goes first."""
    nodes = make_nodes(1, 1)
    requeued = job(
        "requeued",
        1,
        submit_at=NOW - 10,
        first_submit_at=NOW - 20_000,
        attempt=1,
        predicted_p50_s=20_000,
        requested_s=40_000,
    )
    fresh = job("fresh", 1, submit_at=NOW - 1_000, predicted_p50_s=3_000, requested_s=6_000)
    plan = plan_round(snapshot(nodes, pending=[requeued, fresh]), PolicyConfig(name="berth"), NOW)
    assert [s.job_id for s in plan.starts] == ["fresh"]
    # as a first attempt with the same age it would have gone first
    first = job("requeued", 1, submit_at=NOW - 20_000, predicted_p50_s=20_000, requested_s=40_000)
    plan = plan_round(snapshot(nodes, pending=[first, fresh]), PolicyConfig(name="berth"), NOW)
    assert [s.job_id for s in plan.starts] == ["requeued"]


def test_a_preemption_names_the_claimant_only_to_its_own_owner() -> None:
    """The preempted job's owner reads the session's id when the session is theirs, and only
    "another user's interactive session" when it is someone else's (as pending sentences do)."""
    nodes = make_nodes(1, 1)
    victim = running(
        job("v", 1, user="ann", requested_s=50_000, is_preemptible=True), (0,), started_at=NOW - 900
    )
    policy = PolicyConfig(name="berth")
    for owner, expected, hidden in (("ann", "interactive session s7", None), ("bob", "another user's", "s7")):
        session = job("s7", 1, user=owner, kind=JobKind.INTERACTIVE, submit_at=NOW)
        plan = plan_round(snapshot(nodes, running_jobs=[victim], pending=[session]), policy, NOW)
        (preemption,) = plan.preemptions
        assert preemption.for_id == "s7"
        assert preemption.reason.startswith(f"Preempted for {expected}"), preemption.reason
        if hidden:
            assert hidden not in preemption.reason
