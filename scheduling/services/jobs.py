"""Batch jobs: submit (checked against the inventory and the pending limits) and cancel."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from portal.accounts.models import Project
from scheduling.models import (
    AuditEvent,
    Cluster,
    GpuType,
    Job,
)
from scheduling.services.audit import (
    allocations_close,
    entity_event_record,
    job_state,
)
from scheduling.services.common import (
    _capacity_by_cluster,
    _engine_round_soon,
    _now,
    _require_can_manage,
    _require_member,
    _runtime_predict_soon,
)
from scheduling.snapshots import job_startability


def _job_candidate_types(
    *, gpu_type: GpuType | None, min_memory_gib: float, precisions: Sequence[str]
) -> list[GpuType]:
    types = [gpu_type] if gpu_type is not None else list(GpuType.objects.all())
    wanted = set(precisions)
    return [t for t in types if t.memory_gib >= min_memory_gib and wanted <= set(t.precisions)]


def _check_pending_limits(*, user: User, project: Project) -> None:
    """At most ``BERTH_MAX_PENDING_JOBS_PER_USER`` pending jobs per user and
    ``BERTH_MAX_PENDING_JOBS_PER_PROJECT`` per project (0: no limit): every pending job costs
    every engine round work, so a script cannot queue without bound.  Two indexed counts; two
    racing submits may pass one over the limit (the bound, not the exact count, is the point)."""
    per_user = settings.BERTH_MAX_PENDING_JOBS_PER_USER
    per_project = settings.BERTH_MAX_PENDING_JOBS_PER_PROJECT
    pending = Job.objects.filter(status=Job.Status.PENDING)
    if per_user and pending.filter(user_id=user.pk).count() >= per_user:
        raise ValidationError(
            {
                "non_field_errors": f"You have {per_user} pending jobs, the most one user may queue; "
                "wait for some to start or cancel some."
            }
        )
    if per_project and pending.filter(project_id=project.pk).count() >= per_project:
        raise ValidationError(
            {
                "project": (
                    f"Project {project.slug} has {per_project} pending jobs, the most one project may queue."
                )
            }
        )


def job_submit(
    user: User,
    *,
    project: Project,
    name: str,
    gpu_count: int,
    cluster: Cluster | None = None,
    gpu_type: GpuType | None = None,
    kind: str = Job.Kind.BATCH,
    min_memory_gib: float = 0.0,
    precisions: Sequence[str] = (),
    requested_s: int | None = None,
    is_preemptible: bool = False,
    is_checkpointable: bool = False,
    checkpoint_interval_s: int | None = None,
    priority: int = Job.Priority.NORMAL,
    payload: dict[str, Any] | None = None,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Job:
    """Queue a job; the engine places it in a later round and explains why it waits.

    Checks that some GPU type in the cluster satisfies the type, memory and precision
    constraints with at least ``gpu_count`` GPUs (else the job could never run).  A job that
    the project's quota never lets start (`engine.startability`) is accepted, since quotas
    change, with that reason and what would unblock it as its pending sentence and no ETA;
    `selectors.job_warnings` gives the warning to show.
    """
    now = _now(now)
    _job_fields_check(
        name=name,
        gpu_count=gpu_count,
        kind=kind,
        min_memory_gib=min_memory_gib,
        requested_s=requested_s,
        is_checkpointable=is_checkpointable,
        checkpoint_interval_s=checkpoint_interval_s,
        priority=priority,
    )
    _require_member(user, project=project)
    if not project.is_active:
        raise ValidationError({"project": "This project is archived."})
    _check_pending_limits(user=user, project=project)
    chosen = _job_cluster_pick(
        cluster=cluster,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        min_memory_gib=min_memory_gib,
        precisions=precisions,
    )
    with transaction.atomic():
        job = Job.objects.create(
            user=user,
            project=project,
            cluster=chosen,
            name=name.strip(),
            kind=kind,
            gpu_count=gpu_count,
            gpu_type=gpu_type,
            min_memory_gib=min_memory_gib,
            precisions=sorted(set(precisions)),
            requested_s=requested_s,
            is_preemptible=is_preemptible,
            is_checkpointable=is_checkpointable,
            checkpoint_interval_s=checkpoint_interval_s,
            priority=priority,
            payload=payload or {},
            status=Job.Status.PENDING,
            submitted_at=now,
            first_submitted_at=now,
            pending_sentence="Waiting for the next scheduling round.",
        )
        _job_submitted_record(job, user=user, actor_label=actor_label, now=now)
    return job


def _job_fields_check(
    *,
    name: str,
    gpu_count: int,
    kind: str,
    min_memory_gib: float,
    requested_s: int | None,
    is_checkpointable: bool,
    checkpoint_interval_s: int | None,
    priority: int,
) -> None:
    """Every field error of a submission at once (400), before any query."""
    errors: dict[str, list[str]] = defaultdict(list)
    if not name.strip():
        errors["name"].append("Give the job a name.")
    if gpu_count < 1:
        errors["gpu_count"].append("A job needs at least one GPU.")
    if min_memory_gib < 0:
        errors["min_memory_gib"].append("Cannot be negative.")
    if requested_s is not None and not 0 < requested_s <= settings.BERTH_JOB_MAX_REQUESTED_S:
        errors["requested_s"].append(
            f"Give a runtime estimate between 1 s and {settings.BERTH_JOB_MAX_REQUESTED_S} s."
        )
    if checkpoint_interval_s is not None and (not is_checkpointable or checkpoint_interval_s <= 0):
        errors["checkpoint_interval_s"].append(
            "Only a checkpointable job has a (positive) checkpoint interval."
        )
    if kind not in Job.Kind.values:
        errors["kind"].append(f"Unknown kind {kind!r}.")
    if priority not in Job.Priority.values:
        errors["priority"].append(f"Unknown priority {priority!r}.")
    if errors:
        raise ValidationError(dict(errors))


def _job_cluster_pick(
    *,
    cluster: Cluster | None,
    gpu_type: GpuType | None,
    gpu_count: int,
    min_memory_gib: float,
    precisions: Sequence[str],
) -> Cluster:
    """The cluster (the given one, else the active one) with the most GPUs of one fitting type;
    400 when no type fits or the job needs more GPUs than that."""
    types = _job_candidate_types(gpu_type=gpu_type, min_memory_gib=min_memory_gib, precisions=precisions)
    if not types:
        raise ValidationError({"gpu_type": "No GPU type satisfies the memory and precision constraints."})
    clusters = [cluster] if cluster is not None else list(Cluster.objects.filter(is_active=True))
    best: tuple[int, Cluster] | None = None
    for candidate in clusters:
        for gt in types:
            capacity = _capacity_by_cluster(gpu_type=gt, cluster_ids=[candidate.pk]).get(candidate.pk, 0)
            if best is None or capacity > best[0]:
                best = (capacity, candidate)
    if best is None or best[0] == 0:
        raise ValidationError({"gpu_type": "No cluster here has a GPU that satisfies the constraints."})
    if gpu_count > best[0]:
        raise ValidationError({"gpu_count": f"At most {best[0]} fitting GPUs exist in one cluster."})
    return best[1]


def _job_submitted_record(job: Job, *, user: User, actor_label: str, now: datetime) -> None:
    """Inside the submit's transaction: the never-startable verdict, the audit event, and the
    after-commit runtime prediction and engine round."""
    never = job_startability(job)
    if never is not None:
        # accepted (quotas and inventory change), but told at once why waiting will not help
        job.pending_reason = never.reason.value
        job.pending_sentence = never.message[:500]
        job.save(update_fields=["pending_reason", "pending_sentence"])
    entity_event_record(job, verb="job.submit", before=None, actor=user, actor_label=actor_label, at=now)
    _runtime_predict_soon(job.pk)
    _engine_round_soon(job.cluster_id)


@transaction.atomic
def job_cancel(
    job: Job,
    *,
    user: User,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Job:
    """Cancel a pending or running job; its GPUs are free from now on.

    The backend stops a running job in the next engine round (it sees the job cancelled
    with a ``backend_ref`` still running), so no backend call happens inside this transaction.
    """
    now = _now(now)
    job = Job.objects.select_for_update().get(pk=job.pk)
    _require_can_manage(user, owner_id=job.user_id, project_id=job.project_id)
    if job.status not in Job.OPEN_STATUSES:
        raise ValidationError({"status": f"This job is already {job.status}."})
    before = job_state(job)
    job.status = Job.Status.CANCELLED
    job.ended_at = now
    job.pending_reason = Job.PendingReason.NONE
    job.pending_sentence = ""
    job.eta_p50_at = job.eta_p90_at = None
    job.save(
        update_fields=["status", "ended_at", "pending_reason", "pending_sentence", "eta_p50_at", "eta_p90_at"]
    )
    allocations_close(
        job.allocations.all(), at=now, actor=user, actor_label=actor_label, verb="allocation.cancel"
    )
    entity_event_record(job, verb="job.cancel", before=before, actor=user, actor_label=actor_label, at=now)
    _engine_round_soon(job.cluster_id)
    return job
