"""Backfill candidates decided without a placement attempt, and why a candidate waits.

`backfill.backfill` walks a queue that can be thousands long every round (static's grows
through the year on the KTH overlay: docs/benchmarks.md, "Speed V"); most of its candidates
start nothing and get a verdict shared by many.  `CheapVerdicts` gives those verdicts,
`consider` tries the others, `explain_blocked` and `too_few` say why a candidate waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduling.engine.outcome import Verdict, fmt_gpus, fmt_s, job_label
from scheduling.engine.placement import INF
from scheduling.engine.stages.partition import refuse_wide
from scheduling.engine.stages.reserve import HEADROOM
from scheduling.engine.types import JobKind, JobRequest, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.round import Round
    from scheduling.engine.stages.backfill import Admitted

# `CheapVerdicts.memos`: project -> has a limit, common job's key -> admission, project -> quotas
Memos = tuple[dict[str, bool], dict[tuple[object, ...], "Verdict | None"], dict[str, object]]
_KEPT_ADMITTED = 1 << 14  # admitted shapes kept per inventory and admit stage across rounds
_NO_TOP = object()  # `CheapVerdicts.plain_epoch` without a top job: equal to no id or owner


def beyond_window_sentence(depth: int) -> str:
    """The verdict sentence of a job left behind a backfill window of ``depth`` jobs
    (`backfill.beyond_window`); the replay's still-tick test finds the window's end by it."""
    return f"{depth} other jobs are considered first; it is beyond this round's backfill window."


class CheapVerdicts:
    """The verdicts `backfill` gives without trying a start, each shared by the jobs it fits.

    * a static wide job behind the top job waits for the top job (`refuse_wide`, which
      `Place.try_start` would also give first), one verdict per size;
    * a job (not a session under a policy that reclaims) with fewer GPUs of its types free
      than it needs, held ones included, cannot start (`Place.try_start` refuses it before
      anything else) and nothing but a session's reclaim could act for it: `explain_blocked`'s
      verdict, one per distinct sentence (`too_few`).

    Starts and claims take GPUs from a pool mid-pass: the free counts are re-read when the
    pool's ``takes`` counter moves."""

    __slots__ = (
        "_blocked",
        "_counts",
        "_kept",
        "_quotas",
        "admits",
        "by_size",
        "limited",
        "rnd",
        "too_few",
    )

    def __init__(self, rnd: Round, memos: Memos | None = None) -> None:
        """The memos of one round's backfill pass; ``memos``: those of admission (`memos`)
        from an earlier instance on the same round."""
        self.rnd = rnd
        self.by_size: dict[int, Verdict] = {}  # a wide job's verdict behind the top job, per size
        self.too_few: dict[tuple[object, ...], Verdict] = {}
        # (id of the pool, id of the types list) -> (the pool's takes, the types, free count)
        self._counts: dict[tuple[int, int], tuple[int, Sequence[str], int]] = {}
        # project -> whether it has a total limit (`Round.limit`, fixed for the round);
        # (size, project, memory, precisions) of an unconstrained batch job of a project without
        # a limit -> None (admitted) or admit's verdict, once the interactive pool is held;
        # project -> its quotas as `Admit.never_startable_of` keys them (None: it has none)
        self.limited: dict[str, bool]
        self.admits: dict[tuple[object, ...], Verdict | None]
        self._quotas: dict[str, object]
        self.limited, self.admits, self._quotas = ({}, {}, {}) if memos is None else memos
        # the shapes admit admitted in earlier rounds on this inventory (`admit_plain`)
        derived = rnd.state.topology.derived
        kept_key = ("plain_admitted", rnd.composition.admit)
        kept = derived.get(kept_key)
        if kept is None or len(kept) > _KEPT_ADMITTED:
            kept = derived[kept_key] = set()
        self._kept: set[tuple[object, ...]] = kept
        # what `consider` read of a job -> ((the pool's takes, holds), the top job, the verdict
        # the job got, its types list)
        self._blocked: dict[
            tuple[object, ...], tuple[tuple[int, int], JobRequest | None, Verdict, Sequence[str]]
        ] = {}

    def memos(self) -> Memos:
        """The admission memos (limits, admissions, quotas), which outlive the pass: the
        deferred verdicts behind the window use them (`backfill.beyond_window`)."""
        return self.limited, self.admits, self._quotas

    def has_limit(self, project: str) -> bool:
        """Whether a project has a total limit (then admit reads what it runs)."""
        found = self.limited[project] = self.rnd.limit(project) is not None
        return found

    def admit_plain(self, job: JobRequest, key: tuple[object, ...], admitted: Admitted) -> Verdict | None:
        """`Admitted` for the first unconstrained batch job of its ``key`` in this round (its
        project has no limit and the interactive pool is held): None if admitted, else admit's
        verdict.  Admit's answer then reads only the job's size, memory and precisions, its
        project's quotas and the inventory, so an admission is also kept across rounds (a
        refusal, which records a sentence, is asked again)."""
        project = job.project
        if project in self._quotas:
            quotas = self._quotas[project]
        else:
            share = self.rnd.shares.get(project)
            quotas = self._quotas[project] = (
                (share.name, share.guaranteed, share.borrow_limit, share.borrow_limits)
                if share is not None
                and (bool(share.guaranteed) or share.borrow_limit is not None or bool(share.borrow_limits))
                else None
            )
        shape = (key[0], quotas, key[2], key[3])
        if shape in self._kept:
            found: Verdict | None = None
        elif admitted(job):
            self._kept.add(shape)
            found = None
        else:
            found = self.rnd.out.verdicts[job.id]
        self.admits[key] = found
        return found

    def refused(self, job: JobRequest) -> Verdict:
        """A wide job's verdict behind the top job (`refuse_wide`), one per size."""
        verdict = self.by_size.get(job.gpu_count)
        if verdict is None:
            refuse_wide(self.rnd, job)
            verdict = self.by_size[job.gpu_count] = self.rnd.out.verdicts[job.id]
        return verdict

    def free(self, job: JobRequest, types: Sequence[str]) -> int:
        """Free GPUs of ``types`` (held ones included) in the pool of a job that is not wide."""
        rnd = self.rnd
        pool = rnd.inter_pool if job.kind == JobKind.INTERACTIVE else rnd.batch_pool
        key = (id(pool), id(types))
        counted = self._counts.get(key)
        if counted is None or counted[0] != pool.takes:
            # the types list is kept in the entry: its id stays its own while the entry lives
            free = pool.free_in(types)
            counted = self._counts[key] = (pool.takes, types, free)
        return counted[2]

    def plain_epoch(self, job: JobRequest) -> tuple[int, object, object]:
        """For the unconstrained batch jobs that are not wide, from ``job`` (one of them) on
        until the next start or the next top job: the free GPUs of their types (held ones
        included; such a job wider than that cannot start) and the top job's id and owner (a
        marker that equals no job's when there is none).  The too-few verdict of a job neither
        the top job nor of its owner is shared by size within that span: `too_few`'s sentence
        then reads nothing else of it."""
        rnd = self.rnd
        top = rnd.top
        free = self.free(job, rnd.types_for(job))
        if top is None:
            return free, _NO_TOP, _NO_TOP
        return free, top.id, top.user

    def consider(self, job: JobRequest, types: Sequence[str]) -> None:
        """`consider`, or, under a policy whose failed start changes nothing (no reclaim, no
        lending, no drain-aware choice, no pool forecast: easy, static), the verdict of an
        earlier candidate that read the same of the round: a job that is not wide, of the same
        size, estimates, limit, kind, consent and quota limits per type, and the same owner as
        the top job or not, while its pool is as it was (no start, no hold) and the top job too.

        A failed `Place.try_start` of such a policy leaves nothing behind but the verdict it
        may record, and `explain_blocked` reads no more of the job than that key."""
        rnd = self.rnd
        composition = rnd.composition
        if (
            composition.reclaim is not None
            or composition.place.lends
            or rnd.drain_chooser is not None
            or rnd.pool_forecast is not None
            or (rnd.wide and job.id in rnd.wide)
        ):
            consider(rnd, job, types)
            return
        pool = rnd.inter_pool if job.kind == JobKind.INTERACTIVE else rnd.batch_pool
        top = rnd.top
        share = rnd.shares.get(job.project)
        estimate = rnd.state.estimate(job)
        key = (
            id(pool),
            id(types),
            job.gpu_count,
            estimate.hold_s,
            estimate.p50_s,
            job.requested_s,
            job.kind,
            job.is_preemptible,
            job.is_checkpointable,
            job.project if share is not None and share.borrow_limits else None,
            top is not None and top.user == job.user,
        )
        counters = (pool.takes, pool.holds)
        found = self._blocked.get(key)
        if found is not None and found[0] == counters and found[1] is top:
            rnd.out.verdicts[job.id] = found[2]
            return
        consider(rnd, job, types)
        verdict = rnd.out.verdicts.get(job.id)
        if verdict is not None and (pool.takes, pool.holds) == counters and rnd.top is top:
            # nothing started: the types list is kept in the entry, so its id stays its own
            self._blocked[key] = (counters, top, verdict, types)

    def verdict(self, job: JobRequest) -> Verdict | None:
        """The job's shared verdict, or None when it needs `consider`."""
        rnd = self.rnd
        wide = rnd.wide
        if wide and job.id in wide:
            return None if rnd.top is None else self.refused(job)
        if job.kind == JobKind.INTERACTIVE and rnd.composition.reclaim is not None:
            return None
        types = rnd.types_for(job)
        free = self.free(job, types)
        if free >= job.gpu_count:
            return None
        return too_few(rnd, job, types, free, self.too_few, rnd.top)


def consider(rnd: Round, job: JobRequest, types: Sequence[str]) -> None:
    """A backfill candidate that may start: start it where it fits, a session may reclaim,
    else record why it waits."""
    composition = rnd.composition
    reclaim = composition.reclaim
    estimate = rnd.state.estimate(job)
    if composition.place.try_start(rnd, job, types, estimate):
        return
    if job.id in rnd.out.verdicts:
        return
    if (
        reclaim is not None
        and job.kind == JobKind.INTERACTIVE
        and reclaim.for_demand(rnd, job, types, estimate, single=rnd.is_single_node(types, job.gpu_count))
    ):
        return
    explain_blocked(rnd, job, types, estimate)


def too_few(
    rnd: Round,
    job: JobRequest,
    types: Sequence[str],
    free: int,
    kept: dict[tuple[object, ...], Verdict],
    top: JobRequest | None,
) -> Verdict:
    """`explain_blocked`'s verdict for a job with fewer fitting GPUs free than it needs, one
    per distinct sentence of the round (``kept``); ``top``: the pass's top job (`Round.top`)."""
    same_owner = top is not None and top.user == job.user
    is_top = top is not None and top.id == job.id
    key = (job.gpu_count, tuple(types), free, same_owner, is_top)
    verdict = kept.get(key)
    if verdict is None:
        verdict = kept[key] = Verdict(*_too_few_sentence(job, types, free, top))
    return verdict


def explain_blocked(rnd: Round, job: JobRequest, types: Sequence[str], estimate: Estimate) -> None:
    """Record why a backfill candidate did not start: held GPUs, fragments, or too few free."""
    pool = rnd.pool_for(job)
    free = pool.free_in(types)
    top = rnd.top
    if free >= job.gpu_count:
        ignoring_holds = pool.find(types, job.gpu_count, until=-INF, strict_until=-INF)
        if ignoring_holds is not None:
            holder = pool.hold_of(ignoring_holds[0])
            what = holder.holder if holder is not None else "a reservation"
            whom = (
                "interactive headroom"
                if what == HEADROOM
                else (
                    "the top job, " + job_label(top.id, top.name, same_owner=top.user == job.user)
                    if top is not None and what == top.id
                    else "booking " + what
                )
            )
            rnd.out.wait(
                job.id,
                PendingReason.RESERVATION,
                f"{free} fitting GPUs are free, but they are held for {whom} and this job's "
                f"estimated {fmt_s(estimate.hold_s)} would run into that.",
            )
            return
        rnd.out.wait(
            job.id,
            PendingReason.FRAGMENTATION,
            f"{free} fitting GPUs are free in total, but no node has {job.gpu_count} of them together.",
        )
        return
    rnd.out.wait(job.id, *_too_few_sentence(job, types, free, top))


def _too_few_sentence(
    job: JobRequest, types: Sequence[str], free: int, top: JobRequest | None
) -> tuple[PendingReason, str]:
    """Why a job with fewer fitting GPUs free than it needs waits (``top``: the top job)."""
    ahead = (
        "; the next free GPUs go to the job first in line, "
        + job_label(top.id, top.name, same_owner=top.user == job.user)
        if top is not None
        else ""
    )
    return (
        PendingReason.RESOURCES if top is None or top.id == job.id else PendingReason.PRIORITY,
        f"Needs {fmt_gpus(job.gpu_count)} of type {'/'.join(types)}; {free} are free{ahead}.",
    )
