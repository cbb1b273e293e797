"""Backfill: the passes over the queue that start, reserve and backfill jobs.

* `EasyPass` (easy, berth): jobs start in queue order until one does not fit; that one becomes
  the *top job* (reclaim, or a shadow reservation: `reserve.Reserve.top`).  The rest are
  backfill candidates, at most ``PolicyConfig.backfill_depth`` of them, taken in the order's
  backfill order when it gives one (berth: shortest predicted work first, which leaves the top
  job itself chosen by age and fair share, so its reservation stays put from round to round);
  they start only where they leave held GPUs in time (`place`), sessions may reclaim;
* `StrictPass` (fifo): start in arrival order, stop at the first job that does not fit;
* `SplitPass` (static): an `EasyPass` over the batch jobs, then one over the sessions, each
  side with its own top job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from scheduling.engine.outcome import Verdict
from scheduling.engine.stages.admit import hold_pool
from scheduling.engine.stages.backfill_lazy import walk_lazily
from scheduling.engine.stages.backfill_verdicts import (
    CheapVerdicts,
    Memos,
    beyond_window_sentence,
    consider,
    too_few,
)
from scheduling.engine.types import JobKind, JobRequest, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.round import Round

_UNASKED: Any = object()  # a key admit was not asked about yet


class Pass(Protocol):
    """A pass over the queue (priority order, and the backfill order when the order has one)."""

    def run(
        self, rnd: Round, queue: Sequence[JobRequest], backfill_order: Sequence[JobRequest] | None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class EasyPass:
    """EASY with the composition's admit, place, reclaim and reserve stages (module docstring)."""

    def run(
        self, rnd: Round, queue: Sequence[JobRequest], backfill_order: Sequence[JobRequest] | None
    ) -> None:
        """Start, reserve and backfill ``queue`` (already in priority order)."""
        composition = rnd.composition
        admit = composition.admit
        try_start = composition.place.try_start
        reclaim = composition.reclaim
        state = rnd.state
        out = rnd.out
        position = 0
        while position < len(queue) and rnd.top is None:
            job = queue[position]
            position += 1
            if not admit(rnd, job):
                continue
            types = rnd.types_for(job)
            estimate = state.estimate(job)
            if try_start(rnd, job, types, estimate):
                continue
            if job.id in rnd.deferred_wide:
                continue  # a wide job that would borrow waits for smaller work (`Place`)
            low_window = rnd.low_windows.get(job.id)
            if low_window is not None:
                # non-preemptible and kept out of the pool's peak: it heads the queue, so it
                # gets its reservation at the earliest low-demand window (not starved by work
                # that keeps filling that window)
                composition.reserve.top(rnd, job, types, estimate, not_before=low_window)
                continue
            if job.id in out.verdicts:
                continue  # waits on quota
            if reclaim is not None:
                single = rnd.is_single_node(types, job.gpu_count)
                if job.kind == JobKind.INTERACTIVE and reclaim.for_demand(
                    rnd, job, types, estimate, single=single
                ):
                    continue
                if (
                    job.kind == JobKind.BATCH
                    and rnd.is_within_guarantee(job, types)
                    and reclaim.for_demand(rnd, job, types, estimate, single=single, is_quota_claim=True)
                ):
                    continue
            composition.reserve.top(rnd, job, types, estimate)
        rest: Sequence[JobRequest] = queue[position:]
        if backfill_order is not None and rest:
            # the backfill order is the queue's jobs in another order: those left are the ones
            # not passed above (a set of the few passed, not of the many left)
            passed = {job.id for job in queue[:position]}
            rest = [job for job in backfill_order if job.id not in passed]
        backfill(rnd, rest)
        if not rnd.headroom_done:
            hold_pool(rnd)


def backfill(rnd: Round, rest: Sequence[JobRequest]) -> None:
    """The backfill candidates behind the top job, in their order: start what fits without
    delaying anything held, sessions may reclaim, the others are told why they wait; at most
    ``PolicyConfig.backfill_depth`` of them are considered (`beyond_window` for the rest).

    Most candidates of a long queue start nothing and get a verdict shared by many (too few GPUs
    free, or a static wide job behind the top job): `CheapVerdicts` gives those without trying a
    start, and for the common job (batch, unconstrained, of a project without a limit, once the
    interactive pool is held) it is written out here, with no call per job (a queue can be
    thousands long every round); the others go through `consider`.

    Under a policy that never reclaims (easy, static) the candidates too wide for any free GPU
    start nothing and change nothing: only the others are walked now, and the verdicts of those
    are recorded when first read (`backfill_lazy.walk_lazily`)."""
    admitted, cheap = Admitted(rnd), CheapVerdicts(rnd)
    if not walk_lazily(rnd, rest, admitted, cheap, walk):
        walk(rnd, rest, admitted, cheap)


def walk(rnd: Round, rest: Sequence[JobRequest], admitted: Admitted, cheap: CheapVerdicts) -> None:
    """`backfill`'s walk over every candidate of ``rest`` in turn, with the pass's memos."""
    verdicts = rnd.out.verdicts
    scanned, depth = 0, rnd.policy.backfill_depth
    wide, batch = rnd.wide, JobKind.BATCH
    limited, admits, refused = cheap.limited, cheap.admits, cheap.by_size
    # without a project's total limit (the overlay's case) the common job's project needs no test
    any_limit = rnd.has_limits()
    held = rnd.headroom_done  # (it changes only in `_candidate`)
    # the common job's `CheapVerdicts.plain_epoch`, read again at its next job after a call
    # (``stale``) that took GPUs (the pool's takes) or made a top job
    stale, pool, takes, top = True, rnd.batch_pool, -1, _UNASKED
    free, top_id, top_user = 0, _UNASKED, _UNASKED
    few: dict[int, Verdict] = {}
    for index, job in enumerate(rest):
        if scanned >= depth:
            # every job admitted from here on is beyond the window
            beyond = beyond_window_sentence(depth)
            beyond_window(admitted, rest[index:], beyond, cheap)
            return
        job_id = job.id
        if job_id in verdicts:
            continue  # admit refuses it and records nothing (`Admitted.__call__`)
        project = job.project
        if (
            job.kind == batch
            and job.gpu_type is None
            and not job.precisions
            and job.min_memory_gib <= 0
            and held
            and not (any_limit and (limited[project] if project in limited else cheap.has_limit(project)))
        ):
            # what `Admit.__call__` reads of such a job: its size and project (and whether no
            # type satisfies it or it can never start: its memory and precisions)
            key = (job.gpu_count, project, job.min_memory_gib, job.precisions)
            known = admits.get(key, _UNASKED)  # one lookup: the key's hash is not kept
            if known is _UNASKED:
                known = cheap.admit_plain(job, key, admitted)
            if known is not None:
                verdicts[job_id] = known
                continue
            scanned += 1
            if stale and (pool.takes != takes or rnd.top is not top):
                takes, top = pool.takes, rnd.top
                free, top_id, top_user = cheap.plain_epoch(job)
                few = {}
            stale = False
            size = job.gpu_count
            if wide and job_id in wide:
                verdict = refused.get(size) if top is not None else None
                if verdict is not None:
                    verdicts[job_id] = verdict  # behind the top job (`_wide`)
                    continue
                _wide(rnd, job, cheap)
                stale = True
                continue
            if size <= free:
                cheap.consider(job, rnd.types_for(job))
                stale = True
                continue
            # too few free: `too_few`'s verdict, one per size for a job not the top's nor its owner's
            shared = job_id != top_id and job.user != top_user
            verdict = few.get(size) if shared else None
            if verdict is None:
                verdict = too_few(rnd, job, rnd.types_for(job), free, cheap.too_few, rnd.top)
                if shared:
                    few[size] = verdict
            verdicts[job_id] = verdict
            continue
        scanned += _candidate(rnd, job, admitted, cheap)
        stale, held = True, rnd.headroom_done


def _candidate(rnd: Round, job: JobRequest, admitted: Admitted, cheap: CheapVerdicts) -> int:
    """A backfill candidate that is not the common job: admitted (1) or not (0), and then
    given its shared verdict or considered."""
    if not admitted(job):
        return 0
    verdict = cheap.verdict(job)
    if verdict is not None:
        rnd.out.verdicts[job.id] = verdict
    else:
        cheap.consider(job, rnd.types_for(job))
    return 1


def _wide(rnd: Round, job: JobRequest, cheap: CheapVerdicts) -> None:
    """Static's wide candidate (admitted): considered while there is no top job (it draws
    from both sides, `Round.pool_for`), else it waits for the top job, one verdict per size.
    The free GPUs or the top job may have changed after it (``stale`` in `backfill`)."""
    if rnd.top is None:
        consider(rnd, job, rnd.types_for(job))
    else:
        verdict = cheap.by_size.get(job.gpu_count)
        rnd.out.verdicts[job.id] = verdict if verdict is not None else cheap.refused(job)


class Admitted:
    """The admit stage for the backfill candidates, run once per job shape.

    Admit's answer and verdict depend on the job's constraints, size and project (its kind and
    preemptibility are in the key too, to be safe) and, when the project has a limit, on how
    many GPUs it runs (`Round.used`, which only a start changes, is then in the key): the jobs
    of one shape share the first one's answer, so a long queue costs a lookup per job.  While
    the interactive pool is not held yet, admitting a batch job holds it: then every job is
    admitted in turn.
    """

    __slots__ = ("_admit", "by_shape", "rnd")

    def __init__(self, rnd: Round) -> None:
        """The memo of one round's backfill pass."""
        self.rnd = rnd
        self._admit = rnd.composition.admit
        # `job_shape` -> None (admitted) or the verdict admit gave the first job of that shape
        self.by_shape: dict[tuple[object, ...], Verdict | None] = {}

    def __call__(self, job: JobRequest) -> bool:
        """Whether ``job`` may be considered (`Admit.__call__`, with its verdict if not)."""
        rnd = self.rnd
        out = rnd.out
        verdicts = out.verdicts
        if job.id in verdicts:
            return False  # admit refuses it and records nothing
        if not rnd.headroom_done:
            return self._admit(rnd, job)
        shape = job_shape(job, counted_use(rnd, job.project))
        by_shape = self.by_shape
        if shape in by_shape:
            verdict = by_shape[shape]
            if verdict is None:
                return True
            verdicts[job.id] = verdict
            return False
        is_admitted = self._admit(rnd, job)
        # refused: admit said why (one verdict per shape, only read from here on)
        by_shape[shape] = None if is_admitted else verdicts[job.id]
        return is_admitted


def job_shape(job: JobRequest, use: int | None) -> tuple[object, ...]:
    """What admit's answer for a job depends on (`Admitted`); ``use``: `counted_use` of its
    project."""
    return (
        job.gpu_type,
        job.min_memory_gib,
        job.precisions,
        job.gpu_count,
        job.project,
        use,
        job.kind,
        job.is_preemptible,
        job.is_checkpointable,
    )


def counted_use(rnd: Round, project: str) -> int | None:
    """What a project runs, as far as admit reads it: only a project with a limit can be
    refused for what it runs (admit's last test), so without one it is None, whatever starts."""
    return None if rnd.limit(project) is None else rnd.used.get(project, 0)


class _UseNow(dict[str, "int | None"]):
    """`counted_use` per project, each computed once, while nothing starts."""

    def __init__(self, rnd: Round) -> None:
        super().__init__()
        self.rnd = rnd

    def __missing__(self, project: str) -> int | None:
        found = self[project] = counted_use(self.rnd, project)
        return found


def beyond_window(
    admitted: Admitted, jobs: Sequence[JobRequest], sentence: str, cheap: CheapVerdicts | None = None
) -> None:
    """Admit the jobs behind the backfill window, and make each that is admitted wait with
    ``sentence`` (one verdict for all of them, only read from here on); ``cheap``: the pass's
    memos, whose admissions of common jobs (`CheapVerdicts.admit_plain`) are used too.

    Once the interactive pool is held, this is deferred to the first reader of the verdicts
    (`Round.settle`): nothing starts behind the window, so the verdicts are decided already,
    and a replay reads none of them in most rounds (its explanations are never read, and the
    idle reasons read the queue only when an idle GPU is not held: `explain.idle_reasons`).
    Admit reads only the jobs, the inventory, the projects' quotas and limits, what the projects
    run (only under a limit) and the verdicts recorded: nothing may change those for the jobs
    behind the window before they are settled.  Under easy and berth the window ends the
    round's passes; static's session pass settles first unless it cannot change them
    (`_is_tail_apart`)."""
    rnd = admitted.rnd
    if not rnd.headroom_done:
        verdicts = rnd.out.verdicts
        waiting = Verdict(PendingReason.PRIORITY, sentence)
        for job in jobs:
            if admitted(job):
                verdicts[job.id] = waiting
        return
    # the pass's memos go along, not the pass's objects: those hold the round
    rnd.deferred.append(
        partial(
            _beyond_held,
            jobs=jobs,
            sentence=sentence,
            by_shape=admitted.by_shape,
            memos=cheap.memos() if cheap is not None else None,
        )
    )


def _beyond_held(
    rnd: Round,
    *,
    jobs: Sequence[JobRequest],
    sentence: str,
    by_shape: dict[tuple[object, ...], Verdict | None],
    memos: Memos | None,
) -> None:
    """`beyond_window` once the interactive pool is held, with the window's memos."""
    admitted = Admitted(rnd)
    admitted.by_shape = by_shape
    cheap = None if memos is None else CheapVerdicts(rnd, memos)
    verdicts = rnd.out.verdicts
    waiting = Verdict(PendingReason.PRIORITY, sentence)
    # `Admitted.__call__` written out: nothing starts from here on, so what the projects run
    # (part of a job's shape) stays as it is
    by_shape = admitted.by_shape
    use = _UseNow(rnd)
    batch = JobKind.BATCH
    for job in jobs:
        job_id = job.id
        if job_id in verdicts:
            continue
        project = job.project
        if (
            cheap is not None
            and job.kind == batch
            and job.gpu_type is None
            and not job.precisions
            and job.min_memory_gib <= 0
            and not (cheap.limited[project] if project in cheap.limited else cheap.has_limit(project))
        ):
            # `backfill`'s common job: admitted or refused once per (size, project)
            key = (job.gpu_count, project, job.min_memory_gib, job.precisions)
            known = cheap.admits.get(key, _UNASKED)
            if known is _UNASKED:
                known = cheap.admit_plain(job, key, admitted)
            verdicts[job_id] = waiting if known is None else known
            continue
        shape = job_shape(job, use[project])
        if shape in by_shape:
            verdict = by_shape[shape]
            verdicts[job_id] = waiting if verdict is None else verdict
        elif admitted(job):
            verdicts[job_id] = waiting


@dataclass(frozen=True, slots=True)
class StrictPass:
    """Start jobs in queue order until one does not fit; everyone behind it waits.

    Bookings are still honoured as reservations (a start that would run into a booking's
    window on its user estimate does not fit).
    """

    def run(
        self, rnd: Round, queue: Sequence[JobRequest], backfill_order: Sequence[JobRequest] | None
    ) -> None:
        """One strict pass over ``queue`` (``backfill_order`` is ignored: nothing backfills)."""
        composition = rnd.composition
        admit = composition.admit
        blocker: str | None = None
        behind = len(queue)  # index of the first job behind the blocker
        for index, job in enumerate(queue):
            types = rnd.types_for(job)
            if not types:
                rnd.out.wait(
                    job.id, PendingReason.CONSTRAINT, "No GPU in the cluster satisfies its constraints."
                )
                continue  # can never run; skipping it cannot reorder anything that could
            if admit.is_never_startable(rnd, job):
                continue  # likewise (too wide for the inventory or its project's limit)
            if rnd.is_over_limit(job):
                rnd.out.wait(job.id, PendingReason.QUOTA, f"Project {job.project} is at its GPU limit.")
                blocker, behind = job.id, index + 1
                break
            estimate = rnd.state.estimate(job)
            if composition.place.try_start(rnd, job, types, estimate):
                continue
            blocker, behind = job.id, index + 1
            # the head job waits for GPUs to free up; what is free now waits with it
            composition.reserve.top(rnd, job, types, estimate)
            break
        if blocker is not None:
            # everyone behind it waits for it (one sentence for a queue that can be long)
            sentence = f"Strict arrival order: job {blocker}, submitted earlier, does not fit yet."
            verdicts = rnd.out.verdicts
            # one verdict for all of them (only read from here on: explain shares them too)
            waiting = Verdict(PendingReason.PRIORITY, sentence)
            for job in queue[behind:]:
                if job.id not in verdicts:
                    verdicts[job.id] = waiting


@dataclass(frozen=True, slots=True)
class SplitPass:
    """EASY on the batch nodes and, separately, on the interactive partition (static).

    A wide batch job's reservation (`partition`) must be in place before sessions are placed,
    so the batch pass runs first; the two sides use disjoint GPUs otherwise.
    """

    def run(
        self, rnd: Round, queue: Sequence[JobRequest], backfill_order: Sequence[JobRequest] | None
    ) -> None:
        """The batch pass, then the session pass with its own top job."""
        easy = EasyPass()
        # the enum member read once: `JobKind.INTERACTIVE` costs ~0.17 µs per read on Python
        # 3.11 (an enum class attribute), twice per job of a queue thousands long
        session = JobKind.INTERACTIVE
        interactive = [job for job in queue if job.kind == session]
        # without sessions waiting (the common case) the batch queue is the queue
        batch = [job for job in queue if job.kind != session] if interactive else list(queue)
        easy.run(rnd, batch, None)
        if interactive and rnd.deferred and not _is_tail_apart(rnd):
            # the session pass records verdicts and may start sessions (`beyond_window`)
            rnd.settle()
        batch_top = (rnd.top, rnd.top_shadow, rnd.top_fragmented)
        # each side has its own top job: the batch one must not block the partition's pass
        rnd.top = None
        rnd.top_shadow = None
        rnd.top_fragmented = False
        easy.run(rnd, interactive, None)
        rnd.top, rnd.top_shadow, rnd.top_fragmented = batch_top


_ID = attrgetter("id")


def _is_tail_apart(rnd: Round) -> bool:
    """Whether static's session pass leaves the deferred batch verdicts as they are: no
    project has a total limit (admit reads what a project runs, which a session's start
    changes, only under one) and no two pending jobs share an id (the session pass records
    verdicts of sessions only)."""
    if rnd.has_limits():
        return False
    pending = rnd.state.snapshot.pending
    return len(set(map(_ID, pending))) == len(pending)
