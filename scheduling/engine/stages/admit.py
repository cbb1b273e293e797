"""Admit: whether a job may be considered at all, and on what terms it may run.

* `Admit.__call__`: a job is skipped (with its reason) when no GPU type satisfies it, when no
  amount of waiting can start it (`startability`, no ETA), or when its project is at its limit;
* `within_type_limits`: under every policy a project never runs more of a GPU type than its
  guarantee plus borrowing limit (`quota.type_limit`, like a Slurm QOS GrpTRES per type);
* `Admit.must_lend`: with ``enforces_guarantees``, work above its project's guaranteed quota
  borrows, as preemptible work, whether or not its owner marked it preemptible (Kueue and
  Run:ai do this); with ``lends_consenting``, checkpointing preemptible work that no guarantee
  covers starts lent too (bookings and sessions get its GPUs back within a grace);
* `pool_admits`: with a pool forecast, batch work sessions cannot take back (non-preemptible)
  starts only if it leaves the interactive pool's forecast peak, booked GPUs included, free
  until its p90 end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine.outcome import fmt_s
from scheduling.engine.quota import type_limit
from scheduling.engine.startability import Unstartable, never_startable, type_capacity
from scheduling.engine.types import JobKind, JobRequest, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.round import Round

_MISSING = object()
_NEVER_KEPT = 1 << 14  # never-startable verdicts kept per inventory across rounds


@dataclass(frozen=True, slots=True)
class Admit:
    """The admit stage (see the module docstring)."""

    enforces_guarantees: bool = False
    lends_consenting: bool = False

    def __call__(self, rnd: Round, job: JobRequest) -> bool:
        """Whether a job may be considered at all; records why not (constraint, quota limit).

        The interactive pool is held when the first batch job is admitted (sessions, first
        in the queue, were placed before it)."""
        if job.id in rnd.out.verdicts:
            return False
        if not rnd.headroom_done and job.kind != JobKind.INTERACTIVE:
            hold_pool(rnd)
        if not rnd.state.eligible_types(job):
            rnd.out.wait(
                job.id,
                PendingReason.CONSTRAINT,
                f"No GPU in cluster {rnd.state.snapshot.cluster} satisfies its constraints "
                f"(type {job.gpu_type or 'any'}, >= {job.min_memory_gib:g} GiB, "
                f"precisions {', '.join(sorted(job.precisions)) or 'any'}).",
            )
            return False
        never = self.never_startable_of(rnd, job)
        if never is not None:
            _record_never(rnd, job, never)
            return False
        limit = rnd.limit(job.project)
        if limit is not None and rnd.used.get(job.project, 0) + job.gpu_count > limit:  # over its limit
            rnd.out.wait(
                job.id,
                PendingReason.QUOTA,
                f"Project {job.project} runs {rnd.used.get(job.project, 0)} GPUs of its limit "
                f"of {rnd.limit(job.project)}; this job needs {job.gpu_count} more.",
            )
            return False
        return True

    def is_never_startable(self, rnd: Round, job: JobRequest) -> bool:
        """Whether no amount of waiting starts ``job`` (`startability`); if so, records its
        reason and what would unblock it, with no ETA."""
        never = self.never_startable_of(rnd, job)
        if never is None:
            return False
        _record_never(rnd, job, never)
        return True

    def never_startable_of(self, rnd: Round, job: JobRequest) -> Unstartable | None:
        """`startability.never_startable` on this round's inventory, memoised per job shape
        (the project counts only when it has quotas: without, the answer does not depend on it).

        The verdict reads the job's constraints and size, its project's quotas (not its usage)
        and the inventory, so it is also kept across rounds on the (shared) topology, keyed by
        the quotas themselves."""
        project = job.project
        quota_projects = rnd.quota_projects
        has_quotas = quota_projects.get(project)
        if has_quotas is None:
            share = rnd.shares.get(project)
            has_quotas = quota_projects[project] = share is not None and (
                bool(share.guaranteed) or share.borrow_limit is not None or bool(share.borrow_limits)
            )
        key = (
            job.gpu_type,
            job.min_memory_gib,
            job.precisions,
            job.gpu_count,
            project if has_quotas else None,
        )
        cache = rnd.never_cache
        found = cache.get(key, _MISSING)
        if found is _MISSING:
            share = rnd.shares.get(project)
            snapshot = rnd.state.snapshot
            # capacity per type depends on the nodes alone: kept on the (shared) topology
            derived = rnd.state.topology.derived
            capacity = derived.get(("type_capacity",))
            if capacity is None:
                capacity = derived[("type_capacity",)] = type_capacity(snapshot.nodes)
            kept = derived.get(("never_startable",))
            if kept is None or len(kept) > _NEVER_KEPT:
                kept = derived[("never_startable",)] = {}
            quotas = (
                (share.name, share.guaranteed, share.borrow_limit, share.borrow_limits)
                if has_quotas and share is not None
                else None
            )
            shape = (job.gpu_type, job.min_memory_gib, job.precisions, job.gpu_count, quotas)
            found = kept.get(shape, _MISSING)
            if found is _MISSING:
                found = kept[shape] = never_startable(
                    job,
                    gpu_types=snapshot.gpu_types,
                    nodes=snapshot.nodes,
                    share=share,
                    is_guarantee_enforced=self.enforces_guarantees,
                    capacity_by_type=capacity,
                )
            cache[key] = found
        return found  # type: ignore[return-value]

    def must_lend(self, rnd: Round, job: JobRequest, types: Sequence[str]) -> bool:
        """Whether a job may start only lent (reclaimable) under its project's quota."""
        if not self.enforces_guarantees or job.kind != JobKind.BATCH:
            return False
        left = [rnd.guarantee_left(job.project, t) for t in types]
        is_within_guarantee = any(x is not None and x >= job.gpu_count for x in left)
        if not is_within_guarantee and all(x is not None for x in left):
            # the project has quotas and this job is above its guarantee: it borrows, as
            # preemptible work (Kueue), whether or not its owner marked it preemptible
            return True
        # no guarantee covers it and it checkpoints on request: it runs reclaimable, so
        # bookings and sessions can have its GPUs back within a grace at little loss
        return (
            self.lends_consenting and job.is_preemptible and job.is_checkpointable and not is_within_guarantee
        )


def _record_never(rnd: Round, job: JobRequest, never: Unstartable) -> None:
    """Record why a job can never start, with no ETA."""
    rnd.out.wait(job.id, never.reason, never.message)
    rnd.out.verdicts[job.id].has_eta = False


def hold_pool(rnd: Round) -> None:
    """Hold the interactive pool now, once per round (if the policy composes one)."""
    pool = rnd.composition.pool
    if pool is not None:
        pool.hold(rnd)
    rnd.headroom_done = True


def within_type_limits(rnd: Round, job: JobRequest, types: Sequence[str]) -> Sequence[str]:
    """The job's types on which its project stays within guarantee + borrowing limit
    (`quota.type_limit`, every policy: a Slurm QOS GrpTRES per GPU type does the same); when
    none is left, records why it waits."""
    share = rnd.shares.get(job.project)
    if share is None or not share.borrow_limits:
        return types
    kept = [
        t
        for t in types
        if (limit := type_limit(share, t)) is None
        or rnd.used_by_type.get((job.project, t), 0) + job.gpu_count <= limit
    ]
    if not kept:
        limits = ", ".join(f"{type_limit(share, t)} {t}" for t in types)
        rnd.out.wait(
            job.id,
            PendingReason.QUOTA,
            f"Project {job.project} runs as many GPUs as its guarantee and borrowing limit allow "
            f"({limits}); this job needs {job.gpu_count} more and starts when the project's work ends.",
        )
    return kept


def pool_admits(rnd: Round, job: JobRequest, gpus: tuple[int, ...], estimate: Estimate) -> bool:
    """With a pool forecast: non-preemptible batch work (`preemption.is_costly_start`) starts
    only if the GPUs such work holds stay within capacity minus the pool's forecast peak, booked
    GPUs included (`pool.booked_windows`), until its p90 end.

    Sessions cannot take non-preemptible work back, so a start at night that runs into the
    office peak would make sessions wait.  A refused job waits with the earliest window of low
    demand that would admit it as its ETA; a job that no window in the forecast admits (wider
    than the cluster minus the lowest level) is not held back, or it could never run.
    """
    forecast = rnd.pool_forecast
    if forecast is None or job.kind != JobKind.BATCH:
        return True
    state = rnd.state
    now = rnd.now
    name = state.gpu_type[gpus[0]]
    by_type = state.topology.by_type
    end = now + estimate.hold_s
    everything = list(by_type)
    capacity_all = sum(len(g) for g in by_type.values())
    pinned_all = sum(rnd.pinned_by_type.values())
    room_all = capacity_all - pinned_all - job.gpu_count
    room_type = len(by_type.get(name, ())) - rnd.pinned_by_type.get(name, 0) - job.gpu_count
    booked = rnd.booked_windows()
    peak_all = forecast.peak(everything, now, end, booked=booked)
    peak_type = forecast.peak([name], now, end, only_named=True, booked=booked)
    if peak_all <= room_all and peak_type <= room_type:
        return True
    window = forecast.low_window(everything, now, estimate.hold_s, room_all, booked=booked)
    if window is None:
        return True
    rnd.low_windows[job.id] = max(window, now)
    rnd.out.wait(
        job.id,
        PendingReason.HEADROOM,
        "It is not preemptible and would still run when on-demand sessions and bookings are "
        f"forecast to need {peak_all} GPUs; {max(room_all, 0)} GPUs stay free of such work until "
        "its estimated end. Marking it preemptible lets it start now; otherwise it waits for "
        f"demand to fall (from about +{fmt_s(max(window - now, 0.0))}).",
        max(window, now),
    )
    return False
