"""Selectors that build the engine's frozen `ClusterSnapshot` of one cluster from the database.

Identifiers in the snapshot: a job is ``str(job.pk)``, a booking ``"booking-<pk>"``, a GPU its
``Gpu`` primary key, a node its name, a project its slug and a user its username.  Times are
epoch seconds (the portal's engine clock).

The parts live in ``scheduling.snapshot`` (one module per responsibility: ids, inventory,
policy, jobs, shares); this module assembles them and re-exports their public names, so callers
import from here.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings

from scheduling.engine import types as et
from scheduling.engine.startability import Unstartable, enforces_guarantees, never_startable
from scheduling.models import Allocation, Booking, Cluster, GpuType, Job
from scheduling.queries.snapshot import _OPEN_JOBS_BY_ID_SQL  # re-exported: its old home
from scheduling.snapshot.ids import (
    BOOKING_PREFIX,
    RUNNING_STATUSES,
    booking_engine_id,
    epoch,
    from_epoch,
    parse_holder_id,
)
from scheduling.snapshot.inventory import _engine_gpu_type, engine_nodes_for_cluster, gpu_ids_by_node_name
from scheduling.snapshot.jobs import (
    _job_request_from_row,
    _names,
    _open_jobs,
    _running_allocations,
    job_request,
    open_claims,
    open_preemptions,
    running_gpu_ids,
    with_predictions,
)
from scheduling.snapshot.policy import forecast_headroom, forecast_pool, policy_config_for_cluster
from scheduling.snapshot.shares import project_quota_share, project_shares, usage_runs_read

__all__ = [
    "BOOKING_PREFIX",
    "RUNNING_STATUSES",
    "_OPEN_JOBS_BY_ID_SQL",
    "_job_request_from_row",
    "_open_jobs",
    "booking_engine_id",
    "cluster_snapshot_build",
    "engine_nodes_for_cluster",
    "epoch",
    "forecast_headroom",
    "forecast_pool",
    "from_epoch",
    "gpu_ids_by_node_name",
    "job_request",
    "job_startability",
    "open_claims",
    "open_preemptions",
    "parse_holder_id",
    "policy_config_for_cluster",
    "project_quota_share",
    "project_shares",
    "running_gpu_ids",
    "usage_runs_read",
    "with_predictions",
]


def job_startability(job: Job) -> Unstartable | None:
    """`Unstartable` when ``job`` can never start on its cluster's inventory under its project's
    quota and the cluster's policy (`engine.startability`), else None."""
    policy = policy_config_for_cluster(cluster=job.cluster)
    request = job_request(job, usernames={}, slugs={job.project_id: job.project.slug})
    return never_startable(
        request,
        gpu_types=tuple(
            _engine_gpu_type(t) for t in GpuType.objects.filter(nodes__cluster=job.cluster).distinct()
        ),
        nodes=engine_nodes_for_cluster(cluster=job.cluster),
        share=project_quota_share(project=job.project),
        is_guarantee_enforced=enforces_guarantees(policy.name),
    )


def cluster_snapshot_build(
    *, cluster: Cluster, now: datetime, policy: et.PolicyConfig, horizon_s: float | None = None
) -> et.ClusterSnapshot:
    """The frozen input of one engine round: inventory, running and pending work, bookings, shares.

    Running work is every STARTING or RUNNING job with its active allocations; a job in a
    preemption grace carries ``grace_until`` (the planned kill) so it is not signalled twice.
    Bookings are the open ones overlapping ``[now, now + horizon_s)`` with their GPUs.  Jobs
    without predicted runtimes of their own get p50/p90 from the cluster's finished history.
    """
    horizon_s = settings.BERTH_ENGINE_HORIZON_S if horizon_s is None else horizon_s
    nodes = engine_nodes_for_cluster(cluster=cluster)
    type_names = {n.gpu_type for n in nodes}
    gpu_types = tuple(
        _engine_gpu_type(t) for t in GpuType.objects.filter(name__in=type_names).order_by("name")
    )

    open_jobs = _open_jobs(cluster=cluster, now=now)
    bookings = list(
        Booking.objects.filter(
            cluster=cluster,
            status__in=Booking.OPEN_STATUSES,
            end_at__gt=now,
            start_at__lt=now + timedelta(seconds=horizon_s),
        )
        .select_related("gpu_type")
        .order_by("start_at", "id")
    )
    names = _names((), bookings)
    running_jobs = [j for j in open_jobs if j.is_running]
    gpus_of, preemptible_jobs = _running_allocations(cluster=cluster) if running_jobs else ({}, set())
    grace = open_preemptions(cluster=cluster) if running_jobs else {}
    requests = with_predictions(cluster=cluster, requests=[j.request for j in open_jobs])
    request_of = {int(r.id): r for r in requests}
    running = tuple(
        et.RunningJob(
            job=request_of[job.pk],
            gpu_ids=gpus_of[job.pk],
            started_at=job.started_at,
            is_preemptible=job.pk in preemptible_jobs,
            grace_until=epoch(grace[job.pk].kill_at) if job.pk in grace else None,
        )
        for job in running_jobs
        if gpus_of.get(job.pk)
    )
    pending = tuple(request_of[job.pk] for job in open_jobs if not job.is_running)
    booking_gpus: dict[int, list[int]] = defaultdict(list)
    for booking_id, gpu_id in (
        Allocation.objects.filter(booking_id__in=[b.pk for b in bookings])
        .exclude(state=Allocation.State.RELEASED)
        .values_list("booking_id", "gpu_id")
    ):
        booking_gpus[booking_id].append(gpu_id)
    engine_bookings = tuple(
        et.Booking(
            id=booking_engine_id(b.pk),
            user=names.usernames.get(b.user_id, str(b.user_id)),
            project=names.slugs.get(b.project_id, str(b.project_id)),
            gpu_count=b.gpu_count,
            start_at=epoch(b.start_at),
            end_at=epoch(b.end_at),
            gpu_type=b.gpu_type.name,
            gpu_ids=tuple(sorted(booking_gpus.get(b.pk, ()))),
        )
        for b in bookings
    )
    return et.ClusterSnapshot(
        cluster=cluster.name,
        gpu_types=gpu_types,
        nodes=nodes,
        running=running,
        pending=pending,
        bookings=engine_bookings,
        projects=project_shares(cluster=cluster, now=now, half_life_s=policy.fairshare_half_life_s),
        claims=open_claims(cluster=cluster, now=now, hold_s=policy.claim_hold_s) if pending else (),
    )
