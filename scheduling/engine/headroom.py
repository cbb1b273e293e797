"""How much interactive headroom berth must still hold idle this round.

``PolicyConfig.interactive_headroom`` is a forecast of the *level* of on-demand interactive
use (GPUs of sessions running or asking at once), per GPU type.  What must be kept idle for
sessions that have not arrived yet is that level minus what they can already get within a
grace period without waiting:

* GPUs that running sessions (and sessions started this round) already use: they are part of
  the level, not on top of it;
* GPUs of checkpointing work that a session can reclaim within one grace period: batch work
  its owner or its quota marked preemptible, that resumes from a checkpoint
  (`preemption.is_cheap_to_reclaim`: the reclaim loses at most a checkpoint interval plus the
  restore) and that is not already being reclaimed (a session's minimum runtime is at most
  the grace, `preemption.min_runtime_s`).

Restartable work is not counted as in reach even when its owner consented: a session taking
it back throws away everything it did, so an idle pool GPU is the cheaper promise (a session
still reclaims restartable work as a last resort, least work lost first).  Only the rest is
held idle (lendable to checkpointing work, and to restartable work predicted to be gone before
the pool's next demand rise).  This keeps cheap reclaimable work "in reach" instead of holding
the whole forecast idle on top of it, which on a busy cluster wastes the GPUs twice over.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from scheduling.engine.preemption import is_cheap_to_reclaim, is_reclaimable, kill_time
from scheduling.engine.types import JobKind, JobRequest, StartAction

if TYPE_CHECKING:  # round.py and the stages import this module
    from scheduling.engine.round import Round


def headroom_need(sched: Round, types: Collection[str], count: int) -> int:
    """GPUs of ``types`` still to hold idle for a forecast level of ``count`` session GPUs."""
    state = sched.state
    gpu_type = state.gpu_type
    in_reach_by = state.now + state.policy.grace_s
    excluded = sched.out.preempted
    covered = 0
    for running in state.snapshot.running:
        if gpu_type.get(running.gpu_ids[0]) not in types:
            continue
        is_session = running.job.kind == JobKind.INTERACTIVE
        if is_session or (
            is_reclaimable(running, excluded=excluded)
            and is_cheap_to_reclaim(running)
            and kill_time(state, running, is_high_class=True) <= in_reach_by
        ):
            covered += len(running.gpu_ids)
    started: list[StartAction] = sched.out.starts
    # the started jobs among the pending ones (the dict of every pending job, restricted to them)
    starting = {start.job_id for start in started}
    pending = {job.id: job for job in state.snapshot.pending if job.id in starting} if starting else {}
    for start in started:
        job = pending.get(start.job_id)
        if job is not None and job.kind == JobKind.INTERACTIVE and gpu_type[start.gpu_ids[0]] in types:
            covered += len(start.gpu_ids)
    return count - covered


def may_use_headroom(sched: Round, job: JobRequest, types: Sequence[str]) -> bool:
    """Whether a batch job at the head of the queue may start on headroom GPUs.

    A gang wider than the cluster minus the headroom could otherwise never start: the headroom
    is held again every round, long after sessions stop arriving.  Such a job, once it heads the
    queue, may take headroom GPUs; sessions still reclaim lent work meanwhile.
    """
    if job.kind != JobKind.BATCH or not sched.composition.pool is not None or sched.top is not None:
        return False
    wanted = set(types)
    level = sum(count for name, count in sched.headroom_levels() if name == "*" or name in wanted)
    if level <= 0:
        return False
    up = sum(len(gpus) for name, gpus in sched.state.topology.by_type.items() if name in wanted)
    return job.gpu_count > up - level
