"""Selectors that build the engine's frozen `ClusterSnapshot` of one cluster from the database.

Identifiers in the snapshot: a job is ``str(job.pk)``, a booking ``"booking-<pk>"``, a GPU its
``Gpu`` primary key, a node its name, a project its slug and a user its username.  Times are
epoch seconds (the portal's engine clock).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from portal.accounts.models import Project, Quota
from scheduling import inputs
from scheduling.engine import types as et
from scheduling.engine.startability import Unstartable, enforces_guarantees, never_startable
from scheduling.models import Allocation, Booking, Cluster, Gpu, GpuType, Job, Node, Preemption
from scheduling.ports import prediction_port

logger = logging.getLogger(__name__)

BOOKING_PREFIX = "booking-"

_NODE_STATUS = {
    Node.Status.UP: et.NodeStatus.UP,
    Node.Status.DRAINING: et.NodeStatus.DRAINING,
    Node.Status.DOWN: et.NodeStatus.DOWN,
}

RUNNING_STATUSES = (Job.Status.STARTING, Job.Status.RUNNING)


def epoch(value: datetime) -> float:
    return value.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


def booking_engine_id(booking_id: int) -> str:
    return f"{BOOKING_PREFIX}{booking_id}"


def parse_holder_id(holder_id: str) -> tuple[str, int] | None:
    """``("booking", pk)`` or ``("job", pk)`` for an engine id; None for anything else."""
    if holder_id.startswith(BOOKING_PREFIX):
        rest = holder_id[len(BOOKING_PREFIX) :]
        return ("booking", int(rest)) if rest.isdigit() else None
    return ("job", int(holder_id)) if holder_id.isdigit() else None


# ---- inventory ----


def engine_nodes_for_cluster(*, cluster: Cluster) -> tuple[et.Node, ...]:
    """The cluster's nodes as the engine sees them; GPU ids in index order."""
    # Two queries of plain values: model instances of every GPU cost seconds on a large cluster.
    gpus: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for node_id, index, gpu_id in Gpu.objects.filter(node__cluster=cluster).values_list(
        "node_id", "index", "id"
    ):
        gpus[node_id].append((index, gpu_id))
    nodes = (
        Node.objects.filter(cluster=cluster)
        .order_by("name")
        .values_list("pk", "name", "gpu_type__name", "status", "domain")
    )
    return tuple(
        et.Node(
            id=name,
            gpu_type=gpu_type,
            gpu_ids=tuple(gpu_id for _, gpu_id in sorted(gpus.get(pk, ()))),
            status=_NODE_STATUS[Node.Status(status)],
            domain=domain,
        )
        for pk, name, gpu_type, status, domain in nodes
    )


def gpu_ids_by_node_name(*, cluster: Cluster) -> dict[str, tuple[int, ...]]:
    """Node name -> Berth GPU ids by index (what the Slurm and Kubernetes backends map to)."""
    return {node.id: node.gpu_ids for node in engine_nodes_for_cluster(cluster=cluster)}


def _engine_gpu_type(gpu_type: GpuType) -> et.GpuType:
    return et.GpuType(
        name=gpu_type.name,
        memory_gib=gpu_type.memory_gib,
        precisions=frozenset(gpu_type.precisions),
        relative_speed=gpu_type.relative_speed,
        value=gpu_type.value,
    )


# ---- policy ----

_TUPLE_PAIR_FIELDS = {"interactive_headroom"}
_TUPLE_FIELDS = {"interactive_partition"}


def policy_config_for_cluster(*, cluster: Cluster, at: datetime | None = None) -> et.PolicyConfig:
    """`PolicyConfig` from ``cluster.settings["policy"]`` (a name or a mapping of fields) over the defaults.

    ``BERTH_ENGINE_POLICY`` names the policy when the cluster does not.  Unknown keys are ignored.
    With ``at``, a ``berth`` policy whose settings do not fix ``interactive_headroom`` holds the
    headroom the interactive-demand forecast asks for in the hour from ``at``.
    """
    raw: Any = (cluster.settings or {}).get("policy", {})
    if isinstance(raw, str):
        raw = {"name": raw}
    values: dict[str, Any] = {"name": settings.BERTH_ENGINE_POLICY}
    known = {f.name for f in fields(et.PolicyConfig)}
    for key, value in dict(raw).items():
        if key not in known:
            continue
        if key in _TUPLE_PAIR_FIELDS:
            values[key] = tuple((str(k), int(v)) for k, v in value)
        elif key in _TUPLE_FIELDS:
            values[key] = tuple(str(v) for v in value)
        else:
            values[key] = value
    policy = et.PolicyConfig(**values)
    if at is not None and policy.name == "berth" and "interactive_headroom" not in values:
        policy = dataclasses.replace(policy, interactive_headroom=forecast_headroom(cluster=cluster, at=at))
    if at is not None and policy.name == "berth" and "interactive_pool" not in values:
        policy = dataclasses.replace(policy, interactive_pool=forecast_pool(cluster=cluster, at=at))
    return policy


# ---- jobs ----


def job_request(job: Job, *, usernames: Mapping[int, str], slugs: Mapping[int, str]) -> et.JobRequest:
    """The engine's view of one job (pending or running)."""
    first = job.first_submitted_at or job.submitted_at
    return et.JobRequest(
        id=str(job.pk),
        user=usernames.get(job.user_id, str(job.user_id)),
        project=slugs.get(job.project_id, str(job.project_id)),
        gpu_count=job.gpu_count,
        submit_at=epoch(job.submitted_at),
        kind=et.JobKind(job.kind),
        gpu_type=job.gpu_type.name if job.gpu_type is not None else None,
        min_memory_gib=job.min_memory_gib,
        precisions=frozenset(job.precisions),
        requested_s=float(job.requested_s) if job.requested_s is not None else None,
        predicted_p50_s=job.predicted_p50_s,
        predicted_p90_s=job.predicted_p90_s,
        is_preemptible=job.is_preemptible,
        is_checkpointable=job.is_checkpointable,
        checkpoint_interval_s=float(job.checkpoint_interval_s) if job.checkpoint_interval_s else None,
        priority=int(job.priority),
        name=job.name,
        attempt=job.attempt,
        first_submit_at=epoch(first),
    )


@dataclass(frozen=True, slots=True)
class _Names:
    usernames: dict[int, str]
    slugs: dict[int, str]


def _names(jobs: Iterable[Job], bookings: Iterable[Booking]) -> _Names:
    from django.contrib.auth import get_user_model

    user_ids = {j.user_id for j in jobs} | {b.user_id for b in bookings}
    usernames = dict(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username"))
    slugs = dict(Project.objects.values_list("pk", "slug"))
    return _Names(usernames=usernames, slugs=slugs)


def running_gpu_ids(*, job_ids: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Job id -> GPUs of its active allocations."""
    out: dict[int, list[int]] = defaultdict(list)
    rows = Allocation.objects.filter(job_id__in=list(job_ids), state=Allocation.State.ACTIVE).values_list(
        "job_id", "gpu_id"
    )
    for job_id, gpu_id in rows:
        out[job_id].append(gpu_id)
    return {k: tuple(sorted(v)) for k, v in out.items()}


_RUNNING_ALLOCATIONS_SQL = f"""
    SELECT a.job_id, a.gpu_id, a.is_preemptible
      FROM {Allocation._meta.db_table} a
      JOIN {Job._meta.db_table} j ON j.id = a.job_id
     WHERE j.cluster_id = %s AND j.status = ANY(%s) AND a.state = %s
"""  # noqa: S608 (table names from the models; values are parameters)


def _running_allocations(*, cluster: Cluster) -> tuple[dict[int, tuple[int, ...]], set[int]]:
    """`running_gpu_ids` of the cluster's open jobs, and those holding a preemptible allocation.

    One join, no id list: 2,048 running job ids in two ``IN (...)`` lists cost ~200 ms of
    Django parameter handling per round at 1,000 nodes.
    """
    gpus: dict[int, list[int]] = defaultdict(list)
    preemptible: set[int] = set()
    with connection.cursor() as cursor:
        cursor.execute(
            _RUNNING_ALLOCATIONS_SQL, [cluster.pk, list(RUNNING_STATUSES), Allocation.State.ACTIVE]
        )
        for job_id, gpu_id, is_preemptible in cursor.fetchall():
            gpus[job_id].append(gpu_id)
            if is_preemptible:
                preemptible.add(job_id)
    return {k: tuple(sorted(v)) for k, v in gpus.items()}, preemptible


def open_preemptions(*, cluster: Cluster) -> dict[int, Preemption]:
    """Job id -> its signalled, not yet completed preemption, for jobs that still run."""
    rows = Preemption.objects.filter(
        job__cluster=cluster, job__status__in=RUNNING_STATUSES, killed_at__isnull=True
    ).order_by("signalled_at")
    return {p.job_id: p for p in rows}


# ---- runtime predictions and forecast headroom (through the prediction port) ----


def with_predictions(*, cluster: Cluster, requests: Sequence[et.JobRequest]) -> list[et.JobRequest]:
    """The requests with p50/p90 from the cluster's runtime predictor where a job has none stored.

    The predictor (`PredictionPort.runtime_predict`) learns from the cluster's finished jobs and
    is cached per process.  If it fails, the engine plans on the users' estimates.
    """
    missing = [r for r in requests if r.predicted_p50_s is None]
    if not missing:
        return list(requests)
    try:
        answers = prediction_port().runtime_predict(cluster_id=cluster.pk, requests=missing)
        predicted = dict(zip((r.id for r in missing), answers, strict=True))
    except Exception:
        logger.warning(
            "runtime predictions failed for cluster %s; using estimates", cluster.name, exc_info=True
        )
        return list(requests)
    return [
        dataclasses.replace(r, predicted_p50_s=predicted[r.id][0], predicted_p90_s=predicted[r.id][1])
        if r.id in predicted
        else r
        for r in requests
    ]


def forecast_headroom(*, cluster: Cluster, at: datetime) -> tuple[tuple[str, int], ...]:
    """GPUs per type to keep for interactive demand in the coming hour, from the demand forecast.

    Empty when no usable forecast is stored or the prediction port fails (rounds never depend on it).
    """
    try:
        return tuple(prediction_port().interactive_headroom_policy(cluster_id=cluster.pk, at=at))
    except Exception:
        logger.warning("forecast headroom failed for cluster %s", cluster.name, exc_info=True)
        return ()


def forecast_pool(*, cluster: Cluster, at: datetime) -> tuple[tuple[float, str, int], ...]:
    """The interactive pool for the coming hours from the stored forecast (empty on failure)."""
    try:
        return prediction_port().interactive_pool(cluster_id=cluster.pk, at=at)
    except Exception:
        logger.warning("forecast pool failed for cluster %s", cluster.name, exc_info=True)
        return ()


# ---- fair share ----


_USAGE_SQL = f"""
    SELECT p.slug, j.gpu_count, t.value,
           date_part('epoch', j.started_at), date_part('epoch', j.ended_at)
      FROM {Job._meta.db_table} j
      JOIN {Project._meta.db_table} p ON p.id = j.project_id
      LEFT JOIN {GpuType._meta.db_table} t ON t.id = j.gpu_type_id
     WHERE j.cluster_id = %s AND j.started_at IS NOT NULL AND j.started_at < %s
       AND (j.ended_at IS NULL OR j.ended_at > %s)
"""  # noqa: S608 (table names from the models; values are parameters)


def project_shares(*, cluster: Cluster, now: datetime, half_life_s: float) -> tuple[et.ProjectShare, ...]:
    """Every active project with its weight, decayed value-weighted GPU-hours on this cluster and quotas.

    Usage comes from `scheduling.inputs.project_usage` (the replay's code too).  Runs that
    ended more than five half-lives ago are not read: together they weigh less than 2**-5 of
    their GPU-hours.
    """
    window_start = now - timedelta(seconds=half_life_s * 5)
    # Epoch seconds computed by PostgreSQL (the same value as ``datetime.timestamp()``: both are
    # the exact instant correctly rounded to a double): parsing 2 datetimes per run of history
    # in Python was most of this function.
    with connection.cursor() as cursor:
        cursor.execute(_USAGE_SQL, [cluster.pk, now, window_start])
        runs = cursor.fetchall()
    usage = inputs.project_usage(
        (
            (slug, gpu_count * (value or 1.0), started_at, ended_at)
            for slug, gpu_count, value, started_at, ended_at in runs
        ),
        now=epoch(now),
        half_life_s=half_life_s,
    )
    guaranteed: dict[int, list[tuple[str, int]]] = defaultdict(list)
    type_borrow: dict[int, list[tuple[str, int]]] = defaultdict(list)
    borrow: dict[int, int | None] = {}
    for quota in Quota.objects.select_related("gpu_type").order_by("gpu_type__name"):
        guaranteed[quota.project_id].append((quota.gpu_type.name, quota.guaranteed_gpus))
        if quota.borrow_limit_gpus is not None:
            type_borrow[quota.project_id].append((quota.gpu_type.name, quota.borrow_limit_gpus))
        if quota.borrow_limit_gpus is None:
            borrow[quota.project_id] = None
        elif quota.project_id not in borrow or borrow[quota.project_id] is not None:
            borrow[quota.project_id] = (borrow.get(quota.project_id) or 0) + quota.borrow_limit_gpus
    specs = [
        inputs.ProjectSpec(
            name=project.slug,
            weight=project.fair_share_weight,
            guaranteed=tuple(guaranteed.get(project.pk, ())),
            borrow_limit=borrow.get(project.pk),
            borrow_limits=tuple(type_borrow.get(project.pk, ())),
        )
        for project in Project.objects.filter(is_active=True)
    ]
    return inputs.project_shares(specs, usage=usage)


def project_quota_share(*, project: Project) -> et.ProjectShare:
    """One project's quotas as the engine sees them (no usage: that is what a round adds)."""
    guaranteed: list[tuple[str, int]] = []
    type_borrow: list[tuple[str, int]] = []
    borrow: int | None = 0
    has_unlimited = False
    quotas = Quota.objects.filter(project=project).select_related("gpu_type").order_by("gpu_type__name")
    for quota in quotas:
        guaranteed.append((quota.gpu_type.name, quota.guaranteed_gpus))
        if quota.borrow_limit_gpus is None:
            has_unlimited = True
        else:
            borrow = (borrow or 0) + quota.borrow_limit_gpus
            type_borrow.append((quota.gpu_type.name, quota.borrow_limit_gpus))
    if has_unlimited or not guaranteed:
        borrow = None
    return et.ProjectShare(
        name=project.slug,
        weight=project.fair_share_weight,
        guaranteed=tuple(guaranteed),
        borrow_limit=borrow,
        borrow_limits=tuple(type_borrow),
    )


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


# ---- the snapshot ----


@dataclass(frozen=True, slots=True)
class _OpenJob:
    pk: int
    is_running: bool
    started_at: float  # epoch; the round's now for a running job without a start
    request: et.JobRequest


_OPEN_JOBS_COLUMNS = """
    u.username, p.slug, j.gpu_count, date_part('epoch', j.submitted_at), j.kind,
    t.name, j.min_memory_gib, j.precisions, j.requested_s, j.predicted_p50_s, j.predicted_p90_s,
    j.is_preemptible, j.is_checkpointable, j.checkpoint_interval_s, j.priority, j.name, j.attempt,
    date_part('epoch', COALESCE(j.first_submitted_at, j.submitted_at)),
    j.status, date_part('epoch', j.started_at)
"""
_OPEN_JOBS_FROM = f"""
      FROM {Job._meta.db_table} j
      JOIN {User._meta.db_table} u ON u.id = j.user_id
      JOIN {Project._meta.db_table} p ON p.id = j.project_id
      LEFT JOIN {GpuType._meta.db_table} t ON t.id = j.gpu_type_id
"""
# The versions only.  Every UPDATE writes a new row version: a new ``xmin`` (the writing
# transaction's id) when another transaction writes it, a new ``ctid`` (its place) when the same
# transaction writes it again, and neither is reused while a reader could have seen the old one
# (PostgreSQL's own row version; optimistic-locking libraries use ``xmin`` the same way).  So
# the four rows a request is built from (job, user, project, GPU type) are the ones read before
# exactly when their versions are.
_OPEN_JOBS_VERSIONS_SQL = f"""
    SELECT j.id, j.xmin::text || j.ctid::text, u.xmin::text || u.ctid::text,
           p.xmin::text || p.ctid::text, t.xmin::text || t.ctid::text {_OPEN_JOBS_FROM}
     WHERE j.cluster_id = %s AND j.status = ANY(%s)
     ORDER BY j.submitted_at, j.id
"""
# The whole rows (id, then the request's 18 columns, then status and start) of some jobs.
_OPEN_JOBS_BY_ID_SQL = f"""
    SELECT j.id, {_OPEN_JOBS_COLUMNS} {_OPEN_JOBS_FROM}
     WHERE j.id = ANY(%s::bigint[]) AND j.status = ANY(%s)
"""


@dataclass(frozen=True, slots=True)
class _Known:
    """What a snapshot read of one open job left: its rows' versions and the job it built."""

    version: tuple[str | None, ...]
    job: _OpenJob | None  # None: a running job without a start (its start is the round's now)
    columns: tuple[Any, ...]


# Per cluster: job id -> what the last snapshot built in this process read of it.  A queue
# changes little between rounds.
_KNOWN: dict[int, dict[int, _Known]] = {}


def _open_jobs(*, cluster: Cluster, now: datetime) -> list[_OpenJob]:
    """The cluster's pending and running jobs as engine requests, in submission order.

    Plain columns (epochs computed by PostgreSQL), never ``Job`` instances with their payloads.
    Read in two steps: the row versions of every open job (``xmin`` of the job, its user,
    project and GPU type), then the whole rows only of jobs whose versions differ from this
    process's last snapshot of the cluster.  A job read before keeps its request (frozen: safe
    to share): 12,000 open jobs' 21 columns cost ~250 ms a round to read and convert, their
    versions a fraction of it, and a steady round re-reads the few hundred jobs that changed.
    """
    running: set[str] = {str(s) for s in RUNNING_STATUSES}
    now_s = epoch(now)
    statuses = [Job.Status.PENDING, *RUNNING_STATUSES]
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_JOBS_VERSIONS_SQL, [cluster.pk, statuses])
        versions = cursor.fetchall()
    known = _KNOWN.get(cluster.pk, {})
    stale = [row[0] for row in versions if (hit := known.get(row[0])) is None or hit.version != row[1:]]
    fresh: dict[int, tuple[Any, ...]] = {}
    if stale:
        with connection.cursor() as cursor:
            cursor.execute(_OPEN_JOBS_BY_ID_SQL, [stale, statuses])
            fresh = {row[0]: row[1:] for row in cursor.fetchall()}
    kept: dict[int, _Known] = {}
    out = []
    for pk, *version in versions:
        columns = fresh.get(pk)
        hit = known.get(pk)
        if columns is None and hit is not None and hit.version == tuple(version):
            kept[pk] = hit
            out.append(hit.job or _open_job(pk, hit.columns, now_s=now_s, running=running))
            continue
        if columns is None:  # no longer open at the second read (it ended, or was deleted)
            continue
        # An unchanged request is kept even when another column moved (its status, its start).
        same = hit is not None and hit.job is not None and hit.columns[:18] == columns[:18]
        request = hit.job.request if same and hit is not None and hit.job is not None else None
        job = _open_job(pk, columns, now_s=now_s, running=running, request=request)
        kept[pk] = _Known(
            version=tuple(version),
            job=job if columns[18] not in running or columns[19] is not None else None,
            columns=columns,
        )
        out.append(job)
    _KNOWN[cluster.pk] = kept
    return out


def _open_job(
    pk: int,
    columns: tuple[Any, ...],
    *,
    now_s: float,
    running: set[str],
    request: et.JobRequest | None = None,
) -> _OpenJob:
    status, started_at = columns[18], columns[19]
    return _OpenJob(
        pk=pk,
        is_running=status in running,
        started_at=started_at if started_at is not None else now_s,
        request=request or _job_request_from_row(pk, columns[:18]),
    )


_KINDS = {k.value: k for k in et.JobKind}


def _job_request_from_row(pk: int, columns: tuple[Any, ...]) -> et.JobRequest:
    (
        username,
        slug,
        gpu_count,
        submit_at,
        kind,
        gpu_type,
        min_memory_gib,
        precisions,
        requested_s,
        p50,
        p90,
        is_preemptible,
        is_checkpointable,
        checkpoint_interval_s,
        priority,
        name,
        attempt,
        first_submit_at,
    ) = columns
    return et.JobRequest(
        id=str(pk),
        user=username,
        project=slug,
        gpu_count=gpu_count,
        submit_at=submit_at,
        kind=_KINDS[kind],
        gpu_type=gpu_type,
        min_memory_gib=min_memory_gib,
        precisions=frozenset(precisions),
        requested_s=float(requested_s) if requested_s is not None else None,
        predicted_p50_s=p50,
        predicted_p90_s=p90,
        is_preemptible=is_preemptible,
        is_checkpointable=is_checkpointable,
        checkpoint_interval_s=float(checkpoint_interval_s) if checkpoint_interval_s else None,
        priority=int(priority),
        name=name,
        attempt=attempt,
        first_submit_at=first_submit_at,
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
    )
