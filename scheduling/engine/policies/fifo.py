"""``fifo``: strict arrival order, first fit, stop at the first job that does not fit."""

from __future__ import annotations

from scheduling.engine.explain import build_plan
from scheduling.engine.outcome import Verdict
from scheduling.engine.priority import fifo_order
from scheduling.engine.scheduler import Knobs, Scheduler
from scheduling.engine.types import ClusterSnapshot, PendingReason, Plan, PolicyConfig


def plan_fifo(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """Start jobs in submit order until one does not fit; everyone behind it waits.

    Bookings are still honoured as reservations (a start that would run into a booking's
    window on its user estimate does not fit).
    """
    sched = Scheduler(snapshot, policy, now, Knobs())
    queue = fifo_order(snapshot.pending)
    blocker: str | None = None
    behind = len(queue)  # index of the first job behind the blocker
    for index, job in enumerate(queue):
        types = sched.types_for(job)
        if not types:
            sched.out.wait(
                job.id, PendingReason.CONSTRAINT, "No GPU in the cluster satisfies its constraints."
            )
            continue  # can never run; skipping it cannot reorder anything that could
        if sched.is_never_startable(job):
            continue  # likewise (too wide for the inventory or its project's limit)
        if sched.is_over_limit(job):
            sched.out.wait(job.id, PendingReason.QUOTA, f"Project {job.project} is at its GPU limit.")
            blocker, behind = job.id, index + 1
            break
        estimate = sched.state.estimate(job)
        if sched.try_start(job, types, estimate):
            continue
        blocker, behind = job.id, index + 1
        # the head job waits for GPUs to free up; what is free now waits with it
        sched.reserve_top(job, types, estimate)
        break
    if blocker is not None:
        # everyone behind it waits for it (one sentence for a queue that can be long)
        sentence = f"Strict arrival order: job {blocker}, submitted earlier, does not fit yet."
        verdicts = sched.out.verdicts
        for job in queue[behind:]:
            if job.id not in verdicts:
                verdicts[job.id] = Verdict(PendingReason.PRIORITY, sentence)
    return build_plan(sched, queue, is_strict_order=True)
