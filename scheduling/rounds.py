"""The engine round service: lock, snapshot, reconcile, plan, persist, apply after commit (DESIGN §1).

`engine_round_run(cluster_id=...)` runs one round for one cluster:

1. A per-cluster PostgreSQL **session** advisory lock (``pg_try_advisory_lock``) makes rounds
   of one cluster exclusive across any number of workers; a second caller gets ``"locked"`` at
   once.  The lock covers the backend apply after the commit too, so no other round can
   reconcile a start that is still being applied; a crashed worker's connection drops and
   PostgreSQL releases the lock.
2. ``backend.snapshot()``.  A `BackendError` marks the cluster degraded with the message and
   records the round's error; bookings and submissions do not depend on the engine and keep
   working.  The next good round clears the flag.
3. Reconcile (one transaction): jobs that finished or failed end their allocations (periods
   truncated to ``[start, ended)``); preempted jobs are requeued with ``attempt + 1``, their
   ``first_submitted_at`` kept and the lost GPU-seconds written on the `Preemption` row; jobs
   the database believes running that the backend does not know are *lost* and requeued;
   a start that never reached the backend is rolled back.  Work the backend runs that the
   database does not (a cancelled job, a start the database rolled back) is adopted if its GPUs
   are free, else cancelled after the commit; a job running on other GPUs than planned (Slurm
   picks indices) has its allocations moved.  Bookings become active at their start and
   completed at their end.  Allocations of running jobs are extended before they lapse.
4. The frozen `ClusterSnapshot` (``scheduling.snapshots``) goes through ``plan_round``; an
   exception there is recorded on the round (status ``engine_error``) and changes nothing.
5. The plan is persisted in ONE transaction: allocations for starts (job rows, then node
   rows, locked in id order; the exclusion constraint refuses any overlap, which rolls back
   only that start and leaves the job pending with a reason), `Preemption` rows, the pending
   explanations (and the engine's notes on bookings that may start late), the `EngineRound`
   row and an `AuditEvent` (actor ``engine``) for every change.
6. ``backend.apply`` runs in ``transaction.on_commit``.  A failed start (a failed result, or
   the whole apply raising `BackendError`) is rolled back: its allocations are released and
   the job is pending again with reason ``backend``.  Nothing is left half-started.

Every step is idempotent: running a round again, or after a crash at any point, converges.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg.errors
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import F, Min
from django.db.models.functions import Coalesce
from django.utils import timezone

from notifications.events import booking_event_emit, job_event_emit, jobs_cannot_start_emit
from notifications.models import EventKind
from notifications.services import events_deferred
from scheduling import metrics
from scheduling.backends.base import (
    ActionResult,
    BackendError,
    ClusterBackend,
    ObservedCluster,
    ObservedJob,
    UnsupportedOperationError,
)
from scheduling.backends.base import ObservedState as OS
from scheduling.backends.registry import backend_for_cluster
from scheduling.engine import plan_round
from scheduling.engine.explain import idle_by_node
from scheduling.engine.outcome import fmt_s
from scheduling.engine.placement import constraint_key
from scheduling.engine.startability import Unstartable, enforces_guarantees, unstartable_jobs
from scheduling.engine.types import (
    ClusterSnapshot,
    JobRequest,
    NodeStatus,
    Plan,
    PreemptAction,
    ReleaseAction,
    StartAction,
)
from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Cluster,
    EngineRound,
    Gpu,
    Job,
    Node,
    Preemption,
)
from scheduling.services import (
    allocation_events_record,
    allocation_state,
    allocations_close,
    audit_event_record,
    audit_events_deferred,
)
from scheduling.snapshots import (
    BOOKING_PREFIX,
    RUNNING_STATUSES,
    cluster_snapshot_build,
    epoch,
    from_epoch,
    parse_holder_id,
    policy_config_for_cluster,
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


# ---- audit helpers ----


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _job_state(job: Job) -> dict[str, Any]:
    return {
        "status": job.status,
        "started_at": _iso(job.started_at),
        "ended_at": _iso(job.ended_at),
        "attempt": job.attempt,
        "pending_reason": job.pending_reason,
    }


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


def _is_exclusion_violation(exc: IntegrityError) -> bool:
    return isinstance(exc.__cause__, psycopg.errors.ExclusionViolation)


# ---- the lock ----


@contextmanager
def cluster_round_lock(cluster_id: int) -> Iterator[bool]:
    """Try the cluster's session advisory lock; yields whether this caller holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_NAMESPACE, cluster_id])
        acquired = bool(cursor.fetchone()[0])
    try:
        yield acquired
    finally:
        if acquired:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_NAMESPACE, cluster_id])
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


# ---- reconcile ----


@dataclass(slots=True)
class _Reconciled:
    to_cancel: list[str] = field(default_factory=list)


def _is_stale(obs: ObservedJob, job: Job) -> bool:
    """A terminal backend record of an earlier attempt (it started before this attempt did)."""
    if obs.state in (OS.RUNNING, OS.PENDING) or obs.started_at is None or job.started_at is None:
        return False
    return obs.started_at < epoch(job.started_at) - _STALE_TOLERANCE_S


def _lost_gpu_s(
    job: Job, *, started_at: datetime, ended_at: datetime, signalled_at: datetime | None
) -> float:
    """GPU-seconds of work thrown away by a kill: everything since the last checkpoint."""
    run_s = max(0.0, (ended_at - started_at).total_seconds())
    lost_s = run_s
    if job.is_checkpointable:
        if job.checkpoint_interval_s:
            lost_s = run_s % job.checkpoint_interval_s
        if signalled_at is not None:
            lost_s = min(lost_s, max(0.0, (ended_at - signalled_at).total_seconds()))
    return lost_s * job.gpu_count


def _job_finish(job: Job, *, status: str, at: datetime, message: str, result: RoundResult) -> None:
    before = _job_state(job)
    job.status = status
    job.ended_at = at
    job.status_message = message[:500]
    if status == Job.Status.COMPLETED:
        job.exit_code = 0
    elif status == Job.Status.FAILED and job.exit_code is None:
        job.exit_code = 1
    job.save(update_fields=["status", "ended_at", "status_message", "exit_code"])
    _close_job_allocations(job, at=at, verb="allocation.end")
    _audit(f"job.{status}", "job", job.pk, before, _job_state(job), at)
    if status in _FINISH_EVENTS:
        job_event_emit(job, kind=_FINISH_EVENTS[status], at=at)
    result.finished += 1


def _job_requeue(
    job: Job, *, at: datetime, ended_at: datetime, sentence: str, message: str, verb: str, result: RoundResult
) -> None:
    """Back to the queue with ``attempt + 1``; the original submission time is kept."""
    before = _job_state(job)
    _close_job_allocations(job, at=ended_at, verb="allocation.end")
    job.first_submitted_at = job.first_submitted_at or job.submitted_at
    job.status = Job.Status.PENDING
    job.attempt += 1
    job.submitted_at = at
    job.started_at = None
    job.ended_at = None
    job.pending_reason = Job.PendingReason.NONE
    job.pending_sentence = sentence[:500]
    job.eta_p50_at = job.eta_p90_at = None
    job.status_message = message[:500]
    job.save(
        update_fields=[
            "first_submitted_at",
            "status",
            "attempt",
            "submitted_at",
            "started_at",
            "ended_at",
            "pending_reason",
            "pending_sentence",
            "eta_p50_at",
            "eta_p90_at",
            "status_message",
        ]
    )
    _audit(verb, "job", job.pk, before, _job_state(job), at)
    result.requeued += 1


def _start_rollback(job: Job, *, at: datetime, reason: str, sentence: str, message: str) -> None:
    """Undo a start that did not happen: allocations released, the job pending with a reason."""
    before = _job_state(job)
    _release_job_allocations(job, at=at, verb="allocation.release")
    job.status = Job.Status.PENDING
    job.started_at = None
    job.pending_reason = reason
    job.pending_sentence = sentence[:500]
    job.status_message = message[:500]
    job.save(update_fields=["status", "started_at", "pending_reason", "pending_sentence", "status_message"])
    _audit("job.start_rollback", "job", job.pk, before, _job_state(job), at)


def _job_preempted(job: Job, obs: ObservedJob, *, now: datetime, result: RoundResult) -> None:
    ended_at = from_epoch(obs.ended_at) if obs.ended_at is not None else now
    started_at = job.started_at or ended_at
    preemption = job.preemptions.filter(killed_at__isnull=True).order_by("-signalled_at").first()
    if preemption is None:  # the backend preempted it on its own
        preemption = Preemption.objects.create(
            job=job,
            signalled_at=ended_at,
            kill_at=ended_at,
            reason="Preempted by the cluster itself.",
        )
    before = {"killed_at": None, "lost_gpu_s": preemption.lost_gpu_s}
    preemption.killed_at = ended_at
    preemption.lost_gpu_s = _lost_gpu_s(
        job, started_at=started_at, ended_at=ended_at, signalled_at=preemption.signalled_at
    )
    preemption.save(update_fields=["killed_at", "lost_gpu_s"])
    _audit(
        "preemption.kill",
        "preemption",
        preemption.pk,
        before,
        {"killed_at": _iso(ended_at), "lost_gpu_s": preemption.lost_gpu_s},
        now,
    )
    _job_requeue(
        job,
        at=now,
        ended_at=ended_at,
        sentence="Preempted and requeued; waiting for the next round.",
        message=f"Preempted: {preemption.reason}"[:500],
        verb="job.requeue",
        result=result,
    )


def _reconcile_jobs(
    cluster: Cluster, observed: ObservedCluster, *, now: datetime, result: RoundResult
) -> _Reconciled:
    out = _Reconciled()
    by_id = {o.job_id: o for o in observed.jobs}
    open_jobs = list(
        Job.objects.select_for_update().filter(cluster=cluster, status__in=RUNNING_STATUSES).order_by("id")
    )
    open_ids = {str(j.pk) for j in open_jobs}
    # The GPUs each open job holds, read once: `_realign` compares them with what the backend reports.
    held: dict[int, set[int]] = defaultdict(set)
    for job_id, gpu_id in Allocation.objects.filter(
        job_id__in=[j.pk for j in open_jobs], state=Allocation.State.ACTIVE
    ).values_list("job_id", "gpu_id"):
        held[job_id].add(gpu_id)
    for job in open_jobs:
        obs = by_id.get(str(job.pk))
        if obs is not None and _is_stale(obs, job):
            obs = None
        if obs is None and job.status == Job.Status.STARTING:
            _start_rollback(
                job,
                at=now,
                reason=Job.PendingReason.BACKEND,
                sentence="Its start did not reach the cluster; it will be started again.",
                message="The start was not confirmed by the cluster.",
            )
            result.requeued += 1
        elif obs is None or obs.state == OS.LOST:
            _job_requeue(
                job,
                at=now,
                ended_at=now,
                sentence="The cluster lost it; requeued and waiting for the next round.",
                message=("Lost by the cluster: " + (obs.message if obs else "no longer known to it."))[:500],
                verb="job.lost",
                result=result,
            )
            result.lost += 1
        elif obs.state == OS.RUNNING:
            if job.status == Job.Status.STARTING or (obs.backend_ref and obs.backend_ref != job.backend_ref):
                before = _job_state(job)
                job.status = Job.Status.RUNNING
                job.backend_ref = obs.backend_ref or job.backend_ref
                job.save(update_fields=["status", "backend_ref"])
                if before["status"] != job.status:
                    _audit("job.run", "job", job.pk, before, _job_state(job), now)
                    job_event_emit(job, kind=EventKind.JOB_STARTED, at=now)
            if obs.gpu_ids and held.get(job.pk, set()) != set(obs.gpu_ids):
                _realign(job, obs, now=now, result=result)
        elif obs.state in (OS.COMPLETED, OS.FAILED, OS.CANCELLED):
            ended_at = from_epoch(obs.ended_at) if obs.ended_at is not None else now
            message = obs.message or ("Cancelled outside Berth." if obs.state == OS.CANCELLED else "")
            _job_finish(
                job, status=Job.Status(obs.state.value), at=min(ended_at, now), message=message, result=result
            )
        elif obs.state == OS.PREEMPTED:
            _job_preempted(job, obs, now=now, result=result)
        # OS.PENDING: the backend has it queued (e.g. Slurm scheduling it); keep waiting.

    # Work the backend runs that the database does not: cancelled or finished jobs still running,
    # and starts the database rolled back although the backend did them.
    for obs in observed.jobs:
        if obs.job_id in open_ids or obs.state not in (OS.RUNNING, OS.PENDING) or not obs.job_id.isdigit():
            continue
        known = Job.objects.select_for_update().filter(pk=int(obs.job_id), cluster=cluster).first()
        if known is not None and known.status == Job.Status.PENDING and obs.state == OS.PENDING:
            # Queued in the backend for a job still pending here (a start whose answer was a
            # refusal, e.g. Slurm's "nodes not available" right after an outage): keep it; the
            # next start of this job finds it and moves it, and if it runs first it is adopted.
            continue
        if known is None or known.status != Job.Status.PENDING or obs.state != OS.RUNNING or not obs.gpu_ids:
            out.to_cancel.append(obs.job_id)
            continue
        if not _adopt(known, obs, now=now):
            out.to_cancel.append(obs.job_id)
    return out


def _adopt(job: Job, obs: ObservedJob, *, now: datetime) -> bool:
    """A pending job the backend really runs: record it as running if its GPUs are free in the database."""
    started_at = from_epoch(obs.started_at) if obs.started_at is not None else now
    started_at = min(started_at, now)
    upper = _running_upper(job, started_at=started_at, gpu_ids=obs.gpu_ids, now=now, expected_end=None)
    if upper is not None and upper <= started_at:
        return False
    try:
        with transaction.atomic():
            allocations = Allocation.objects.bulk_create(
                Allocation(
                    gpu_id=g,
                    job=job,
                    period=DateTimeTZRange(started_at, upper, "[)"),
                    state=Allocation.State.ACTIVE,
                    is_preemptible=job.is_preemptible,
                )
                for g in obs.gpu_ids
            )
    except IntegrityError as exc:
        if not _is_exclusion_violation(exc):
            raise
        return False
    before = _job_state(job)
    job.status = Job.Status.RUNNING
    job.started_at = started_at
    job.backend_ref = obs.backend_ref or job.backend_ref
    job.pending_reason = Job.PendingReason.NONE
    job.pending_sentence = ""
    job.save(update_fields=["status", "started_at", "backend_ref", "pending_reason", "pending_sentence"])
    _audit_allocations([(a, None) for a in allocations], "allocation.create", now)
    _audit("job.adopt", "job", job.pk, before, _job_state(job), now)
    job_event_emit(job, kind=EventKind.JOB_STARTED, at=now)
    return True


def _realign(job: Job, obs: ObservedJob, *, now: datetime, result: RoundResult) -> None:
    """The backend runs the job on other GPUs than planned (Slurm picks GPU indices on a node):
    move its allocations to the GPUs it really holds, from its start; keep them if those are taken."""
    current = list(job.allocations.filter(state=Allocation.State.ACTIVE))
    if {a.gpu_id for a in current} == set(obs.gpu_ids):
        return
    started_at = job.started_at or now
    upper = _running_upper(job, started_at=started_at, gpu_ids=obs.gpu_ids, now=now, expected_end=None)
    try:
        with transaction.atomic():
            for allocation in current:
                allocation.state = Allocation.State.RELEASED
            Allocation.objects.bulk_update(current, ["state"])
            moved = Allocation.objects.bulk_create(
                Allocation(
                    gpu_id=g,
                    job=job,
                    period=DateTimeTZRange(started_at, upper, "[)"),
                    state=Allocation.State.ACTIVE,
                    is_preemptible=any(a.is_preemptible for a in current),
                )
                for g in obs.gpu_ids
            )
    except IntegrityError as exc:
        if not _is_exclusion_violation(exc):
            raise
        result.notes.append(f"job {job.pk} runs on GPUs {list(obs.gpu_ids)}, which other holders have")
        return
    _audit_allocations([(a, None) for a in current], "allocation.release", now)
    _audit_allocations([(a, None) for a in moved], "allocation.create", now)


_Caps = dict[int, list[tuple[datetime, int | None]]]


def _blocking_starts(*, gpu_ids: Iterable[int], after: datetime) -> _Caps:
    """GPU id -> (start, job id) of every blocking allocation on it starting at or after ``after``,
    soonest first: what `_running_upper` caps with, read once for all the starts of a plan."""
    out: _Caps = defaultdict(list)
    rows = (
        Allocation.objects.filter(gpu_id__in=sorted(set(gpu_ids)), period__startswith__gte=after)
        .exclude(state=Allocation.State.RELEASED)
        .values_list("gpu_id", "period__startswith", "job_id")
    )
    for gpu_id, lower, job_id in rows:
        out[gpu_id].append((lower, job_id))
    for starts in out.values():
        starts.sort(key=lambda item: item[0])
    return out


def _first_cap(
    caps: _Caps, *, gpu_ids: Sequence[int], after: datetime, exclude_job_id: int
) -> datetime | None:
    first: datetime | None = None
    for gpu_id in gpu_ids:
        for lower, job_id in caps.get(gpu_id, ()):
            if lower >= after and job_id != exclude_job_id:
                first = lower if first is None else min(first, lower)
                break
    return first


def _running_upper(
    job: Job,
    *,
    started_at: datetime,
    gpu_ids: Sequence[int],
    now: datetime,
    expected_end: datetime | None,
    caps: _Caps | None = None,
) -> datetime | None:
    """End of a running job's allocation: its expected end (or open), capped by the next holder's start.

    ``caps`` (from `_blocking_starts`, read at or before ``started_at``) saves the query."""
    if expected_end is None and job.requested_s:
        expected_end = started_at + timedelta(seconds=job.requested_s)
    if expected_end is not None:
        expected_end = max(expected_end, now + _MIN_PERIOD)
    if caps is not None:
        cap = _first_cap(caps, gpu_ids=gpu_ids, after=started_at, exclude_job_id=job.pk)
    else:
        cap = _next_blocking_start(gpu_ids=gpu_ids, after=started_at, exclude_job_id=job.pk)
    if cap is not None and (expected_end is None or cap < expected_end):
        return cap
    return expected_end


def _reconcile_bookings(cluster: Cluster, *, now: datetime) -> None:
    """Confirmed bookings become active at their start and completed at their end."""
    due = (
        Booking.objects.select_for_update()
        .filter(cluster=cluster, status__in=Booking.OPEN_STATUSES, start_at__lte=now)
        .order_by("id")
    )
    for booking in due:
        before = {"status": booking.status}
        if booking.end_at <= now:
            booking.status = Booking.Status.COMPLETED
            booking.ended_at = booking.end_at
            new_alloc = Allocation.State.ENDED
        elif booking.status == Booking.Status.CONFIRMED:
            booking.status = Booking.Status.ACTIVE
            new_alloc = Allocation.State.ACTIVE
        else:
            continue
        booking.save(update_fields=["status", "ended_at", "updated_at"])
        changes = []
        for allocation in booking.allocations.exclude(state__in=(Allocation.State.RELEASED, new_alloc)):
            changes.append((allocation, allocation_state(allocation)))
            allocation.state = new_alloc
        if changes:
            Allocation.objects.bulk_update([a for a, _ in changes], ["state"])
            _audit_allocations(changes, f"allocation.{new_alloc}", now)
        _audit(f"booking.{booking.status}", "booking", booking.pk, before, {"status": booking.status}, now)
        if booking.status == Booking.Status.ACTIVE:
            booking_event_emit(booking, kind=EventKind.BOOKING_STARTED, at=now)


def _extend_running(cluster: Cluster, *, now: datetime) -> None:
    """Move the end of running jobs' allocations forward before it lapses (up to the next booking)."""
    soon = now + _EXTEND_MARGIN
    rows = Allocation.objects.filter(
        job__cluster=cluster,
        job__status__in=RUNNING_STATUSES,
        state=Allocation.State.ACTIVE,
        period__endswith__lt=soon,
    ).select_related("job")
    by_job: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in rows:
        if allocation.job_id is not None:
            by_job[allocation.job_id].append(allocation)
    lapsing = [a for allocations in by_job.values() for a in allocations]
    caps = (
        _blocking_starts(gpu_ids=(a.gpu_id for a in lapsing), after=min(a.period.upper for a in lapsing))
        if lapsing
        else {}
    )
    for job_id, allocations in by_job.items():
        changes = []
        for allocation in allocations:
            upper = allocation.period.upper
            cap = _first_cap(caps, gpu_ids=[allocation.gpu_id], after=upper, exclude_job_id=job_id)
            new_upper = max(upper, now) + _EXTEND_BY
            if cap is not None:
                new_upper = min(new_upper, cap)
            if new_upper <= upper:
                continue
            changes.append((allocation, allocation_state(allocation)))
            allocation.period = DateTimeTZRange(allocation.period.lower, new_upper, "[)")
        if not changes:
            continue
        try:
            with transaction.atomic():
                Allocation.objects.bulk_update([a for a, _ in changes], ["period"])
        except IntegrityError as exc:
            if not _is_exclusion_violation(exc):
                raise
            continue  # a booking took the time meanwhile; the engine reclaims or reports it
        _audit_allocations(changes, "allocation.extend", now)


def _sync_nodes(cluster: Cluster, observed: ObservedCluster) -> None:
    """Take node states from the backend (drains and failures happen there)."""
    wanted = {n.id: _NODE_STATUS[n.status] for n in observed.nodes}
    for node in Node.objects.filter(cluster=cluster, name__in=wanted):
        if node.status != wanted[node.name]:
            node.status = wanted[node.name]
            node.save(update_fields=["status"])


def _set_degraded(cluster: Cluster, *, is_degraded: bool, message: str, now: datetime) -> None:
    locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if locked.is_degraded == is_degraded and (not is_degraded or locked.status_message == message):
        return
    before = {"is_degraded": locked.is_degraded, "status_message": locked.status_message}
    locked.is_degraded = is_degraded
    locked.status_message = message[:2000]
    locked.save(update_fields=["is_degraded", "status_message"])
    cluster.is_degraded, cluster.status_message = locked.is_degraded, locked.status_message
    verb = "cluster.degraded" if is_degraded else "cluster.recovered"
    _audit(
        verb,
        "cluster",
        cluster.pk,
        before,
        {"is_degraded": is_degraded, "status_message": locked.status_message},
        now,
    )


# ---- persist ----


@dataclass(slots=True)
class _Persisted:
    starts: list[StartAction] = field(default_factory=list)
    preemptions: list[PreemptAction] = field(default_factory=list)
    payloads: dict[str, dict[str, Any]] = field(default_factory=dict)


def _job_payload(job: Job) -> dict[str, Any]:
    payload = dict(job.payload or {})
    payload.update(
        requested_s=job.requested_s,
        is_preemptible=job.is_preemptible,
        is_checkpointable=job.is_checkpointable,
        checkpoint_interval_s=job.checkpoint_interval_s,
        gpu_count=job.gpu_count,
        attempt=job.attempt,
        name=job.name,
    )
    return payload


def _allocations_insert(
    periods: Sequence[tuple[StartAction, Job, DateTimeTZRange]],
) -> list[tuple[StartAction, Job, list[Allocation]]]:
    """The allocations of the planned starts, in one INSERT when none conflicts.

    The exclusion constraint refuses a GPU someone took since the snapshot (a booking made this
    instant); then each start is inserted in a savepoint of its own and only the conflicting
    ones are left out.  Returns the starts whose allocations exist, with them.
    """

    def rows(action: StartAction, job: Job, period: DateTimeTZRange) -> list[Allocation]:
        return [
            Allocation(
                gpu_id=g,
                job=job,
                period=period,
                state=Allocation.State.ACTIVE,
                is_preemptible=action.is_preemptible,
            )
            for g in action.gpu_ids
        ]

    if not periods:
        return []
    try:
        with transaction.atomic():
            built = [(action, job, rows(action, job, period)) for action, job, period in periods]
            Allocation.objects.bulk_create([a for _, _, allocations in built for a in allocations])
        return built
    except IntegrityError as exc:
        if not _is_exclusion_violation(exc):
            raise
    placed = []
    for action, job, period in periods:
        allocations = rows(action, job, period)
        try:
            with transaction.atomic():
                Allocation.objects.bulk_create(allocations)
        except IntegrityError as exc:
            if not _is_exclusion_violation(exc):
                raise
            continue
        placed.append((action, job, allocations))
    return placed


def _persist_plan(
    cluster: Cluster,
    plan: Plan,
    *,
    round_row: EngineRound,
    now: datetime,
    result: RoundResult,
    unstartable: dict[str, Unstartable] | None = None,
) -> _Persisted:
    out = _Persisted()
    start_ids = [int(s.job_id) for s in plan.starts if s.job_id.isdigit()]
    victim_ids = [int(p.job_id) for p in plan.preemptions if p.job_id.isdigit()]
    # Locking protocol (scheduling.services): job rows first, then the cluster's nodes, in id order.
    jobs = {
        j.pk: j
        for j in Job.objects.select_for_update()
        .filter(cluster=cluster, pk__in=start_ids + victim_ids)
        .order_by("id")
    }
    list(Node.objects.select_for_update().filter(cluster=cluster).order_by("id").values_list("id", flat=True))
    cluster_gpus = set(Gpu.objects.filter(node__cluster=cluster).values_list("id", flat=True))

    candidates: list[tuple[StartAction, Job]] = []
    for action in plan.starts:
        job = jobs.get(int(action.job_id)) if action.job_id.isdigit() else None
        if job is None or job.status != Job.Status.PENDING:
            result.notes.append(f"start {action.job_id}: no longer pending")
            continue
        if not set(action.gpu_ids) <= cluster_gpus:
            result.notes.append(f"start {action.job_id}: GPUs {action.gpu_ids} are not in this cluster")
            continue
        candidates.append((action, job))

    caps = _blocking_starts(gpu_ids=(g for action, _ in candidates for g in action.gpu_ids), after=now)
    periods: list[tuple[StartAction, Job, DateTimeTZRange]] = []
    conflicts: list[Job] = []
    for action, job in candidates:
        expected_end = from_epoch(action.expected_end_at) if math.isfinite(action.expected_end_at) else None
        upper = _running_upper(
            job, started_at=now, gpu_ids=action.gpu_ids, now=now, expected_end=expected_end, caps=caps
        )
        if upper is not None and upper <= now:
            conflicts.append(job)
        else:
            periods.append((action, job, DateTimeTZRange(now, upper, "[)")))
    placed = _allocations_insert(periods)
    placed_ids = {job.pk for _, job, _ in placed}
    conflicts += [job for _, job, _ in periods if job.pk not in placed_ids]

    for job in conflicts:
        # Someone (a booking made this instant) took one of the GPUs: this start only is undone.
        before = _job_state(job)
        job.pending_reason = Job.PendingReason.RESOURCES
        job.pending_sentence = "Its GPUs were taken just before it could start; it will be placed again."
        job.save(update_fields=["pending_reason", "pending_sentence"])
        _audit("job.start_conflict", "job", job.pk, before, _job_state(job), now)
        result.start_conflicts += 1

    if placed:
        # One UPDATE for every start: each gets the same values at the same instant.
        Job.objects.filter(pk__in=sorted(placed_ids)).update(
            status=Job.Status.STARTING,
            started_at=now,
            ended_at=None,
            first_submitted_at=Coalesce(F("first_submitted_at"), F("submitted_at")),
            pending_reason=Job.PendingReason.NONE,
            pending_sentence="",
            eta_p50_at=None,
            eta_p90_at=None,
            status_message="",
        )
    for action, job, allocations in placed:
        before = _job_state(job)
        job.status = Job.Status.STARTING
        job.started_at = now
        job.ended_at = None
        job.first_submitted_at = job.first_submitted_at or job.submitted_at
        job.pending_reason = Job.PendingReason.NONE
        job.pending_sentence = ""
        job.eta_p50_at = job.eta_p90_at = None
        job.status_message = ""
        _audit_allocations([(a, None) for a in allocations], "allocation.create", now)
        _audit("job.start", "job", job.pk, before, _job_state(job), now)
        out.starts.append(action)
        out.payloads[action.job_id] = _job_payload(job)
        result.started += 1

    for preempt in plan.preemptions:
        job = jobs.get(int(preempt.job_id)) if preempt.job_id.isdigit() else None
        if job is None or job.status not in RUNNING_STATUSES:
            continue
        if job.preemptions.filter(killed_at__isnull=True).exists():
            continue
        holder = parse_holder_id(preempt.for_id) if preempt.for_id else None
        preemption = Preemption.objects.create(
            job=job,
            engine_round=round_row,
            for_booking_id=holder[1] if holder and holder[0] == "booking" else None,
            for_job_id=holder[1] if holder and holder[0] == "job" else None,
            signalled_at=from_epoch(preempt.signal_at),
            kill_at=from_epoch(max(preempt.kill_at, preempt.signal_at)),
            reason=preempt.reason[:500],
        )
        _audit(
            "job.preempt_signal",
            "job",
            job.pk,
            _job_state(job),
            {**_job_state(job), "preemption_id": preemption.pk, "kill_at": _iso(preemption.kill_at)},
            now,
        )
        job_event_emit(
            job,
            kind=EventKind.JOB_PREEMPTED,
            at=now,
            preemption=preemption,
            lost_gpu_s=_lost_gpu_s(
                job,
                started_at=job.started_at or now,
                ended_at=preemption.kill_at,
                signalled_at=preemption.signalled_at,
            ),
        )
        if preemption.for_booking_id is not None:
            booking = Booking.objects.filter(pk=preemption.for_booking_id).first()
            if booking is not None:
                booking_event_emit(
                    booking,
                    kind=EventKind.BOOKING_RECLAIMED,
                    at=now,
                    detail=f"Job {job.pk} gets {_grace_text(preemption)} to stop.",
                )
        out.preemptions.append(preempt)
        result.preempted += 1

    _write_explanations(cluster, plan, now=now, result=result, unstartable=unstartable or {})
    _write_booking_notes(cluster, plan, now=now)
    return out


def _grace_text(preemption: Preemption) -> str:
    return f"{round((preemption.kill_at - preemption.signalled_at).total_seconds())} s"


def _write_explanations(
    cluster: Cluster,
    plan: Plan,
    *,
    now: datetime,
    result: RoundResult,
    unstartable: dict[str, Unstartable],
) -> None:
    """Reason, sentence and ETAs on every pending job the plan explains (not a state change: no audit).

    A job in ``unstartable`` (it can never start under today's inventory and quotas) keeps
    that reason and what would unblock it, and no ETA: no amount of waiting starts it.

    Only rows whose values change are written (an ETA that moved less than `_eta_close`
    allows is kept, and with it the sentence's ETA text: `_with_eta_text`), in one statement
    over arrays (``UNNEST``):
    from one round to the next most of a long queue keeps its explanation, and a ``CASE`` per
    row (Django's ``bulk_update``) costs PostgreSQL time quadratic in the rows of one statement.
    """
    explanations = {int(p.job_id): p for p in plan.pending if p.job_id.isdigit()}
    # Plain columns, ETAs as epoch seconds, every pending job of the cluster (the plan explains
    # all of them): 2,000 ids in an ``IN (...)`` list, or in an array parameter (psycopg dumps
    # lists in Python), and 4,000 timestamps parsed in Python were most of this function.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, pending_reason, pending_sentence,
                   EXTRACT(EPOCH FROM eta_p50_at)::float8, EXTRACT(EPOCH FROM eta_p90_at)::float8
              FROM {Job._meta.db_table}
             WHERE cluster_id = %s AND status = %s
            """,  # noqa: S608 (the table name is the model's, every value a parameter)
            [cluster.pk, Job.Status.PENDING],
        )
        current = cursor.fetchall()
    valid = set(Job.PendingReason.values)
    now_s = epoch(now)
    changed: list[tuple[int, str, str, float | None, float | None]] = []
    cannot_start: list[int] = []
    seen = 0
    for pk, old_reason, old_sentence, old_p50, old_p90 in current:
        p = explanations.get(pk)
        if p is None:  # submitted after the snapshot: the next round explains it
            continue
        seen += 1
        never = unstartable.get(p.job_id)
        row: tuple[int, str, str, float | None, float | None]
        if never is not None:
            cannot_start.append(pk)
            row = (pk, never.reason.value, never.message[:500], None, None)
        else:
            row = (
                pk,
                p.reason.value if p.reason.value in valid else str(Job.PendingReason.RESOURCES),
                p.sentence[:500],
                p.eta_p50_at,
                p.eta_p90_at,
            )
        if _explanation_changed(row, (old_reason, old_sentence, old_p50, old_p90), now_s=now_s):
            changed.append(row)
    result.pending = seen
    if cannot_start:  # told once per attempt: waiting alone never starts them
        jobs = Job.objects.filter(pk__in=cannot_start).select_related("project", "cluster", "user")
        jobs_cannot_start_emit(list(jobs), at=now)
    if changed:
        columns = list(zip(*changed, strict=True))
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                UPDATE {Job._meta.db_table} AS j
                   SET pending_reason = v.reason, pending_sentence = v.sentence,
                       eta_p50_at = to_timestamp(v.p50), eta_p90_at = to_timestamp(v.p90)
                  FROM UNNEST(%s::bigint[], %s::varchar[], %s::varchar[],
                              %s::float8[], %s::float8[]) AS v(id, reason, sentence, p50, p90)
                 WHERE j.id = v.id AND j.status = %s
                """,  # noqa: S608 (the table name is the model's, every value a parameter)
                [list(c) for c in columns] + [Job.Status.PENDING],
            )


def _explanation_changed(
    row: tuple[int, str, str, float | None, float | None],
    stored: tuple[str, str, float | None, float | None],
    *,
    now_s: float,
) -> bool:
    """Whether a pending job's new (reason, sentence, p50, p90) must be written over the stored one."""
    _, reason, sentence, p50, p90 = row
    old_reason, old_sentence, old_p50, old_p90 = stored
    if reason != old_reason or not (
        _eta_close_s(p50, old_p50, now_s=now_s) and _eta_close_s(p90, old_p90, now_s=now_s)
    ):
        return True
    return sentence != old_sentence and old_sentence != _with_eta_text(
        sentence, new=(p50, p90), old=(old_p50, old_p90), now_s=now_s
    )


def _eta_text(p50: float, p90: float, *, now_s: float) -> str:
    """The engine's ETA sentence tail (`engine.explain.explain_pending`) for these ETAs at ``now_s``."""
    return f" Expected start in {fmt_s(p50 - now_s)} (p90 {fmt_s(p90 - now_s)})."


def _with_eta_text(
    sentence: str,
    *,
    new: tuple[float | None, float | None],
    old: tuple[float | None, float | None],
    now_s: float,
) -> str:
    """``sentence`` (the engine's, ending in the text of the ``new`` ETAs) told with the ``old``
    ETAs instead: what the stored sentence must be for the stored row to stay as it is.

    The engine's sentences end in "Expected start in 5.4 d (p90 10.6 d).", relative to the
    round's instant: ETAs that move by minutes flip that rounding on most of a long queue every
    round (1,900 of 2,000 rows rewritten per round in the demo lab).  A row whose ETAs are kept
    (within `_eta_close`) keeps its sentence when only that tail differs *and* the stored
    sentence is what the engine says now for the stored ETAs, so the text shown always agrees
    with the stored ETAs at this instant.  A sentence without the tail is returned unchanged.
    """
    if None in new or None in old:
        return sentence
    tail = _eta_text(new[0], new[1], now_s=now_s)  # type: ignore[arg-type]
    if not sentence.endswith(tail):
        return sentence
    return sentence[: -len(tail)] + _eta_text(old[0], old[1], now_s=now_s)  # type: ignore[arg-type]


def _eta_close_s(new: float | None, old: float | None, *, now_s: float) -> bool:
    """`_eta_close` on epoch seconds."""
    if new is None or old is None:
        return new is old
    slack_s = max(_ETA_SLACK.total_seconds(), 0.1 * max(0.0, old - now_s))
    return abs(new - old) <= slack_s


def _eta_close(new: datetime | None, old: datetime | None, *, now: datetime) -> bool:
    """Whether a stored ETA may stay: within ``max(_ETA_SLACK, 10 %)`` of the time left until it.

    ETAs move by seconds from one round to the next; a queue of 10,000 jobs rewritten every
    round for that costs PostgreSQL seconds and nobody can see the difference ("in about 3 h").
    """
    return _eta_close_s(
        epoch(new) if new is not None else None, epoch(old) if old is not None else None, now_s=epoch(now)
    )


def _write_booking_notes(cluster: Cluster, plan: Plan, *, now: datetime) -> None:
    """Tell a booking's owner why it may start late: the engine's notes that name the booking
    ("Booking booking-<pk>: ...") go on its status message; the message clears when none is left."""
    notes: dict[int, str] = {}
    for note in plan.notes:
        head, sep, _ = note.partition(":")
        holder = parse_holder_id(head.removeprefix("Booking ").strip()) if sep else None
        if holder is not None and holder[0] == "booking":
            notes.setdefault(holder[1], (_BOOKING_NOTE_PREFIX + note.partition(": ")[2])[:500])
    # Only messages the engine wrote are cleared; anything else on a booking is left alone.
    stale = Booking.objects.filter(
        cluster=cluster, status__in=Booking.OPEN_STATUSES, status_message__startswith=_BOOKING_NOTE_PREFIX
    )
    for booking in Booking.objects.filter(cluster=cluster, pk__in=list(notes)) | stale:
        message = notes.get(booking.pk, "")
        if booking.status_message != message:
            booking.status_message = message
            booking.save(update_fields=["status_message", "updated_at"])
            if message:
                booking_event_emit(
                    booking,
                    kind=EventKind.BOOKING_AT_RISK,
                    at=now,
                    detail=message.removeprefix(_BOOKING_NOTE_PREFIX),
                )


def _resent_preemptions(cluster: Cluster, *, exclude: Iterable[str]) -> list[PreemptAction]:
    """Preemptions signalled in earlier rounds whose job still runs: backends apply them until done."""
    skip = set(exclude)
    out = []
    for job_id, p in _open_preemptions(cluster).items():
        if str(job_id) in skip:
            continue
        out.append(
            PreemptAction(
                job_id=str(job_id),
                signal_at=epoch(p.signalled_at),
                kill_at=epoch(p.kill_at),
                reason=p.reason,
                for_id=f"booking-{p.for_booking_id}"
                if p.for_booking_id
                else (str(p.for_job_id) if p.for_job_id else ""),
            )
        )
    return out


def _open_preemptions(cluster: Cluster) -> dict[int, Preemption]:
    from scheduling.snapshots import open_preemptions

    return open_preemptions(cluster=cluster)


# ---- apply after commit ----


def _call_apply(
    backend: ClusterBackend, plan: Plan, payloads: dict[str, dict[str, Any]]
) -> list[ActionResult]:
    return backend.apply(plan, payloads=payloads)


def _closed_booking_releases(cluster: Cluster, *, now: datetime) -> list[ReleaseAction]:
    """Bookings cancelled or ended in the last hour: the backend drops what it holds for them.

    The engine plans only for open bookings, so nothing else tells a backend (a Slurm
    reservation) that a booking is gone.  Releasing is idempotent, so the hour of repeats
    covers rounds the backend missed while it was unreachable.
    """
    closed = Booking.objects.filter(
        cluster=cluster,
        status__in=(Booking.Status.CANCELLED, Booking.Status.COMPLETED),
        updated_at__gte=now - timedelta(hours=1),
    ).values_list("pk", flat=True)
    return [
        ReleaseAction(holder_id=f"{BOOKING_PREFIX}{pk}", gpu_ids=(), reason="booking closed") for pk in closed
    ]


def _apply_after_commit(
    *,
    cluster: Cluster,
    backend: ClusterBackend,
    persisted: _Persisted,
    plan: Plan,
    to_cancel: Sequence[str],
    round_id: int,
    result: RoundResult,
) -> None:
    """Run the backend's apply and record its results; failed starts are rolled back."""
    apply_t0 = time.perf_counter()
    try:
        _apply_and_record(
            cluster=cluster,
            backend=backend,
            persisted=persisted,
            plan=plan,
            to_cancel=to_cancel,
            round_id=round_id,
            result=result,
        )
    finally:
        result.phases_ms["apply"] = (time.perf_counter() - apply_t0) * 1000.0


def _apply_and_record(
    *,
    cluster: Cluster,
    backend: ClusterBackend,
    persisted: _Persisted,
    plan: Plan,
    to_cancel: Sequence[str],
    round_id: int,
    result: RoundResult,
) -> None:
    now = timezone.now()
    preemptions = [
        *persisted.preemptions,
        *_resent_preemptions(cluster, exclude=[p.job_id for p in persisted.preemptions]),
    ]
    backend_plan = Plan(
        starts=tuple(persisted.starts),
        preemptions=tuple(preemptions),
        reservations=plan.reservations,
        releases=(*plan.releases, *_closed_booking_releases(cluster, now=now)),
    )
    error = ""
    results: list[ActionResult] = []
    if backend_plan.starts or backend_plan.preemptions or backend_plan.reservations or backend_plan.releases:
        try:
            results = _call_apply(backend, backend_plan, persisted.payloads)
        except BackendError as exc:
            error = f"apply failed: {exc}"
            metrics.backend_error_count(cluster=cluster.name, operation="apply")
            results = [ActionResult("start", s.job_id, False, str(exc)) for s in persisted.starts]
    cancel_results = []
    starting = {s.job_id for s in persisted.starts}
    for job_id in (j for j in to_cancel if j not in starting):  # never cancel what this round starts
        try:
            cancel_results.append(backend.cancel(job_id))
        except UnsupportedOperationError:
            break
        except BackendError as exc:
            cancel_results.append(ActionResult("cancel", job_id, False, str(exc)))
    start_results = {r.target_id: r for r in results if r.action == "start"}
    failures = [r for r in [*results, *cancel_results] if not r.is_ok]
    for failure in failures:
        metrics.backend_error_count(cluster=cluster.name, operation=failure.action)

    with transaction.atomic(), audit_events_deferred(), events_deferred():
        # No answer for a start: the next round's reconcile decides from what really runs.
        answered = [int(a.job_id) for a in persisted.starts if a.job_id in start_results]
        locked = {
            j.pk: j
            for j in Job.objects.select_for_update(of=("self",))
            .filter(pk__in=answered)
            .select_related("project", "cluster")  # the start notices name them
            .order_by("id")
        }
        confirmed: list[Job] = []
        for action in persisted.starts:
            r = start_results.get(action.job_id)
            job = locked.get(int(action.job_id)) if r is not None else None
            if r is None or job is None or job.status != Job.Status.STARTING:
                continue
            if r.is_ok:
                before = _job_state(job)
                job.status = Job.Status.RUNNING
                job.backend_ref = r.backend_ref or job.backend_ref
                confirmed.append(job)
                _audit("job.run", "job", job.pk, before, _job_state(job), now)
                job_event_emit(job, kind=EventKind.JOB_STARTED, at=now)
            else:
                _start_rollback(
                    job,
                    at=now,
                    reason=Job.PendingReason.BACKEND,
                    sentence=f"The cluster refused to start it ({r.message[:300]}); it will be tried again.",
                    message=f"Start refused: {r.message}",
                )
                result.failed_starts += 1
                result.started -= 1
        Job.objects.bulk_update(confirmed, ["status", "backend_ref"], batch_size=200)
        _tell_refused_reservations(cluster, failures, now=now)
        if error:
            _set_degraded(cluster, is_degraded=True, message=error, now=now)
        round_row = EngineRound.objects.select_for_update().get(pk=round_id)
        decisions = dict(round_row.decisions or {})
        decisions["apply"] = {
            "results": len(results),
            "failed": [
                {"action": r.action, "target": r.target_id, "message": r.message[:200]} for r in failures[:50]
            ],
            "cancelled": list(to_cancel),
        }
        round_row.decisions = decisions
        if error:
            round_row.error = error[:2000]
        round_row.save(update_fields=["decisions", "error"])
    if error:
        result.status = "apply_failed"
        result.message = error


def _tell_refused_reservations(cluster: Cluster, failures: Sequence[ActionResult], *, now: datetime) -> None:
    """A booking whose reservation the cluster refused may not get its GPUs at its start: tell its owner."""
    refused: dict[int, str] = {}
    for failure in failures:
        holder = parse_holder_id(failure.target_id) if failure.action == "reserve" else None
        if holder is not None and holder[0] == "booking":
            refused.setdefault(holder[1], failure.message)
    bookings = Booking.objects.filter(cluster=cluster, pk__in=list(refused), status__in=Booking.OPEN_STATUSES)
    for booking in bookings.select_related("project", "cluster", "gpu_type"):
        why = refused[booking.pk][:300]
        detail = f"the cluster refused to hold its GPUs ({why}); Berth tries again each round."
        booking_event_emit(booking, kind=EventKind.BOOKING_AT_RISK, at=now, detail=detail)


# ---- the round ----


def _record_backend_error(cluster: Cluster, *, now: datetime, exc: Exception, policy: str, t0: float) -> int:
    message = f"backend unreachable: {exc}"
    with transaction.atomic():
        _set_degraded(cluster, is_degraded=True, message=message, now=now)
        row = EngineRound.objects.create(
            cluster=cluster,
            policy=policy,
            started_at=now,
            duration_ms=(time.perf_counter() - t0) * 1000.0,
            error=message[:2000],
        )
    metrics.backend_error_count(cluster=cluster.name, operation="snapshot")
    return row.pk


# Per cluster: the inventory a memo of verdicts was made on, and the verdict of each shape.
_UNSTARTABLE_MEMO: dict[str, tuple[Any, dict[tuple[Any, ...], Unstartable | None]]] = {}
_UNSTARTABLE_MEMO_MAX_SHAPES = 50_000


def _unstartable_by_shape(
    snapshot: ClusterSnapshot, jobs: Sequence[JobRequest], *, is_guarantee_enforced: bool
) -> dict[str, Unstartable]:
    """`unstartable_jobs` asked once per job shape, not once per job, and not again while the
    inventory stays the same.

    The verdict depends on a job only through its constraints, GPU count, kind,
    preemptibility and project (its quotas), and each question reads the whole inventory: a
    queue of 10,000 jobs on 1,000 nodes has a few hundred shapes, so this is 10 million steps
    fewer.  The verdicts of a round are kept (per process, per cluster) with the inventory
    they were made on (nodes with their status and GPUs, GPU types, the guarantee rule);
    the next round with the same inventory asks only about shapes it has not seen.
    """
    quotas = {p.name: (p.guaranteed, p.borrow_limit, p.borrow_limits) for p in snapshot.projects}
    members: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    representative: dict[tuple[Any, ...], JobRequest] = {}
    for job in jobs:
        shape = (
            constraint_key(job),
            job.gpu_count,
            job.kind,
            job.is_preemptible,
            job.project,
            quotas.get(job.project),
        )
        representative.setdefault(shape, job)
        members[shape].append(job.id)
    inventory = (snapshot.nodes, snapshot.gpu_types, is_guarantee_enforced)
    memo = _UNSTARTABLE_MEMO.get(snapshot.cluster)
    known = memo[1] if memo is not None and memo[0] == inventory else {}
    if len(known) > _UNSTARTABLE_MEMO_MAX_SHAPES:
        known = {}
    asked = {shape: job for shape, job in representative.items() if shape not in known}
    if asked:
        verdicts = unstartable_jobs(snapshot, asked.values(), is_guarantee_enforced=is_guarantee_enforced)
        for shape, job in asked.items():
            known[shape] = verdicts.get(job.id)
    _UNSTARTABLE_MEMO[snapshot.cluster] = (inventory, known)
    return {
        job_id: verdict
        for shape in representative
        if (verdict := known[shape]) is not None
        for job_id in members[shape]
    }


def _elapsed_ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0


def engine_round_run(*, cluster_id: int, now: datetime | None = None) -> RoundResult:
    """Run one engine round for a cluster; returns what it did.  Never raises for backend trouble.

    ``now`` (aware) fixes the round's clock and, for the simulator, the backend's clock
    (tests); by default both are the wall clock.  Status ``"locked"`` means another round of
    this cluster is running; ``"backend_error"`` means the backend could not be read (the
    cluster is marked degraded); ``"apply_failed"`` means the plan was persisted but the
    backend refused it as a whole (the starts were rolled back).
    """
    result = RoundResult(cluster_id=cluster_id)
    fixed_now = now
    with cluster_round_lock(cluster_id) as acquired:
        if not acquired:
            result.status = "locked"
            return result
        t0 = time.perf_counter()
        now = fixed_now or timezone.now()
        cluster = Cluster.objects.get(pk=cluster_id)
        if not cluster.is_active:
            result.status = "inactive"
            return result
        policy = policy_config_for_cluster(cluster=cluster, at=now)
        clock = (lambda: epoch(fixed_now)) if fixed_now is not None else None
        phases = result.phases_ms
        mark = time.perf_counter()
        try:
            backend = backend_for_cluster(cluster, clock=clock)
            observed = backend.snapshot()
        except BackendError as exc:
            result.round_id = _record_backend_error(cluster, now=now, exc=exc, policy=policy.name, t0=t0)
            result.status = "backend_error"
            result.message = str(exc)
            result.duration_ms = (time.perf_counter() - t0) * 1000.0
            metrics.round_observe(
                cluster=cluster.name, duration_s=result.duration_ms / 1000.0, outcome=result.status
            )
            return result
        phases["backend_snapshot"], mark = _elapsed_ms(mark), time.perf_counter()

        with transaction.atomic(durable=True), audit_events_deferred(), events_deferred():
            if cluster.is_degraded:
                _set_degraded(cluster, is_degraded=False, message="", now=now)
            _sync_nodes(cluster, observed)
            reconciled = _reconcile_jobs(cluster, observed, now=now, result=result)
            _reconcile_bookings(cluster, now=now)
            _extend_running(cluster, now=now)
        phases["reconcile"], mark = _elapsed_ms(mark), time.perf_counter()

        snapshot = cluster_snapshot_build(cluster=cluster, now=now, policy=policy)
        phases["snapshot_build"] = _elapsed_ms(mark)
        plan_t0 = time.perf_counter()
        try:
            plan = plan_round(snapshot, policy, epoch(now))
        except Exception as exc:  # an engine bug must show on the round, not only in a worker log
            logger.exception("plan_round failed for cluster %s", cluster.name)
            result.duration_ms = (time.perf_counter() - t0) * 1000.0
            row = EngineRound.objects.create(
                cluster=cluster,
                policy=policy.name,
                started_at=now,
                duration_ms=result.duration_ms,
                error=f"engine error: {type(exc).__name__}: {exc}"[:2000],
            )
            result.round_id, result.status, result.message = row.pk, "engine_error", str(exc)
            metrics.round_observe(
                cluster=cluster.name, duration_s=result.duration_ms / 1000.0, outcome=result.status
            )
            return result
        plan_ms = phases["plan"] = _elapsed_ms(plan_t0)

        mark = time.perf_counter()
        with transaction.atomic(durable=True), audit_events_deferred(), events_deferred():
            idle = Counter(reason.value for _, reason in plan.idle)
            round_row = EngineRound.objects.create(
                cluster=cluster,
                policy=policy.name,
                started_at=now,
                decisions={
                    "starts": len(plan.starts),
                    "preemptions": len(plan.preemptions),
                    "reservations": len(plan.reservations),
                    "releases": len(plan.releases),
                    "pending": len(plan.pending),
                    "running": len(snapshot.running),
                    "idle": dict(idle),
                    "idle_nodes": idle_by_node(snapshot.nodes, plan.idle),
                    "notes": list(plan.notes)[:20],
                    "plan_ms": round(plan_ms, 3),
                    "next_round_at": plan.next_round_at,
                },
            )
            result.round_id = round_row.pk
            result.next_round_at = plan.next_round_at
            started_ids = {s.job_id for s in plan.starts}
            unstartable = _unstartable_by_shape(
                snapshot,
                [job for job in snapshot.pending if job.id not in started_ids],
                is_guarantee_enforced=enforces_guarantees(policy.name),
            )
            persisted = _persist_plan(
                cluster, plan, round_row=round_row, now=now, result=result, unstartable=unstartable
            )
            round_row.decisions = {
                **round_row.decisions,
                "reconcile": {"finished": result.finished, "requeued": result.requeued, "lost": result.lost},
                "persisted": {
                    "starts": result.started,
                    "conflicts": result.start_conflicts,
                    "preemptions": result.preempted,
                },
            }
            round_row.save(update_fields=["decisions"])
            transaction.on_commit(
                lambda: _apply_after_commit(
                    cluster=cluster,
                    backend=backend,
                    persisted=persisted,
                    plan=plan,
                    to_cancel=reconciled.to_cancel,
                    round_id=round_row.pk,
                    result=result,
                )
            )
        # The apply ran on commit, inside the block just left: it has a phase of its own.
        phases["persist"] = max(0.0, _elapsed_ms(mark) - phases.get("apply", 0.0))
        result.duration_ms = (time.perf_counter() - t0) * 1000.0
        EngineRound.objects.filter(pk=round_row.pk).update(duration_ms=result.duration_ms)
        metrics.round_observe(
            cluster=cluster.name, duration_s=result.duration_ms / 1000.0, outcome=result.status
        )
    return result
