"""Apply after the commit (DESIGN §1, step 6): the backend runs the plan; failed starts roll back."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from notifications.events import booking_event_emit, job_event_emit
from notifications.models import EventKind
from notifications.services import events_deferred
from scheduling import metrics
from scheduling.backends.base import (
    ActionResult,
    BackendError,
    ClusterBackend,
    UnsupportedOperationError,
)
from scheduling.engine.types import (
    Plan,
    PreemptAction,
    ReleaseAction,
)
from scheduling.models import (
    Booking,
    Cluster,
    EngineRound,
    Job,
    Preemption,
)
from scheduling.rounds.batch import jobs_set_running
from scheduling.rounds.common import (
    RoundResult,
    _audit,
    _job_state,
    _with_project_and_cluster,
    hook,
)
from scheduling.rounds.persist import (
    _Persisted,
)
from scheduling.rounds.reconcile import (
    _set_degraded,
    _start_rollback,
)
from scheduling.services import (
    audit_events_deferred,
)
from scheduling.snapshots import (
    BOOKING_PREFIX,
    epoch,
    parse_holder_id,
)

logger = logging.getLogger(__name__)


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
    results, error = _backend_apply(cluster, backend, persisted, plan, now=now)
    cancel_results = _backend_cancel(backend, to_cancel, starting={s.job_id for s in persisted.starts})
    start_results = {r.target_id: r for r in results if r.action == "start"}
    failures = [r for r in [*results, *cancel_results] if not r.is_ok]
    for failure in failures:
        metrics.backend_error_count(cluster=cluster.name, operation=failure.action)

    with transaction.atomic(), audit_events_deferred(), events_deferred():
        _record_start_results(persisted, start_results, cluster=cluster, now=now, result=result)
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


def _backend_apply(
    cluster: Cluster, backend: ClusterBackend, persisted: _Persisted, plan: Plan, *, now: datetime
) -> tuple[list[ActionResult], str]:
    """The backend's results for the persisted plan (plus preemptions still open and releases of
    closed bookings), and the error when the whole apply failed (every start then failed)."""
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
    if not (
        backend_plan.starts or backend_plan.preemptions or backend_plan.reservations or backend_plan.releases
    ):
        return [], ""
    try:
        return hook("_call_apply")(backend, backend_plan, persisted.payloads), ""
    except BackendError as exc:
        metrics.backend_error_count(cluster=cluster.name, operation="apply")
        return [
            ActionResult("start", s.job_id, False, str(exc)) for s in persisted.starts
        ], f"apply failed: {exc}"


def _backend_cancel(
    backend: ClusterBackend, to_cancel: Sequence[str], *, starting: set[str]
) -> list[ActionResult]:
    out = []
    for job_id in (j for j in to_cancel if j not in starting):  # never cancel what this round starts
        try:
            out.append(backend.cancel(job_id))
        except UnsupportedOperationError:
            break
        except BackendError as exc:
            out.append(ActionResult("cancel", job_id, False, str(exc)))
    return out


def _record_start_results(
    persisted: _Persisted,
    start_results: dict[str, ActionResult],
    *,
    cluster: Cluster,
    now: datetime,
    result: RoundResult,
) -> None:
    """Confirmed starts run; refused ones are rolled back (pending, reason ``backend``)."""
    # No answer for a start: the next round's reconcile decides from what really runs.
    answered = [int(a.job_id) for a in persisted.starts if a.job_id in start_results]
    locked = {
        j.pk: j
        for j in Job.objects.select_for_update().filter(cluster=cluster, pk__in=answered).order_by("id")
    }
    _with_project_and_cluster(locked.values(), cluster=cluster)  # the start notices name them
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
    jobs_set_running(confirmed)  # one UPDATE (Django's bulk_update: a CASE per row)


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
