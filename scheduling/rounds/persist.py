"""Persist the plan (DESIGN §1, step 5): starts, preemptions, explanations, booking notes."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from notifications.events import booking_event_emit, job_event_emit
from notifications.models import EventKind
from scheduling import queries
from scheduling.engine.placement import constraint_key
from scheduling.engine.startability import Unstartable, never_startable, type_capacity
from scheduling.engine.types import (
    ClusterSnapshot,
    JobRequest,
    Plan,
    PreemptAction,
    StartAction,
)
from scheduling.models import (
    Allocation,
    Booking,
    Cluster,
    EngineRound,
    Gpu,
    Job,
    Node,
    Preemption,
)
from scheduling.rounds.common import (
    _BOOKING_NOTE_PREFIX,
    RoundResult,
    _audit,
    _audit_allocations,
    _is_exclusion_violation,
    _iso,
    _job_state,
    _with_project_and_cluster,
)
from scheduling.rounds.explanations import _write_explanations
from scheduling.rounds.reconcile import (
    _blocking_starts,
    _lost_gpu_s,
    _running_upper,
)
from scheduling.snapshots import (
    RUNNING_STATUSES,
    from_epoch,
    parse_holder_id,
)

logger = logging.getLogger(__name__)

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
            _allocations_create([a for _, _, allocations in built for a in allocations])
        return built
    except IntegrityError as exc:
        if not _is_exclusion_violation(exc):
            raise
    placed = []
    for action, job, period in periods:
        allocations = rows(action, job, period)
        try:
            with transaction.atomic():
                _allocations_create(allocations)
        except IntegrityError as exc:
            if not _is_exclusion_violation(exc):
                raise
            continue
        placed.append((action, job, allocations))
    return placed


def _allocations_create(allocations: Sequence[Allocation]) -> None:
    """``bulk_create`` of the starts' new allocations (all ACTIVE, as `_allocations_insert`
    builds them) in one statement over array literals (`queries.job_allocations_insert`): each
    gets its ``pk`` and ``created_at``."""
    at = timezone.now()
    ids = queries.job_allocations_insert(
        [(a.gpu_id, a.job_id, a.period.lower, a.period.upper, a.is_preemptible) for a in allocations],
        state=Allocation.State.ACTIVE,
        at=at,
    )
    for allocation, pk in zip(allocations, ids, strict=True):
        allocation.pk = pk
        allocation.created_at = at
        allocation._state.adding = False


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
    jobs = _lock_plan_rows(cluster, plan)
    candidates = _start_candidates(cluster, plan, jobs=jobs, result=result)
    _place_starts(candidates, now=now, result=result, out=out)
    _signal_preemptions(plan, jobs=jobs, round_row=round_row, now=now, result=result, out=out)
    _write_explanations(cluster, plan, now=now, result=result, unstartable=unstartable or {})
    _write_booking_notes(cluster, plan, now=now)
    return out


def _lock_plan_rows(cluster: Cluster, plan: Plan) -> dict[int, Job]:
    """The plan's jobs (starts and victims), locked; then the cluster's nodes.

    Locking protocol (scheduling.services): job rows first, then the cluster's nodes, in id order."""
    start_ids = [int(s.job_id) for s in plan.starts if s.job_id.isdigit()]
    victim_ids = [int(p.job_id) for p in plan.preemptions if p.job_id.isdigit()]
    jobs = {
        j.pk: j
        for j in Job.objects.select_for_update()
        .filter(cluster=cluster, pk__in=start_ids + victim_ids)
        .order_by("id")
    }
    _with_project_and_cluster(jobs.values(), cluster=cluster)  # the preemption notices name them
    list(Node.objects.select_for_update().filter(cluster=cluster).order_by("id").values_list("id", flat=True))
    return jobs


def _start_candidates(
    cluster: Cluster, plan: Plan, *, jobs: dict[int, Job], result: RoundResult
) -> list[tuple[StartAction, Job]]:
    """The planned starts whose job is still pending, on GPUs of this cluster."""
    # Only the GPUs the plan names: the cluster's 8,000 GPU ids read every round cost ~0.2 s.
    planned = sorted({g for action in plan.starts for g in action.gpu_ids})
    cluster_gpus = (
        set(Gpu.objects.filter(node__cluster=cluster, pk__in=planned).values_list("id", flat=True))
        if planned
        else set()
    )
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
    return candidates


def _place_starts(
    candidates: list[tuple[StartAction, Job]], *, now: datetime, result: RoundResult, out: _Persisted
) -> None:
    """Allocations for the starts (capped by the next holders); a start whose GPUs were taken
    since the snapshot stays pending with a reason, the others become STARTING."""
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


def _signal_preemptions(
    plan: Plan,
    *,
    jobs: dict[int, Job],
    round_row: EngineRound,
    now: datetime,
    result: RoundResult,
    out: _Persisted,
) -> None:
    """A `Preemption` row, an audit event and the owners' notices for every new preemption.

    The rows are inserted in one statement; a job whose earlier preemption is still open is
    skipped (one read for all of them)."""
    victims = [
        (preempt, job)
        for preempt in plan.preemptions
        if (job := jobs.get(int(preempt.job_id)) if preempt.job_id.isdigit() else None) is not None
        and job.status in RUNNING_STATUSES
    ]
    if not victims:
        return
    still_open = set(
        Preemption.objects.filter(
            job_id__in=sorted({job.pk for _, job in victims}), killed_at__isnull=True
        ).values_list("job_id", flat=True)
    )
    rows: list[tuple[PreemptAction, Job, Preemption]] = []
    for preempt, job in victims:
        if job.pk in still_open:
            continue
        still_open.add(job.pk)  # a plan names a victim once; a repeat must not signal it twice
        holder = parse_holder_id(preempt.for_id) if preempt.for_id else None
        rows.append(
            (
                preempt,
                job,
                Preemption(
                    job=job,
                    engine_round=round_row,
                    for_booking_id=holder[1] if holder and holder[0] == "booking" else None,
                    for_job_id=holder[1] if holder and holder[0] == "job" else None,
                    signalled_at=from_epoch(preempt.signal_at),
                    kill_at=from_epoch(max(preempt.kill_at, preempt.signal_at)),
                    reason=preempt.reason[:500],
                ),
            )
        )
    Preemption.objects.bulk_create([preemption for _, _, preemption in rows])
    for preempt, job, preemption in rows:
        _preemption_told(job, preemption, now=now)
        out.preemptions.append(preempt)
        result.preempted += 1


def _preemption_told(job: Job, preemption: Preemption, *, now: datetime) -> None:
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


def _grace_text(preemption: Preemption) -> str:
    return f"{round((preemption.kill_at - preemption.signalled_at).total_seconds())} s"


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


# Per cluster: the inventory a memo of verdicts was made on, and the verdict of each shape.
_UNSTARTABLE_MEMO: dict[str, tuple[Any, dict[tuple[Any, ...], Unstartable | None]]] = {}
_UNSTARTABLE_MEMO_MAX_SHAPES = 50_000


def _unstartable_by_shape(
    snapshot: ClusterSnapshot, jobs: Sequence[JobRequest], *, is_guarantee_enforced: bool
) -> dict[str, Unstartable]:
    """`engine.startability.unstartable_jobs` asked once per job shape, not once per job, and
    not again while the inventory stays the same.

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
        # `unstartable_jobs` job by job, with the inventory's GPUs per type counted once: it
        # counts them over every node for each job (300 shapes x 1,000 nodes in the first round
        # of the full-size bench: ~45 ms of CPU).
        shares = {share.name: share for share in snapshot.projects}
        capacity = type_capacity(snapshot.nodes)
        for shape, job in asked.items():
            known[shape] = never_startable(
                job,
                gpu_types=snapshot.gpu_types,
                nodes=snapshot.nodes,
                share=shares.get(job.project),
                is_guarantee_enforced=is_guarantee_enforced,
                capacity_by_type=capacity,
            )
    _UNSTARTABLE_MEMO[snapshot.cluster] = (inventory, known)
    return {
        job_id: verdict
        for shape in representative
        if (verdict := known[shape]) is not None
        for job_id in members[shape]
    }
