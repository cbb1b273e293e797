"""Still ticks under easy and static: the part of the queue order a still round's plan reads.

`StillTickRule._is_still` (``scheduling.sim.replay_still``) first compares the whole queue order
at the tick with the still round's.  Static's queue is hundreds to thousands of jobs long and
fair-share factors decay continuously, so two jobs deep in it swap often while the round would
still plan the same no-op.  For a still round that started and preempted nothing
(`replay_still._acted_on_nothing`), with the same pending jobs, the tick's order decides alike
when, in each pass's queue (easy: the queue, `EasyPass`; static: its batch jobs, then its
sessions, `SplitPass`), the jobs through the pass's top job (the job that got the pass's
reservation; with no top job, every job) are in their places and the jobs behind it that the
still round's backfill window held come first again: either the tick's queue differs from the
still one only inside the ``backfill_depth`` places right behind the top job, or, when the
still round's verdicts tell where its window ended (`_window_end`: the first job it left
beyond the window), its first jobs up to there are the same set.  Why:

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
  when the window closed (``depth`` counted jobs and the uncounted ones among them).  If the
  tick's queue behind the top is the still one permuted within its first ``depth`` places and
  equal after them, its first ``w`` jobs are the same set.  If the first admitted job the still
  round left beyond the window is at ``w* >= w`` (its verdict says so; the jobs between are
  refused by admit, uncounted) and the tick's first ``w*`` jobs are the same set, they hold the
  same ``depth`` counted jobs and nothing else counted.  Either way the tick's round counts
  the same ``depth`` jobs (or, when the still window never closed, all admitted jobs again),
  considers the same jobs, starts none, and gives every job the verdict it got in the still
  round; the jobs behind the window wait in any order with the same verdicts.
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

from scheduling.engine.stages.backfill_verdicts import beyond_window_sentence
from scheduling.engine.types import JobKind, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.round import Round
    from scheduling.engine.types import ClusterSnapshot, JobRequest, Plan

# a pass's queue in the still order, the index of its top job (its last index if it has none)
# and, when the still round's verdicts tell (`_window_end`), the index of its first job beyond
# the backfill window with the ids of the jobs between the two (None: not known)
Passes = list[tuple[list["JobRequest"], int, "tuple[int, set[int]] | None"]]


def pass_queues(order: list[JobRequest], *, split: bool) -> list[list[JobRequest]]:
    """The queues of the round's passes: the order (`EasyPass`), or static's batch jobs and
    sessions in it (`SplitPass`)."""
    if not split:
        return [order]
    session = JobKind.INTERACTIVE
    return [[job for job in order if job.kind != session], [job for job in order if job.kind == session]]


def pass_heads(
    order: list[JobRequest],
    plan: Plan,
    snapshot: ClusterSnapshot,
    *,
    split: bool,
    depth: int,
    rnd: Round | None = None,
) -> Passes | None:
    """Each pass's queue in the still round's ``order``, the index of its top job (the
    pending job its reservation is for) and, from the still round ``rnd`` when given, where
    its backfill window ended (`_window_end`); None when the plan does not tell (a holder that
    is both a booking and a pending job, two holders in one pass)."""
    holders = {reservation.holder_id for reservation in plan.reservations}
    clash = holders.intersection(booking.id for booking in snapshot.bookings)
    if clash and any(job.id in clash for job in order):
        return None
    passes: Passes = []
    for queue in pass_queues(order, split=split):
        tops = [index for index, job in enumerate(queue) if job.id in holders]
        if len(tops) > 1:
            return None
        top = tops[0] if tops else len(queue) - 1
        end = None if rnd is None else _window_end(rnd, queue, top, depth)
        window = None if end is None else (end, {id(job) for job in queue[top + 1 : end]})
        passes.append((queue, top, window))
    return passes


def _window_end(rnd: Round, queue: list[JobRequest], top: int, depth: int) -> int | None:
    """The index in ``queue`` of the first job the still round ``rnd`` left beyond the pass's
    backfill window (`backfill.beyond_window`'s verdict, read after `Round.settle`): every job
    between the top job and it was considered or refused by admit, and the jobs considered are
    ``depth`` (the window closed there).  None when no job is beyond it (then a reorder behind
    the top job keeps the window's jobs only when ``depth`` places cover them: the caller's
    first test) or the pass has more jobs behind the top job than ``depth`` allows but no such
    verdict is found (a window that never closed: not read as a window).  The verdict is
    told by `backfill_verdicts.beyond_window_sentence`, the sentence the engine writes."""
    if len(queue) <= top + 1 + depth:
        return None
    rnd.settle()
    verdicts = rnd.out.verdicts
    beyond = beyond_window_sentence(depth)
    priority = PendingReason.PRIORITY
    # at least ``depth`` jobs come before the first beyond the window
    for index in range(top + 1 + depth, len(queue)):
        verdict = verdicts.get(queue[index].id)
        if verdict is not None and verdict.reason == priority and verdict.sentence == beyond:
            return index
    return None


def decides_alike(order: list[JobRequest], passes: Passes, depth: int, *, split: bool) -> bool:
    """Whether the tick's ``order`` (a permutation of the still one) keeps, in each pass's
    queue, the jobs through the top job in their places, and the jobs the still round's
    backfill window held as the first ones behind it: those within ``depth`` places of it with
    every job after them in its place, or, when the still round's verdicts tell where its
    window ended, the same set of jobs up to there (module docstring)."""
    for queue, (still_queue, top, window) in zip(pass_queues(order, split=split), passes, strict=True):
        if len(queue) != len(still_queue):
            return False
        through_top = top + 1
        if queue[:through_top] != still_queue[:through_top]:
            return False
        if queue[through_top + depth :] == still_queue[through_top + depth :]:
            continue
        if window is None:
            return False
        end, ids = window
        if {id(job) for job in queue[through_top:end]} != ids:
            return False
    return True
