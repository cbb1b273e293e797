"""Shared pieces of the engine round: the result, audit helpers, the lock, allocation helpers."""

from __future__ import annotations

import gc
import importlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.db.models import Min

from notifications.models import EventKind
from portal.accounts.models import Project
from scheduling import queries
from scheduling.engine.types import (
    NodeStatus,
)
from scheduling.models import (
    Allocation,
    AuditEvent,
    Cluster,
    Job,
    Node,
)
from scheduling.services import (
    allocation_events_record,
    allocation_state,
    allocations_close,
    audit_event_record,
    is_exclusion_violation,
    iso_or_none,
    job_state,
)

logger = logging.getLogger(__name__)

ENGINE = AuditEvent.Actor.ENGINE
_LOCK_NAMESPACE = 0x4265  # "Be": first key of the two-key advisory lock, the cluster id is the second
# A running job's allocation is extended when it would lapse within this margin, by this much.
_EXTEND_MARGIN = timedelta(minutes=5)
_EXTEND_BY = timedelta(minutes=30)
_MIN_PERIOD = timedelta(seconds=60)
# A pending job's stored ETA is rewritten only when it moves by more than this (or 10 % of the wait).
_ETA_SLACK = timedelta(seconds=60)
# A terminal backend record that started this long before the job's current start is an earlier attempt.
_STALE_TOLERANCE_S = 2.0
_BOOKING_NOTE_PREFIX = "Engine: "
_FINISH_EVENTS: dict[str, str] = {
    Job.Status.COMPLETED: EventKind.JOB_FINISHED,
    Job.Status.FAILED: EventKind.JOB_FAILED,
}
_NODE_STATUS = {
    NodeStatus.UP: Node.Status.UP,
    NodeStatus.DRAINING: Node.Status.DRAINING,
    NodeStatus.DOWN: Node.Status.DOWN,
}


@dataclass(slots=True)
class RoundResult:
    """What one call of `engine_round_run` did (returned to the task, logged, shown in tests)."""

    cluster_id: int
    status: str = "ok"  # ok | locked | inactive | backend_error | apply_failed | engine_error
    round_id: int | None = None
    message: str = ""
    started: int = 0
    start_conflicts: int = 0
    failed_starts: int = 0
    preempted: int = 0
    finished: int = 0
    requeued: int = 0
    lost: int = 0
    pending: int = 0
    duration_ms: float = 0.0
    next_round_at: float | None = None  # epoch s: the engine wants another round by then
    notes: list[str] = field(default_factory=list)
    # Wall milliseconds per phase: backend_snapshot, reconcile, snapshot_build, plan, persist, apply.
    phases_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def hook(name: str) -> Any:
    """``scheduling.rounds.<name>``, looked up when called: the package re-exports `plan_round`
    and `_call_apply`, and whoever replaces them there (a test, a debugging session) is obeyed."""
    return getattr(importlib.import_module("scheduling.rounds"), name)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (reference counting still frees
    everything else), as it was again afterwards.

    A round allocates hundreds of thousands of short-lived objects (12,000 open jobs' rows and
    requests, the engine's plan): each allocation threshold crossed starts a collection, and a
    collection of the oldest generation walks every object a long-lived worker holds (its
    runtime predictor, the kept requests).  Measured on the full-size lab: a snapshot build of
    0.8-1.0 s with the collector on, 0.4-0.6 s with it off.  The cycles a round leaves are
    collected by the interpreter after it, not on the way to the backend's apply.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def round_process_warm() -> None:
    """What a worker process does once before its first round, so that round does not pay it.

    The URL resolver is built on the first ``reverse()`` (the notices of a round link to the
    job's page): it imports every view module, ~1 s once per process.  Then everything alive
    (modules, settings, the resolver) is moved out of the collector's sight (``gc.freeze``): a
    full collection after a round (`cyclic_gc_paused`) need not walk it again every time.
    """
    from django.urls import get_resolver

    get_resolver().reverse_dict  # noqa: B018 (the property builds the resolver's tables)
    gc.collect()
    gc.freeze()


# ---- audit helpers ----

# One definition each, in the services: a job's audited state reads the same whether a service
# or the round changed it.  The round's modules import them from here under these names.
_iso = iso_or_none
_job_state = job_state
_is_exclusion_violation = is_exclusion_violation


def _audit(verb: str, entity_type: str, entity_id: int, before: Any, after: Any, at: datetime) -> None:
    audit_event_record(
        actor=None,
        actor_label=ENGINE,
        verb=verb,
        entity_type=entity_type,
        entity_id=entity_id,
        before=before,
        after=after,
        at=at,
    )


def _audit_allocations(
    changes: Sequence[tuple[Allocation, dict[str, Any] | None]], verb: str, at: datetime
) -> None:
    allocation_events_record(changes=changes, actor=None, actor_label=ENGINE, verb=verb, at=at)


def _with_project_and_cluster(jobs: Iterable[Job], *, cluster: Cluster) -> None:
    """Give the round's job rows what ``select_related("project", "cluster")`` would (their
    notices name both): the cluster is the round's, the projects come from one read of a few
    rows.  The join made Django build two more instances per row: the 469 rows a first round
    of the full bench locks cost 22-26 ms of CPU with it, 14 without."""
    rows = list(jobs)
    projects = Project.objects.in_bulk({job.project_id for job in rows})
    for job in rows:
        job.project = projects[job.project_id]
        job.cluster = cluster


# ---- the lock ----


@contextmanager
def cluster_round_lock(cluster_id: int) -> Iterator[bool]:
    """Try the cluster's session advisory lock; yields whether this caller holds it."""
    acquired = queries.advisory_lock_try(_LOCK_NAMESPACE, cluster_id)
    try:
        yield acquired
    finally:
        if acquired:
            try:
                queries.advisory_unlock(_LOCK_NAMESPACE, cluster_id)
            except DatabaseError:  # the connection died: PostgreSQL released the lock with it
                logger.warning("could not unlock round lock of cluster %s", cluster_id, exc_info=True)


# ---- allocation helpers ----


def _close_job_allocations(job: Job, *, at: datetime, verb: str) -> None:
    """End the job's blocking allocations at ``at``: truncate what had started, release the rest."""
    allocations_close(job.allocations.all(), at=at, actor=None, actor_label=ENGINE, verb=verb)


def _release_job_allocations(job: Job, *, at: datetime, verb: str) -> None:
    """A start that never happened: its allocations leave the constraint (state ``released``)."""
    changes: list[tuple[Allocation, dict[str, Any] | None]] = []
    for allocation in job.allocations.exclude(state__in=(Allocation.State.RELEASED, Allocation.State.ENDED)):
        before = allocation_state(allocation)
        allocation.state = Allocation.State.RELEASED
        changes.append((allocation, before))
    if changes:
        Allocation.objects.bulk_update([a for a, _ in changes], ["state"])
        _audit_allocations(changes, verb, at)


def _next_blocking_start(
    *, gpu_ids: Sequence[int], after: datetime, exclude_job_id: int | None
) -> datetime | None:
    """The earliest start, at or after ``after``, of another holder's blocking allocation on these GPUs."""
    qs = Allocation.objects.filter(gpu_id__in=list(gpu_ids), period__startswith__gte=after).exclude(
        state=Allocation.State.RELEASED
    )
    if exclude_job_id is not None:
        qs = qs.exclude(job_id=exclude_job_id)
    first: datetime | None = qs.aggregate(first=Min("period__startswith"))["first"]
    return first
