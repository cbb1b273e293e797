"""``berth``: slowdown-aware, preemptive EASY on predicted runtimes, lending with guaranteed reclaim.

Order of a round:
1. bookings whose reclaim time has come signal the preemptible work on their GPUs;
2. the queue is ordered by `priority.slowdown_orders`: interactive sessions first, then
   explicit priority classes, then jobs past the starvation bound (oldest first), then the
   rest by expected slowdown ``(wait + p50) / p50`` weighted by the project's fair share (a
   requeued job waits from its requeue), so a short job overtakes a long one once it has
   waited a fair share of its own runtime and every waiting job keeps rising;
3. interactive sessions start at once, or reclaim consenting work (any job its owner or its
   quota marked preemptible, however it started; victims losing least work, restore included,
   first; a session waits at most the grace, see `preemption.min_runtime_s`);
4. the interactive pool is held: the forecast level of this hour (`pool.PoolForecast`, else
   ``interactive_headroom``), idle but lendable to checkpointing work and to restartable work
   predicted to be gone before demand rises; non-preemptible work starts only if it leaves the
   pool's forecast peak free until its p90 end;
5. the EASY pass: jobs start in that order until one does not fit; it becomes the top job and
   suspends checkpointing work in its way that is past its minimum runtime and either predicted
   to run on more than `scheduler.SUSPEND_RATIO` times its runtime or lent on its drain, when
   that saves more idle GPU-time than it loses; else it gets a shadow reservation, whose drain
   is lent to checkpointing work.  The shadow time comes from the users' limits of running
   work (as Slurm sees it), except that a job already past its limit is expected to run on in
   proportion to its age (`overdue.correct_overdue`) rather than to end within a minute, so a
   wide top job blocked by an overrunning job does not freeze the GPUs in front of it;
6. backfill candidates are taken shortest predicted GPU-time first.  On GPUs reserved for the
   top job, non-preemptible work starts if its predicted median ends in time; on a booking's,
   only if the user's limit does; checkpointing preemptible work may borrow those GPUs and the
   pool as lent work;
7. work above a project's guaranteed quota runs only as preemptible.
"""

from __future__ import annotations

from scheduling.engine.explain import build_plan
from scheduling.engine.priority import SlowdownOrder, slowdown_orders
from scheduling.engine.scheduler import Knobs, Scheduler
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

BERTH = Knobs(
    is_predicted=True,
    can_preempt=True,
    can_lend=True,
    prefers_cheap_types=True,
    enforces_guarantees=True,
    # Backfill when the median fits before the top job's shadow time: the shadow comes from
    # the users' limits, which overestimate, so the median is the better bet of when the GPUs
    # are really needed (on the full KTH replay it beat the p90 on wait, slowdown and
    # utilization; the first 4,000 jobs alone, with one 60-hour job predicted at a few hours
    # holding a 94-GPU reservation, favoured the p90).
    fits_on_p50=True,
    # The shadow time from the users' limits: predictions of running jobs are optimistic for
    # the long tail, and a too-early shadow blocks backfill that would have fitted.
    shadow_on_requested=True,
    drain_aware=True,
    corrects_overdue=True,
    # checkpointing preemptible work outside any guarantee starts lent (outside the project's
    # guaranteed count); any consenting work is reclaimable by sessions and bookings anyway
    preempts_by_consent=True,
)

ORDER = SlowdownOrder()


def plan_berth(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """One berth round (see the module docstring)."""
    sched = Scheduler(snapshot, policy, now, BERTH)
    sched.reclaim_for_bookings()
    queue, backfill = slowdown_orders(sched.state, ORDER)
    sched.easy_pass(queue, interactive_first=True, backfill_order=backfill)
    return build_plan(sched, queue)
