"""Still ticks: a tick whose round would plan exactly what the last round planned is not planned.

`Replay` (``scheduling.sim.replay``) mixes this in.  Under ``easy`` and ``static`` (the shipped
engine, `scheduling.engine.plan_round`; ``berth``: what its round reads besides is bounded or
refused in `scheduling.sim.replay_still_berth`) a tick that follows a round which started and preempted
nothing, with no event of any kind in between, plans nothing new when time alone has crossed
no threshold the round reads.  Between the two instants the pending jobs, the running jobs, the
free GPUs, the bookings and the policy are the very same objects; what a round of these policies
reads of ``now`` is then:

* the queue order (age saturating at ``max_age_s``, fair share from usage that decays while
  work runs): recomputed at the tick with the engine's own `priority.priority_order` and
  compared job by job, or, when the still round started and preempted nothing, only where the
  round reads it: each pass's queue through its top job, and which jobs fill the backfill
  window behind it (`scheduling.sim.replay_still_order`);
* the bookings passed to the engine (those starting within the replay's horizon): compared;
* running jobs' expected ends (the user's estimate; one past it is seen as ending
  ``overdue_epsilon_s`` from now): no running job may pass its estimate in between (the seen
  end jumps there), nor, while a job is overdue, may its moving end pass a fixed instant at
  which a GPU comes free or is held from (another job's end, a booking's lead time, start or
  end: the order in which GPUs come free changes there); an overdue job's seen end moves with
  ``now``, and what depends on it (the top job's shadow) moves later by no more than ``now``
  does, so a start that would delay a reservation at the last round still would;
* whether a job's run fits before a time something is held from: a booking's lead time, the
  start of a reservation the last plan made (the top job's shadow).  A job of
  duration ``d`` (any of a pending job's estimates, plus ``overdue_epsilon_s`` for a GPU whose
  overdue job frees it "soon") fits before ``s`` until ``now`` passes ``s - d``: no such
  instant may lie between the two rounds.  When the still round started and preempted nothing
  only the top jobs' durations count: a job that did not start then cannot start later for time
  alone, nor wait for another reason (`_acted_on_nothing`).  A booking's start, end, lead and
  release are events of their own (they end the stillness).

So the skipped round would start nothing, preempt nothing, explain the idle GPUs as the last
round did and ask for the same wake-up: the replay keeps the last round's idle counts and
doubles the tick as after a round that changed nothing.  ``ReplayOptions.verify_still_ticks``
plans every skipped tick anyway and raises if its plan differs in any of these
(`tests/scheduling/sim/test_replay_still.py`; docs/benchmarks.md, "Speed IV").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine import plan_round
from scheduling.engine.cluster import estimate_of, estimates_by_job
from scheduling.engine.policies.berth import BERTH
from scheduling.engine.policies.easy import EASY
from scheduling.engine.policies.static import STATIC
from scheduling.engine.priority import order_inputs, priority_order
from scheduling.engine.stages.compose import plan_and_round
from scheduling.engine.stages.order import guarantee_test
from scheduling.sim.replay_still_berth import berth_order, berth_refuses, berth_until, has_starved
from scheduling.sim.replay_still_order import Passes, decides_alike, pass_heads

if TYPE_CHECKING:
    from scheduling.engine.round import Round
    from scheduling.engine.types import ClusterSnapshot, JobRequest, Plan, PolicyConfig
    from scheduling.sim.replay_setup import PlanFn

# the policies whose rounds read ``now`` only as the module docstring says (no predictions,
# no reclaim, no interactive pool, no forecast), and berth, whose other reads of it
# `replay_still_berth` bounds or refuses
STILL_POLICIES = frozenset({"easy", "static", "berth"})
# what `plan_round` runs for each of them (`_plan` keeps the round)
_COMPOSITIONS = {"easy": EASY, "static": STATIC, "berth": BERTH}


@dataclass(slots=True)
class _Still:
    """The last round, which acted on nothing; what a tick compares is computed at the first
    tick that asks (most such rounds are followed by an event, not a tick)."""

    at: float
    snapshot: ClusterSnapshot
    plan: Plan
    free_gpus: int  # GPUs free at ``at`` (and until the next event)
    config: PolicyConfig  # the policy of that round (berth's is rebuilt from its forecast)
    order: list[JobRequest] | None = None  # the queue order at ``at``
    until: float | None = None  # the first instant after ``at`` at which time alone could change the plan
    # berth: the still round's guarantee test, once a starved job asks it (`replay_still_berth`)
    guarantees: Callable[[JobRequest], bool] | None = None
    round: Round | None = None  # the round that planned ``plan`` (`plan_and_round`)
    # easy, static: each pass's queue in the still order and its top job's index (`pass_heads`)
    passes: Passes | None = None  # ([] when the plan does not tell)


class StillTickRule:
    """The still-tick half of `Replay` (module docstring); the attributes are `Replay`'s."""

    config: PolicyConfig
    plan_fn: PlanFn
    _still: _Still | None
    _still_order: tuple[float, ClusterSnapshot, list[JobRequest]] | None
    _skips_still_ticks: bool
    _rounds_skipped: int
    _still_is_berth: bool
    _still_splits: bool
    _planned: tuple[Round, list[JobRequest]] | None

    def _init_still(self, policy: str, plan_fn: PlanFn, *, enabled: bool) -> None:
        self._skips_still_ticks = enabled and policy in STILL_POLICIES and plan_fn is plan_round
        self._still_is_berth = policy == "berth"
        self._still_splits = policy == "static"  # `SplitPass`: a batch pass, then a session pass
        self._planned = None  # (round, queue order) of the last berth plan (`_plan`)
        self._still = None
        self._still_order = None  # (instant, snapshot, queue order) of the last `_order_at`
        self._rounds_skipped = 0

    def _order_at(self, snapshot: ClusterSnapshot, t: float) -> list[JobRequest]:
        """The engine's queue order of ``snapshot`` at ``t`` (`priority.priority_order`), kept
        for the next call with the same instant and snapshot (two rounds can share an instant:
        an event the first round caused)."""
        kept = self._still_order
        if kept is not None and kept[0] == t and kept[1] is snapshot:
            return kept[2]
        if self._still_is_berth:
            still = self._still
            guarantees = None
            if still is not None and has_starved(snapshot, t):
                guarantees = self._still_guarantees()
            order = berth_order(snapshot, self.config, t, guarantees)
        else:
            order = priority_order(order_inputs(snapshot, self.config, t))
        self._still_order = (t, snapshot, order)
        return order

    def _still_guarantees(self) -> Callable[[JobRequest], bool]:
        """Berth's guarantee test of the still round, built once (`replay_still_berth`)."""
        still = self._still
        assert still is not None
        if still.guarantees is None:
            still.guarantees = guarantee_test(self._still_round())
        return still.guarantees

    def _still_round(self) -> Round:
        """The round that planned the still round (berth: `stages.compose.plan_and_round`)."""
        still = self._still
        assert still is not None
        assert still.round is not None
        return still.round

    def _plan(self, snapshot: ClusterSnapshot, config: PolicyConfig, t: float) -> Plan:
        """``plan_fn``'s plan; with still ticks skipped, `plan_round`'s very plan through
        `plan_and_round` (what `plan_easy`, `plan_static` and `plan_berth` run), keeping its
        round and queue order for `_remember_still`."""
        composition = _COMPOSITIONS.get(config.name)
        if (
            composition is not None
            and self._skips_still_ticks
            and self.plan_fn is plan_round  # not a caller's own, set after `_init_still`
        ):
            plan, rnd, queue = plan_and_round(composition, snapshot, config, t)
            self._planned = (rnd, queue)
            return plan
        return self.plan_fn(snapshot, policy=config, now=t)

    def _is_still(self, snapshot: ClusterSnapshot, t: float) -> bool:
        """Whether a tick at ``t`` would plan what the last round planned (module docstring)."""
        still = self._still
        if still is None or snapshot.bookings != still.snapshot.bookings or self.config is not still.config:
            return False
        if self._still_is_berth and still.round is None:
            return False  # berth's round was not kept (another ``plan_fn``): nothing is known of it
        if still.until is None:
            last = still.snapshot
            if not self._still_is_berth:
                still.until = min(
                    _next_overdue(last, self.config, still.at),
                    _next_fit_change(
                        last,
                        still.plan,
                        self.config,
                        still.at,
                        free_gpus=still.free_gpus,
                        holders_only=_acted_on_nothing(still.plan),
                    ),
                )
            elif berth_refuses(last, self.config, still.at):
                still.until = still.at
            else:
                still.until = berth_until(
                    last,
                    still.plan,
                    self.config,
                    still.at,
                    free_gpus=still.free_gpus,
                    rnd=self._still_round(),
                )
        if t >= still.until:
            return False
        if still.order is None:
            still.order = self._order_at(still.snapshot, still.at)
        order = self._order_at(snapshot, t)
        if order == still.order:
            return True
        if (
            self._still_is_berth
            or not _acted_on_nothing(still.plan)
            or snapshot.pending != still.snapshot.pending  # (the same jobs: no event came between)
        ):
            return False
        if still.passes is None:
            still.passes = (
                pass_heads(
                    still.order,
                    still.plan,
                    still.snapshot,
                    split=self._still_splits,
                    depth=self.config.backfill_depth,
                    rnd=still.round,
                )
                or []
            )
        return bool(still.passes) and decides_alike(
            order, still.passes, self.config.backfill_depth, split=self._still_splits
        )

    def _remember_still(
        self, snapshot: ClusterSnapshot, plan: Plan, t: float, *, acted: bool, free_gpus: int
    ) -> None:
        """After a planned round: keep it for the ticks after it, if it did nothing."""
        if acted or not self._skips_still_ticks:
            self._still = self._planned = None
            return
        still = _Still(t, snapshot, plan, free_gpus, self.config)
        if self._planned is not None:
            # berth: its round, and its queue order at ``t`` (the order the tick compares)
            still.round, still.order = self._planned
            self._planned = None
        self._still = still


def _next_overdue(snapshot: ClusterSnapshot, config: PolicyConfig, t: float) -> float:
    """The first instant after ``t`` at which a running job passes its estimate, or, while some
    job is overdue (seen ending ``overdue_epsilon_s`` from now), at which that moving end
    passes a fixed instant at which a GPU comes free or is held from (which GPUs come free
    first, so which ones a reservation takes, can change there)."""
    estimates = estimates_by_job(config, is_predicted=False)
    ends = [
        running.started_at + estimate_of(running.job, estimates, config, is_predicted=False).hold_s
        for running in snapshot.running
    ]
    found = min((end for end in ends if end > t), default=math.inf)
    if any(end <= t for end in ends):
        # every fixed instant a GPU comes free at or is held from: other jobs' ends, and the
        # bookings' lead times, starts and ends (an active booking's GPUs come free at its end)
        fixed = list(ends)
        for booking in snapshot.bookings:
            fixed += (booking.start_at - config.booking_lead_s, booking.start_at, booking.end_at)
        epsilon = config.overdue_epsilon_s
        found = min(found, min((at - epsilon for at in fixed if at - epsilon > t), default=math.inf))
    return found - _MARGIN_S


def _next_fit_change(
    snapshot: ClusterSnapshot,
    plan: Plan,
    config: PolicyConfig,
    t: float,
    *,
    free_gpus: int,
    holders_only: bool = False,
) -> float:
    """The first instant after ``t`` at which some job's run stops fitting before a time
    something is held from (module docstring); inf when nothing is held ahead.  The jobs whose
    runs are placed against those times: those no wider than the ``free_gpus`` (the others
    cannot start, and their verdict says so whatever the time) and the holders of the plan's
    reservations (the top jobs: where their shadow falls).

    ``holders_only`` (the plan started and preempted nothing): only the holders.  A job that
    did not start at ``t`` does not start later for time alone (`_acted_on_nothing`), and
    the reason it waits does not read ``now``, so only where the top jobs' shadows fall can
    change what the round explains."""
    holds = {r.start_at for r in plan.reservations if r.start_at > t}
    for booking in snapshot.bookings:
        if booking.start_at > t:
            # a future booking's GPUs are held from its lead time (pools, and the windows a
            # reservation's run must fit between); its start is an event of its own
            holds.add(booking.start_at - config.booking_lead_s)
    if not holds:
        return math.inf
    estimates = estimates_by_job(config, is_predicted=False)
    holders = {r.holder_id for r in plan.reservations}
    # what each job's durations are made of, once per distinct triple (a queue of thousands
    # has a few hundred)
    made_of: set[tuple[float, float, float | None]] = set()
    for job in snapshot.pending:
        if (holders_only or job.gpu_count > free_gpus) and job.id not in holders:
            continue
        # `estimate_of`'s lookup written out (the very same job object: its kept estimate)
        entry = estimates.get(job.id)
        if entry is not None and entry[0] is job:
            estimate = entry[1]
        else:
            estimate = estimate_of(job, estimates, config, is_predicted=False)
        made_of.add((estimate.p50_s, estimate.hold_s, job.requested_s))
    durations: set[float] = set()
    for p50_s, hold_s, requested_s in made_of:
        durations.update((p50_s, hold_s, max(hold_s, requested_s or 0.0)))
    durations.update([d + config.overdue_epsilon_s for d in durations])
    ordered = sorted(durations)
    found = math.inf
    for start in holds:
        # the longest duration that still fits before ``start`` at ``t`` stops fitting first
        index = bisect_right(ordered, start - t) - 1
        if index >= 0:
            found = min(found, start - ordered[index])
    return found - _MARGIN_S


def _acted_on_nothing(plan: Plan) -> bool:
    """Whether ``plan`` starts and preempts nothing (the replay's still round may also be one
    whose starts the backend refused: then only the base rule applies).

    Then every job of an easy or static round that did not start failed `Place.try_start`
    (or admit, or had no shadow) on a round state no start changed, and later, for time alone,
    it fails again with the same reason: its run ``[now, now + d]`` may use a held free GPU only
    while ``now + d`` is at most the hold's end (`FreePool._hold_allows`, normal starts: easy
    and static lend nothing), so the GPUs it may use only shrink as ``now`` grows and
    `FreePool.find` fails on fewer GPUs where it failed on more (the interactive pool's holds,
    which sessions may use whatever the time, are berth's); a failed start's verdict reads the
    free GPUs with holds ignored (`explain_blocked`, `too_few`), the job's size, types and
    quota and the top job, none of which move with ``now``; a top job's shadow is bounded by
    its own durations (kept) and `_next_overdue`."""
    return not plan.starts and not plan.preemptions


_MARGIN_S = 1e-3  # float rounding of ``now + d`` against ``start``: stop a little early


def still_plan_difference(
    plan: Plan, idle: Counter[str], new_idle: Counter[str], *, wakes: set[float], t: float
) -> str | None:
    """Why a skipped tick's ``plan`` is not the no-op the skip assumed (None when it is):
    ``idle``/``new_idle`` are the idle counts kept and those ``plan`` gives."""
    if plan.starts or plan.preemptions:
        return f"it starts {len(plan.starts)} and preempts {len(plan.preemptions)} jobs"
    if new_idle != idle:
        return f"its idle GPUs are {dict(new_idle)}, not {dict(idle)}"
    wake = plan.next_round_at
    if wake is not None and wake > t and wake not in wakes:
        return f"it asks for a new wake-up at {wake}"
    return None
