"""Open jobs as engine requests: pending and running work, their GPUs, graces and predictions."""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models.functions import Coalesce, Greatest

from portal.accounts.models import Project
from scheduling import queries
from scheduling.engine import types as et
from scheduling.models import Allocation, Booking, Cluster, Job, Preemption
from scheduling.ports import prediction_port
from scheduling.snapshot.ids import RUNNING_STATUSES, epoch

logger = logging.getLogger(__name__)
_new_tuple = tuple.__new__  # a named tuple built without its Python-level __new__


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


def _running_allocations(*, cluster: Cluster) -> tuple[dict[int, tuple[int, ...]], set[int]]:
    """`running_gpu_ids` of the cluster's open jobs, and those holding a preemptible allocation.

    One join, no id list: 2,048 running job ids in two ``IN (...)`` lists cost ~200 ms of
    Django parameter handling per round at 1,000 nodes.
    """
    gpus: dict[int, list[int]] = defaultdict(list)
    preemptible: set[int] = set()
    for job_id, gpu_id, is_preemptible in queries.running_allocations_read(
        cluster_id=cluster.pk, statuses=list(RUNNING_STATUSES)
    ):
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


# A claim's victims were signalled at most this long ago: a grace is seconds, and the bound keeps
# the read on the ``-signalled_at`` index as the preemption history grows.
_CLAIM_SIGNAL_WINDOW = timedelta(days=1)


def open_claims(*, cluster: Cluster, now: datetime, hold_s: float) -> tuple[tuple[str, str, float], ...]:
    """(claimant, evicted job, when its GPUs were freed) for every job that running work was
    reclaimed for, freed at most ``hold_s`` ago or still in its grace: the engine's
    ``ClusterSnapshot.claims`` (it keeps only those whose two jobs are pending).  Freed is the
    planned kill, or the real stop when the backend stopped the work later than planned."""
    rows = (
        Preemption.objects.filter(
            job__cluster=cluster, for_job__isnull=False, signalled_at__gte=now - _CLAIM_SIGNAL_WINDOW
        )
        .annotate(freed=Greatest("kill_at", Coalesce("killed_at", "kill_at")))
        .filter(freed__gte=now - timedelta(seconds=hold_s))
        .order_by("for_job_id", "job_id", "freed")
        .values_list("for_job_id", "job_id", "freed")
    )
    latest = {(str(claimant), str(evicted)): epoch(freed) for claimant, evicted, freed in rows}
    return tuple((claimant, evicted, freed) for (claimant, evicted), freed in latest.items())


# How long a prediction a round made is reused for a job without a stored one: the hourly
# refresh (``forecasting.tasks.forecast_refresh_dispatch``) stores every pending job's.
_PREDICTION_REUSE_S = 3_600.0


class _Predicted(NamedTuple):
    """A prediction a round made for a job without a stored one (a named tuple: a round makes
    ~2,000 in its first run, built by ``tuple.__new__``)."""

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
            kept[r.id] = _new_tuple(_Predicted, (r, _with_runtime(r, p50=p50, p90=p90), now))
    _PREDICTED[cluster.pk] = (port, kept)  # only the jobs still without a stored prediction
    return [
        hit.answered if r.predicted_p50_s is None and (hit := kept.get(r.id)) is not None else r
        for r in requests
    ]


def round_predictions_forget(*, cluster_id: int) -> None:
    """Drop the predictions rounds made for ``cluster_id``'s jobs: the next round asks again
    (after a history import the predictor has learned what those predictions did not know)."""
    _PREDICTED.pop(cluster_id, None)


# These two are NamedTuples, not frozen dataclasses: a snapshot's first read makes one of each
# per open job (12,048 at full size), and a frozen dataclass's __init__ costs twice as much.
class _OpenJob(NamedTuple):
    pk: int
    is_running: bool
    started_at: float  # epoch; the round's now for a running job without a start
    request: et.JobRequest


class _Known(NamedTuple):
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
        rows = queries.open_jobs_whole_read(cluster_id=cluster.pk, statuses=statuses)
        out, _KNOWN[cluster.pk] = _open_jobs_first(rows, now_s=now_s, running=running)
        return out
    versions = queries.open_jobs_versions_read(cluster_id=cluster.pk, statuses=statuses)
    stale = [pk for pk, version in versions if (hit := known.get(pk)) is None or hit.version != version]
    if stale:
        fresh = {row[0]: row[1:] for row in queries.open_jobs_by_id_read(job_ids=stale, statuses=statuses)}
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


def _open_jobs_first(
    rows: Sequence[tuple[Any, ...]], *, now_s: float, running: set[str]
) -> tuple[list[_OpenJob], dict[int, _Known]]:
    """`_open_jobs` of a cluster read for the first time in this process: every row (id, version,
    the 20 columns) is new, so each becomes its job and what is kept of it in one pass, the
    two named tuples built directly (the general path, with its per-row lookups and calls,
    cost ~25 ms of CPU more for the full bench's 12,048 open jobs).  The same jobs and the same
    `_Known` entries as the general path."""
    kept: dict[int, _Known] = {}
    out: list[_OpenJob] = []
    append = out.append
    for row in rows:
        pk = row[0]
        started_at = row[21]
        is_running = row[20] in running
        job = _new_tuple(
            _OpenJob,
            (
                pk,
                is_running,
                started_at if started_at is not None else now_s,
                _job_request_from_row(pk, row[2:20]),
            ),
        )
        # a running job without a start is rebuilt each round (its start is the round's now)
        kept[pk] = _new_tuple(
            _Known, (row[1], job if not is_running or started_at is not None else None, row[2:])
        )
        append(job)
    return out, kept


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
# `JobRequest(...)` set slot by slot (as `engine.explain` builds its explanations): the
# dataclass ``__init__`` of a frozen class sets each of its 19 fields through
# ``object.__setattr__``; 12,048 requests of the full bench's first read cost 43-47 ms of CPU
# that way and 20-21 ms this way (equal requests).  Precision sets are shared (a few distinct ones).
_REQUEST_SETTERS = tuple(et.JobRequest.__dict__[f.name].__set__ for f in dataclasses.fields(et.JobRequest))
_PRECISIONS: dict[tuple[str, ...], frozenset[str]] = {}


_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(et.JobRequest))
_REQUEST_VALUES = operator.attrgetter(*_REQUEST_FIELDS)
_P50_AT, _P90_AT = _REQUEST_FIELDS.index("predicted_p50_s"), _REQUEST_FIELDS.index("predicted_p90_s")


def _with_runtime(request: et.JobRequest, *, p50: float, p90: float) -> et.JobRequest:
    """``dataclasses.replace(request, predicted_p50_s=p50, predicted_p90_s=p90)``, slot by slot
    (`_REQUEST_SETTERS`): 2,079 of them in the full bench's first round, 9 -> 4 ms of CPU."""
    values = list(_REQUEST_VALUES(request))
    values[_P50_AT], values[_P90_AT] = p50, p90
    answered = object.__new__(et.JobRequest)
    for setter, value in zip(_REQUEST_SETTERS, values, strict=True):
        setter(answered, value)
    return answered


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
    key = tuple(precisions)
    shared = _PRECISIONS.get(key)
    if shared is None:
        shared = frozenset(precisions)
        if len(_PRECISIONS) < 1_000:
            _PRECISIONS[key] = shared
    (
        set_id,
        set_user,
        set_project,
        set_gpu_count,
        set_submit_at,
        set_kind,
        set_gpu_type,
        set_min_memory_gib,
        set_precisions,
        set_requested_s,
        set_p50,
        set_p90,
        set_is_preemptible,
        set_is_checkpointable,
        set_checkpoint_interval_s,
        set_priority,
        set_name,
        set_attempt,
        set_first_submit_at,
    ) = _REQUEST_SETTERS
    request = object.__new__(et.JobRequest)
    set_id(request, str(pk))
    set_user(request, username)
    set_project(request, slug)
    set_gpu_count(request, gpu_count)
    set_submit_at(request, submit_at)
    set_kind(request, _KINDS[kind])
    set_gpu_type(request, gpu_type)
    set_min_memory_gib(request, min_memory_gib)
    set_precisions(request, shared)
    set_requested_s(request, float(requested_s) if requested_s is not None else None)
    set_p50(request, p50)
    set_p90(request, p90)
    set_is_preemptible(request, is_preemptible)
    set_is_checkpointable(request, is_checkpointable)
    set_checkpoint_interval_s(request, float(checkpoint_interval_s) if checkpoint_interval_s else None)
    set_priority(request, int(priority))
    set_name(request, name)
    set_attempt(request, attempt)
    set_first_submit_at(request, first_submit_at)
    return request
