"""Page-specific reads for the researcher pages: the dashboard and the availability outlook.

Everything here is built on the scoped selectors in ``scheduling.selectors`` (the user's own
work only) and the forecasting app's answers through the prediction port
(``scheduling.ports``); nothing writes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Max
from django.utils import timezone

from scheduling.models import Allocation, Booking, Cluster, Job, Node, Preemption
from scheduling.ports import prediction_port
from scheduling.selectors import availability_get, booking_list, gpu_type_list, job_list

HOUR = timedelta(hours=1)
RECENT_FINISHED = timedelta(hours=24)
RECENT_PREEMPTIONS = timedelta(days=7)


# ---- dashboard ----


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """One preemption of the user's job, said the way the dashboard says it."""

    job: Job
    signalled_at: datetime
    stopped_at: datetime  # killed_at, or the planned end of the grace period
    lost_gpu_h: float
    reason: str

    @property
    def is_back_running(self) -> bool:
        return self.job.status in (Job.Status.STARTING, Job.Status.RUNNING) and bool(
            self.job.started_at and self.job.started_at >= self.signalled_at
        )


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """Whether engine rounds are running; ``sentence`` says why not, for the dashboard."""

    is_paused: bool
    sentence: str = ""


_ENGINE_STATUS_TTL_S = 5.0
_engine_status_cache: list[tuple[float, EngineStatus]] = []


def engine_status_get(*, now: datetime | None = None) -> EngineStatus:
    """Paused when the broker (Redis) does not answer, or when no active cluster has had a round
    for ``max(60 s, 4 x BERTH_ENGINE_ROUND_INTERVAL_S)``.

    Rounds pause by themselves while Redis is down (the worker and beat cannot reach their
    broker) and resume when it is back; this only says so.  Kept per process for 5 s, so a
    dashboard polled by many users costs one PING and one query every 5 s.
    """
    import time

    clock = time.monotonic()
    if _engine_status_cache and clock - _engine_status_cache[0][0] < _ENGINE_STATUS_TTL_S and now is None:
        return _engine_status_cache[0][1]
    status = _engine_status_compute(now=now or timezone.now())
    _engine_status_cache[:] = [(clock, status)]
    return status


def engine_status_cache_clear() -> None:
    _engine_status_cache.clear()


def _engine_status_compute(*, now: datetime) -> EngineStatus:
    import redis

    try:
        redis.Redis.from_url(
            settings.BERTH_ENGINE_REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
        ).ping()
    except (redis.RedisError, OSError):
        return EngineStatus(
            is_paused=True,
            sentence="The scheduling engine is paused: its message broker is unreachable. "
            "Bookings and submissions are kept and the engine resumes by itself when the broker is back.",
        )
    stale_s = max(60, 4 * settings.BERTH_ENGINE_ROUND_INTERVAL_S)
    latest = Cluster.objects.filter(is_active=True).aggregate(at=Max("engine_rounds__started_at"))["at"]
    if latest is not None and (now - latest).total_seconds() > stale_s:
        return EngineStatus(
            is_paused=True,
            sentence=f"The scheduling engine is paused: no round since {latest:%H:%M} UTC. "
            "Bookings and submissions are kept and are scheduled when it resumes.",
        )
    return EngineStatus(is_paused=False)


@dataclass(frozen=True, slots=True)
class Dashboard:
    bookings: tuple[Booking, ...]  # open (confirmed or active), soonest first
    jobs: tuple[Job, ...]  # open (pending, starting, running), newest first
    finished_jobs: tuple[Job, ...]  # ended in the last day, newest first
    preemptions: tuple[PreemptionNotice, ...]  # last week, newest first
    engine: EngineStatus = EngineStatus(is_paused=False)

    @property
    def pending_count(self) -> int:
        return sum(1 for job in self.jobs if job.status == Job.Status.PENDING)

    @property
    def running_count(self) -> int:
        return sum(1 for job in self.jobs if job.status in (Job.Status.STARTING, Job.Status.RUNNING))


def dashboard_get(user: User, *, now: datetime | None = None, limit: int = 50) -> Dashboard:
    """The user's own open bookings and jobs, recently finished jobs and recent preemptions.

    A fixed number of queries whatever the amount of work (each list is capped at ``limit``).
    """
    now = now or timezone.now()
    bookings = booking_list(user, mine_only=True, status=Booking.OPEN_STATUSES).order_by("start_at", "id")
    jobs = job_list(user, mine_only=True, status=Job.OPEN_STATUSES).order_by("-submitted_at", "-id")
    finished = (
        job_list(user, mine_only=True)
        .exclude(status__in=Job.OPEN_STATUSES)
        .filter(ended_at__gte=now - RECENT_FINISHED)
        .order_by("-ended_at", "-id")
    )
    preemptions = (
        Preemption.objects.filter(job__user=user, signalled_at__gte=now - RECENT_PREEMPTIONS)
        .select_related("job", "job__gpu_type", "job__project")
        .order_by("-signalled_at", "-id")[:limit]
    )
    notices = tuple(
        PreemptionNotice(
            job=row.job,
            signalled_at=row.signalled_at,
            stopped_at=row.killed_at or row.kill_at,
            lost_gpu_h=row.lost_gpu_s / 3600.0,
            reason=row.reason,
        )
        for row in preemptions
    )
    return Dashboard(
        bookings=tuple(bookings[:limit]),
        jobs=tuple(jobs[:limit]),
        finished_jobs=tuple(finished[:10]),
        preemptions=notices,
        engine=engine_status_get(),
    )


# ---- availability outlook ----


@dataclass(frozen=True, slots=True)
class OutlookHour:
    start_at: datetime
    free_gpus: int  # free for the whole hour (bookable)
    booked_gpus: int  # held by bookings at some instant of the hour
    lendable_gpus: int  # booked-but-unused plus held headroom: what preemptible work may borrow
    forecast: float | None  # demand forecast (GPUs, hourly mean)
    forecast_lower80: float | None
    forecast_upper80: float | None
    booked_unused_gpus: int = 0  # of the booked ones, not in use (lent to preemptible work)
    held_gpus: int = 0  # of the free ones, held idle as interactive headroom (lendable too)

    def stack(self, capacity: int) -> tuple[int, int, int, int]:
        """Disjoint parts of the type's GPUs in the hour, adding up to ``capacity``: running work
        (held by jobs, neither booked nor free), booked and in use, lendable (booked but unused,
        plus held headroom), and free to book."""
        booked_in_use = max(0, self.booked_gpus - self.booked_unused_gpus)
        lendable = self.booked_unused_gpus + self.held_gpus
        free = max(0, self.free_gpus - self.held_gpus)
        running = max(0, capacity - self.free_gpus - self.booked_gpus)
        return running, booked_in_use, lendable, free


@dataclass(frozen=True, slots=True)
class TypeOutlook:
    gpu_type: str
    capacity: int
    hours: tuple[OutlookHour, ...]

    def chart_data(self) -> dict[str, Any]:
        """The numbers the chart draws (the table prints the same ones)."""
        return {
            "gpuType": self.gpu_type,
            "capacity": self.capacity,
            "hours": [timezone.localtime(h.start_at).strftime("%Y-%m-%dT%H:%M") for h in self.hours],
            "free": [h.free_gpus for h in self.hours],
            "booked": [h.booked_gpus for h in self.hours],
            # the stacked bars: disjoint parts adding up to the capacity (`OutlookHour.stack`)
            "stack": {
                name: [h.stack(self.capacity)[k] for h in self.hours]
                for k, name in enumerate(("running", "bookedInUse", "lendable", "freeToBook"))
            },
            "lendable": [h.lendable_gpus for h in self.hours],
            "forecast": [h.forecast for h in self.hours],
            "lower80": [h.forecast_lower80 for h in self.hours],
            "upper80": [h.forecast_upper80 for h in self.hours],
        }


def _booked_by_hour(
    *, gpu_type_id: int, start_at: datetime, steps: int, now: datetime
) -> tuple[list[int], list[int]]:
    """Per hour: GPUs held by open bookings, and of those the ones lendable.

    A booking that has started lends its GPUs to preemptible work (the portal has no telemetry
    of the owner's own use: what the owner runs through the portal holds the GPUs itself); the
    outlook projects that through the booking's end.  A booking that has not started lends
    nothing here: before its start its GPUs are simply free or used by other work.
    """
    end_at = start_at + steps * HOUR
    rows = Allocation.objects.filter(
        gpu__node__gpu_type_id=gpu_type_id,
        gpu__node__cluster__is_active=True,
        booking__isnull=False,
        booking__status__in=Booking.OPEN_STATUSES,
        period__overlap=DateTimeTZRange(start_at, end_at, "[)"),
    ).exclude(state=Allocation.State.RELEASED)
    booked: list[set[int]] = [set() for _ in range(steps)]
    unused: list[set[int]] = [set() for _ in range(steps)]
    for gpu_id, period, booking_start in rows.values_list("gpu_id", "period", "booking__start_at"):
        lower = max(period.lower or start_at, start_at)
        upper = min(period.upper or end_at, end_at)
        first = int((lower - start_at).total_seconds() // 3600)
        last = int(((upper - start_at).total_seconds() - 1) // 3600)
        is_lendable = booking_start <= now
        for i in range(max(first, 0), min(last, steps - 1) + 1):
            booked[i].add(gpu_id)
            if is_lendable:
                unused[i].add(gpu_id)
    return [len(s) for s in booked], [len(s) for s in unused]


def _headroom_by_hour(*, clusters: list[Cluster], start_at: datetime, hours: int) -> list[dict[str, int]]:
    """GPUs per type the engine holds idle as interactive headroom in each hour (all clusters).

    `PredictionPort.interactive_headroom` per hour, but only for the hours a stored interactive forecast
    can cover: it uses runs at most ``BERTH_HEADROOM_MAX_FORECAST_AGE_H`` old, so after the
    newest run's issue time plus that age the headroom is 0 and is not asked for.
    """
    out: list[dict[str, int]] = [defaultdict(int) for _ in range(hours)]
    port = prediction_port()
    newest = port.interactive_forecast_issued_latest(cluster_ids=[c.pk for c in clusters])
    max_age = timedelta(hours=settings.BERTH_HEADROOM_MAX_FORECAST_AGE_H)
    for cluster in clusters:
        latest = newest.get(cluster.pk)
        if latest is None:
            continue
        for i in range(hours):
            at = start_at + i * HOUR
            if at >= latest + max_age + HOUR:
                break
            for type_name, gpus in port.interactive_headroom(cluster_id=cluster.pk, at=at).items():
                out[i][type_name] += gpus
    return out


def availability_outlook(*, start_at: datetime, hours: int) -> list[TypeOutlook]:
    """Free, booked and lendable GPUs per GPU type and hour, with the demand forecast behind it.

    ``start_at`` is an hour boundary (aware).  Lendable = GPUs of started bookings not in use
    plus the interactive headroom the engine holds idle for the hour (both lendable to
    preemptible, checkpointing work and reclaimed with a grace period).  The forecast is the
    newest stored GPU-type demand forecast of each active cluster, summed over clusters.
    """
    now = timezone.now()
    start_at = start_at.astimezone(UTC)  # hours are real hours, also over a summer-time change
    port = prediction_port()
    clusters = list(Cluster.objects.filter(is_active=True).order_by("pk"))
    headroom = _headroom_by_hour(clusters=clusters, start_at=start_at, hours=hours)
    types_by_cluster: dict[int, set[str]] = defaultdict(set)
    for cluster_id, type_name in Node.objects.filter(cluster__in=clusters).values_list(
        "cluster_id", "gpu_type__name"
    ):
        types_by_cluster[cluster_id].add(type_name)
    out: list[TypeOutlook] = []
    for gpu_type in gpu_type_list().filter(nodes__cluster__is_active=True).distinct():
        availability = availability_get(
            gpu_type_name=gpu_type.name, start_at=start_at, end_at=start_at + hours * HOUR, step_s=3600
        )
        if availability.capacity == 0:
            continue
        # The newest stored demand forecast of the type per cluster (what forecast_band_get
        # draws, without the history it also loads), summed over clusters.
        by_ts: dict[datetime, list[float]] = {}
        for cluster in clusters:
            if gpu_type.name not in types_by_cluster[cluster.pk]:
                continue
            points = port.demand_forecast_points(cluster_id=cluster.pk, gpu_type=gpu_type.name, at=now)
            for point in points:
                sums = by_ts.setdefault(point.ts, [0.0, 0.0, 0.0])
                sums[0] += point.yhat
                sums[1] += point.lower80
                sums[2] += point.upper80
        booked, unused = _booked_by_hour(gpu_type_id=gpu_type.pk, start_at=start_at, steps=hours, now=now)
        rows = []
        for i, slot in enumerate(availability.slots):
            band_point = by_ts.get(slot.start_at)
            held = min(headroom[i].get(gpu_type.name, 0), slot.free_gpus)
            rows.append(
                OutlookHour(
                    start_at=slot.start_at,
                    free_gpus=slot.free_gpus,
                    booked_gpus=booked[i],
                    lendable_gpus=unused[i] + held,
                    booked_unused_gpus=unused[i],
                    held_gpus=held,
                    forecast=round(band_point[0], 2) if band_point else None,
                    forecast_lower80=round(band_point[1], 2) if band_point else None,
                    forecast_upper80=round(band_point[2], 2) if band_point else None,
                )
            )
        out.append(TypeOutlook(gpu_type.name, availability.capacity, tuple(rows)))
    return out
