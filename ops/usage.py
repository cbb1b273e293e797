"""Utilization and fairness reads for the staff pages (from allocation periods and jobs).

Queries are bounded: each selector runs a fixed number of queries whatever the range, and
buckets in Python.  Split from `ops.selectors` (house rule); callers check ``is_staff``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from ops.tables import Range, Table, _label
from portal.accounts.models import Project, Quota
from scheduling.models import Allocation, Job, Node
from scheduling.stats import jain_index, quantile

HEATMAP_MAX_COLUMNS = 7 * 24

# ---- utilization ----


@dataclass(frozen=True, slots=True)
class _Busy:
    gpu_id: int
    node: str
    gpu_type: str
    value: float
    project: str
    lower: datetime
    upper: datetime


def _busy_periods(*, cluster_id: int, rng: Range, now: datetime) -> list[_Busy]:
    """Allocation periods clipped to the range and to now (one query).

    Released allocations never ran; planned ones count only for the part already past (a
    booking holds its GPUs from its start whether or not its owner uses them).
    """
    stop = min(rng.end_at, now)
    rows = (
        Allocation.objects.filter(
            gpu__node__cluster_id=cluster_id, period__overlap=DateTimeTZRange(rng.start_at, stop, "[)")
        )
        .exclude(state=Allocation.State.RELEASED)
        .values_list(
            "gpu_id",
            "gpu__node__name",
            "gpu__node__gpu_type__name",
            "gpu__node__gpu_type__value",
            "job__project__slug",
            "booking__project__slug",
            "period",
        )
    )
    out = []
    for gpu_id, node, type_name, value, job_project, booking_project, period in rows:
        lower = max(period.lower or rng.start_at, rng.start_at)
        upper = min(period.upper or stop, stop)
        if upper > lower:
            out.append(
                _Busy(gpu_id, node, type_name, value, job_project or booking_project or "?", lower, upper)
            )
    return out


def _spread(periods: Iterable[_Busy], rng: Range, key: Any, weight: Any = None) -> dict[Any, list[float]]:
    """GPU-hours per key per bucket (a period crossing buckets is split at their edges)."""
    n = len(rng.starts())
    out: dict[Any, list[float]] = defaultdict(lambda: [0.0] * n)
    for p in periods:
        w = weight(p) if weight else 1.0
        i = rng.index(p.lower)
        t = p.lower
        while t < p.upper and i < n:
            edge = min(rng.start_at + (i + 1) * rng.step, p.upper)
            out[key(p)][i] += w * (edge - t).total_seconds() / 3600.0
            t, i = edge, i + 1
    return out


def _capacity_gpus(cluster_id: int) -> dict[str, int]:
    cap: dict[str, int] = defaultdict(int)
    for type_name, count in Node.objects.filter(cluster_id=cluster_id).values_list(
        "gpu_type__name", "gpu_count"
    ):
        cap[type_name] += count
    return dict(cap)


def _span_text(rng: Range, now: datetime) -> str:
    stop = min(rng.end_at, now)
    return f"between {rng.start_at:%Y-%m-%d %H:%M} and {stop:%Y-%m-%d %H:%M} UTC"


def _first_work_at(cluster_id: int) -> datetime | None:
    """When the cluster's first allocation (job or booking) began: before it there is no record."""
    first = (
        Allocation.objects.filter(gpu__node__cluster_id=cluster_id)
        .exclude(state=Allocation.State.RELEASED)
        .order_by("period")
        .values_list("period", flat=True)
        .first()
    )
    return first.lower if first is not None else None


def _before_record(rng: Range, first_at: datetime | None) -> list[bool]:
    """Per bucket: does it end before the first record (its cells are "no data", not 0)?"""
    if first_at is None:
        return [False] * len(rng.starts())
    return [start + rng.step <= first_at for start in rng.starts()]


def _no_data_note(before: Sequence[bool], first_at: datetime | None, what: str) -> str:
    if first_at is None or not any(before):
        return ""
    return (
        f"“–” marks periods before {first_at:%Y-%m-%d %H:%M} UTC, when {what}: "
        "there is no record then, which is not the same as 0."
    )


def no_work_reason(*, cluster_id: int, rng: Range, now: datetime) -> str:
    """Why no GPU-hours fall in the range, in words: no work ever, work only before or after it."""
    held = Allocation.objects.filter(gpu__node__cluster_id=cluster_id).exclude(
        state=Allocation.State.RELEASED
    )
    first = held.order_by("period").values_list("period", flat=True).first()
    if first is None:
        return "This cluster has run no work yet: no job or booking has held one of its GPUs."
    last = held.order_by("-period").values_list("period", flat=True).first()
    if first.lower is not None and first.lower >= min(rng.end_at, now):
        return (
            f"No GPU was busy {_span_text(rng, now)}: the cluster's first work started "
            f"{first.lower:%Y-%m-%d %H:%M} UTC."
        )
    if last is not None and last.lower is not None and last.lower < rng.start_at:
        return (
            f"No GPU was busy {_span_text(rng, now)}: the latest work started "
            f"{last.lower:%Y-%m-%d %H:%M} UTC. Choose more days to see it."
        )
    return f"No GPU was busy {_span_text(rng, now)}."


def utilization_get(*, cluster_id: int, rng: Range, now: datetime | None = None) -> list[Table]:
    """Busy GPU-hours per bucket by GPU type and by project (stacked), and per node busy fraction."""
    now = now or timezone.now()
    periods = _busy_periods(cluster_id=cluster_id, rng=rng, now=now)
    starts = rng.starts()
    labels = [_label(s, rng.bucket) for s in starts]
    step_h = rng.step.total_seconds() / 3600.0
    capacity = _capacity_gpus(cluster_id)
    total_gpus = sum(capacity.values())

    first_at = _first_work_at(cluster_id)
    before = _before_record(rng, first_at)
    note = _no_data_note(before, first_at, "the cluster's first recorded work started")
    by_type = _spread(periods, rng, key=lambda p: p.gpu_type)
    types = sorted(set(capacity) | set(by_type))
    type_rows: list[tuple[Any, ...]] = []
    for i, label in enumerate(labels):
        if before[i]:
            type_rows.append((label, *(None for _ in types), None))
            continue
        busy = [round(by_type[t][i], 2) if t in by_type else 0.0 for t in types]
        util = round(100.0 * sum(busy) / (total_gpus * step_h), 1) if total_gpus else 0.0
        type_rows.append((label, *busy, util))
    reason = "" if periods else no_work_reason(cluster_id=cluster_id, rng=rng, now=now)
    by_type_table = Table(
        name="utilization-by-type",
        caption="Busy GPU-hours by GPU type",
        headers=("Period", *types, "Utilization %"),
        rows=tuple(type_rows),
        chart="stacked",
        extra={"skip_last": True},
        empty_reason=reason or "This cluster has no GPUs.",
        note=note,
    )

    by_project = _spread(periods, rng, key=lambda p: p.project)
    projects = sorted(by_project)
    project_rows = [
        (label, *(None if before[i] else round(by_project[p][i], 2) for p in projects))
        for i, label in enumerate(labels)
    ]
    by_project_table = Table(
        name="utilization-by-project",
        caption="Busy GPU-hours by project",
        headers=("Period", *projects),
        rows=tuple(project_rows),
        chart="stacked",
        empty_reason=reason,
        note=note,
    )

    heatmap = _heatmap(periods, rng, cluster_id=cluster_id, reason=reason)
    return [by_type_table, by_project_table, heatmap]


def _heatmap(periods: list[_Busy], rng: Range, *, cluster_id: int, reason: str) -> Table:
    """Node x time heatmap: busy fraction = busy GPU-hours / (GPUs on the node x bucket length).

    More than a week of hours would be thousands of cells per node: those go per day."""
    heat_rng = rng if len(rng.starts()) <= HEATMAP_MAX_COLUMNS else Range(rng.start_at, rng.end_at, "day")
    # Columns start at the bucket of the first busy period: before the cluster's history there
    # is nothing to colour, and a wall of empty columns hides the part that says something.
    if periods:
        first = min(p.lower for p in periods)
        heat_rng = Range(
            heat_rng.start_at + heat_rng.index(first) * heat_rng.step, heat_rng.end_at, heat_rng.bucket
        )
    heat_labels = [_label(s, heat_rng.bucket) for s in heat_rng.starts()]
    heat_step_h = heat_rng.step.total_seconds() / 3600.0
    nodes = list(Node.objects.filter(cluster_id=cluster_id).order_by("name").values_list("name", "gpu_count"))
    by_node = _spread(periods, heat_rng, key=lambda p: p.node)
    heat_rows = []
    for name, count in nodes:
        cells = by_node.get(name, [0.0] * len(heat_labels))
        heat_rows.append((name, *(round(min(1.0, c / (count * heat_step_h)), 2) for c in cells)))
    return Table(
        name="node-heatmap",
        caption=f"Busy fraction per node and {heat_rng.bucket} (0 = idle, 1 = every GPU busy all the time)",
        headers=("Node", *heat_labels),
        rows=tuple(heat_rows),
        chart="heatmap",
        extra={
            # column heads short enough for narrow cells; the full labels are in the CSV
            "short_labels": [
                s.strftime("%m-%d") if heat_rng.bucket == "day" else s.strftime("%d %Hh")
                for s in heat_rng.starts()
            ],
            "from": _label(heat_rng.start_at, heat_rng.bucket),
        },
        empty_reason=reason or "This cluster has no nodes.",
    )


# ---- fairness ----


def fairness_get(*, cluster_id: int, rng: Range, now: datetime | None = None) -> list[Table]:
    """Value-weighted GPU-hour shares against entitlements, Jain's index, and waits.

    * share: a project's busy GPU-hours times ``GpuType.value``, over everyone's, per bucket;
    * entitlement: its fair-share weight over the weights of all active projects (the engine's
      fair-share target), beside its guaranteed quota's value over all guarantees;
    * Jain's index over the projects that ran something in the bucket, of share / entitlement;
    * wait = start - first submission, for jobs that started in the range, by project and class.
    """
    now = now or timezone.now()
    periods = _busy_periods(cluster_id=cluster_id, rng=rng, now=now)
    labels = [_label(s, rng.bucket) for s in rng.starts()]
    weighted = _spread(periods, rng, key=lambda p: p.project, weight=lambda p: p.value)
    projects = list(
        Project.objects.filter(is_active=True).order_by("slug").values_list("slug", "fair_share_weight")
    )
    weights = dict(projects)
    total_weight = sum(weights.values()) or 1.0
    entitled = {slug: w / total_weight for slug, w in weights.items()}
    guaranteed = _guaranteed_value()
    total_guaranteed = sum(guaranteed.values())
    slugs = sorted(set(weights) | set(weighted))

    share_rows, jain_rows = _share_rows(labels, weighted, slugs=slugs, entitled=entitled)

    totals = {s: sum(weighted[s]) if s in weighted else 0.0 for s in slugs}
    grand = sum(totals.values())
    no_share = (
        ""
        if periods
        else no_work_reason(cluster_id=cluster_id, rng=rng, now=now)
        + " With no GPU-hours there are no shares."
    )
    summary = Table(
        name="fairness-summary",
        caption="Share of value-weighted GPU-hours against entitlement over the whole range (%)",
        headers=(
            "Project",
            "Value-weighted GPU-hours",
            "Share %",
            "Fair-share entitlement %",
            "Quota entitlement %",
        ),
        rows=tuple(
            (
                s,
                round(totals[s], 2),
                round(100.0 * totals[s] / grand, 1) if grand else 0.0,
                round(100.0 * entitled.get(s, 0.0), 1),
                round(100.0 * guaranteed.get(s, 0.0) / total_guaranteed, 1) if total_guaranteed else None,
            )
            for s in slugs
        ),
        chart="bar",
        extra={"only": [2, 3, 4], "data_columns": [2]},
        empty_reason=no_share or "No project is active.",
    )
    shares_table = Table(
        name="fairness-shares",
        caption="Share of value-weighted GPU-hours by project (%)",
        headers=("Period", *slugs),
        rows=tuple(share_rows),
        chart="line",
        empty_reason=no_share,
    )
    jain_table = Table(
        name="fairness-jain",
        caption="Jain's fairness index of share / entitlement (1 = everyone at their entitlement)",
        headers=("Period", "Jain index"),
        rows=tuple(jain_rows),
        chart="line",
        empty_reason=no_share
        or "No project with a fair-share entitlement ran anything in this range, so there is no index.",
    )

    wait_table = _waits_table(cluster_id=cluster_id, rng=rng, now=now)
    return [summary, shares_table, jain_table, wait_table]


def _guaranteed_value() -> dict[str, float]:
    """Each active project's guaranteed GPUs times their type's value."""
    guaranteed: dict[str, float] = defaultdict(float)
    for slug, gpus, value in Quota.objects.filter(project__is_active=True).values_list(
        "project__slug", "guaranteed_gpus", "gpu_type__value"
    ):
        guaranteed[slug] += gpus * value
    return guaranteed


def _share_rows(
    labels: list[str], weighted: dict[str, list[float]], *, slugs: list[str], entitled: dict[str, float]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Per bucket: each project's share (%) and Jain's index of share / entitlement."""
    share_rows, jain_rows = [], []
    for i, label in enumerate(labels):
        total = sum(v[i] for v in weighted.values())
        shares = {s: (weighted[s][i] / total if total and s in weighted else 0.0) for s in slugs}
        # No GPU-hours at all in the bucket: no shares (blank), not everyone at 0%.
        share_rows.append((label, *((round(100.0 * shares[s], 1) if total else None) for s in slugs)))
        ratios = [
            shares[s] / entitled[s] for s in slugs if s in weighted and weighted[s][i] > 0 and entitled.get(s)
        ]
        # Nobody ran in the bucket: nothing to judge (blank), not a perfectly fair 1.0.
        j = jain_index(ratios) if ratios else None
        jain_rows.append((label, round(j, 3) if j is not None else None))
    return share_rows, jain_rows


def _waits_table(*, cluster_id: int, rng: Range, now: datetime) -> Table:
    """Wait = start - first submission, for jobs that started in the range, by project and class."""
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for slug, kind, submitted, first, started in Job.objects.filter(
        cluster_id=cluster_id, started_at__gte=rng.start_at, started_at__lt=rng.end_at
    ).values_list("project__slug", "kind", "submitted_at", "first_submitted_at", "started_at"):
        if started is not None:  # filtered above; for the type checker
            waits[(slug, kind)].append(max(0.0, (started - (first or submitted)).total_seconds()))
    return Table(
        name="fairness-waits",
        caption="Wait from submission to start by project and class (minutes)",
        headers=("Project / class", "Jobs", "Mean wait min", "p95 wait min"),
        rows=tuple(
            (
                f"{slug} / {kind}",
                len(w),
                round(sum(w) / len(w) / 60.0, 1),
                round(quantile(w, 0.95, method="linear") / 60.0, 1),
            )
            for (slug, kind), w in sorted(waits.items())
        ),
        chart="bar",
        extra={"only": [2, 3], "data_columns": [1]},
        empty_reason=f"No job started {_span_text(rng, now)}, so there are no waits to show.",
    )


def runtime_accuracy_get(*, cluster_id: int, rng: Range) -> Table:
    """How good the runtime predictor was, per project, for jobs that completed in the range.

    A job counts when it completed (not failed, cancelled or preempted: a cut-short runtime
    says nothing about the prediction) with a stored p50.  Per project: jobs, share whose p50
    is within 2x of the actual runtime (started to ended), share with runtime <= p90, and
    share that ran longer than twice the p50 (what delays backfill reservations).  The stored
    p50/p90 are the last the engine computed for the job.
    """
    rows: dict[str, list[tuple[float, float, float | None]]] = defaultdict(list)
    for slug, p50, p90, started, ended in Job.objects.filter(
        cluster_id=cluster_id,
        status=Job.Status.COMPLETED,
        attempt=0,
        ended_at__gte=rng.start_at,
        ended_at__lt=rng.end_at,
        started_at__isnull=False,
        predicted_p50_s__isnull=False,
    ).values_list("project__slug", "predicted_p50_s", "predicted_p90_s", "started_at", "ended_at"):
        if ended is None or started is None or p50 is None:  # excluded by the filter; for the types
            continue
        actual = max((ended - started).total_seconds(), 1.0)
        rows[slug].append((actual, max(float(p50), 1.0), None if p90 is None else float(p90)))

    def _shares(jobs: list[tuple[float, float, float | None]]) -> tuple[float, float | None, float]:
        within = sum(1 for a, p, _ in jobs if 0.5 <= p / a <= 2.0) / len(jobs)
        with_p90 = [(a, q) for a, _, q in jobs if q is not None]
        cover = sum(1 for a, q in with_p90 if a <= q) / len(with_p90) if with_p90 else None
        under = sum(1 for a, p, _ in jobs if a > 2.0 * p) / len(jobs)
        return (
            round(100.0 * within, 1),
            None if cover is None else round(100.0 * cover, 1),
            round(100.0 * under, 1),
        )

    return Table(
        name="runtime-accuracy",
        caption="Runtime predictions of completed jobs by project (%)",
        headers=("Project", "Jobs", "Within 2x %", "Runtime <= p90 %", "Ran > 2x p50 %"),
        rows=tuple((slug, len(jobs), *_shares(jobs)) for slug, jobs in sorted(rows.items())),
        chart="bar",
        extra={"only": [2, 3, 4], "data_columns": [1]},
        empty_reason=(
            "No job with a stored runtime prediction completed in this range. Berth stores a "
            "prediction when a job is submitted through the portal; jobs of the imported or replayed "
            "history have none, so this chart fills as jobs submitted here complete."
        ),
    )
