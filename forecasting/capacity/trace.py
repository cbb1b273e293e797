"""The what-if's inputs from the database: the lab's finished jobs of one GPU type as a replay
trace, the cluster's usual node size and its policy."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q

from scheduling.models import Allocation, Cluster, Job, Node


def wait_trace_get(
    *, cluster_id: int, gpu_type: str, start_at: datetime, end_at: datetime, max_jobs: int
) -> Any:
    """The cluster's finished jobs on ``gpu_type`` submitted in ``[start_at, end_at)`` as a replay trace.

    A job counts for a type when it asked for it, or asked for none and ran on it.  Arrival is
    the first submission, runtime is end - start (what the job really needed); times are
    shifted so the first arrival is 0.  The newest ``max_jobs`` are kept.
    """
    from scheduling.sim.trace import Trace, TraceJob

    finished = Job.objects.filter(
        cluster_id=cluster_id,
        status__in=(Job.Status.COMPLETED, Job.Status.FAILED),
        started_at__isnull=False,
        ended_at__isnull=False,
        submitted_at__gte=start_at,
        submitted_at__lt=end_at,
    )
    ran_on = Allocation.objects.filter(gpu__node__gpu_type__name=gpu_type).values("job_id")
    rows = list(
        finished.filter(Q(gpu_type__name=gpu_type) | Q(gpu_type__isnull=True, pk__in=ran_on))
        .order_by("-submitted_at", "-id")
        .values_list(
            "id",
            "user_id",
            "project_id",
            "first_submitted_at",
            "submitted_at",
            "started_at",
            "ended_at",
            "gpu_count",
            "requested_s",
            "status",
        )[:max_jobs]
    )
    jobs = []
    for job_id, user_id, project_id, first, submitted, started, ended, gpus, requested, status in rows:
        if started is None or ended is None:  # filtered above; for the type checker
            continue
        jobs.append(
            (
                (first or submitted),
                TraceJob(
                    id=str(job_id),
                    user=f"u{user_id}",
                    project=f"p{project_id}",
                    submit_at=0.0,
                    runtime_s=max((ended - started).total_seconds(), 1.0),
                    gpu_count=gpus,
                    gpu_type=None,  # the what-if inventory has this one type only
                    requested_s=float(requested) if requested else None,
                    status=status,
                ),
            )
        )
    jobs.sort(key=lambda item: item[0])
    origin = jobs[0][0] if jobs else start_at
    monday = (origin - timedelta(days=origin.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    trace_jobs = tuple(
        TraceJob(
            id=j.id,
            user=j.user,
            project=j.project,
            submit_at=(when - origin).total_seconds(),
            runtime_s=j.runtime_s,
            gpu_count=j.gpu_count,
            gpu_type=None,
            requested_s=j.requested_s,
            status=j.status,
        )
        for when, j in jobs
    )
    return Trace(
        name=f"cluster{cluster_id}-{gpu_type}",
        jobs=trace_jobs,
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=(origin - monday).total_seconds(),
    )


def gpus_per_node(*, cluster_id: int, gpu_type: str) -> int:
    """The cluster's usual node size for ``gpu_type`` (8 when it has none): what-ifs add or
    remove whole nodes of it."""
    sizes = Counter(
        Node.objects.filter(cluster_id=cluster_id, gpu_type__name=gpu_type).values_list(
            "gpu_count", flat=True
        )
    )
    return sizes.most_common(1)[0][0] if sizes else 8


def policy_name(*, cluster_id: int) -> str:
    """The policy the cluster's engine round runs (``Cluster.settings["policy"]``, a name or a
    dict with one, else ``BERTH_ENGINE_POLICY``)."""
    raw = (Cluster.objects.filter(pk=cluster_id).values_list("settings", flat=True).first() or {}).get(
        "policy"
    )
    name = raw if isinstance(raw, str) else (raw or {}).get("name") if isinstance(raw, dict) else None
    return str(name or settings.BERTH_ENGINE_POLICY)
