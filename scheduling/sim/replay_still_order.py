"""Still ticks under easy and static: the part of the queue order a still round's plan reads.

`StillTickRule._is_still` (``scheduling.sim.replay_still``) first compares the whole queue order
at the tick with the still round's.  Static's queue is hundreds to thousands of jobs long and
fair-share factors decay continuously, so two jobs deep in it swap often while the round would
still plan the same no-op.  For a still round that started and preempted nothing
(`replay_still._acted_on_nothing`), with the same pending jobs, the tick's order decides alike
when, in each pass's queue (easy: the queue, `EasyPass`; static: its batch jobs, then its
sessions, `SplitPass`), the tick's queue differs from the still one only inside the block of
the ``backfill_depth`` positions right behind the pass's top job (the job that got the pass's
reservation; with no top job, nowhere).  Why:

* *The head.*  `EasyPass` walks the queue until a job gets a reservation (the top job); every
  job up to it is the same job at the same place, and none of them started (nothing started):
  each was refused by admit, or found no shadow, in a round state no start changed, so the same
  walk ends at the same top job with the same reservation and verdicts.
* *The window.*  Behind the top job, `backfill` considers admitted jobs until ``backfill_depth``
  of them were counted; the rest wait as beyond the window (`beyond_window`), or with admit's
  verdict if not admitted.  Nothing started, so no candidate changed the round's state (a failed
  `Place.try_start` of easy or static records at most a verdict: `CheapVerdicts.consider`), and
  each job's admission and verdict are functions of the job and that state, whatever the jobs
  considered before it (the shared verdicts, `too_few`, `CheapVerdicts`, are keyed by all they
  read).  The still round's window is its first ``w`` jobs behind the top, with ``w >= depth``
  when the window closed (``depth`` counted jobs and the uncounted ones among them).  The tick's
  queue behind the top is the still one permuted within its first ``depth`` places and equal
  after them, so its first ``w`` jobs are the same set: it counts the same ``depth`` jobs (or,
  when the still window never closed, all admitted jobs again), the same jobs are considered,
  none starts, and every job gets the verdict it got in the still round.
* *What the replay reads* (`still_plan_difference`): starts and preemptions (none), the idle
  GPUs' reasons and the next wake.  The reasons read the held GPUs (the same reservations) and,
  of the queue, only sets and sums of the waiting jobs' (types, reason) (`explain.idle_reasons`:
  `waiting_kinds`, `fragmented_types`, `quota_demand`), not their order; the wake comes from
  the bookings (the same).  The jobs' sentences and ETAs (`Plan.pending`, which reads the
  order) are never read by the replay.

Time passing is bounded as before (`replay_still._next_overdue`, `_next_fit_change`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduling.engine.types import JobKind

if TYPE_CHECKING:
    from scheduling.engine.types import ClusterSnapshot, JobRequest, Plan

# (a pass's queue in the still order, the index of its top job: its last index if it has none)
Passes = list[tuple[list["JobRequest"], int]]


def pass_queues(order: list[JobRequest], *, split: bool) -> list[list[JobRequest]]:
    """The queues of the round's passes: the order (`EasyPass`), or static's batch jobs and
    sessions in it (`SplitPass`)."""
    if not split:
        return [order]
    session = JobKind.INTERACTIVE
    return [[job for job in order if job.kind != session], [job for job in order if job.kind == session]]


def pass_heads(
    order: list[JobRequest], plan: Plan, snapshot: ClusterSnapshot, *, split: bool
) -> Passes | None:
    """Each pass's queue in the still round's ``order`` and the index of its top job (the
    pending job its reservation is for); None when the plan does not tell (a holder that is
    both a booking and a pending job, two holders in one pass)."""
    holders = {reservation.holder_id for reservation in plan.reservations}
    clash = holders.intersection(booking.id for booking in snapshot.bookings)
    if clash and any(job.id in clash for job in order):
        return None
    passes: Passes = []
    for queue in pass_queues(order, split=split):
        tops = [index for index, job in enumerate(queue) if job.id in holders]
        if len(tops) > 1:
            return None
        passes.append((queue, tops[0] if tops else len(queue) - 1))
    return passes


def decides_alike(order: list[JobRequest], passes: Passes, depth: int, *, split: bool) -> bool:
    """Whether the tick's ``order`` (a permutation of the still one) differs from it, in each
    pass's queue, only within the ``depth`` places behind the pass's top job (module
    docstring)."""
    for queue, (still_queue, top) in zip(pass_queues(order, split=split), passes, strict=True):
        if len(queue) != len(still_queue):
            return False
        through_top, window_end = top + 1, top + 1 + depth
        if queue[:through_top] != still_queue[:through_top]:
            return False
        if queue[window_end:] != still_queue[window_end:]:
            return False
    return True
