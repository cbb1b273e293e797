"""Reconcile (DESIGN §1, step 3): the database follows what the backend really runs."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from notifications.events import booking_event_emit, job_event_emit
from notifications.models import EventKind
from scheduling.backends.base import (
    ObservedCluster,
    ObservedJob,
)
from scheduling.backends.base import ObservedState as OS
from scheduling.models import (
    Allocation,
    Booking,
    Cluster,
    Job,
    Node,
    Preemption,
)
from scheduling.rounds.batch import (
    Finish,
    Kill,
    Requeue,
    jobs_finish,
    jobs_requeue,
    jobs_set_running,
    preemptions_kill,
)
from scheduling.rounds.common import (
    _EXTEND_BY,
    _EXTEND_MARGIN,
    _MIN_PERIOD,
    _NODE_STATUS,
    _STALE_TOLERANCE_S,
    RoundResult,
    _audit,
    _audit_allocations,
    _is_exclusion_violation,
    _job_state,
    _next_blocking_start,
    _release_job_allocations,
)
from scheduling.services import (
    allocation_state,
)
from scheduling.snapshots import (
    RUNNING_STATUSES,
    epoch,
    from_epoch,
)

logger = logging.getLogger(__name__)

# ---- reconcile ----


@dataclass(slots=True)
class _Reconciled:
    to_cancel: list[str] = field(default_factory=list)


def _is_stale(obs: ObservedJob, job: Job) -> bool:
    """A terminal backend record of an earlier attempt (it started before this attempt did)."""
    return _is_stale_at(obs, job.started_at)


def _is_stale_at(obs: ObservedJob, started_at: datetime | None) -> bool:
    """`_is_stale` for a job that started at ``started_at``."""
    if obs.state in (OS.RUNNING, OS.PENDING) or obs.started_at is None or started_at is None:
        return False
    return obs.started_at < epoch(started_at) - _STALE_TOLERANCE_S


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


def _saved_s(kill: Kill, preemption: Preemption) -> float:
    """Seconds of progress the killed run kept (its run less the work `_lost_gpu_s` counted lost)."""
    job = kill.job
    if job.started_at is None or job.gpu_count <= 0:
        return 0.0
    run_s = max(0.0, (kill.ended_at - job.started_at).total_seconds())
    return max(0.0, run_s - preemption.lost_gpu_s / job.gpu_count)


def _job_finish(job: Job, *, status: str, at: datetime, message: str, result: RoundResult) -> None:
    """One job ended (`batch.jobs_finish` for one)."""
    jobs_finish([Finish(job=job, status=status, at=at, message=message)], result=result)


def _job_requeue(
    job: Job, *, at: datetime, ended_at: datetime, sentence: str, message: str, verb: str, result: RoundResult
) -> None:
    """Back to the queue with ``attempt + 1``; the original submission time is kept (`batch.jobs_requeue`)."""
    jobs_requeue(
        [Requeue(job=job, ended_at=ended_at, sentence=sentence, message=message, verb=verb)],
        at=at,
        result=result,
    )


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
    """One preempted job: its preemption closed, the job requeued (`_jobs_preempted`)."""
    _jobs_preempted([(job, obs)], now=now, result=result)


def _jobs_preempted(killed: Sequence[tuple[Job, ObservedJob]], *, now: datetime, result: RoundResult) -> None:
    """Jobs the backend preempted: each open preemption gets its kill time and lost work, and the
    jobs are requeued, in a handful of statements for any number of jobs (`batch`)."""
    kills = [
        Kill(job=job, ended_at=from_epoch(obs.ended_at) if obs.ended_at is not None else now)
        for job, obs in killed
    ]
    preemptions = preemptions_kill(kills, now=now, lost_gpu_s=_lost_gpu_s)
    jobs_requeue(
        [
            Requeue(
                job=kill.job,
                ended_at=kill.ended_at,
                sentence="Preempted and requeued; waiting for the next round.",
                message=f"Preempted: {preemption.reason}"[:500],
                verb="job.requeue",
                saved_s=_saved_s(kill, preemption),
            )
            for kill, preemption in zip(kills, preemptions, strict=True)
        ],
        at=now,
        result=result,
    )


def _reconcile_jobs(
    cluster: Cluster, observed: ObservedCluster, *, now: datetime, result: RoundResult
) -> _Reconciled:
    by_id = {o.job_id: o for o in observed.jobs}
    # Every open job is locked, but read as four columns: on a steady round nearly all of them
    # run as recorded, and 2,000 `Job` instances (with their payloads and, for the notices,
    # project and cluster) cost ~0.3 s a round to load for nothing.  Only the jobs something
    # happened to are loaded whole (`_touched`).
    open_rows = list(
        Job.objects.select_for_update()
        .filter(cluster=cluster, status__in=RUNNING_STATUSES)
        .order_by("id")
        .values_list("id", "status", "started_at", "backend_ref")
    )
    # The GPUs each open job holds, read once: `_realign` compares them with what the backend reports.
    held: dict[int, set[int]] = defaultdict(set)
    for job_id, gpu_id in Allocation.objects.filter(
        job__cluster=cluster, job__status__in=RUNNING_STATUSES, state=Allocation.State.ACTIVE
    ).values_list("job_id", "gpu_id"):
        held[job_id].add(gpu_id)
    observed_of: dict[int, ObservedJob | None] = {}
    for pk, status, started_at, backend_ref in open_rows:
        obs = by_id.get(str(pk))
        if obs is not None and _is_stale_at(obs, started_at):
            obs = None
        if not _runs_as_recorded(obs, status=status, backend_ref=backend_ref, held=held.get(pk, set())):
            observed_of[pk] = obs
    # Collected, then written once per kind (`batch`): a round where 174 jobs were preempted
    # wrote ~1,000 statements one job at a time.
    changes = _JobChanges()
    touched = (
        Job.objects.filter(pk__in=sorted(observed_of)).select_related("project", "cluster").order_by("id")
    )
    for job in touched if observed_of else ():
        _reconcile_job(job, observed_of[job.pk], now=now, result=result, held=held, changes=changes)
    jobs_set_running(changes.running)
    jobs_finish(changes.finished, result=result)
    _jobs_preempted(changes.preempted, now=now, result=result)
    jobs_requeue(changes.lost, at=now, result=result)
    result.lost += len(changes.lost)
    return _reconcile_unknown(cluster, observed, open_ids={str(row[0]) for row in open_rows}, now=now)


def _runs_as_recorded(obs: ObservedJob | None, *, status: str, backend_ref: str, held: set[int]) -> bool:
    """Whether `_reconcile_job` would change nothing: the backend runs the job as the database says."""
    return (
        obs is not None
        and obs.state == OS.RUNNING
        and status == Job.Status.RUNNING
        and (not obs.backend_ref or obs.backend_ref == backend_ref)
        and (not obs.gpu_ids or held == set(obs.gpu_ids))
    )


@dataclass(slots=True)
class _JobChanges:
    """What reconcile will write for the open jobs, by kind (`_reconcile_job`)."""

    running: list[Job] = field(default_factory=list)
    finished: list[Finish] = field(default_factory=list)
    preempted: list[tuple[Job, ObservedJob]] = field(default_factory=list)
    lost: list[Requeue] = field(default_factory=list)


def _reconcile_job(
    job: Job,
    obs: ObservedJob | None,
    *,
    now: datetime,
    result: RoundResult,
    held: dict[int, set[int]],
    changes: _JobChanges,
) -> None:
    """One open job against the backend's record of it (None: the backend does not know it)."""
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
        changes.lost.append(
            Requeue(
                job=job,
                ended_at=now,
                sentence="The cluster lost it; requeued and waiting for the next round.",
                message=("Lost by the cluster: " + (obs.message if obs else "no longer known to it."))[:500],
                verb="job.lost",
            )
        )
    elif obs.state == OS.RUNNING:
        if job.status == Job.Status.STARTING or (obs.backend_ref and obs.backend_ref != job.backend_ref):
            before = _job_state(job)
            job.status = Job.Status.RUNNING
            job.backend_ref = obs.backend_ref or job.backend_ref
            changes.running.append(job)
            if before["status"] != job.status:
                _audit("job.run", "job", job.pk, before, _job_state(job), now)
                job_event_emit(job, kind=EventKind.JOB_STARTED, at=now)
        if obs.gpu_ids and held.get(job.pk, set()) != set(obs.gpu_ids):
            _realign(job, obs, now=now, result=result)
    elif obs.state in (OS.COMPLETED, OS.FAILED, OS.CANCELLED):
        ended_at = from_epoch(obs.ended_at) if obs.ended_at is not None else now
        message = obs.message or ("Cancelled outside Berth." if obs.state == OS.CANCELLED else "")
        changes.finished.append(
            Finish(job=job, status=Job.Status(obs.state.value), at=min(ended_at, now), message=message)
        )
    elif obs.state == OS.PREEMPTED:
        changes.preempted.append((job, obs))
    # OS.PENDING: the backend has it queued (e.g. Slurm scheduling it); keep waiting.


def _reconcile_unknown(
    cluster: Cluster, observed: ObservedCluster, *, open_ids: set[str], now: datetime
) -> _Reconciled:
    """Work the backend runs that the database does not: adopted if its GPUs are free, else cancelled."""
    out = _Reconciled()
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
    )
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
    # Names and states of the cluster's nodes as plain values (1,000 `Node` instances a round,
    # and their names as an ``IN`` list, for nothing: nodes rarely change state); only the
    # nodes whose state changed are loaded and saved.
    changed = [
        pk
        for pk, name, status in Node.objects.filter(cluster=cluster).values_list("pk", "name", "status")
        if name in wanted and status != wanted[name]
    ]
    for node in Node.objects.filter(pk__in=changed).order_by("pk") if changed else ():
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
