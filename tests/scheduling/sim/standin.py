"""Tiny stand-in policies so the simulator's tests do not depend on the real engine.

They are deliberately simple and only exercise the driver's paths: first-fit starts, strict
FIFO blocking, lending booked GPUs to preemptible work and reclaiming them with a grace
period.  They are not meant to be good schedulers.
"""

from __future__ import annotations

from scheduling.engine.types import (
    ClusterSnapshot,
    IdleReason,
    JobKind,
    Plan,
    PolicyConfig,
    PreemptAction,
    StartAction,
)


def standin_plan(snapshot: ClusterSnapshot, *, policy: PolicyConfig, now: float) -> Plan:
    """``fifo``: strict arrival order; anything else: greedy first fit over the whole queue.

    Booked GPUs are kept free from ``grace`` before the booking until its end, except under
    policy ``lend``, which lends them to preemptible jobs until the owner shows up, then
    preempts those jobs with ``policy.grace_s``.
    """
    node_of = {g: node for node in snapshot.nodes for g in node.gpu_ids}
    busy = {g for running in snapshot.running for g in running.gpu_ids}
    is_lending = policy.name == "lend"
    booked: set[int] = set()
    claimed: set[int] = set()  # booked GPUs whose owner is in (must be vacated)
    for booking in snapshot.bookings:
        if booking.start_at - policy.grace_s <= now < booking.end_at:
            booked.update(booking.gpu_ids)
            if booking.is_in_use:
                claimed.update(booking.gpu_ids)
    preemptions: list[PreemptAction] = []
    for running in snapshot.running:
        on_claimed = claimed.intersection(running.gpu_ids)
        if on_claimed and running.is_preemptible and running.grace_until is None:
            preemptions.append(
                PreemptAction(
                    job_id=running.job.id,
                    signal_at=now,
                    kill_at=now + policy.grace_s,
                    reason="booking owner arrived",
                )
            )
    free = [g for g in sorted(node_of) if g not in busy and g not in booked]
    lendable = [g for g in sorted(booked - claimed) if g not in busy] if is_lending else []
    starts: list[StartAction] = []
    queue = sorted(snapshot.pending, key=lambda job: (job.kind != JobKind.INTERACTIVE, job.submit_at, job.id))
    for job in queue:
        pool = free
        preemptible = False
        if len(pool) < job.gpu_count and job.is_preemptible and len(pool) + len(lendable) >= job.gpu_count:
            pool = free + lendable
            preemptible = True
        if len(pool) >= job.gpu_count:
            chosen = tuple(pool[: job.gpu_count])
            starts.append(
                StartAction(
                    job_id=job.id,
                    gpu_ids=chosen,
                    node_ids=tuple(sorted({node_of[g].id for g in chosen})),
                    is_preemptible=preemptible,
                    expected_end_at=now + (job.requested_s or policy.default_limit_s),
                )
            )
            free = [g for g in free if g not in chosen]
            lendable = [g for g in lendable if g not in chosen]
        elif policy.name == "fifo":
            break
    used = {g for start in starts for g in start.gpu_ids}
    idle: list[tuple[int, IdleReason]] = []
    has_pending = len(starts) < len(snapshot.pending)
    for g in sorted(node_of):
        if g in busy or g in used:
            continue
        if g in booked:
            idle.append((g, IdleReason.RESERVED_UNUSED))
        elif has_pending:
            idle.append((g, IdleReason.FRAGMENTATION))
        else:
            idle.append((g, IdleReason.NO_DEMAND))
    return Plan(starts=tuple(starts), preemptions=tuple(preemptions), idle=tuple(idle))
