"""Backfill's inert candidates, decided now and recorded when first read.

Under a policy that never reclaims (easy, static), a backfill candidate wider than every GPU
free in its pools, held ones included, can start nothing and change nothing: `Place.try_start`
would refuse it before anything else, so `backfill.walk` gives it a verdict (admit's, the wide
job's behind the top job, or too few GPUs free) and nothing else.  Free GPUs only ever decrease
during a pass (`FreePool.take` is the only change to the free counts), so a candidate wider than
the pools' free total at the start of the pass stays so: it is *inert*.  On static's long queue
most candidates are (docs/benchmarks.md, "Speed XVI").

`walk_lazily` walks only the other candidates (`backfill.walk`, in runs of neighbours, in queue
order) and notes the pools' free counts each time a run took GPUs; the inert candidates' verdicts
are recorded when first read (`Round.settle`, as `backfill.beyond_window` does), each from the
free counts of its place in the queue, as the walk would have recorded them.  Why they are the
same whenever they are recorded:

* admit reads only the job, the inventory, the projects' quotas and limits, what a project runs
  (only under a limit: no project has one here) and the verdicts recorded (the job's own id:
  every id of the pass is distinct and none has a verdict yet);
* the top job does not change during the pass (only `Reserve.top` and reclaim set it), and a
  walked candidate reads no other candidate's verdict;
* the verdicts are recorded before anything else reads them: every reader settles first
  (`Round.settle`), static's session pass too unless it cannot change them
  (`backfill._is_tail_apart`).

A queue longer than the backfill window is admitted up to the window's end first (admit's
answers decide where it ends), then the jobs behind it go to `backfill.beyond_window`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, overload

from scheduling.engine.outcome import Verdict
from scheduling.engine.stages.backfill_verdicts import CheapVerdicts, Memos, beyond_window_sentence, too_few
from scheduling.engine.stages.partition import wide_sentence
from scheduling.engine.types import JobKind, JobRequest, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.round import Round
    from scheduling.engine.stages.backfill import Admitted

Walk = Callable[["Round", Sequence[JobRequest], "Admitted", CheapVerdicts], None]
# (first queue index it applies to, batch pool's free counts, interactive pool's free counts)
Epoch = tuple[int, dict[str, int], dict[str, int]]

_UNASKED: Any = object()  # a key admit was not asked about yet
_ID = attrgetter("id")


class _Bounds(tuple[int, int, bool]):
    """The free totals of the batch and interactive pools (one pool for both without a
    partition) as (the lower, the higher, whether the interactive pool's is the higher): a job
    wider than its pool's total is inert."""

    def __new__(cls, batch_free: int, inter_free: int) -> _Bounds:
        if inter_free > batch_free:
            return super().__new__(cls, (batch_free, inter_free, True))
        return super().__new__(cls, (inter_free, batch_free, False))


def walk_lazily(
    rnd: Round, rest: Sequence[JobRequest], admitted: Admitted, cheap: CheapVerdicts, walk: Walk
) -> bool:
    """`backfill.backfill` with its inert candidates deferred (module docstring): False, having
    done nothing, when it does not apply (a policy that reclaims, the interactive pool not held
    yet, no top job, a project with a limit, a repeated or already decided id, nothing inert)."""
    count = len(rest)
    if (
        not count
        or rnd.composition.reclaim is not None
        or not rnd.headroom_done
        or rnd.top is None
        or rnd.has_limits()
    ):
        return False
    ids = set(map(_ID, rest))
    if len(ids) != count or not rnd.out.verdicts.keys().isdisjoint(ids):
        return False
    batch_pool, inter_pool = rnd.batch_pool, rnd.inter_pool
    bounds = _Bounds(batch_pool.free_total(), inter_pool.free_total())
    low, high, session_wider = bounds
    session = JobKind.INTERACTIVE
    depth = rnd.policy.backfill_depth
    end = count if count <= depth else _window_end(rnd, rest, admitted, cheap, depth)
    # the candidates some free GPUs of their pool could fit (`_Bounds`)
    active = [
        index
        for index, job in enumerate(rest[:end] if end < count else rest)
        if job.gpu_count <= low or (job.gpu_count <= high and (job.kind == session) is session_wider)
    ]
    if len(active) == end:
        if end < count:  # all walked: admit's answers are kept by the memos, and the window ends here
            walk(rnd, rest, admitted, cheap)
            return True
        return False
    top = rnd.top
    epochs: list[Epoch] = [(0, batch_pool.free_counts(), inter_pool.free_counts())]
    walked = _Walked(rnd, rest, active, epochs, end)
    walk(rnd, walked, admitted, cheap)
    stop = walked.stop
    if stop < end:
        # not expected (nothing in the walk sets a top job without reclaim): the rest of the
        # window is walked as it is
        walk(rnd, rest[stop:end], admitted, cheap)
    # the pass's memos go along, not the pass's objects: those hold the round
    rnd.deferred.append(
        partial(
            _record_inert,
            jobs=rest,
            stop=stop,
            bounds=bounds,
            top=top,
            epochs=epochs,
            by_shape=admitted.by_shape,
            memos=cheap.memos(),
        )
    )
    if end < count:
        from scheduling.engine.stages.backfill import beyond_window  # here: it imports this module

        beyond = beyond_window_sentence(depth)
        beyond_window(admitted, rest[end:], beyond, cheap)
    return True


class _Walked(Sequence[JobRequest]):
    """The candidates `walk_lazily` walks, for one `backfill.walk` in queue order.  Between two
    of them it notes the pools' free counts when the one before took GPUs (``epochs``: they
    apply from the next queue index on), and it ends the walk there if the top job changed
    (``stop``: the queue index the walk over all resumes at; ``end`` if it did not)."""

    __slots__ = ("_active", "_epochs", "_rest", "_rnd", "stop")

    def __init__(
        self, rnd: Round, rest: Sequence[JobRequest], active: list[int], epochs: list[Epoch], end: int
    ) -> None:
        self._rnd, self._rest, self._active, self._epochs = rnd, rest, active, epochs
        self.stop = end

    def __len__(self) -> int:
        return len(self._active)

    @overload
    def __getitem__(self, index: int) -> JobRequest: ...

    @overload
    def __getitem__(self, index: slice) -> list[JobRequest]: ...

    def __getitem__(self, index: int | slice) -> JobRequest | list[JobRequest]:
        rest = self._rest
        if isinstance(index, slice):
            return [rest[position] for position in self._active[index]]
        return rest[self._active[index]]

    def __iter__(self) -> Iterator[JobRequest]:
        rnd, rest, epochs = self._rnd, self._rest, self._epochs
        batch_pool, inter_pool = rnd.batch_pool, rnd.inter_pool
        batch_takes, inter_takes, top = batch_pool.takes, inter_pool.takes, rnd.top
        after = 0  # the queue index after the last one walked
        for index in self._active:
            if batch_pool.takes != batch_takes or inter_pool.takes != inter_takes:
                batch_takes, inter_takes = batch_pool.takes, inter_pool.takes
                epochs.append((after, batch_pool.free_counts(), inter_pool.free_counts()))
            if rnd.top is not top:
                self.stop = after
                return
            yield rest[index]
            after = index + 1
        if batch_pool.takes != batch_takes or inter_pool.takes != inter_takes:
            epochs.append((after, batch_pool.free_counts(), inter_pool.free_counts()))
        if rnd.top is not top:
            self.stop = after


def _window_end(
    rnd: Round, rest: Sequence[JobRequest], admitted: Admitted, cheap: CheapVerdicts, depth: int
) -> int:
    """Where `backfill.walk`'s window ends in ``rest``: the index of the first job after
    ``depth`` admitted ones (admit's answers, which only the jobs decide here, are memoized
    for the walk and `record_inert`)."""
    batch = JobKind.BATCH
    # the common job's `admits` answer per project and size when it asks no memory (its key is
    # then (size, project, 0, no precisions)): two lookups, no key built (about half the time)
    by_project: dict[str, dict[int, Verdict | None]] = {}
    scanned = 0
    for index, job in enumerate(rest):
        if scanned >= depth:
            return index
        if job.kind == batch and job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
            # `backfill.walk`'s common job (no project has a limit here)
            if job.min_memory_gib == 0:
                sizes = by_project.get(job.project)
                if sizes is None:
                    sizes = by_project[job.project] = {}
                known = sizes.get(job.gpu_count, _UNASKED)
                if known is _UNASKED:
                    known = sizes[job.gpu_count] = _admission(job, admitted, cheap)
            else:
                known = _admission(job, admitted, cheap)
            if known is None:
                scanned += 1
        elif admitted(job):
            scanned += 1
    return len(rest)


def _admission(job: JobRequest, admitted: Admitted, cheap: CheapVerdicts) -> Verdict | None:
    """`backfill.walk`'s answer for a common job: None (admitted) or admit's verdict."""
    key = (job.gpu_count, job.project, job.min_memory_gib, job.precisions)
    known: Verdict | None = cheap.admits.get(key, _UNASKED)
    if known is _UNASKED:
        known = cheap.admit_plain(job, key, admitted)
    return known


def _record_inert(
    rnd: Round,
    *,
    jobs: Sequence[JobRequest],
    stop: int,
    bounds: _Bounds,
    top: JobRequest,
    epochs: list[Epoch],
    by_shape: dict[tuple[object, ...], Verdict | None],
    memos: Memos,
) -> None:
    """The verdicts `backfill.walk` gives the inert candidates of ``jobs[:stop]`` (those wider
    than their pool's ``bounds``), each told the free GPUs of its epoch: admit's refusal, the wide job's
    verdict behind ``top``, or too few GPUs free."""
    from scheduling.engine.stages.backfill import Admitted  # here: it imports this module

    admitted = Admitted(rnd)
    admitted.by_shape = by_shape
    cheap = CheapVerdicts(rnd, memos)
    admits, kept = cheap.admits, cheap.too_few
    verdicts = rnd.out.verdicts
    types_for = rnd.types_for
    wide, batch, session = rnd.wide, JobKind.BATCH, JobKind.INTERACTIVE
    low, high, session_wider = bounds
    refused: dict[int, Verdict] = {}  # wide jobs' verdicts per size
    # (size, types list's id, free, the top job's owner's) -> too-few verdict
    few: dict[tuple[int, int, int, bool], Verdict] = {}
    edges = iter(epochs[1:])
    _first, batch_free, inter_free = epochs[0]
    following = next(edges, None)
    for index, job in enumerate(jobs[:stop] if stop < len(jobs) else jobs):
        size = job.gpu_count
        if size <= low or (size <= high and (job.kind == session) is session_wider):
            continue  # walked
        while following is not None and following[0] <= index:
            _first, batch_free, inter_free = following
            following = next(edges, None)
        job_id = job.id
        if job_id in verdicts:
            continue
        if job.kind == batch and job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
            key = (size, job.project, job.min_memory_gib, job.precisions)
            known = admits.get(key, _UNASKED)
            if known is _UNASKED:
                known = cheap.admit_plain(job, key, admitted)
            if known is not None:
                verdicts[job_id] = known
                continue
        elif not admitted(job):
            continue  # admit recorded why
        if wide and job_id in wide:
            verdict = refused.get(size)
            if verdict is None:
                verdict = refused[size] = Verdict(PendingReason.PRIORITY, wide_sentence(job, top))
            verdicts[job_id] = verdict
            continue
        types = types_for(job)
        counts = inter_free if job.kind == session else batch_free
        # `FreePool.free_in` as it was at the job's place in the walk
        free = counts.get(types[0], 0) if len(types) == 1 else sum(counts.get(name, 0) for name in types)
        shared = (size, id(types), free, top.user == job.user)
        verdict = few.get(shared) if job_id != top.id else None
        if verdict is None:
            verdict = too_few(rnd, job, types, free, kept, top)
            if job_id != top.id:
                few[shared] = verdict
        verdicts[job_id] = verdict
