"""``berth``: slowdown-aware, preemptive EASY on predicted runtimes, lending with guaranteed reclaim.

Order of a round:
1. bookings whose reclaim time has come signal the preemptible work on their GPUs;
2. the queue is ordered by `priority.slowdown_orders`: interactive sessions first, then
   explicit priority classes, then jobs past the starvation bound (oldest first, those within
   their project's guarantee before borrowing work, which they would claim back), then the
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
   to run on more than `stages.reclaim.SUSPEND_RATIO` times its runtime or lent on its drain, when
   that saves more idle GPU-time than it loses; else it gets a shadow reservation, whose drain
   is lent to checkpointing work.  The shadow time comes from the users' limits of running
   work (as Slurm sees it), except that a job already past its limit is expected to run on in
   proportion to its age (`overdue.correct_overdue`) rather than to end within a minute, so a
   wide top job blocked by an overrunning job does not freeze the GPUs in front of it;
6. backfill candidates are taken shortest predicted GPU-time first.  On GPUs reserved for the
   top job, non-preemptible work starts if its predicted median ends in time; on a booking's,
   only if the user's limit does; checkpointing preemptible work may borrow those GPUs and the
   pool as lent work;
7. work above a project's guaranteed quota runs only as preemptible, and a job of several GPUs
   on one node that would run so waits (no start, not the top job) while a smaller job within
   its own project's guarantee could use the free GPUs, at most the starvation bound
   (`fragmentation.defers_wide_borrower`).
"""

from __future__ import annotations

from scheduling.engine.priority import SlowdownOrder
from scheduling.engine.stages.admit import Admit
from scheduling.engine.stages.backfill import EasyPass
from scheduling.engine.stages.compose import Composition, Model, plan_with
from scheduling.engine.stages.explain import Explain
from scheduling.engine.stages.order import SlowdownFirst
from scheduling.engine.stages.place import Place
from scheduling.engine.stages.reclaim import Reclaim
from scheduling.engine.stages.reserve import InteractivePool, Reserve
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

BERTH = Composition(
    # Shadow times from the users' limits of running work: predictions of running jobs are
    # optimistic for the long tail, and a too-early shadow blocks backfill that would have fitted.
    model=Model(
        is_predicted=True, is_running_predicted=False, corrects_overdue=True, prefers_cheap_types=True
    ),
    # Work above a guarantee runs preemptible; checkpointing preemptible work outside any
    # guarantee starts lent (any consenting work is reclaimable by sessions and bookings anyway).
    admit=Admit(enforces_guarantees=True, lends_consenting=True),
    order=SlowdownFirst(),
    pool=InteractivePool(),
    reserve=Reserve(),
    backfill=EasyPass(),
    reclaim=Reclaim(),
    # Backfill when the median fits before the top job's shadow time: the shadow comes from
    # the users' limits, which overestimate, so the median is the better bet of when the GPUs
    # are really needed (on the full KTH replay it beat the p90 on wait, slowdown and
    # utilization; the first 4,000 jobs alone, with one 60-hour job predicted at a few hours
    # holding a 94-GPU reservation, favoured the p90).
    # A wide job that would borrow waits while smaller jobs within their guarantees can use the
    # free GPUs, at most the order's starvation bound (`fragmentation.defers_wide_borrower`).
    place=Place(
        fits_on_p50=True, lends=True, is_drain_aware=True, wide_borrower_wait_s=SlowdownOrder().starvation_s
    ),
    explain=Explain(),
)


def plan_berth(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """One berth round (see the module docstring)."""
    return plan_with(BERTH, snapshot, policy, now)
