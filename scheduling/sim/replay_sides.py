"""Batch-still rounds (static): a round whose batch side would plan what the last full round
planned there plans only the interactive partition.

`Replay` (``scheduling.sim.replay``) mixes this in.  Under ``static`` (the shipped engine,
`scheduling.engine.plan_round`) sessions and bookings live on the interactive partition and
batch work on the other nodes, each side with its own EASY pass (`stages.backfill.SplitPass`,
batch first).  A session arriving, ending or giving up, a booking event, or a tick walks the
whole batch queue again although nothing the batch pass reads may have changed.  After a full
round ``R0`` that started no batch job and whose batch top job (if any) is not wide (its
reservation holds no partition GPU), a later round at ``t`` is *batch-still* when

* the batch running jobs are the very same (so the batch side's free GPUs are: sessions and
  bookings never use them), and the batch jobs in queue order at ``t`` are the very same jobs
  in the same order as at ``R0`` (recomputed with the engine's `priority.priority_order` on the
  full snapshot: age and fair share move with time and with sessions' usage);
* no batch running job passes its estimate between ``R0`` and ``t``, nor, while one is
  overdue, does its moving end pass another batch job's end (`replay_still._next_overdue` on
  the batch side: the top job's shadow reads only batch GPUs' free times);
* every booking's GPUs are the partition's (a booking the engine places goes there too), no
  claim lives, no project has a GPU limit (admit would read what sessions run), every project
  of a batch job is one the snapshot lists (else it weighs in the fair-share total, and a
  round without the batch queue would order the sessions differently);
* the inventory has one GPU type and at most one GPU per node, and some batch job waits that
  any GPU fits: then no job waits for fragmentation or a constraint, and an idle batch-side GPU
  is ``reserved_unused`` when the top job's reservation holds it, else ``no_demand``,
  whatever sessions wait (`explain.idle_reasons`).

Time alone starts no batch job in between: with the same order, the same top job and the same
backfill window, a candidate that did not fit before the top job's shadow at ``R0`` fits less
at ``t`` (no booking holds a batch GPU), and the shadow itself moves only when a running end
does.  So the batch pass at ``t`` starts nothing and reserves what it did at ``R0``; the round
is planned on the snapshot without the batch queue (the interactive pass sees the same pools:
the batch pass took nothing from them), and its plan is completed with ``R0``'s batch
reservation and batch-side idle reasons.  ``ReplayOptions.verify_still_ticks`` plans every such
round in full as well and raises if starts, preemptions, reservations, idle reasons or the
wake-up differ (`tests/scheduling/sim/test_replay_sides.py`; docs/benchmarks.md, "Speed VII").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine import plan_round
from scheduling.engine.cluster import estimate_of, estimates_by_job
from scheduling.engine.types import JobKind, Plan
from scheduling.sim.replay_still import _MARGIN_S, _next_fit_change

if TYPE_CHECKING:
    from collections import Counter

    from scheduling.engine.types import (
        Booking,
        ClusterSnapshot,
        IdleReason,
        JobRequest,
        PolicyConfig,
        ReserveAction,
        RunningJob,
    )
    from scheduling.sim.inventory import Inventory
    from scheduling.sim.replay_setup import PlanFn

_BATCH = JobKind.BATCH
_INTERACTIVE = JobKind.INTERACTIVE


@dataclass(slots=True)
class _BatchSide:
    """What the batch side of the last full round ``R0`` planned, and what it read."""

    at: float
    snapshot: ClusterSnapshot
    running: tuple[RunningJob, ...]  # the batch running jobs
    bookings: tuple[Booking, ...]  # those holding a batch-side GPU
    free_gpus: int  # batch-side GPUs free
    count: int  # batch jobs pending
    reservations: tuple[ReserveAction, ...]  # the batch top job's (none or one)
    idle: tuple[tuple[int, IdleReason], ...]  # the idle reasons of batch-side GPUs
    order: list[JobRequest] | None = None  # the batch jobs in queue order at ``at``
    top_at: int | None = None  # the batch top job's index in ``order`` (None: no top job)
    until: float | None = None  # the first instant time alone could change the batch pass


class BatchSideRule:
    """The batch-still half of `Replay` (module docstring); the attributes are `Replay`'s."""

    config: PolicyConfig
    inventory: Inventory
    plan_fn: PlanFn
    _pending: dict[str, JobRequest]
    _partition_gpus: set[int]
    _batch_widths: Counter[int]
    _batch_side: _BatchSide | None
    _splits_rounds: bool
    _rounds_split: int

    def _order_at(self, snapshot: ClusterSnapshot, t: float) -> list[JobRequest]:
        raise NotImplementedError  # `StillTickRule._order_at`

    def _free_split(self) -> tuple[int, int]:
        raise NotImplementedError  # `TickRule._free_split`

    def _init_sides(self, policy: str, plan_fn: PlanFn, *, enabled: bool) -> None:
        nodes = self.inventory.nodes
        self._splits_rounds = (
            enabled
            and policy == "static"
            and plan_fn is plan_round
            and bool(self._partition_gpus)
            and len({node.gpu_type for node in nodes}) == 1
            and all(len(node.gpu_ids) <= 1 for node in nodes)
        )
        self._batch_side = None
        self._rounds_split = 0  # rounds planned without the batch queue

    def _plan(self, snapshot: ClusterSnapshot, config: PolicyConfig, t: float, *, verify: bool) -> Plan:
        """The round's plan: only the interactive side's when the batch side is still
        (module docstring), else the engine's on the whole snapshot."""
        side = self._batch_side
        if side is not None and self._is_batch_still(side, snapshot, t):
            plan = self._plan_interactive(side, snapshot, config, t)
            self._rounds_split += 1
            if verify:
                self._verify_split(plan, snapshot, config, t)
            return plan
        plan = self.plan_fn(snapshot, policy=config, now=t)
        if self._splits_rounds:
            self._batch_side = self._batch_side_of(snapshot, plan, t)
        return plan

    def _batch_side_of(self, snapshot: ClusterSnapshot, plan: Plan, t: float) -> _BatchSide | None:
        """``plan``'s batch side if later rounds may keep it (module docstring), else None."""
        pending = self._pending
        if any(pending[start.job_id].kind == _BATCH for start in plan.starts):
            return None
        if snapshot.claims or any(
            share.borrow_limit is not None or share.borrow_limits for share in snapshot.projects
        ):
            return None
        partition = self._partition_gpus
        reservations = []
        for reservation in plan.reservations:
            holder = pending.get(reservation.holder_id)
            if holder is not None and holder.kind == _BATCH:
                if not partition.isdisjoint(reservation.gpu_ids):
                    return None  # a wide top job: its shadow reads the partition
                reservations.append(reservation)
        return _BatchSide(
            at=t,
            snapshot=snapshot,
            running=tuple(r for r in snapshot.running if r.job.kind == _BATCH),
            bookings=_batch_bookings(snapshot, partition),
            free_gpus=self._free_split()[1],
            count=sum(self._batch_widths.values()),
            reservations=tuple(reservations),
            idle=tuple(entry for entry in plan.idle if entry[0] not in partition),
        )

    def _is_batch_still(self, side: _BatchSide, snapshot: ClusterSnapshot, t: float) -> bool:
        """Whether the batch pass at ``t`` would plan what it planned at ``side.at``."""
        if side.until is None:
            order = side.order = [job for job in self._order_at(side.snapshot, side.at) if job.kind == _BATCH]
            if side.reservations:
                holder = side.reservations[0].holder_id
                side.top_at = next(i for i, job in enumerate(order) if job.id == holder)
            # never, without a plain queue (`_is_plain_queue`)
            side.until = self._batch_until(side) if _is_plain_queue(side.snapshot, order) else -math.inf
        if t >= side.until or snapshot.claims:
            return False
        # only split rounds came since (a full round replaces the side): no batch job started,
        # so the same count means no batch job arrived either (the same jobs)
        if sum(self._batch_widths.values()) != side.count:
            return False
        if tuple(r for r in snapshot.running if r.job.kind == _BATCH) != side.running:
            return False
        if _batch_bookings(snapshot, self._partition_gpus) != side.bookings:
            return False
        order = [job for job in self._order_at(snapshot, t) if job.kind == _BATCH]
        kept = side.order
        assert kept is not None
        if side.top_at is None:
            return order == kept
        # the same jobs up to the top job, and the same backfill window (as a set): nothing
        # starts in it, so each candidate meets the same pools whatever its place
        top = side.top_at + 1
        window_end = top + self.config.backfill_depth
        if order[:top] != kept[:top]:
            return False
        return len(order) <= window_end or order[window_end:] == kept[window_end:]

    def _batch_until(self, side: _BatchSide) -> float:
        """The first instant after ``side.at`` at which time alone could change the batch pass:
        a batch running job passes its estimate, a booking on batch GPUs starts or ends, or a
        batch job's run stops fitting before the batch top job's shadow or such a booking's
        lead time (`replay_still._next_fit_change`).  Never (-inf) while a batch job is
        overdue: it is seen ending ``overdue_epsilon_s`` from now, so the top job's shadow
        moves with time (the still-tick rule allows that, it keeps no reservation)."""
        config = self.config
        estimates = estimates_by_job(config, is_predicted=False)
        ends = [
            running.started_at + estimate_of(running.job, estimates, config, is_predicted=False).hold_s
            for running in side.running
        ]
        if any(end <= side.at for end in ends):
            return -math.inf
        # the bookings' starts and ends: their GPUs turn from held ahead to taken, then free
        ends += [at for b in side.bookings for at in (b.start_at, b.end_at)]
        batch = dataclasses.replace(side.snapshot, pending=tuple(side.order or ()), bookings=side.bookings)
        return min(
            min((end for end in ends if end > side.at), default=math.inf) - _MARGIN_S,
            _next_fit_change(
                batch, Plan(reservations=side.reservations), config, side.at, free_gpus=side.free_gpus
            ),
        )

    def _plan_interactive(
        self, side: _BatchSide, snapshot: ClusterSnapshot, config: PolicyConfig, t: float
    ) -> Plan:
        """The engine's plan of the snapshot without its batch queue, completed with the batch
        side's reservation and idle reasons."""
        sessions = tuple(job for job in snapshot.pending if job.kind == _INTERACTIVE)
        plan = self.plan_fn(dataclasses.replace(snapshot, pending=sessions), policy=config, now=t)
        partition = self._partition_gpus
        return Plan(
            starts=plan.starts,
            preemptions=plan.preemptions,
            reservations=plan.reservations + side.reservations,
            releases=plan.releases,
            idle=tuple(entry for entry in plan.idle if entry[0] in partition) + side.idle,
            notes=plan.notes,
            next_round_at=plan.next_round_at,
        )

    def _verify_split(self, plan: Plan, snapshot: ClusterSnapshot, config: PolicyConfig, t: float) -> None:
        full = self.plan_fn(snapshot, policy=config, now=t)
        why = split_plan_difference(plan, full)
        if why is not None:
            raise AssertionError(f"static: the batch-still round at {t} was not: {why}")


def _batch_bookings(snapshot: ClusterSnapshot, partition: set[int]) -> tuple[Booking, ...]:
    """The bookings holding a GPU outside the partition (the portal picks a booking's GPUs
    anywhere; one without GPUs is placed in the partition)."""
    return tuple(
        booking
        for booking in snapshot.bookings
        if booking.gpu_ids and not partition.issuperset(booking.gpu_ids)
    )


def _is_plain_queue(snapshot: ClusterSnapshot, batch: list[JobRequest]) -> bool:
    """Whether the batch side's idle reasons cannot read the sessions (module docstring): some
    batch job waits that any GPU type fits, and every batch job's project is listed in the
    snapshot (an unlisted one would weigh in the fair-share total only while queued)."""
    listed = {share.name for share in snapshot.projects}
    has_plain = False
    for job in batch:
        if job.project not in listed:
            return False
        if job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
            has_plain = True
    return has_plain


def split_plan_difference(plan: Plan, full: Plan) -> str | None:
    """Why a batch-still round's ``plan`` is not the ``full`` round's (None when it is), in
    what the replay reads of a plan."""
    if plan.starts != full.starts or plan.preemptions != full.preemptions:
        return f"it starts {full.starts}, preempts {full.preemptions}; not {plan.starts}, {plan.preemptions}"
    if set(plan.reservations) != set(full.reservations):
        return f"its reservations are {full.reservations}, not {plan.reservations}"
    if sorted(plan.idle) != sorted(full.idle):
        return f"its idle GPUs are {sorted(full.idle)}, not {sorted(plan.idle)}"
    if plan.next_round_at != full.next_round_at:
        return f"it asks for a wake-up at {full.next_round_at}, not {plan.next_round_at}"
    return None
