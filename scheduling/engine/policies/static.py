"""``static``: a fixed interactive partition (sized for peak) plus ``easy`` on the rest.

Interactive sessions and bookings only go to ``policy.interactive_partition`` nodes; batch
never does.  Each side runs its own EASY pass with its own top-job reservation.
"""

from __future__ import annotations

from scheduling.engine.explain import build_plan
from scheduling.engine.priority import priority_order
from scheduling.engine.scheduler import Knobs, Scheduler
from scheduling.engine.types import ClusterSnapshot, JobKind, Plan, PolicyConfig

STATIC = Knobs(has_partition=True)


def plan_static(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """EASY on the batch nodes and, separately, on the interactive partition."""
    sched = Scheduler(snapshot, policy, now, STATIC)
    queue = priority_order(sched.state)
    interactive = [job for job in queue if job.kind == JobKind.INTERACTIVE]
    batch = [job for job in queue if job.kind != JobKind.INTERACTIVE]
    sched.easy_pass(interactive, interactive_first=False)
    # the partition's top job must not block batch backfill elsewhere
    sched.top = None
    sched.top_shadow = None
    sched.easy_pass(batch, interactive_first=False)
    return build_plan(sched, queue)
