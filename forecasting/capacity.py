"""Capacity planning: when forecast demand outgrows the cluster, and what-if replays.

* `capacity_exceed_when`: per GPU type, the first forecast hour whose demand (point, and the
  upper end of the 80% interval) exceeds the GPUs the cluster has.  Prophet's linear trend is
  what extrapolates growth over weeks, so the default model is ``prophet`` (``berth`` is
  sharper for the next day but forecasts at most one week and blends towards last week).
* `wait_trace_get` and `wait_replay`: the lab's own recent finished jobs on one type as a
  trace, replayed in the simulator (``scheduling.sim``: the same ``plan_round`` as production)
  on a given number of nodes and policy.  The what-if (``forecasting.services.
  capacity_study_execute``, stored as a `CapacityStudy`) replays it twice: as the cluster is
  and with GPUs added or removed.  Nothing here writes.
"""

from __future__ import annotations

import time
from collections import Counter
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
    from forecasting.selectors import forecast_events

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
