"""Reclaim: take consenting work back for higher-class demand, within a grace.

* bookings (`Reclaim.for_bookings`): one grace before a booking's lead time, the reclaimable
  work on its GPUs is signalled so they are free at its start;
* sessions, guaranteed-quota claims and the top job (`Reclaim.for_demand`): a blocked demand
  assembles its GPUs from free ones, ones already in grace and new victims
  (`preemption.plan_reclaim`: least work lost, restore included, first).  Sessions may take any
  consenting work; a quota claim other projects' preemptible work; the top job only what
  `Reclaim.suspendable_for` allows, and only when it gains more idle GPU-time than the victims
  lose (`Reclaim.is_worth_it`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine.backfill import Shadow, earliest_start
from scheduling.engine.outcome import claim_label, fmt_s
from scheduling.engine.placement import INF, FreePool
from scheduling.engine.preemption import Reclaim as ReclaimPlan
from scheduling.engine.preemption import demand_may_take, is_reclaimable, kill_time, plan_reclaim
from scheduling.engine.types import JobKind, JobRequest, PendingReason, RunningJob

if TYPE_CHECKING:
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.round import Round

# The top job may suspend checkpointing work whose predicted remaining time exceeds this many
# times its own predicted runtime (`Reclaim.suspendable_for`).  Any ratio above 1 keeps chains
# short; 2 rather than 4 (KTH `100x1`, no overlay, seeds 1 and 2: busy 0.838 -> 0.842 and
# 0.835 -> 0.845, wait -4.5 % and -3.3 %, bounded slowdown -7 % and -4 %; 1.5 gains no more;
# Alibaba seeds 0-15 unchanged; docs/benchmarks.md, "Suspending for the top job at twice").
SUSPEND_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class Reclaim:
    """The reclaim stage (see the module docstring); ``suspend_ratio``: see `suspendable_for`."""

    suspend_ratio: float = SUSPEND_RATIO

    def for_bookings(self, rnd: Round) -> None:
        """Signal reclaimable work on a booking's GPUs so they are free at its start."""
        state = rnd.state
        policy = rnd.policy
        for booking in sorted(state.snapshot.bookings, key=lambda b: (b.start_at, b.id)):
            gpus = rnd.booking_gpus.get(booking.id)
            if not gpus or booking.end_at <= rnd.now:
                continue
            signal_at = booking.start_at - policy.booking_lead_s - policy.grace_s
            if rnd.now < signal_at:
                continue
            for gpu in gpus:
                running = state.running_by_gpu.get(gpu)
                if running is None:
                    continue
                rnd.out.promised.update(running.gpu_ids)
                if is_reclaimable(running, excluded=rnd.out.preempted):
                    label = claim_label("booking", booking.id, same_owner=booking.user == running.job.user)
                    why = f"{label}, which starts now"
                    rnd.preempt(running, for_id=booking.id, why=why, is_high_class=True)
                elif running.grace_until is None and running.job.id not in rnd.out.preempted:
                    rnd.out.notes.append(
                        f"Booking {booking.id}: GPU {gpu} is still running non-preemptible job "
                        f"{running.job.id}; the booking may start late."
                    )

    def for_demand(
        self,
        rnd: Round,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        *,
        single: bool,
        is_quota_claim: bool = False,
    ) -> bool:
        """Get GPUs for a blocked session, a guaranteed-quota claim or the top job by reclaiming
        consenting work; True when the demand is served (its GPUs claimed or arriving)."""
        state = rnd.state
        out = rnd.out
        now = rnd.now
        pool = rnd.pool_for(job)
        memo = _FailMemo.of(rnd, job, types, estimate, pool, single=single, is_quota_claim=is_quota_claim)
        if memo is not None and memo.has_failed():
            return False
        until = now + estimate.hold_s
        incoming = _incoming(rnd)
        is_high_class = job.kind == JobKind.INTERACTIVE or is_quota_claim
        # the top job's shadow without reclaim, computed at most once per call: nothing this
        # call reads changes before it decides
        shadow_memo: list[Shadow | None] = []
        may_take = self._may_take_for(
            rnd, job, types, estimate, single, shadow_memo, is_quota_claim=is_quota_claim
        )
        if may_take is not None:
            may_take = _memoised(may_take)
        if not incoming and not _has_victim(rnd, may_take):
            if memo is not None:
                memo.failed(whatever_is_taken=True)
            return False  # no victim and nothing arriving: a plan could only use free GPUs
        reclaim = plan_reclaim(
            state,
            node_indexes=rnd.nodes_for(job, types),
            gpu_count=job.gpu_count,
            free_on_node=lambda i: pool.node_usable(i, until=until, strict_until=until, is_lent=0),
            incoming=incoming,
            excluded_jobs=out.preempted,
            is_single_node=single,
            may_take=may_take,
            is_high_class=is_high_class,
            free_nodes=pool.nodes_with_free() if type(pool) is FreePool else None,
        )
        if reclaim is None or (not reclaim.victims and not reclaim.incoming_gpus):
            if memo is not None:
                # too few GPUs stays too few when the pool loses some; enough free ones may not
                memo.failed(whatever_is_taken=reclaim is None)
            return False
        if not is_high_class and not self.is_worth_it(
            rnd, job, types, estimate, reclaim, single, shadow_memo
        ):
            out.worth_refused = True
            return False
        _commit(rnd, job, reclaim, pool, is_quota_claim=is_quota_claim, is_high_class=is_high_class)
        return True

    def _may_take_for(
        self,
        rnd: Round,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        single: bool,
        shadow_memo: list[Shadow | None],
        *,
        is_quota_claim: bool,
    ) -> Callable[[RunningJob], bool] | None:
        """Which reclaimable jobs a demand may take: sessions checkpointing work and restartable
        work losing at most what they ask for (`preemption.demand_may_take`); a quota claim the
        same, of other projects' borrowed work only (started above their guarantee or on lent
        capacity: a project's own guarantee is never taken by another's claim); the top job
        what `suspendable_for` allows."""
        if job.kind == JobKind.INTERACTIVE:
            return demand_may_take(rnd.state, demand_gpu_s=estimate.hold_s * job.gpu_count)
        if is_quota_claim:
            project = job.project
            affordable = demand_may_take(rnd.state, demand_gpu_s=estimate.hold_s * job.gpu_count)
            return lambda running: (
                running.is_preemptible and running.job.project != project and affordable(running)
            )
        return self.suspendable_for(rnd, job, types, estimate, single, shadow_memo)

    def suspendable_for(
        self,
        rnd: Round,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        single: bool,
        shadow_memo: list[Shadow | None] | None = None,
    ) -> Callable[[RunningJob], bool]:
        """Which running work the top job may suspend to start now (preemptive slowdown order).

        Only checkpointing work whose owner or quota consented (a restart from scratch loses
        everything; a resume loses the work since the last checkpoint plus ``restore_s``), only
        work past its batch minimum runtime (it goes within the grace), only work expected to
        still run at the top job's shadow time (the work really in its way), and of that:

        * work whose predicted remaining time is more than ``suspend_ratio`` times the top
          job's predicted runtime, however it started: suspending it delays it by a small share
          of what it still has to run while the top job, short next to it, starts now instead
          of at its shadow time (shortest-remaining-first, which is what cuts mean slowdown).
          Each such suspension needs a victim that many times longer than the demand, so a
          suspended job that later heads the queue can only suspend work longer still: chains
          stay short and never come back to the job that suspended it;
        * work lent (started reclaimable) after the top job was queued: it borrowed the top
          job's drain (`Reserve.top`) and gives it back.

        ``shadow_memo``: holds the top job's shadow without reclaim once computed (shared with
        `is_worth_it`).
        """
        memo: list[Shadow | None] = [] if shadow_memo is None else shadow_memo
        latest_kill = rnd.now + rnd.policy.grace_s
        state = rnd.state
        end_hold = state.end_hold
        longer_than = rnd.now + self.suspend_ratio * estimate.p50_s
        in_way: list[float] = []  # the shadow time, computed once and only if a cheap test passes

        def in_way_after() -> float:
            if not in_way:
                shadow = _shadow_once(memo, rnd, job, types, estimate, single)
                in_way.append(-INF if shadow is None else shadow.start_at)
            return in_way[0]

        def may_take(running: RunningJob) -> bool:
            return (
                running.job.is_checkpointable
                and kill_time(state, running) <= latest_kill
                and (
                    rnd.predicted_end(running) > longer_than
                    or (running.is_preemptible and running.started_at >= job.submit_at)
                )
                and end_hold[running.job.id] >= in_way_after()
            )

        return may_take

    def is_worth_it(
        self,
        rnd: Round,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        reclaim: ReclaimPlan,
        single: bool,
        shadow_memo: list[Shadow | None] | None = None,
    ) -> bool:
        """Suspend for the top job only if it gains more than the victims lose.

        The gain is the idle time of the free GPUs the top job would otherwise hold until its
        shadow time (the victims' GPUs stay busy either way); the loss is the victims' work
        since their last checkpoint plus the restore (`RoundState.lost_work_s`).
        """
        if not reclaim.victims:
            return True
        shadow = _shadow_once([] if shadow_memo is None else shadow_memo, rnd, job, types, estimate, single)
        if shadow is None:
            return True
        gained = (shadow.start_at - reclaim.ready_at) * len(reclaim.free_gpus)
        lost = sum(v.lost_gpu_s for v in reclaim.victims)
        return gained > lost


def _has_victim(rnd: Round, may_take: Callable[[RunningJob], bool] | None) -> bool:
    """Whether some running job is reclaimable now and ``may_take`` (None: any) allows it."""
    excluded = rnd.out.preempted
    return any(
        is_reclaimable(running, excluded=excluded) and (may_take is None or may_take(running))
        for running in rnd.state.snapshot.running
    )


def _commit(
    rnd: Round,
    job: JobRequest,
    reclaim: ReclaimPlan,
    pool: FreePool,
    *,
    is_quota_claim: bool,
    is_high_class: bool,
) -> None:
    """Act on a reclaim plan for ``job``: signal its victims, claim its free GPUs, promise the
    arriving ones, and record that it starts once they are all there."""
    out = rnd.out
    now = rnd.now
    for victim in reclaim.victims:
        rnd.preempt(
            victim.running,
            for_id=job.id,
            why=claim_label(
                "interactive session"
                if job.kind == JobKind.INTERACTIVE
                else ("job within its guaranteed quota" if is_quota_claim else "top job"),
                job.id,
                same_owner=job.user == victim.running.job.user,
            ),
            is_high_class=is_high_class,
        )
    pool.take(reclaim.free_gpus)
    for gpu in reclaim.free_gpus:
        out.claimed[gpu] = job.id
    rnd.round_promised.update(reclaim.incoming_gpus)
    out.promised.update(reclaim.incoming_gpus)
    if rnd.top is None and job.kind != JobKind.INTERACTIVE:
        rnd.top = job
    out.wait(
        job.id,
        PendingReason.PREEMPTING,
        f"{len(reclaim.free_gpus)} of its {job.gpu_count} GPUs are free and the rest are being "
        f"reclaimed from preemptible work ({len(reclaim.victims)} job(s) signalled now); "
        f"it starts in about {fmt_s(reclaim.ready_at - now)}.",
        reclaim.ready_at,
    )
    out.wake_at(reclaim.ready_at, now)


class _FailMemo:
    """A session's failed reclaim, remembered per demand shape for the rest of the round.

    A session's search (`Reclaim.for_demand`) reads only its eligible types, GPU count,
    single-node need and hold time (the planned end of its free GPUs' use and the GPU-time
    `preemption.demand_may_take` weighs), the interactive pool, and what this round signalled
    or promised (``out.preempted``, ``out.promised``, ``round_promised``): an identical session
    asking again gets the same "no" without the search while none of those changed.  A hold
    on the pool (``FreePool.holds``) always forgets the answer; GPUs taken from the pool
    (``FreePool.takes``) only forget a failure that found enough GPUs on free ones alone
    (fewer free GPUs may now need victims, so a plan with victims may be found): with fewer
    free GPUs a demand that could not assemble enough GPUs still cannot.  Identical plans;
    `tests/scheduling/engine/test_reclaim_memo.py`.
    """

    __slots__ = ("key", "marks", "pool", "rnd")

    def __init__(self, rnd: Round, key: tuple[object, ...], pool: FreePool) -> None:
        self.rnd = rnd
        self.key = key
        self.pool = pool
        out = rnd.out
        self.marks = (len(out.preempted), len(out.promised), len(rnd.round_promised), pool.holds)

    @staticmethod
    def of(
        rnd: Round,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        pool: FreePool,
        *,
        single: bool,
        is_quota_claim: bool,
    ) -> _FailMemo | None:
        """The memo of a session's demand (None for other demands: their search reads more)."""
        if job.kind != JobKind.INTERACTIVE or is_quota_claim or type(pool) is not FreePool:
            return None
        if rnd.wide and job.id in rnd.wide:
            return None
        return _FailMemo(rnd, (tuple(types), job.gpu_count, single, estimate.hold_s), pool)

    def has_failed(self) -> bool:
        """Whether an identical demand failed since nothing its search reads changed."""
        seen = self.rnd.reclaim_failed.get(self.key)
        if seen is None:
            return False
        marks, takes = seen
        return marks == self.marks and (takes is None or takes == self.pool.takes)

    def failed(self, *, whatever_is_taken: bool) -> None:
        """Remember this failure (``whatever_is_taken``: it holds however many GPUs the pool
        loses)."""
        self.rnd.reclaim_failed[self.key] = (self.marks, None if whatever_is_taken else self.pool.takes)


def _incoming(rnd: Round) -> dict[int, float]:
    """GPUs of work already in grace (or signalled this round and not promised to another
    demand) -> when they come free; none promised to a demand earlier in this round."""
    now = rnd.now
    out = rnd.out
    incoming: dict[int, float] = {}
    state = rnd.state
    if rnd.in_grace is None:  # the snapshot's work in grace, once per round
        rnd.in_grace = [running for running in state.snapshot.running if running.grace_until is not None]
    for running in rnd.in_grace:
        at = max(running.grace_until or now, now)
        for gpu in running.gpu_ids:
            incoming[gpu] = at
    running_by_id = state.running_by_id
    for job_id in out.preempted:  # signalled this round (a set: the order is not used)
        signalled = running_by_id.get(job_id)
        if signalled is None or signalled.grace_until is not None:
            continue  # in grace already: above
        for gpu in signalled.gpu_ids:
            if gpu not in out.promised:
                incoming[gpu] = now
    for gpu in rnd.round_promised:
        incoming.pop(gpu, None)
    return incoming


def regular_shadow(
    rnd: Round, job: JobRequest, types: Sequence[str], estimate: Estimate, single: bool
) -> Shadow | None:
    """The top job's shadow time if nothing were reclaimed for it."""
    return earliest_start(
        node_gpus=rnd.node_gpus_for(job, types),
        available=rnd.availability(for_job=job.id, with_reclaim=False),
        gpu_count=job.gpu_count,
        is_single_node=single,
        duration_s=estimate.hold_s,
        windows=rnd.windows,
    )


def _shadow_once(
    memo: list[Shadow | None],
    rnd: Round,
    job: JobRequest,
    types: Sequence[str],
    estimate: Estimate,
    single: bool,
) -> Shadow | None:
    """`regular_shadow`, kept in ``memo`` after the first call."""
    if not memo:
        memo.append(regular_shadow(rnd, job, types, estimate, single))
    return memo[0]


def _memoised(may_take: Callable[[RunningJob], bool]) -> Callable[[RunningJob], bool]:
    """``may_take`` asked once per running job (it is asked per node and again by the
    pre-check; its answer depends only on the job within one reclaim)."""
    answers: dict[str, bool] = {}

    def memoised(running: RunningJob) -> bool:
        answer = answers.get(running.job.id)
        if answer is None:
            answer = answers[running.job.id] = may_take(running)
        return answer

    return memoised
