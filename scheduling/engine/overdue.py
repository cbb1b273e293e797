"""Berth's view of running jobs that outlived their user's limit.

The simulator (like a site without wall-clock enforcement) lets a job run past its
``requested_time``.  Slurm-style EASY assumes such a job ends ``overdue_epsilon_s`` from now,
every round, so the top job's shadow time stays a minute away and nothing backfills in front
of it, possibly for days.  Berth corrects upwards instead: a job that has run ``elapsed``
seconds and passed its limit is expected to run ``overrun_fraction x elapsed`` more (a job's
remaining time grows with its age once its estimate has failed, the same rule `running_ends`
applies past a prediction), so the top job's reservation lies where the GPUs are likely to
come free and the GPUs before it can be backfilled.
"""

from __future__ import annotations

from scheduling.engine.cluster import RoundState, estimate_of, estimates_by_job


def correct_overdue(state: RoundState) -> None:
    """Move the expected ends of overdue running jobs (past their user estimate) later.

    Mutates ``state.end_p50`` and ``state.end_hold`` in place; jobs in their preemption grace
    keep their ends (they are gone at the end of the grace).
    """
    policy = state.policy
    now = state.now
    fraction = policy.overrun_fraction
    epsilon = policy.overdue_epsilon_s
    # the users' limits, through the memo the round's running model may already have filled
    limits = estimates_by_job(policy, is_predicted=False)
    for running in state.snapshot.running:
        if running.grace_until is not None:
            continue
        limit = estimate_of(running.job, limits, policy, is_predicted=False).hold_s
        if running.started_at + limit > now:
            continue
        elapsed = max(0.0, now - running.started_at)
        job_id = running.job.id
        hold = now + max(fraction * elapsed, epsilon)
        p50 = now + max(0.5 * fraction * elapsed, epsilon)
        state.end_hold[job_id] = max(state.end_hold[job_id], hold)
        state.end_p50[job_id] = max(state.end_p50[job_id], min(p50, state.end_hold[job_id]))
