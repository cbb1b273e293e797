"""Multifactor priority (Slurm style): age + fair share (+ class), and berth's short-job bonus."""

from __future__ import annotations

import math

from scheduling.engine.cluster import RoundState
from scheduling.engine.fairshare import fairshare_factors
from scheduling.engine.types import JobKind, JobRequest


def submitted_at(job: JobRequest) -> float:
    """The job's original submit time; requeues keep their age."""
    return job.first_submit_at if job.first_submit_at is not None else job.submit_at


def fifo_order(jobs: tuple[JobRequest, ...]) -> list[JobRequest]:
    """Strict arrival order (ties by id, so the order is total)."""
    return sorted(jobs, key=lambda job: (submitted_at(job), job.id))


def short_job_factor(gpu_seconds: float) -> float:
    """1 for tiny jobs, about 0.5 at one GPU-hour, towards 0 for huge ones."""
    return 1.0 / (1.0 + math.sqrt(max(gpu_seconds, 0.0) / 3_600.0))


def priority_scores(state: RoundState, *, with_short_bonus: bool) -> dict[str, float]:
    """Score per pending job id; higher runs first.

    Interactive sessions get ``interactive_priority``; ``JobRequest.priority`` adds its class
    bonus; age saturates at ``max_age_s``; fair share is in (0, 1].  Berth adds a bonus for
    short predicted GPU-time (it cuts mean wait and slowdown; age keeps long jobs from
    starving).
    """
    policy = state.policy
    factors = fairshare_factors(state.snapshot, state.types, state.gpu_type)
    max_age = policy.max_age_s if policy.max_age_s > 0 else 1.0
    scores: dict[str, float] = {}
    for job in state.snapshot.pending:
        age = max(0.0, state.now - submitted_at(job))
        score = policy.age_weight * min(age / max_age, 1.0)
        score += policy.fairshare_weight * factors.get(job.project, 1.0)
        score += 10.0 * job.priority
        if job.kind == JobKind.INTERACTIVE:
            score += policy.interactive_priority
        if with_short_bonus:
            estimate = state.estimate(job)
            score += policy.short_job_weight * short_job_factor(estimate.p50_s * job.gpu_count)
        scores[job.id] = score
    return scores


def priority_order(state: RoundState, *, with_short_bonus: bool) -> list[JobRequest]:
    """Pending jobs, highest priority first; ties by original submit time, then id."""
    scores = priority_scores(state, with_short_bonus=with_short_bonus)
    keyed = [(-scores[job.id], submitted_at(job), job.id, job) for job in state.snapshot.pending]
    keyed.sort(key=lambda item: item[:3])
    return [item[3] for item in keyed]
