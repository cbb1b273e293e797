"""The live demo's load generator: new work keeps arriving while someone watches.

`make demo` turns it on (``BERTH_DEMO_LOAD=1``); it is off everywhere else, and the Celery
beat entry exists only when it is on.  Every ``BERTH_DEMO_LOAD_TICK_S`` a beat task calls
`demo_load_tick`, which submits batch jobs, on-demand sessions and the odd booking through
the ordinary services (`job_submit`, `booking_create`), as the demo's researchers.

The rate is the demo lab's own: arrivals per hour of the day, counted over the history the
demo lab replayed from the shipped trace (its batch jobs and its sessions), times
``BERTH_DEMO_LOAD_SCALE``.  What arrives is a copy of a job of that history picked at random
(its person, project, GPU type and count, runtime estimate and true runtime for the
simulator), so the live load looks like the past the pages show.  The draw is seeded by the
cluster and the tick's instant, so a tick repeated (a redelivered task) submits the same work
at most once (the job names carry the tick).

Bounded so it never floods: at most ``BERTH_DEMO_LOAD_MAX_PER_TICK`` submissions a tick, and
none while the cluster already has ``BERTH_DEMO_LOAD_MAX_PENDING`` pending jobs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from scheduling.models import AuditEvent, Cluster, GpuType, Job

logger = logging.getLogger(__name__)

LOAD_SOURCE = "demo-load"
HISTORY_SOURCE = "pwa_kth_sp2_1996"  # the demo lab's replayed history (demo_lab.HISTORY_SOURCE)
# Bookings are not in the trace: a few an hour, as a lab's people book windows ahead.
BOOKINGS_PER_HOUR = 1.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One job of the history to copy."""

    user_id: int
    project_id: int
    kind: str
    gpu_count: int
    gpu_type_id: int | None
    requested_s: int | None
    runtime_s: float


@dataclass(slots=True)
class TickResult:
    """What one tick did (the task logs it; the tests read it)."""

    is_enabled: bool = True
    expected: float = 0.0  # arrivals expected in this tick (Poisson mean)
    jobs: list[int] = field(default_factory=list)
    sessions: list[int] = field(default_factory=list)
    bookings: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    pending_before: int = 0
    is_full: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.is_enabled,
            "expected": round(self.expected, 3),
            "jobs": len(self.jobs),
            "sessions": len(self.sessions),
            "bookings": len(self.bookings),
            "skipped": self.skipped[:5],
            "pending_before": self.pending_before,
            "full": self.is_full,
        }


def _history(cluster: Cluster) -> tuple[dict[int, list[Sample]], float]:
    """The history's jobs by hour of day (of their first submission) and its length in days."""
    rows = Job.objects.filter(
        cluster=cluster, payload__source=HISTORY_SOURCE, first_submitted_at__isnull=False
    ).values_list(
        "user_id",
        "project_id",
        "kind",
        "gpu_count",
        "gpu_type_id",
        "requested_s",
        "started_at",
        "ended_at",
        "first_submitted_at",
        "payload",
    )
    by_hour: dict[int, list[Sample]] = defaultdict(list)
    first: datetime | None = None
    last: datetime | None = None
    for user_id, project_id, kind, gpus, type_id, requested, started, ended, submitted, payload in rows:
        if submitted is None:  # every job has one; the column's type allows none
            continue
        if started is not None and ended is not None:
            runtime = (ended - started).total_seconds()
        else:
            runtime = float((payload or {}).get("sim_runtime_s") or requested or 600)
        by_hour[submitted.hour].append(
            Sample(user_id, project_id, kind, gpus, type_id, requested, max(60.0, runtime))
        )
        first = submitted if first is None or submitted < first else first
        last = submitted if last is None or submitted > last else last
    days = max(1.0, (last - first).total_seconds() / 86_400.0) if first and last else 1.0
    return by_hour, days


@dataclass(slots=True)
class _Pools:
    """Per GPU type: GPUs in the cluster, GPUs asked for by pending work, and each project's
    limit there (guarantee + borrowing limit; a type it may not use at all is 0)."""

    capacity: dict[int, int]
    queued: dict[int, int]
    limits: dict[tuple[int, int], int]

    def limit(self, project_id: int, type_id: int) -> int:
        return self.limits.get((project_id, type_id), self.capacity.get(type_id, 0))

    def retarget(self, sample: Sample) -> tuple[int | None, int]:
        """The type and GPU count for a copy of ``sample``: its own, unless that pool's queue is
        already as large as the pool, then the pool whose queue is the smallest share of its
        size (among those the project may use), with the same share of that pool as the sample
        took of its own.  So work queues on every type in proportion to its capacity, and a
        one-GPU pool is not buried under a hundred GPUs of demand."""
        own = sample.gpu_type_id
        if own is None or own not in self.capacity or self.queued.get(own, 0) < self.capacity[own]:
            return own, sample.gpu_count
        share = sample.gpu_count / self.capacity[own]
        room = {
            t: (self.queued.get(t, 0) + max(1, round(share * cap))) / cap
            for t, cap in self.capacity.items()
            if cap > 0 and self.queued.get(t, 0) < cap and self.limit(sample.project_id, t) > 0
        }
        if not room:
            return own, sample.gpu_count  # every pool is queued up: the tick's bounds decide
        target = min(room, key=lambda t: (room[t], t))
        count = max(1, min(self.limit(sample.project_id, target), round(share * self.capacity[target])))
        return target, count

    def add(self, type_id: int | None, gpu_count: int) -> None:
        if type_id is not None:
            self.queued[type_id] = self.queued.get(type_id, 0) + gpu_count


def _pools(cluster: Cluster, project_ids: Iterable[int]) -> _Pools:
    from django.db.models import Sum

    from portal.accounts.models import Quota
    from scheduling.models import Node

    capacity: dict[int, int] = defaultdict(int)
    for type_id, gpus in Node.objects.filter(cluster=cluster).values_list("gpu_type_id", "gpu_count"):
        capacity[type_id] += gpus
    queued = {
        type_id: int(gpus or 0)
        for type_id, gpus in Job.objects.filter(
            cluster=cluster, status=Job.Status.PENDING, gpu_type__isnull=False
        )
        .values_list("gpu_type_id")
        .annotate(gpus=Sum("gpu_count"))
    }
    limits = {
        (project_id, type_id): guaranteed + borrow if borrow is not None else capacity.get(type_id, 0)
        for project_id, type_id, guaranteed, borrow in Quota.objects.filter(
            project_id__in=list(project_ids)
        ).values_list("project_id", "gpu_type_id", "guaranteed_gpus", "borrow_limit_gpus")
    }
    return _Pools(dict(capacity), queued, limits)


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method: fine for the small means of one tick."""
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def demo_load_tick(
    *, cluster_id: int, now: datetime | None = None, tick_s: float | None = None
) -> TickResult:
    """Submit this tick's arrivals on ``cluster_id`` (see the module docstring); a no-op when off."""
    from django.contrib.auth import get_user_model

    from portal.accounts.models import Project, Quota

    result = TickResult(is_enabled=bool(settings.BERTH_DEMO_LOAD))
    if not result.is_enabled:
        return result
    now = now or timezone.now()
    tick_s = tick_s or float(settings.BERTH_DEMO_LOAD_TICK_S)
    cluster = Cluster.objects.filter(pk=cluster_id, is_active=True).first()
    if cluster is None:
        result.skipped.append("no such active cluster")
        return result
    result.pending_before = Job.objects.filter(cluster=cluster, status=Job.Status.PENDING).count()
    room = int(settings.BERTH_DEMO_LOAD_MAX_PENDING) - result.pending_before
    if room <= 0:
        result.is_full = True
        return result
    by_hour, days = _history(cluster)
    samples = by_hour.get(now.hour, [])
    per_hour = len(samples) / days * float(settings.BERTH_DEMO_LOAD_SCALE)
    result.expected = per_hour * tick_s / 3600.0
    tick = int(now.timestamp() // tick_s)
    rng = random.Random(f"demo-load:{cluster.pk}:{tick}")
    count = min(_poisson(rng, result.expected), int(settings.BERTH_DEMO_LOAD_MAX_PER_TICK), room)
    users = {u.pk: u for u in get_user_model().objects.filter(pk__in={s.user_id for s in samples})}
    projects = {p.pk: p for p in Project.objects.filter(pk__in={s.project_id for s in samples})}
    types = {t.pk: t for t in GpuType.objects.filter(nodes__cluster=cluster).distinct()}
    quotas = {
        (project_id, type_id): gpus
        for project_id, type_id, gpus in Quota.objects.filter(project_id__in=projects).values_list(
            "project_id", "gpu_type_id", "guaranteed_gpus"
        )
    }
    tick_state = _Tick(cluster, now, tick, rng, users, projects, types, quotas, result)
    _submit_arrivals(tick_state, samples, count=count, pools=_pools(cluster, projects))
    # Now and then a booking ahead, on the most plentiful type.
    if types and rng.random() < BOOKINGS_PER_HOUR * tick_s / 3600.0 * float(settings.BERTH_DEMO_LOAD_SCALE):
        _book_ahead(tick_state, samples)
    return result


@dataclass(slots=True)
class _Tick:
    """What one tick submits with: the cluster, its instant and seeded draw, people and types."""

    cluster: Cluster
    now: datetime
    tick: int
    rng: random.Random
    users: dict[int, Any]
    projects: dict[int, Any]
    types: dict[int, GpuType]
    quotas: dict[tuple[int, int], int]
    result: TickResult


def _submit_arrivals(t: _Tick, samples: list[Sample], *, count: int, pools: _Pools) -> None:
    """``count`` copies of history jobs through `job_submit` (sessions as sessions)."""
    from scheduling.services import job_submit

    for i in range(count):
        sample = t.rng.choice(samples)
        user, project = t.users.get(sample.user_id), t.projects.get(sample.project_id)
        if user is None or project is None:
            continue
        is_session = sample.kind == Job.Kind.INTERACTIVE
        if not is_session:
            type_id, gpu_count = pools.retarget(sample)
            sample = dataclasses.replace(sample, gpu_type_id=type_id, gpu_count=gpu_count)
        # Above the project's guarantee only preemptible work runs (the portal says so at submit).
        guaranteed = t.quotas.get((sample.project_id, sample.gpu_type_id or 0), 0)
        is_preemptible = not is_session and (t.rng.random() < 0.5 or sample.gpu_count > guaranteed)
        is_checkpointable = is_preemptible and t.rng.random() < 0.5
        name = f"{'session' if is_session else project.slug}-live-{t.tick}-{i}"
        if Job.objects.filter(cluster=t.cluster, name=name).exists():
            continue  # this tick ran already (a redelivered task)
        try:
            job = job_submit(
                user,
                project=project,
                name=name,
                gpu_count=sample.gpu_count,
                cluster=t.cluster,
                gpu_type=None if is_session else t.types.get(sample.gpu_type_id or -1),
                kind=sample.kind,
                requested_s=sample.requested_s,
                is_preemptible=is_preemptible,
                is_checkpointable=is_checkpointable,
                checkpoint_interval_s=900 if is_checkpointable else None,
                payload={
                    "command": "jupyter lab" if is_session else f"python train.py --run {name}",
                    "source": LOAD_SOURCE,
                    "sim_runtime_s": round(sample.runtime_s, 1),
                },
                actor_label=AuditEvent.Actor.ADMIN,
                now=t.now,
            )
        except (ValidationError, PermissionDenied) as exc:
            t.result.skipped.append(f"{name}: {exc}")
            continue
        (t.result.sessions if is_session else t.result.jobs).append(job.pk)
        if not is_session:
            pools.add(sample.gpu_type_id, sample.gpu_count)


def _book_ahead(t: _Tick, samples: list[Sample]) -> None:
    """A booking a little ahead by one of this hour's people, through `booking_create`."""
    from scheduling.services import BookingConflictError, booking_create

    people = [s for s in samples if s.kind == Job.Kind.BATCH] or samples
    booker = t.rng.choice(people) if people else None
    user = t.users.get(booker.user_id) if booker else None
    project = t.projects.get(booker.project_id) if booker else None
    gpu_type = max(t.types.values(), key=lambda gt: gt.nodes.filter(cluster=t.cluster).count())
    note = f"{LOAD_SOURCE} {t.tick}"
    if user is not None and project is not None and not t.cluster.bookings.filter(note=note).exists():
        start_at = (t.now + timedelta(minutes=t.rng.choice((15, 30, 60, 120)))).replace(
            second=0, microsecond=0
        )
        try:
            booking = booking_create(
                user,
                project=project,
                cluster=t.cluster,
                gpu_type=gpu_type,
                gpu_count=t.rng.choice((1, 1, 2, 4)),
                start_at=start_at,
                end_at=start_at + timedelta(hours=t.rng.choice((1, 2, 3))),
                note=note,
                actor_label=AuditEvent.Actor.ADMIN,
                now=t.now,
            )
            t.result.bookings.append(booking.pk)
        except (ValidationError, PermissionDenied, BookingConflictError) as exc:
            t.result.skipped.append(f"booking: {exc}")
