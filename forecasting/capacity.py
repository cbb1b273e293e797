"""Capacity planning: when forecast demand outgrows the cluster, and how many GPUs a wait target needs.

* `capacity_exceed_when`: per GPU type, the first forecast hour whose demand (point, and the
  upper end of the 80% interval) exceeds the GPUs the cluster has.  Prophet's linear trend is
  what extrapolates growth over weeks, so the default model is ``prophet`` (``berth`` is
  sharper for the next day but forecasts at most one week and blends towards last week).
* `capacity_for_wait_target`: what-if replays of the lab's own recent jobs on that type in
  the simulator (``scheduling.sim``: the same ``plan_round`` as production) with different
  node counts; a binary search for the fewest GPUs whose p95 batch wait meets the target.
  Bounded: at most ``max_replays`` replays, ``max_jobs`` jobs and ``time_budget_s`` seconds.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from forecasting.models import ForecastRun
from forecasting.selectors import cluster_capacity_by_type, demand_series_get, from_naive_utc, hour_floor
from scheduling.models import Allocation, Cluster, Job, Node

# ---- when does demand exceed capacity ----


@dataclass(frozen=True, slots=True)
class CapacityCrossing:
    gpu_type: str
    capacity_gpus: int
    yhat_exceeds_at: datetime | None  # first forecast hour with point demand > capacity
    upper80_exceeds_at: datetime | None  # first forecast hour with the 80% upper bound > capacity
    peak_yhat: float
    peak_upper80: float
    model_name: str
    issued_at: datetime
    horizon_h: int

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("yhat_exceeds_at", "upper80_exceeds_at", "issued_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


def capacity_exceed_when(
    *, cluster_id: int, horizon_days: int, at: datetime | None = None, model_name: str = "prophet"
) -> dict[str, CapacityCrossing]:
    """Per GPU type of the cluster: the first hour within ``horizon_days`` when forecast demand
    exceeds its capacity (GPUs on nodes that are not down).  Types without demand history get
    no crossing.  Fits one model per type now (about a second each); nothing is stored.
    """
    from forecasting.core.models import make_model
    from forecasting.services import forecast_events

    if horizon_days < 1:
        raise ValueError("horizon_days must be at least 1")
    issued = hour_floor(at or timezone.now())
    horizon_h = 24 * horizon_days
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    series = demand_series_get(cluster_id=cluster_id, end_at=issued)
    out: dict[str, CapacityCrossing] = {}
    for type_name, total in sorted(capacity.items()):
        y = series.get((ForecastRun.Kind.GPU_TYPE, type_name))
        yhat_at = upper_at = None
        peak_point = peak_upper = 0.0
        if y is not None and bool(np.any(y.to_numpy() > 0)):
            fc = make_model(model_name, events=forecast_events()).fit(y).forecast(horizon_h)
            point = np.nan_to_num(fc.point, nan=0.0)
            upper = np.maximum(np.nan_to_num(fc.upper, nan=0.0), point)
            peak_point, peak_upper = float(point.max()), float(upper.max())
            over = np.flatnonzero(point > total)
            yhat_at = from_naive_utc(fc.index[over[0]]) if len(over) else None
            over = np.flatnonzero(upper > total)
            upper_at = from_naive_utc(fc.index[over[0]]) if len(over) else None
        out[type_name] = CapacityCrossing(
            gpu_type=type_name,
            capacity_gpus=total,
            yhat_exceeds_at=yhat_at,
            upper80_exceeds_at=upper_at,
            peak_yhat=peak_point,
            peak_upper80=peak_upper,
            model_name=model_name,
            issued_at=issued,
            horizon_h=horizon_h,
        )
    return out


# ---- how many GPUs keep the wait under a target ----


@dataclass(frozen=True, slots=True)
class WaitPoint:
    gpus: int
    nodes: int
    wait_p95_s: float
    wait_mean_s: float
    utilization: float  # useful GPU-hours / (these GPUs x the replay's span): its own capacity
    unfinished_jobs: int
    wall_s: float
    useful_gpu_hours: float = 0.0
    span_h: float = 0.0  # first arrival to last completion
    too_large_jobs: int = 0  # jobs asking for more GPUs than these nodes have: they never run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class WaitTargetResult:
    gpu_type: str
    p95_wait_s: float
    current_gpus: int
    gpus_per_node: int
    answer_gpus: int | None  # None: not reachable within the searched range (see message)
    points: tuple[WaitPoint, ...]  # every evaluated count, ascending
    jobs: int
    message: str


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


def peak_concurrent_gpus(trace: Any) -> int:
    """Most GPUs the trace's jobs would hold at once if each started on arrival."""
    events: list[tuple[float, int]] = []
    for job in trace.jobs:
        events.append((job.submit_at, job.gpu_count))
        events.append((job.submit_at + job.runtime_s, -job.gpu_count))
    level = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        level += delta
        peak = max(peak, level)
    return peak


def wait_replay(
    trace: Any, *, gpu_type: str, nodes: int, gpus_per_node: int, policy: str = "berth", seed: int = 0
) -> WaitPoint:
    """Replay ``trace`` on ``nodes`` nodes of ``gpus_per_node`` GPUs of one type; batch waits."""
    from forecasting.core.runtime import HistoryRuntimePredictor
    from scheduling.engine import plan_round
    from scheduling.sim.inventory import parse_cluster_spec
    from scheduling.sim.metrics import compute_metrics
    from scheduling.sim.overlays import Overlay
    from scheduling.sim.replay import run_replay

    inventory = parse_cluster_spec(f"{nodes}x{gpus_per_node}:{gpu_type}")
    # The lab's own jobs only: no synthetic sessions or bookings, nothing preemptible.
    overlay = Overlay(
        sessions=(),
        bookings=(),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1800.0,
    )
    started = time.perf_counter()
    record = run_replay(
        trace,
        inventory,
        overlay,
        policy=policy,
        plan_fn=plan_round,
        predictor=HistoryRuntimePredictor(),
        seed=seed,
    )
    wall = time.perf_counter() - started
    metrics = compute_metrics(record)
    gpus = nodes * gpus_per_node
    return WaitPoint(
        gpus=gpus,
        nodes=nodes,
        wait_p95_s=float(metrics["wait_p95_s"]),
        wait_mean_s=float(metrics["wait_mean_s"]),
        utilization=float(metrics["utilization"]),
        unfinished_jobs=int(metrics["unfinished_jobs"]),
        wall_s=wall,
        useful_gpu_hours=float(metrics["useful_gpu_hours"]),
        span_h=max(record.span_end - record.span_start, 0.0) / 3600.0,
        too_large_jobs=sum(1 for job in trace.jobs if job.gpu_count > gpus),
    )


def _gpus_per_node(*, cluster_id: int, gpu_type: str) -> int:
    sizes = Counter(
        Node.objects.filter(cluster_id=cluster_id, gpu_type__name=gpu_type).values_list(
            "gpu_count", flat=True
        )
    )
    return sizes.most_common(1)[0][0] if sizes else 8


def _policy_name(*, cluster_id: int) -> str:
    raw = (Cluster.objects.filter(pk=cluster_id).values_list("settings", flat=True).first() or {}).get(
        "policy"
    )
    name = raw if isinstance(raw, str) else (raw or {}).get("name") if isinstance(raw, dict) else None
    return str(name or settings.BERTH_ENGINE_POLICY)


ProgressFn = Callable[[Sequence[WaitPoint], int, int], None]


def capacity_for_wait_target(
    *,
    cluster_id: int,
    gpu_type: str,
    p95_wait_s: float,
    history_days: int = 14,
    at: datetime | None = None,
    max_jobs: int | None = None,
    max_replays: int | None = None,
    time_budget_s: float | None = None,
    policy: str | None = None,
    on_progress: ProgressFn | None = None,
) -> WaitTargetResult:
    """The fewest GPUs of ``gpu_type`` (whole nodes of the cluster's usual size) whose replayed
    p95 batch wait is at most ``p95_wait_s``.

    Replays the type's finished jobs of the last ``history_days`` days.  The search range is
    from the nodes the largest job needs to the nodes that hold the peak concurrent demand
    (where nothing should wait); it is binary search, so the answer is monotone by
    construction: the answer meets the target and one node fewer (when evaluated) does not.
    When the replay budget runs out the smallest passing count found so far is returned and
    the message says the answer is an upper bound.  ``on_progress(points, done, planned)``
    is called after every replay.
    """
    max_jobs = settings.BERTH_CAPACITY_MAX_JOBS if max_jobs is None else max_jobs
    max_replays = settings.BERTH_CAPACITY_MAX_REPLAYS if max_replays is None else max_replays
    time_budget_s = settings.BERTH_CAPACITY_TIME_BUDGET_S if time_budget_s is None else time_budget_s
    policy = policy or _policy_name(cluster_id=cluster_id)
    end = at or timezone.now()
    trace = wait_trace_get(
        cluster_id=cluster_id,
        gpu_type=gpu_type,
        start_at=end - timedelta(days=history_days),
        end_at=end,
        max_jobs=max_jobs,
    )
    per_node = _gpus_per_node(cluster_id=cluster_id, gpu_type=gpu_type)
    current = cluster_capacity_by_type(cluster_id=cluster_id).get(gpu_type, 0)
    if not trace.jobs:
        return WaitTargetResult(
            gpu_type=gpu_type,
            p95_wait_s=p95_wait_s,
            current_gpus=current,
            gpus_per_node=per_node,
            answer_gpus=None,
            points=(),
            jobs=0,
            message="No finished jobs on this type in the window.",
        )
    search = _NodeSearch(
        trace=trace,
        gpu_type=gpu_type,
        per_node=per_node,
        policy=policy,
        p95_wait_s=p95_wait_s,
        max_replays=max_replays,
        time_budget_s=time_budget_s,
        on_progress=on_progress,
    )
    answer, message = search.run()
    return WaitTargetResult(
        gpu_type=gpu_type,
        p95_wait_s=p95_wait_s,
        current_gpus=current,
        gpus_per_node=per_node,
        answer_gpus=answer * per_node if answer is not None else None,
        points=tuple(sorted(search.points.values(), key=lambda p: p.gpus)),
        jobs=len(trace.jobs),
        message=message,
    )


class _NodeSearch:
    """Binary search over whole nodes for :func:`capacity_for_wait_target` (one replay per count)."""

    def __init__(
        self,
        *,
        trace: Any,
        gpu_type: str,
        per_node: int,
        policy: str,
        p95_wait_s: float,
        max_replays: int,
        time_budget_s: float,
        on_progress: ProgressFn | None,
    ) -> None:
        self.trace, self.gpu_type, self.per_node, self.policy = trace, gpu_type, per_node, policy
        self.p95_wait_s, self.max_replays, self.time_budget_s = p95_wait_s, max_replays, time_budget_s
        self.on_progress = on_progress
        self.lo = max(1, math.ceil(max(j.gpu_count for j in trace.jobs) / per_node))
        self.hi = max(self.lo, math.ceil(peak_concurrent_gpus(trace) / per_node))
        self.planned = min(max_replays, 2 + math.ceil(math.log2(max(self.hi - self.lo, 1))))
        self.points: dict[int, WaitPoint] = {}
        self.started = time.monotonic()

    def evaluate(self, nodes: int) -> WaitPoint:
        points = self.points
        if nodes not in points:
            points[nodes] = wait_replay(
                self.trace,
                gpu_type=self.gpu_type,
                nodes=nodes,
                gpus_per_node=self.per_node,
                policy=self.policy,
            )
            if self.on_progress is not None:
                self.on_progress(sorted(points.values(), key=lambda p: p.gpus), len(points), self.planned)
        return points[nodes]

    def budget_left(self) -> bool:
        return len(self.points) < self.max_replays and time.monotonic() - self.started < self.time_budget_s

    def meets(self, nodes: int) -> bool:
        point = self.evaluate(nodes)
        return point.unfinished_jobs == 0 and point.wait_p95_s <= self.p95_wait_s

    def run(self) -> tuple[int | None, str]:
        """(answer in nodes or None, the sentence for the page)."""
        lo, hi, per_node, p95_wait_s = self.lo, self.hi, self.per_node, self.p95_wait_s
        if not self.meets(hi):
            return (
                None,
                f"Even {hi * per_node} GPUs (the peak concurrent demand) give a p95 wait of "
                f"{self.points[hi].wait_p95_s:.0f} s; the target is below the scheduler's own latency.",
            )
        if self.budget_left() and self.meets(lo):
            return lo, f"{lo * per_node} GPUs (enough for the largest job) already meet the target."
        fail, ok = lo, hi
        while ok - fail > 1 and self.budget_left():
            mid = (fail + ok) // 2
            if self.meets(mid):
                ok = mid
            else:
                fail = mid
        exact = ok - fail <= 1 and fail in self.points
        note = "" if exact else " (an upper bound: the replay budget ran out)"
        message = f"{ok * per_node} GPUs keep the p95 wait under {p95_wait_s:.0f} s{note}."
        return ok, message + _anomaly(self.points)


def _anomaly(points: dict[int, WaitPoint]) -> str:
    """A sentence when a larger replay waited clearly longer than a smaller one, else ""."""
    ordered = sorted(points.values(), key=lambda p: p.gpus)
    for small, large in itertools.pairwise(ordered):
        if large.wait_p95_s > 1.1 * small.wait_p95_s + 60.0:
            return (
                f" The replays are not monotone here ({large.gpus} GPUs waited longer than {small.gpus}:"
                " a scheduling anomaly of this workload), so a count between the evaluated ones may"
                " also do."
            )
    return ""
