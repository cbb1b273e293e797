"""``easy``: today's Slurm set-up, a faithful baseline.

Multifactor priority (age + fair share with decay), interactive sessions first but without
preemption, bookings as reservations, and EASY backfill on the user's estimate (else the
partition limit): the top job gets a shadow reservation and nothing that would delay it (on
those estimates) starts.  A job past its estimate is seen as ending in ``overdue_epsilon_s``.
No preemption ever.
"""

from __future__ import annotations

from scheduling.engine.explain import build_plan
from scheduling.engine.priority import priority_order
from scheduling.engine.scheduler import Knobs, Scheduler
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

EASY = Knobs()


def plan_easy(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """One EASY-backfill round over the whole cluster."""
    sched = Scheduler(snapshot, policy, now, EASY)
    queue = priority_order(sched.state)
    sched.easy_pass(queue, interactive_first=False)
    return build_plan(sched, queue)
