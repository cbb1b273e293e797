"""Every read of scheduling data, scoped by who asks.

Visibility: a user sees their own bookings and jobs, a project manager also sees those of
their projects, staff see everything.  Anything else does not exist for the user (404).
Availability is public to every signed-in user: it says how many GPUs are free, not whose.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, connections
from django.db.models import Count, Prefetch, Q, QuerySet
from django.http import Http404
from django.utils import timezone

from portal.accounts.models import Membership, Project
from scheduling import queries
from scheduling.alternatives import (  # noqa: F401 (re-exported: their old home)
    Alternative,
    BookingQuota,
    _earliest_start,
    booking_alternatives,
    booking_quota_get,
    job_warnings,
    peak_concurrent_gpus,
)
from scheduling.models import Allocation, AuditEvent, Booking, Cluster, GpuType, Job, Node
from scheduling.prepared import (  # re-exported: their old home
    prepared_execute as prepared_execute,
)
from scheduling.prepared import (
    prepared_fetchall as prepared_fetchall,
)

AnyUser = User | AnonymousUser
_Listed = TypeVar("_Listed", Booking, Job)

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _is_staff(user: AnyUser) -> bool:
    return bool(getattr(user, "is_staff", False))


def _uid(user: AnyUser) -> int:
    """The user's id; 0 (no such row) for an anonymous user, who then sees nothing."""
    return int(user.pk) if user.is_authenticated and user.pk is not None else 0


def _visible_q(user: AnyUser) -> Q:
    """Own objects, plus those of projects the user manages (one subquery, no extra round trip)."""
    managed = Membership.objects.filter(user_id=_uid(user), role=Membership.Role.MANAGER).values("project_id")
    return Q(user_id=_uid(user)) | Q(project_id__in=managed)


# ---- bookings and jobs ----


def _scoped(
    qs: QuerySet[_Listed], user: AnyUser, *, status: Sequence[str], project_slug: str | None, mine_only: bool
) -> QuerySet[_Listed]:
    """``qs`` (bookings or jobs) narrowed to what the user may see and to the list's filters."""
    if mine_only:
        qs = qs.filter(user_id=_uid(user))
    elif not _is_staff(user):
        qs = qs.filter(_visible_q(user))
    if status:
        qs = qs.filter(status__in=status)
    if project_slug:
        qs = qs.filter(project__slug=project_slug)
    return qs


def booking_list(
    user: AnyUser,
    *,
    status: Sequence[str] = (),
    project_slug: str | None = None,
    mine_only: bool = False,
) -> QuerySet[Booking]:
    """Bookings the user may see, newest start first, with everything the API shows preloaded."""
    qs = _scoped(Booking.objects.all(), user, status=status, project_slug=project_slug, mine_only=mine_only)
    held = (
        Allocation.objects.exclude(state=Allocation.State.RELEASED)
        .select_related("gpu__node")
        .only("id", "booking_id", "gpu__index", "gpu__node__name")
    )
    return qs.select_related("user", "project", "cluster", "gpu_type").prefetch_related(
        Prefetch("allocations", queryset=held.order_by("gpu_id"), to_attr="held_allocations")
    )


def booking_get(user: AnyUser, *, booking_id: int) -> Booking:
    """One visible booking, else 404 (another user's booking does not exist for you)."""
    booking = booking_list(user).filter(pk=booking_id).first()
    if booking is None:
        raise Http404("No such booking.")
    return booking


def job_list(
    user: AnyUser,
    *,
    status: Sequence[str] = (),
    project_slug: str | None = None,
    mine_only: bool = False,
) -> QuerySet[Job]:
    """Jobs the user may see, newest submission first."""
    qs = _scoped(Job.objects.all(), user, status=status, project_slug=project_slug, mine_only=mine_only)
    return qs.select_related("user", "project", "cluster", "gpu_type")


def jobs_waits_set(jobs: Iterable[Job]) -> None:
    """Set ``waited_s`` on each job: seconds it spent queued before its current run started, over
    every attempt (from its first submission, less the runs that preemptions or a lost node
    ended: their allocations' periods); None when it has not started.  One query for the jobs
    that ran before."""
    jobs = list(jobs)
    again = [job.pk for job in jobs if job.started_at is not None and job.attempt > 0]
    runs: dict[int, set[tuple[datetime, datetime]]] = defaultdict(set)
    if again:
        for job_id, period in Allocation.objects.filter(
            job_id__in=again, state=Allocation.State.ENDED
        ).values_list("job_id", "period"):
            if period.lower is not None and period.upper is not None:
                runs[job_id].add((period.lower, period.upper))  # one per run, not per GPU
    for job in jobs:
        started = job.started_at
        if started is None:
            job.waited_s = None
            continue
        earlier = sum((end - start).total_seconds() for start, end in runs.get(job.pk, ()) if end <= started)
        queued = (started - (job.first_submitted_at or job.submitted_at)).total_seconds()
        job.waited_s = max(0.0, queued - earlier)


def job_get(user: AnyUser, *, job_id: int) -> Job:
    """One visible job, else 404."""
    job = job_list(user).filter(pk=job_id).first()
    if job is None:
        raise Http404("No such job.")
    return job


# A job's output: at most this many lines from the end.
JOB_OUTPUT_MAX_LINES = 2000


def job_output_get(user: AnyUser, *, job_id: int, tail_lines: int = 200) -> tuple[Job, Any]:
    """The owner's job and the tail of its output (a `JobOutput`) read from its backend.

    Output is the owner's (and staff's) only: it may hold paths, tokens or data that a project
    manager who sees the job in lists should not read; anyone else gets a 404.  Raises
    `BackendError` when the backend cannot be reached (the API answers 503).
    """
    from scheduling.backend_registry import backend_for_cluster
    from scheduling.backends.base import JobOutput, UnsupportedOperationError

    job = job_get(user, job_id=job_id)
    if job.user_id != user.pk and not _is_staff(user):
        raise Http404("No such job.")
    tail_lines = max(1, min(int(tail_lines), JOB_OUTPUT_MAX_LINES))
    if job.started_at is None and not job.backend_ref and job.attempt == 0:
        return job, JobOutput(stdout="", exit_code=job.exit_code, source="not started yet")
    backend = backend_for_cluster(job.cluster)
    try:
        out = backend.job_output(str(job.pk), backend_ref=job.backend_ref, tail_lines=tail_lines)
    except UnsupportedOperationError:
        return job, JobOutput(stdout="", exit_code=job.exit_code, source="this backend keeps no output")
    if out.exit_code is None and job.exit_code is not None:
        out = JobOutput(
            stdout=out.stdout,
            stderr=out.stderr,
            exit_code=job.exit_code,
            source=out.source,
            is_truncated=out.is_truncated,
        )
    return job, out


def audit_event_list(
    user: AnyUser, *, entity_type: str | None = None, entity_id: int | None = None
) -> QuerySet[AuditEvent]:
    """The audit log; staff only (it names every user's actions)."""
    if not _is_staff(user):
        raise PermissionDenied("The audit log is for staff.")
    qs = AuditEvent.objects.select_related("actor")
    if entity_type:
        qs = qs.filter(entity_type=entity_type)
    if entity_id is not None:
        qs = qs.filter(entity_id=entity_id)
    return qs


# ---- inventory ----


def gpu_type_list() -> QuerySet[GpuType]:
    return GpuType.objects.order_by("name")


def cluster_list() -> QuerySet[Cluster]:
    return Cluster.objects.filter(is_active=True).order_by("name")


@dataclass(frozen=True, slots=True)
class ClusterCapacity:
    gpu_type: str
    gpu_count: int  # all GPUs of the type in the cluster
    up_gpu_count: int  # on nodes that are up (bookable)


def cluster_capacity() -> dict[int, list[ClusterCapacity]]:
    """GPUs per cluster and type, in one grouped query."""
    rows = (
        Node.objects.values("cluster_id", "gpu_type__name")
        .annotate(
            total=Count("gpus"),
            up=Count("gpus", filter=Q(status=Node.Status.UP)),
        )
        .order_by("cluster_id", "gpu_type__name")
    )
    out: dict[int, list[ClusterCapacity]] = defaultdict(list)
    for row in rows:
        out[row["cluster_id"]].append(ClusterCapacity(row["gpu_type__name"], row["total"], row["up"]))
    return out


# ---- availability ----


@dataclass(frozen=True, slots=True)
class AvailabilitySlot:
    start_at: datetime
    end_at: datetime
    free_gpus: int  # GPUs free during the whole slot


@dataclass(frozen=True, slots=True)
class Availability:
    gpu_type: str
    cluster: str | None
    capacity: int  # GPUs of the type on up nodes
    step_s: int
    start_at: datetime
    end_at: datetime
    free: tuple[int, ...]  # free GPUs per step (the API renders these without building slots)

    def boundaries(self) -> list[datetime]:
        """The ``len(free) + 1`` step boundaries; the last is ``end_at`` (computed, not added,
        so year 9999 cannot overflow)."""
        step = timedelta(seconds=self.step_s)
        out = [self.start_at + i * step for i in range(len(self.free))]
        out.append(self.end_at)
        return out

    @property
    def slots(self) -> tuple[AvailabilitySlot, ...]:
        b = self.boundaries()
        return tuple(AvailabilitySlot(b[i], b[i + 1], free) for i, free in enumerate(self.free))


def _validate_query_window(*, start_at: datetime, end_at: datetime, step_s: int) -> int:
    errors: dict[str, list[str]] = defaultdict(list)
    for name, value in (("start", start_at), ("end", end_at)):
        if timezone.is_naive(value):
            errors[name].append("Give a timezone (for example 2026-01-31T09:00:00Z).")
    if errors:
        raise ValidationError(dict(errors))
    if end_at <= start_at:
        errors["end"].append("The end must be after the start.")
    if step_s < settings.BERTH_AVAILABILITY_MIN_STEP_S:
        errors["step"].append(f"The step is at least {settings.BERTH_AVAILABILITY_MIN_STEP_S} s.")
    if errors:
        raise ValidationError(dict(errors))
    steps = math.ceil((end_at - start_at).total_seconds() / step_s)
    if steps > settings.BERTH_AVAILABILITY_MAX_STEPS:
        raise ValidationError(
            {"step": [f"At most {settings.BERTH_AVAILABILITY_MAX_STEPS} steps; use a larger step or window."]}
        )
    return steps


def _in_utc(value: datetime) -> datetime:
    """An aware time in UTC (a naive one unchanged, for the validation to refuse).  Python adds
    and subtracts times of one zone on the wall clock: in a zone with summer time, local
    midnight + 24 h or + 3 h over the change night is not 24 h or 3 h later, and the steps would
    be labelled an hour off the counts the database computed in real time."""
    return value.astimezone(UTC) if timezone.is_aware(value) else value


def _epoch_s(value: datetime) -> Decimal:
    """Seconds since the epoch, exactly (a float loses microseconds at today's epoch)."""
    delta = value - _EPOCH
    return Decimal(delta.days * 86_400 + delta.seconds) + Decimal(delta.microseconds).scaleb(-6)


# ---- the availability cache ----
# Availability is read far more often than GPUs are booked: each process keeps answers for a
# *generation* of the data, a counter of its own that a listener thread moves on.
#
# Invalidation is PostgreSQL's: statement triggers on allocations, GPUs, nodes, clusters and
# GPU types (migration 0005) send ``NOTIFY berth_availability`` for every write, whoever makes
# it (a service, a round, a queryset update, the admin, psql).  A notification is delivered when
# its transaction commits and never for one that rolls back; PostgreSQL sends one per
# transaction.  Each process that reads availability LISTENs on its own connection
# (`_AvailabilityWatch`) and starts a new generation per notification, so a cache hit costs no
# round trip to anyone.  While the listener is not connected (starting, PostgreSQL away) answers
# are computed and not cached; on (re)connecting it starts a new generation (it may have missed
# writes).  A transaction's own reads bypass the cache (it sees writes nobody else sees yet).
#
# Read your own writes: a notification reaches other processes a little after the commit, and
# a client may send its next read sooner.  So every successful write request leaves the
# PostgreSQL clock after its commits (`AvailabilityStampMiddleware`: cookie and response header
# ``Berth-Availability-After``; an API client echoes the header), and a read that carries such a
# stamp uses the cache only once the listener has seen a sync marker sent after that instant:
# markers (``sync:<epoch>``, from any process, asked for when a reader needs one) are queued
# behind every notification of a transaction that committed before them.  A reader without a
# stamp sees another's write once the notification arrives (well under a millisecond on an idle
# machine); ``BERTH_AVAILABILITY_CACHE_S`` bounds an entry's life whatever happens (0 turns the
# cache off).

_CHANNEL = "berth_availability"
_SYNC_PREFIX = "sync:"
_CACHE_MAX_ENTRIES = 2_000
_cache: dict[tuple[object, ...], tuple[float, Availability]] = {}
# The stamp (PostgreSQL epoch seconds) the current request carries; set by the middleware.
_read_after: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "berth_availability_after", default=None
)


class _AvailabilityWatch:
    """One listener thread per process: the generation and how far the notifications are synced.

    ``generation`` is None while the listener is not listening.  ``synced_to`` (epoch s of the
    PostgreSQL clock): every transaction that committed before it has been counted.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.generation: int | None = None
        self.synced_to = 0.0
        # A random start: answers a forked child inherited, or left by a stopped listener, are
        # keyed by the generations of another counter and must never match this one's.
        self._counter = secrets.randbits(48)
        self._sync_wanted = threading.Event()
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="berth-availability-listen", daemon=True)
        self._thread.start()

    def generation_for(self, after: float | None) -> int | None:
        """The generation a read may use; None: compute it afresh (and a sync marker is asked for
        when the listener is behind the read's stamp)."""
        generation = self.generation
        if generation is None or after is None or self.synced_to >= after:
            return generation
        self._sync_wanted.set()
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._sync_wanted.set()
        self._thread.join(timeout_s)

    def _notified(self, notify: psycopg.Notify) -> None:
        if notify.payload.startswith(_SYNC_PREFIX):
            with contextlib.suppress(ValueError):
                self.synced_to = max(self.synced_to, float(notify.payload[len(_SYNC_PREFIX) :]))
            return
        self._counter += 1
        self.generation = self._counter

    def _run(self) -> None:
        backoff_s = 0.5
        while not self._stop.is_set():
            try:
                self._listen()
                backoff_s = 0.5
            except Exception:  # PostgreSQL away: answers are computed, not cached, meanwhile
                logger.warning("availability listener: reconnecting in %.1f s", backoff_s, exc_info=True)
            self.generation = None
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
            self._stop.wait(backoff_s)
            backoff_s = min(backoff_s * 2, 10.0)

    def _listen(self) -> None:
        params = {
            k: v
            for k, v in connections["default"].get_connection_params().items()
            if k not in ("cursor_factory", "context", "prepare_threshold")
        }
        conn = psycopg.connect(**params, autocommit=True, application_name="berth-availability-listen")
        self._conn = conn
        conn.execute(f"LISTEN {_CHANNEL}")
        # Anything may have changed while nobody listened: a new generation from now on.
        self._counter += 1
        self.generation = self._counter
        while not self._stop.is_set():
            # Short waits: a reader that asked for a sync marker gets it within ~50 ms (it
            # computes its answer meanwhile).  A lost connection raises here.  What arrives
            # during the marker's own statement waits in psycopg's backlog for the next call.
            for notify in conn.notifies(timeout=0.05):
                self._notified(notify)
                if self._sync_wanted.is_set() or self._stop.is_set():
                    break
            if self._sync_wanted.is_set():
                self._sync_wanted.clear()
                conn.execute(
                    "SELECT pg_notify(%s, %s || date_part('epoch', clock_timestamp())::text)",
                    [_CHANNEL, _SYNC_PREFIX],
                )


_watch_lock = threading.Lock()
_watch: _AvailabilityWatch | None = None


def _availability_watch() -> _AvailabilityWatch:
    """This process's listener (started on first use; a forked child starts its own)."""
    global _watch
    watch = _watch
    if watch is not None and watch.pid == os.getpid():
        return watch
    with _watch_lock:
        if _watch is None or _watch.pid != os.getpid():
            _watch = _AvailabilityWatch()
        return _watch


def availability_watch_stop() -> None:
    """Stop this process's listener (its connection would keep a test database from being dropped)."""
    global _watch
    with _watch_lock:
        if _watch is not None and _watch.pid == os.getpid():
            _watch.stop()
        _watch = None
    _cache.clear()


def availability_stamp() -> float:
    """The PostgreSQL clock now (epoch s): a read stamped with it sees every write committed before."""
    return queries.clock_epoch_s()


@contextlib.contextmanager
def availability_read_after(stamp: float | None) -> Iterator[None]:
    """Reads in the block see every write committed before ``stamp`` (`availability_stamp`)."""
    token = _read_after.set(stamp)
    try:
        yield
    finally:
        _read_after.reset(token)


STAMP_HEADER = "Berth-Availability-After"
STAMP_COOKIE = "berth_availability_after"


def availability_get(
    *,
    gpu_type_name: str,
    start_at: datetime,
    end_at: datetime,
    step_s: int = 3600,
    cluster_name: str | None = None,
) -> Availability:
    """Free GPUs of one type per time step over ``[start_at, end_at)``, through the
    per-process cache described above (same answer as ``availability_compute``)."""
    start_at, end_at = _in_utc(start_at), _in_utc(end_at)
    ttl = float(settings.BERTH_AVAILABILITY_CACHE_S)
    generation = None
    if ttl > 0 and not connection.in_atomic_block:
        generation = _availability_watch().generation_for(_read_after.get())
    if generation is None:
        return availability_compute(
            gpu_type_name=gpu_type_name,
            start_at=start_at,
            end_at=end_at,
            step_s=step_s,
            cluster_name=cluster_name,
        )
    key = (generation, gpu_type_name, cluster_name or None, start_at, end_at, step_s)
    now = time.monotonic()
    hit = _cache.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    result = availability_compute(
        gpu_type_name=gpu_type_name,
        start_at=start_at,
        end_at=end_at,
        step_s=step_s,
        cluster_name=cluster_name,
    )
    if len(_cache) >= _CACHE_MAX_ENTRIES:
        _cache.clear()
    _cache[key] = (now + ttl, result)
    return result


def availability_compute(
    *,
    gpu_type_name: str,
    start_at: datetime,
    end_at: datetime,
    step_s: int = 3600,
    cluster_name: str | None = None,
) -> Availability:
    """Free GPUs of one type per time step over ``[start_at, end_at)``.

    A GPU counts as free in a step only if nothing holds it at any instant of that step, so
    a step's count is what one could book for that whole step.  One query (capacity and the
    steps each overlapping allocation touches) and a sweep in Python: O(allocations + steps).
    """
    start_at, end_at = _in_utc(start_at), _in_utc(end_at)
    steps = _validate_query_window(start_at=start_at, end_at=end_at, step_s=step_s)
    rows = queries.availability_rows(
        {
            "gpu_type": gpu_type_name,
            "cluster": cluster_name or None,
            "t0": _epoch_s(start_at),
            "step": step_s,
            "last": steps - 1,
            "start": start_at,
            "end": end_at,
        }
    )
    if not rows or rows[0][0] is not None:
        raise ValidationError({"gpu_type": [f"Unknown GPU type {gpu_type_name!r}."]})
    capacity = rows[0][1]
    if (
        cluster_name
        and capacity == 0
        and not Cluster.objects.filter(name=cluster_name, is_active=True).exists()
    ):
        raise ValidationError({"cluster": [f"Unknown cluster {cluster_name!r}."]})
    # An unbounded upper end (a running job with no expected end) reaches the last step.
    spans = [
        (int(gpu_id or 0), first, steps - 1 if last is None else last) for gpu_id, first, last in rows[1:]
    ]

    # Merge each GPU's spans so a GPU held twice within one step is counted once.
    busy_delta = [0] * (steps + 1)
    current: tuple[int, int, int] | None = None
    for span in spans:
        if current is not None and span[0] == current[0] and span[1] <= current[2] + 1:
            current = (current[0], current[1], max(current[2], span[2]))
            continue
        if current is not None:
            busy_delta[current[1]] += 1
            busy_delta[current[2] + 1] -= 1
        current = span
    if current is not None:
        busy_delta[current[1]] += 1
        busy_delta[current[2] + 1] -= 1

    free: list[int] = []
    busy = 0
    for i in range(steps):
        busy += busy_delta[i]
        free.append(max(capacity - busy, 0))
    return Availability(gpu_type_name, cluster_name, capacity, step_s, start_at, end_at, tuple(free))


def project_for_member(user: AnyUser, *, slug: str) -> Project:
    """An active project the user belongs to (staff: any); another project is a 404."""
    projects = Project.objects.filter(slug=slug, is_active=True)
    if not getattr(user, "is_staff", False):
        projects = projects.filter(memberships__user_id=int(user.pk or 0))
    project = projects.first()
    if project is None:
        raise Http404("No such project.")
    return project
