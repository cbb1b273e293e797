"""Open jobs as engine requests: pending and running work, their GPUs, graces and predictions."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection

from portal.accounts.models import Project
from scheduling.engine import types as et
from scheduling.models import Allocation, Booking, Cluster, GpuType, Job, Preemption
from scheduling.ports import prediction_port
from scheduling.snapshot.ids import RUNNING_STATUSES, epoch

logger = logging.getLogger(__name__)


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


# How long a prediction a round made is reused for a job without a stored one: the hourly
# refresh (``forecasting.tasks.forecast_refresh_dispatch``) stores every pending job's.
_PREDICTION_REUSE_S = 3_600.0


@dataclass(frozen=True, slots=True)
class _Predicted:
    """A prediction a round made for a job without a stored one."""

    asked: et.JobRequest  # the request it was made for
    answered: et.JobRequest  # that request with the predicted p50/p90
    at: float  # monotonic time of the answer


# Per cluster: the port that answered, and job id -> its `_Predicted`.
_PREDICTED: dict[int, tuple[object, dict[str, _Predicted]]] = {}


def with_predictions(*, cluster: Cluster, requests: Sequence[et.JobRequest]) -> list[et.JobRequest]:
    """The requests with p50/p90 from the cluster's runtime predictor where a job has none stored.

    The predictor (`PredictionPort.runtime_predict`) learns from the cluster's finished jobs and
    is cached per process.  If it fails, the engine plans on the users' estimates.

    A prediction is made once per job and reused by the next rounds of this process while the
    job's request is the same, for up to `_PREDICTION_REUSE_S` (until the hourly refresh stores
    one): the predictor's own memo is dropped whenever it learns a finished job, so a live
    cluster's rounds re-predicted every such job after each one that ended (2,000 jobs, about
    0.5 s a round at 1,000 nodes), as if the stored predictions were recomputed every round.
    """
    missing = [r for r in requests if r.predicted_p50_s is None]
    if not missing:
        _PREDICTED.pop(cluster.pk, None)
        return list(requests)
    now = time.monotonic()
    port = prediction_port()
    memo = _PREDICTED.get(cluster.pk)
    known = memo[1] if memo is not None and memo[0] is port else {}
    kept: dict[str, _Predicted] = {}
    ask: list[et.JobRequest] = []
    for r in missing:
        hit = known.get(r.id)
        if hit is not None and (hit.asked is r or hit.asked == r) and now - hit.at < _PREDICTION_REUSE_S:
            kept[r.id] = hit
        else:
            ask.append(r)
    if ask:
        try:
            answers = list(zip(ask, port.runtime_predict(cluster_id=cluster.pk, requests=ask), strict=True))
        except Exception:
            logger.warning(
                "runtime predictions failed for cluster %s; using estimates", cluster.name, exc_info=True
            )
            answers = []
        for r, (p50, p90) in answers:
            answered = dataclasses.replace(r, predicted_p50_s=p50, predicted_p90_s=p90)
            kept[r.id] = _Predicted(asked=r, answered=answered, at=now)
    _PREDICTED[cluster.pk] = (port, kept)  # only the jobs still without a stored prediction
    return [
        hit.answered if r.predicted_p50_s is None and (hit := kept.get(r.id)) is not None else r
        for r in requests
    ]


def round_predictions_forget(*, cluster_id: int) -> None:
    """Drop the predictions rounds made for ``cluster_id``'s jobs: the next round asks again
    (after a history import the predictor has learned what those predictions did not know)."""
    _PREDICTED.pop(cluster_id, None)


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
# What the 20 columns are computed from, as stored (hashing the computed epochs costs more).
_OPEN_JOBS_SOURCES = """
    u.username, p.slug, j.gpu_count, j.submitted_at, j.kind, t.name, j.min_memory_gib,
    j.precisions, j.requested_s, j.predicted_p50_s, j.predicted_p90_s, j.is_preemptible,
    j.is_checkpointable, j.checkpoint_interval_s, j.priority, j.name, j.attempt,
    j.first_submitted_at, j.status, j.started_at
"""
# The versions only: a 64-bit hash of the text of those values (the row's text form quotes
# every value and tells NULL from ''; ``hashtextextended`` is the hash PostgreSQL's hash
# partitioning keeps stable across versions).  A request is read again exactly when something
# it is built from changed, its user's name, project's slug or GPU type's name included, and
# not when the job row changed elsewhere: a round's own explanation writes rewrite ~10,000
# pending rows, and with the rows' ``xmin`` as the version (as before) the next round re-read
# every one of them.  Two different values with one hash (a chance of 2^-64 per change) would
# keep the old request until the job changes again.
_OPEN_JOBS_VERSIONS_SQL = f"""
    SELECT j.id, hashtextextended(ROW({_OPEN_JOBS_SOURCES})::text, 0) {_OPEN_JOBS_FROM}
     WHERE j.cluster_id = %s AND j.status = ANY(%s)
     ORDER BY j.submitted_at, j.id
"""
# The whole rows (id, then the request's 18 columns, then status and start) of some jobs.
_OPEN_JOBS_BY_ID_SQL = f"""
    SELECT j.id, {_OPEN_JOBS_COLUMNS} {_OPEN_JOBS_FROM}
     WHERE j.id = ANY(%s::bigint[]) AND j.status = ANY(%s)
"""
# Both at once (id, the version, then the 20 columns), for a cluster this process has not
# read yet: every row is stale then, and a second statement naming 12,000 ids costs more.
_OPEN_JOBS_WHOLE_SQL = f"""
    SELECT j.id, hashtextextended(ROW({_OPEN_JOBS_SOURCES})::text, 0), {_OPEN_JOBS_COLUMNS}
           {_OPEN_JOBS_FROM}
     WHERE j.cluster_id = %s AND j.status = ANY(%s)
     ORDER BY j.submitted_at, j.id
"""


@dataclass(frozen=True, slots=True)
class _Known:
    """What a snapshot read of one open job left: its version and the job it built."""

    version: int
    job: _OpenJob | None  # None: a running job without a start (its start is the round's now)
    columns: tuple[Any, ...]


# Per cluster: job id -> what the last snapshot built in this process read of it.  A queue
# changes little between rounds.
_KNOWN: dict[int, dict[int, _Known]] = {}


def _open_jobs(*, cluster: Cluster, now: datetime) -> list[_OpenJob]:
    """The cluster's pending and running jobs as engine requests, in submission order.

    Plain columns (epochs computed by PostgreSQL), never ``Job`` instances with their payloads.
    Read in two steps: the versions of every open job (a hash of what its request, status and
    start are built from), then the whole rows only of jobs whose versions differ from this
    process's last snapshot of the cluster.  A job read before keeps its request (frozen: safe
    to share): 12,000 open jobs' 21 columns cost ~250 ms a round to read and convert, their
    versions a fraction of it, and a steady round re-reads the few hundred jobs that changed.
    The first read of a cluster in a process (nothing known) takes both in one statement.
    """
    running: set[str] = {str(s) for s in RUNNING_STATUSES}
    now_s = epoch(now)
    statuses = [Job.Status.PENDING, *RUNNING_STATUSES]
    known = _KNOWN.get(cluster.pk, {})
    fresh: dict[int, tuple[Any, ...]] = {}
    if not known:  # the first read of this cluster in this process: every row is needed
        with connection.cursor() as cursor:
            cursor.execute(_OPEN_JOBS_WHOLE_SQL, [cluster.pk, statuses])
            rows = cursor.fetchall()
        versions = [row[:2] for row in rows]
        fresh = {row[0]: row[2:] for row in rows}
    else:
        with connection.cursor() as cursor:
            cursor.execute(_OPEN_JOBS_VERSIONS_SQL, [cluster.pk, statuses])
            versions = cursor.fetchall()
        stale = [pk for pk, version in versions if (hit := known.get(pk)) is None or hit.version != version]
        if stale:
            # One text parameter: a list of ids is quoted element by element in Python.
            with connection.cursor() as cursor:
                cursor.execute(_OPEN_JOBS_BY_ID_SQL, ["{" + ",".join(map(str, stale)) + "}", statuses])
                fresh = {row[0]: row[1:] for row in cursor.fetchall()}
    kept: dict[int, _Known] = {}
    out = []
    for pk, version in versions:
        columns = fresh.get(pk)
        hit = known.get(pk)
        if columns is None and hit is not None and hit.version == version:
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
            version=version,
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
