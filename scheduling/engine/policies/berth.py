"""``berth``: lending with guaranteed reclaim, predicted-runtime backfill, value-aware placement.

Order of a round:
1. bookings whose reclaim time has come signal the lent work on their GPUs;
2. interactive sessions start at once, or reclaim lent work (victims losing least work first);
3. interactive headroom is held: idle, but lendable to preemptible work;
4. the EASY pass on predicted runtimes (a job backfills when its median fits before the shadow
   time, which comes from the users' limits of running work): the top job is chosen by
   age and fair share (so its reservation is stable), backfill candidates are taken shortest
   predicted GPU-time first; the top job reclaims lent work when that gains more than it loses, else gets
   a shadow reservation; backfill that would run into a reservation, a booking or the headroom
   starts only as preemptible (lent) work;
5. work above a project's guaranteed quota runs only as preemptible.
"""

from __future__ import annotations

from scheduling.engine.explain import build_plan
from scheduling.engine.priority import priority_orders
from scheduling.engine.scheduler import Knobs, Scheduler
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

BERTH = Knobs(
    is_predicted=True,
    can_preempt=True,
    can_lend=True,
    prefers_cheap_types=True,
    enforces_guarantees=True,
    # Replays of the KTH log (first 2,500 jobs) showed these two help wait and slowdown: the
    # shadow time from the users' limits (as Slurm sees it) and backfill when the median fits.
    fits_on_p50=True,
    shadow_on_requested=True,
    # checkpointing preemptible work outside any guarantee runs reclaimable, so sessions and
    # bookings can take it back within a grace losing at most a checkpoint interval; work that
    # would restart from scratch is not lent (`lends_restartable`): reclaiming it for sessions
    # lost far more work than it saved waiting
    preempts_by_consent=True,
)


def plan_berth(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """One berth round (see the module docstring)."""
    sched = Scheduler(snapshot, policy, now, BERTH)
    sched.reclaim_for_bookings()
    queue, backfill = priority_orders(sched.state)
    sched.easy_pass(queue, interactive_first=True, backfill_order=backfill)
    return build_plan(sched, queue)
