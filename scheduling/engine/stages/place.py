"""Place: choose GPUs for one job and start it, normally or lent (reclaimable).

A job starts normally where it fits without running into anything held for later (a booking,
the top job's reservation, the interactive pool): on the planning estimate, or with
``fits_on_p50`` on its predicted median (the top job's shadow time comes from the users'
limits, which overestimate, so the median is the better bet of when the GPUs are really
needed).  With ``lends``, preemptible batch work that does not fit so may still borrow held
GPUs as lent work, for as long as it can be evicted in time (`lent_until`).  With
``is_drain_aware`` the node is chosen where it delays nodes' expected drain least
(`fragmentation.DrainAwareChooser`), and consenting work that does delay a drain starts lent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine.fragmentation import defers_wide_borrower
from scheduling.engine.headroom import may_use_headroom
from scheduling.engine.placement import INF
from scheduling.engine.preemption import is_costly_start
from scheduling.engine.stages.admit import pool_admits, within_type_limits
from scheduling.engine.types import JobKind, JobRequest

if TYPE_CHECKING:
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.round import Round


@dataclass(frozen=True, slots=True)
class Place:
    """The place stage (see the module docstring)."""

    fits_on_p50: bool = False
    lends: bool = False
    is_drain_aware: bool = False
    # > 0: a wide job that would borrow waits while smaller jobs within their guarantees can use
    # the free GPUs, at most this long from its first submission (`fragmentation.defers_wide_borrower`)
    wide_borrower_wait_s: float = 0.0

    def lent_until(self, rnd: Round, job: JobRequest, estimate: Estimate) -> float:
        """Earliest time a lent start of this job could be off its GPUs again.

        Checkpointable work loses little when reclaimed, so it may borrow for as long as its
        minimum runtime; restartable work only where its planning estimate (the p90 under berth)
        fits before the need.
        """
        policy = rnd.policy
        held = policy.min_runtime_s if job.is_checkpointable else max(estimate.hold_s, policy.min_runtime_s)
        return rnd.now + held + policy.grace_s

    def try_start(self, rnd: Round, job: JobRequest, types: Sequence[str], estimate: Estimate) -> bool:
        """Start the job now if it fits without hurting anything held; lent if it must."""
        if rnd.wide and job.id in rnd.wide and rnd.top is not None:
            from scheduling.engine.stages.partition import refuse_wide  # here: it imports place

            refuse_wide(rnd, job)
            return False
        wait_s = self.wide_borrower_wait_s
        if wait_s > 0.0 and defers_wide_borrower(rnd, job, types, wait_s):
            return False
        pool = rnd.pool_for(job)
        free = pool.free_in(types)
        if free < job.gpu_count:
            return False  # too few free GPUs (held ones included) for any start, lent or not
        now = rnd.now
        until = now + (estimate.p50_s if self.fits_on_p50 else estimate.hold_s)
        # a booking is honoured on the user's own limit: predictions are not promises
        strict_until = now + max(estimate.hold_s, job.requested_s or 0.0)
        types = within_type_limits(rnd, job, types)
        if not types:
            return False
        must_lend = rnd.composition.admit.must_lend(rnd, job, types)
        prefer = rnd.composition.model.prefers_cheap_types
        chooser = rnd.drain_chooser
        if chooser is not None:
            chooser.is_lendable = job.is_preemptible and job.kind == JobKind.BATCH
        gpus = pool.find(
            types,
            job.gpu_count,
            until=until,
            strict_until=strict_until,
            is_interactive=job.kind == JobKind.INTERACTIVE or may_use_headroom(rnd, job, types),
            prefer_type_order=prefer,
        )
        if (
            gpus is not None
            and is_costly_start(job)
            and not must_lend
            and not pool_admits(rnd, job, gpus, estimate)
        ):
            if chooser is not None:
                chooser.is_lendable = False
            return False
        if gpus is not None:
            if chooser is not None:
                must_lend = must_lend or (chooser.is_lendable and chooser.delays_drain(gpus, INF))
                chooser.is_lendable = False
            rnd.start(job, gpus, estimate, is_lent=must_lend)
            return True
        if self.lends and job.is_preemptible and job.kind == JobKind.BATCH:
            gpus = pool.find(
                types,
                job.gpu_count,
                until=self.lent_until(rnd, job, estimate),
                is_lent=True,
                is_checkpointing=job.is_checkpointable,
                prefer_type_order=prefer,
            )
            if gpus is not None:
                rnd.start(job, gpus, estimate, is_lent=True)
                return True
        if chooser is not None:
            chooser.is_lendable = False
        return False
