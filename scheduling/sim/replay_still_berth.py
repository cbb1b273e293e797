"""Still ticks under berth: when a tick provably plans what the last (no-op) round planned.

`scheduling.sim.replay_still` holds the rule and its proof for easy and static; this module adds
what berth reads of ``now`` besides.  Between a berth round that started and preempted nothing
and a tick with no event in between, the pending and running jobs, the free GPUs, the bookings
and the claims are the same; the policy (interactive headroom and pool, rebuilt by the replay
from its forecast every round) must be the very same object.  Time alone then changes berth's
plan only through:

* the queue order (expected slowdown ``(wait + p50) / p50`` x fair share, which every waiting
  job's wait and the decaying usage move; the one-day starvation bound; claims expiring
  ``claim_hold_s`` past their kill): recomputed at the tick with berth's own order stage
  (`berth_order`) and compared job by job;
* reclaim for sessions and quota claims (`stages.reclaim.Reclaim.for_demand`, high class, no
  worth test) may take checkpointing work always and restartable work only while the work it
  would lose (`RoundState.lost_work_s`, all it did) is at most the GPU-time the demand asks
  for (`preemption.demand_may_take`): that set only shrinks as ``now`` grows; every victim is
  ready at ``now`` + the grace (a high-class minimum runtime is at most the grace); the free
  GPUs a demand may use for its run only shrink as its end ``now`` + its hold passes the fixed
  instants things are held from; what arrives (work in grace) changes only at its kill, an
  event.  So a session's or a claim's reclaim that found no plan in the still round finds none
  at the tick (and one that found a plan signalled someone, or waits ``preempting`` on
  arriving GPUs: not kept, `_reclaim_until`).  Wide jobs' reclaim
  (`fragmentation.reclaim_for_wide`) and drain-aware placement read predicted ends that drift
  once a job outlives its prediction: no tick is skipped on a cluster with a node of several
  GPUs (`berth_refuses`).  Restartable consenting work is taken by nothing else but a booking,
  whose signal instant is a threshold;
* checkpointing work that is reclaimable (`preemption.is_reclaimable`: consenting batch work
  not in its grace): its GPUs count as back at its kill time (`Round.avail_reclaim`), which is
  its minimum runtime until that passes and ``now`` + the grace after; the pool counts it as
  in reach once its session kill fits in a grace (`headroom.headroom_need`); the top job may
  suspend it once it is past its minimum runtime and either lent after the top job was queued
  or predicted to run on more than ``suspend_ratio`` times the top job's p50
  (`stages.reclaim.Reclaim.suspendable_for`).  Those minimum runtimes and the ages at which a
  predicted remaining time (p50 and p90 pieces, each at least a share of the age past them,
  `cluster.running_ends`) passes that bound are thresholds; ``now`` + the grace crossing a
  fixed instant (a running job's limit, a hold) is one too.  The still round's own reclaim for
  the top job (`stages.reclaim.Reclaim.for_demand`) either found no plan, for want of victims
  or GPUs (bounded as above), or found one and refused it as not worth it, which weighs gain
  and loss that move with ``now``: the round records the latter (`Outcome.worth_refused`, read
  from the finished round, `stages.compose.plan_and_round`) and the tick is then not skipped;
  nor when some job's reclaim was planned (it waits ``preempting``) or found no shadow (the
  top job is not known);
* running jobs' expected ends: from the users' limits, fixed until a job passes its limit, after
  which berth moves the end later with the job's age (`overdue.correct_overdue`): no tick is
  skipped while a job is overdue, and the next limit is a threshold (`berth_until`).  A job in
  its grace is gone at its kill, an event;
* whether a run fits before an instant something is held from (`berth_until`): the top job's
  shadow, a booking's reclaim signal, lead time, start and end (its window, and the booked
  windows the pool's peak adds), the pool forecast's hour starts and its end (its level, peak,
  next rise and low-demand windows), with every duration berth places a job with: p50 (backfill
  before the shadow), p90 (the pool's peak, the next rise), the user's limit (a booking's
  window), a lent start's ``min_runtime_s`` (checkpointing) or p90 (restartable) plus the grace,
  and each plus the grace while checkpointing work is reclaimable; the hour starts and the
  booking instants are thresholds in themselves too, and one reached at the round's own
  instant refuses (just after it, ``<`` and ``<=`` differ).

A shadow at the round's own instant could move with ``now`` (a low-demand window that opens
now): such a round is not kept.  `ReplayOptions.verify_still_ticks` plans every skipped tick
anyway and raises if it differs (`tests/scheduling/sim/test_replay_still_berth.py`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduling.engine.cluster import RoundState, estimate_of, estimates_by_job, job_estimate
from scheduling.engine.policies.berth import BERTH
from scheduling.engine.pool import HOUR_S, PoolForecast
from scheduling.engine.preemption import is_reclaimable
from scheduling.engine.priority import live_claims, slowdown_orders
from scheduling.engine.round import Round
from scheduling.engine.stages.order import SlowdownFirst
from scheduling.engine.types import PendingReason

if TYPE_CHECKING:
    from scheduling.engine.types import ClusterSnapshot, JobRequest, Plan, PolicyConfig, RunningJob

_NOTHING: set[str] = set()
# a job's reclaim was planned (it waits for GPUs arriving) or its shadow was not found: the top
# job is not known
_TOP_UNKNOWN = frozenset({PendingReason.PREEMPTING, PendingReason.CONSTRAINT})
_MARGIN_S = 1e-3  # float rounding of ``now + d`` against an instant: stop a little early

GuaranteeTest = Callable[["JobRequest"], bool]


def _order_stage() -> SlowdownFirst:
    order = BERTH.order
    assert isinstance(order, SlowdownFirst)
    return order


def has_starved(snapshot: ClusterSnapshot, t: float) -> bool:
    """Whether some pending job is past berth's starvation bound at ``t`` (only then does the
    order ask whether a job runs within its project's guarantee)."""
    starve = _order_stage().params.starvation_s
    for job in snapshot.pending:
        submitted = job.first_submit_at if job.first_submit_at is not None else job.submit_at
        if t - submitted >= starve:
            return True
    return False


def berth_order(
    snapshot: ClusterSnapshot, config: PolicyConfig, t: float, guarantees: GuaranteeTest | None
) -> list[JobRequest]:
    """Berth's queue order of ``snapshot`` at ``t`` (`stages.order.SlowdownFirst`), with the
    guarantee test ``guarantees`` (asked of starved jobs only: None when none is starved)."""
    state = RoundState(snapshot, config, t, is_predicted=True, is_running_predicted=False)
    claims = live_claims(snapshot, config.claim_hold_s, t)
    return slowdown_orders(state, _order_stage().params, guarantees, claims)[0]


def berth_refuses(snapshot: ClusterSnapshot, config: PolicyConfig, t: float) -> bool:
    """Whether a round of ``snapshot`` at ``t`` may read ``now`` in a way `berth_until` does not
    bound (module docstring): some running work is overdue, or a node has several GPUs (wide
    jobs' reclaim, drain-aware placement on predicted ends)."""
    if any(len(node.gpu_ids) > 1 for node in snapshot.nodes):
        return True
    limits = estimates_by_job(config, is_predicted=False)
    for running in snapshot.running:
        if running.started_at + estimate_of(running.job, limits, config, is_predicted=False).hold_s <= t:
            return True
    return False


def berth_until(
    snapshot: ClusterSnapshot,
    plan: Plan,
    config: PolicyConfig,
    t: float,
    *,
    free_gpus: int,
    rnd: Round,
) -> float:
    """The first instant after ``t`` at which time alone could change berth's plan of
    ``snapshot`` (module docstring); ``t`` itself when the round must not be kept.
    ``rnd``: the round that planned ``plan`` (`stages.compose.plan_and_round`)."""
    pending = {job.id: job for job in snapshot.pending}
    if any(r.start_at <= t and r.holder_id in pending for r in plan.reservations):
        return t  # a job's shadow from now on moves with now (a booking's start is fixed)
    reclaimable = [
        running
        for running in snapshot.running
        if running.job.is_checkpointable and is_reclaimable(running, excluded=_NOTHING)
    ]
    found = _reclaim_until(plan, config, t, reclaimable, pending, rnd)
    if found <= t:
        return t
    limits = estimates_by_job(config, is_predicted=False)
    ends = {
        running.started_at + estimate_of(running.job, limits, config, is_predicted=False).hold_s
        for running in snapshot.running
    }
    holds = {r.start_at for r in plan.reservations}
    for booking in snapshot.bookings:
        lead = booking.start_at - config.booking_lead_s
        holds.update((lead - config.grace_s, lead, booking.start_at, booking.end_at))
    forecast = PoolForecast.of(config)
    if forecast is not None:
        holds.update(forecast.starts)
        holds.add(forecast.starts[-1] + HOUR_S)
    durations = _durations(snapshot, plan, config, free_gpus=free_gpus)
    # what is compared with a fixed instant: now (free GPUs, the hour, a booking's signal),
    # now + a duration (a run's end) and, while checkpointing work may be reclaimed, now + the
    # grace (when its GPUs could be back, `Round.avail_reclaim`) and that plus a duration
    offsets = {0.0, *durations}
    end_offsets = [0.0]
    if reclaimable:
        offsets.update([config.grace_s, *(config.grace_s + d for d in durations)])
        end_offsets.append(config.grace_s)
    found = min(found, _first_crossing(holds, sorted(offsets), t))
    return min(found, _first_crossing(ends, end_offsets, t)) - _MARGIN_S


def _first_crossing(instants: set[float], offsets: list[float], t: float) -> float:
    """The first instant after ``t`` at which ``now + a`` reaches one of ``instants`` for one of
    the (sorted) ``offsets`` ``a``: for each instant the largest offset still short of it at
    ``t`` reaches it first."""
    found = math.inf
    for at in instants:
        index = bisect_right(offsets, at - t) - 1
        if index >= 0:
            # ``t`` when one reaches it at ``t`` exactly: just after, ``<`` and ``<=`` differ
            found = min(found, max(at - offsets[index], t))
    return found


def _reclaim_until(
    plan: Plan,
    config: PolicyConfig,
    t: float,
    reclaimable: list[RunningJob],
    pending: dict[str, JobRequest],
    rnd: Round,
) -> float:
    """While checkpointing work is reclaimable: the first instant after
    ``t`` at which the top job's suspension test (`stages.reclaim.Reclaim.suspendable_for`) or
    the pool's count of work in reach (`headroom.headroom_need`) could change; ``t`` when the
    round (``rnd``) refused a reclaim as not worth it (`Outcome.worth_refused`: gain and loss
    move with now) or when some job's reclaim was planned or its shadow not found (the top
    job is not known)."""
    if rnd.out.worth_refused:
        # the top job's reclaim found a plan and was refused on its worth; had it failed for
        # want of victims or GPUs, only the instants below could change that
        return t
    # a pending job's explanation gives its verdict's reason (`explain.explain_pending`; none
    # started in a still round): read from the verdicts, without explaining the plan
    rnd.settle()
    verdicts = rnd.out.verdicts
    for job_id in pending:
        verdict = verdicts.get(job_id)
        if verdict is not None and verdict.reason in _TOP_UNKNOWN:
            return t
    if not reclaimable:
        return math.inf
    grace, floor = config.grace_s, config.min_runtime_s
    found = math.inf
    for running in reclaimable:
        # past these its kill (batch, then high class) is no longer bound by its minimum runtime
        for at in (running.started_at + floor - grace, running.started_at + min(floor, grace) - grace):
            if at > t:
                found = min(found, at)
    tops = [pending[r.holder_id] for r in plan.reservations if r.holder_id in pending]
    if not tops:
        return found  # no job was made the top job: nothing asked to suspend work
    reclaim = BERTH.reclaim
    assert reclaim is not None
    predicted = estimates_by_job(config, is_predicted=True)
    # `RoundState.estimate` of the top job
    estimate = estimate_of(tops[0], predicted, config, is_predicted=True)
    longer_than = reclaim.suspend_ratio * estimate.p50_s
    fraction = config.overrun_fraction
    for running in reclaimable:
        # its predicted remaining time (`cluster.running_ends`, p50 and p90 each at least a
        # share of its age) passes ``longer_than`` only where one of its pieces does
        own = estimate_of(running.job, predicted, config, is_predicted=True)
        ages = [own.p50_s - longer_than, own.hold_s - longer_than]
        if fraction > 0:
            ages += [longer_than / (0.5 * fraction), longer_than / fraction]
        for age in ages:
            if running.started_at + age > t:
                found = min(found, running.started_at + age)
    return found


def _durations(snapshot: ClusterSnapshot, plan: Plan, config: PolicyConfig, *, free_gpus: int) -> list[float]:
    """Every duration berth fits a pending job's run with (module docstring), of the jobs that
    could use the free GPUs or those in grace, and of the plan's reservation holders; sorted."""
    in_grace = sum(len(r.gpu_ids) for r in snapshot.running if r.grace_until is not None)
    holders = {r.holder_id for r in plan.reservations}
    predicted = estimates_by_job(config, is_predicted=True)
    grace, floor = config.grace_s, config.min_runtime_s
    durations: set[float] = set()
    for job in snapshot.pending:
        if job.gpu_count > free_gpus + in_grace and job.id not in holders:
            continue
        estimate = estimate_of(job, predicted, config, is_predicted=True)
        limit = job_estimate(job, config, is_predicted=False).hold_s
        p90 = estimate.hold_s
        durations.update((estimate.p50_s, p90, limit, max(p90, job.requested_s or 0.0)))
        if job.is_preemptible:
            durations.add((floor if job.is_checkpointable else max(p90, floor)) + grace)
    return sorted(durations)
