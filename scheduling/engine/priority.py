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


def priority_scores(state: RoundState) -> tuple[dict[str, float], dict[str, float]]:
    """(base score, short-job bonus) per pending job id; higher runs first.

    Interactive sessions get ``interactive_priority``; ``JobRequest.priority`` adds its class
    bonus; age saturates at ``max_age_s``; fair share is in (0, 1].  The bonus (berth's
    backfill order) favours short predicted GPU-time: it cuts mean wait and slowdown, while
    the top job itself stays chosen by the base score so long jobs do not starve.
    """
    policy = state.policy
    factors = fairshare_factors(state.snapshot, state.types, state.gpu_type)
    max_age = policy.max_age_s if policy.max_age_s > 0 else 1.0
    age_weight = policy.age_weight / max_age
    cap = policy.age_weight
    fs_weight = policy.fairshare_weight
    now = state.now
    scores: dict[str, float] = {}
    bonus: dict[str, float] = {}
    estimate = state.estimate
    for job in state.snapshot.pending:
        submitted = job.first_submit_at if job.first_submit_at is not None else job.submit_at
        score = min(max(0.0, now - submitted) * age_weight, cap)
        score += fs_weight * factors.get(job.project, 1.0)
        if job.priority:
            score += 10.0 * job.priority
        if job.kind == JobKind.INTERACTIVE:
            score += policy.interactive_priority
        scores[job.id] = score
        bonus[job.id] = policy.short_job_weight * short_job_factor(estimate(job).p50_s * job.gpu_count)
    return scores, bonus


def _ordered(jobs: tuple[JobRequest, ...], score: dict[str, float]) -> list[JobRequest]:
    keyed = [(-score[job.id], submitted_at(job), job.id, job) for job in jobs]
    keyed.sort(key=lambda item: item[:3])
    return [item[3] for item in keyed]


def priority_order(state: RoundState) -> list[JobRequest]:
    """Pending jobs by multifactor priority, highest first; ties by original submit, then id."""
    scores, _bonus = priority_scores(state)
    return _ordered(state.snapshot.pending, scores)


def priority_orders(state: RoundState) -> tuple[list[JobRequest], list[JobRequest]]:
    """(priority order, backfill order with the short-job bonus added)."""
    scores, bonus = priority_scores(state)
    with_bonus = {job_id: score + bonus[job_id] for job_id, score in scores.items()}
    return _ordered(state.snapshot.pending, scores), _ordered(state.snapshot.pending, with_bonus)
