"""Aggregate reads for the staff (operations) pages: utilization, fairness, idle reasons, audit.

Every selector returns plain `Table` objects: the page draws its chart from a table, prints
the same table under it and serves it as CSV, so the three can never disagree.  Callers
check ``is_staff`` (these read every project's data).

Queries are bounded: each selector runs a fixed number of queries whatever the range, and
buckets in Python (allocations are few per GPU and hour).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.accounts.models import Project, Quota
from portal.ops.labels import reason_label
from scheduling.engine.types import IdleReason
from scheduling.models import Allocation, AuditEvent, Cluster, EngineRound, Gpu, Job, Node

BUCKETS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
# A round's idle counts hold until the next round, but no longer than this (a stopped loop
# must not paint hours of idleness from one stale round).
ROUND_HOLD_MAX = timedelta(minutes=5)
HEATMAP_MAX_COLUMNS = 7 * 24
IDLE_REASONS: tuple[str, ...] = tuple(r.value for r in IdleReason)


@dataclass(frozen=True, slots=True)
class Table:
    """One chart's numbers: the same rows print as an HTML table and download as CSV."""

    name: str  # also the CSV file name and the ?csv= value
    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    # How ops.js draws it: "stacked" (bars), "line", "heatmap" or "" (table only).
    chart: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Said in words in place of the chart when `is_blank` (why there is nothing to draw).
    empty_reason: str = ""
    # Said under the chart: e.g. why some cells are "–" (no record then), not 0.
    note: str = ""

    @property
    def is_blank(self) -> bool:
        """No value to draw: every charted cell is empty or zero (a blank axis says nothing)."""
        columns = self.extra.get("data_columns") or self.extra.get("only") or range(1, len(self.headers))
        if self.extra.get("skip_last") and not (self.extra.get("only") or self.extra.get("data_columns")):
            columns = list(columns)[:-1]
        return not any(row[i] for row in self.rows for i in columns if i < len(row))

    @property
    def blank_reason(self) -> str:
        """The sentence shown instead of an empty chart ("" while there is something to draw)."""
        if not self.is_blank:
            return ""
        return self.empty_reason or "Nothing to draw in this range."

    @property
    def chart_id(self) -> str:
        return f"chart-{self.name}"

    def chart_data(self) -> dict[str, Any]:
        """Column 0 is the x label; every other column one dataset."""
        return {
            "kind": self.chart,
            "title": self.caption,
            "labels": [str(r[0]) for r in self.rows],
            "series": [
                {"label": reason_label(h), "data": [r[i] for r in self.rows]}
                for i, h in enumerate(self.headers)
                if i > 0
            ],
            **self.extra,
        }


@dataclass(frozen=True, slots=True)
class Range:
    start_at: datetime
    end_at: datetime
    bucket: str  # "hour" | "day"

    @property
    def step(self) -> timedelta:
        return BUCKETS[self.bucket]

    def starts(self) -> list[datetime]:
        out, t = [], self.start_at
        while t < self.end_at:
            out.append(t)
            t += self.step
        return out

    def index(self, at: datetime) -> int:
        return int((at - self.start_at) // self.step)


def range_get(*, days: int, bucket: str, now: datetime | None = None) -> Range:
    """The last ``days`` days up to the end of the current bucket, aligned to the bucket."""
    now = (now or timezone.now()).astimezone(UTC)
    if bucket == "day":
        end = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    else:
        end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return Range(start_at=end - timedelta(days=days), end_at=end, bucket=bucket)


def _label(at: datetime, bucket: str) -> str:
    return at.strftime("%Y-%m-%d") if bucket == "day" else at.strftime("%Y-%m-%d %H:00")


def cluster_list() -> list[Cluster]:
    return list(Cluster.objects.filter(is_active=True).order_by("name"))


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

    # Node x time heatmap: busy fraction = busy GPU-hours / (GPUs on the node x bucket length).
    # More than a week of hours would be thousands of cells per node: those go per day.
    heat_rng = rng if len(starts) <= HEATMAP_MAX_COLUMNS else Range(rng.start_at, rng.end_at, "day")
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
    heatmap = Table(
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
    return [by_type_table, by_project_table, heatmap]


# ---- fairness ----


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 = equal, 1/n = one takes all."""
    xs = [v for v in values if v is not None]
    square = sum(x * x for x in xs)
    if not xs or square == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * square)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


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
    guaranteed: dict[str, float] = defaultdict(float)
    for slug, gpus, value in Quota.objects.filter(project__is_active=True).values_list(
        "project__slug", "guaranteed_gpus", "gpu_type__value"
    ):
        guaranteed[slug] += gpus * value
    total_guaranteed = sum(guaranteed.values())
    slugs = sorted(set(weights) | set(weighted))

    share_rows, jain_rows = [], []
    for i, label in enumerate(labels):
        total = sum(v[i] for v in weighted.values())
        shares = {s: (weighted[s][i] / total if total and s in weighted else 0.0) for s in slugs}
        # No GPU-hours at all in the bucket: no shares (blank), not everyone at 0%.
        share_rows.append((label, *((round(100.0 * shares[s], 1) if total else None) for s in slugs)))
        ratios = [
            shares[s] / entitled[s] for s in slugs if s in weighted and weighted[s][i] > 0 and entitled.get(s)
        ]
        j = jain_index(ratios)
        jain_rows.append((label, round(j, 3) if j is not None else None))

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

    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for slug, kind, submitted, first, started in Job.objects.filter(
        cluster_id=cluster_id, started_at__gte=rng.start_at, started_at__lt=rng.end_at
    ).values_list("project__slug", "kind", "submitted_at", "first_submitted_at", "started_at"):
        if started is not None:  # filtered above; for the type checker
            waits[(slug, kind)].append(max(0.0, (started - (first or submitted)).total_seconds()))
    wait_table = Table(
        name="fairness-waits",
        caption="Wait from submission to start by project and class (minutes)",
        headers=("Project / class", "Jobs", "Mean wait min", "p95 wait min"),
        rows=tuple(
            (
                f"{slug} / {kind}",
                len(w),
                round(sum(w) / len(w) / 60.0, 1),
                round(_percentile(w, 0.95) / 60.0, 1),
            )
            for (slug, kind), w in sorted(waits.items())
        ),
        chart="bar",
        extra={"only": [2, 3], "data_columns": [1]},
        empty_reason=f"No job started {_span_text(rng, now)}, so there are no waits to show.",
    )
    return [summary, shares_table, jain_table, wait_table]


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


# ---- idle GPU-hours by reason ----


def _rounds(
    cluster_id: int, rng: Range, now: datetime
) -> list[tuple[datetime, dict[str, int], int, timedelta]]:
    """Rounds that can hold into the range: (instant, idle counts, id, how long the count holds
    at most: `ROUND_HOLD_MAX`, or the replayed gap to the next round for history rounds)."""
    rows = list(
        EngineRound.objects.filter(
            cluster_id=cluster_id,
            error="",
            started_at__gte=rng.start_at - ROUND_HOLD_MAX,
            started_at__lt=min(rng.end_at, now),
        )
        .order_by("started_at", "id")
        .values_list("started_at", "decisions", "id")
    )
    out = []
    for at, d, pk in rows:
        decisions = d or {}
        hold = decisions.get("hold_s")
        limit = (
            timedelta(seconds=float(hold)) if isinstance(hold, int | float) and hold > 0 else ROUND_HOLD_MAX
        )
        out.append((at, dict(decisions.get("idle", {})), pk, max(limit, ROUND_HOLD_MAX)))
    return out


def idle_get(*, cluster_id: int, rng: Range, now: datetime | None = None) -> Table:
    """Idle GPU-hours by idle reason per bucket, reconstructed from the engine rounds.

    A round stores how many GPUs were idle for each reason at its instant
    (``EngineRound.decisions["idle"]``).  Each count is held until the next round, at most
    `ROUND_HOLD_MAX` (and not past now or the range): idle GPU-hours = GPUs x that interval.
    """
    now = now or timezone.now()
    rounds = _rounds(cluster_id, rng, now)
    first_at = (
        EngineRound.objects.filter(cluster_id=cluster_id, error="")
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    before = _before_record(rng, first_at)
    n = len(rng.starts())
    hours: dict[str, list[float]] = {r: [0.0] * n for r in IDLE_REASONS}
    stop = min(rng.end_at, now)
    for k, (at, idle, _, hold) in enumerate(rounds):
        nxt = rounds[k + 1][0] if k + 1 < len(rounds) else stop
        upper = min(nxt, at + hold, stop)
        t = max(at, rng.start_at)  # a round just before the range holds into it
        i = rng.index(t)
        while t < upper and i < n:
            edge = min(rng.start_at + (i + 1) * rng.step, upper)
            for reason, count in idle.items():
                hours.setdefault(reason, [0.0] * n)[i] += count * (edge - t).total_seconds() / 3600.0
            t, i = edge, i + 1
    reasons = [r for r in hours if any(hours[r])] or list(IDLE_REASONS[:1])
    return Table(
        name="idle-by-reason",
        caption="Idle GPU-hours by reason (reconstructed from engine rounds)",
        headers=("Period", *reasons),
        rows=tuple(
            (_label(s, rng.bucket), *(None if before[i] else round(hours[r][i], 2) for r in reasons))
            for i, s in enumerate(rng.starts())
        ),
        chart="stacked",
        extra={"drill": True},
        note=_no_data_note(before, first_at, "the first engine round was recorded"),
        empty_reason=(
            f"No engine round was recorded {_span_text(rng, now)} (the engine loop was not running), "
            "so nothing says which GPUs were idle or why."
            if not rounds
            else f"No GPU was idle {_span_text(rng, now)}: every round found every GPU in use."
        ),
    )


def _indexes(values: Sequence[int]) -> str:
    """GPU indexes as short ranges: ``0-3, 6``."""
    out: list[str] = []
    for value in sorted(values):
        if out and "-" not in out[-1].split(", ")[-1] and int(out[-1]) == value - 1:
            out[-1] = f"{out[-1]}-{value}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == value - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{value}"
        else:
            out.append(str(value))
    return ", ".join(out) or "none free"


@dataclass(frozen=True, slots=True)
class IdleDrill:
    round_id: int | None
    at: datetime | None
    idle: dict[str, int]
    gpus: Table
    jobs: Table


def idle_drill_get(*, cluster_id: int, start_at: datetime, end_at: datetime) -> IdleDrill:
    """The latest round in ``[start_at, end_at)``: its idle counts, the GPUs that were free at its
    instant (no allocation covering it) with their node state, and the jobs pending then.

    Rounds store counts by reason, not which GPU had which reason, so the GPU list is rebuilt
    from allocations and node state, and each pending job shows its latest stored reason.
    """
    row = (
        EngineRound.objects.filter(
            cluster_id=cluster_id, error="", started_at__gte=start_at, started_at__lt=end_at
        )
        .order_by("-started_at", "-id")
        .values_list("id", "started_at", "decisions")
        .first()
    )
    if row is None:
        empty = Table(name="idle-gpus", caption="No engine round in this period", headers=("GPU",), rows=())
        return IdleDrill(
            None, None, {}, empty, Table(name="idle-jobs", caption="", headers=("Job",), rows=())
        )
    pk, at, decisions = row
    busy = set(
        Allocation.objects.filter(gpu__node__cluster_id=cluster_id, period__contains=at)
        .exclude(state=Allocation.State.RELEASED)
        .values_list("gpu_id", flat=True)
    )
    free_by_node: dict[str, list[int]] = defaultdict(list)
    node_info: dict[str, tuple[str, str]] = {}
    for gid, node, index, type_name, status in (
        Gpu.objects.filter(node__cluster_id=cluster_id)
        .order_by("node__name", "index")
        .values_list("id", "node__name", "index", "node__gpu_type__name", "node__status")
    ):
        node_info[node] = (type_name, status)
        if gid not in busy:
            free_by_node[node].append(index)
    # One row per node and idle reason: the round's own per-node counts where it stored them
    # (rounds since per-node counts exist, and the last replayed round of each hour), else the
    # node's free GPUs under "not recorded".
    by_node = (decisions or {}).get("idle_nodes")
    groups: list[tuple[Any, ...]] = []
    if isinstance(by_node, dict) and by_node:
        for node in sorted(by_node):
            type_name, status = node_info.get(node, ("?", "?"))
            free = free_by_node.get(node, [])
            for reason, count in sorted(by_node[node].items(), key=lambda kv: (-kv[1], kv[0])):
                groups.append((node, type_name, status, reason, count, _indexes(free)))
    else:
        for node in sorted(free_by_node):
            type_name, status = node_info[node]
            free = free_by_node[node]
            groups.append((node, type_name, status, "not recorded", len(free), _indexes(free)))
    total = sum(g[4] for g in groups)
    pending = (
        Job.objects.filter(cluster_id=cluster_id, submitted_at__lte=at)
        .filter(Q(started_at__isnull=True) | Q(started_at__gt=at))
        .exclude(status=Job.Status.CANCELLED, ended_at__lte=at)
        .order_by("submitted_at", "id")
        .values_list(
            "id", "name", "project__slug", "gpu_count", "gpu_type__name", "pending_reason", "pending_sentence"
        )[:200]
    )
    return IdleDrill(
        pk,
        at,
        dict((decisions or {}).get("idle", {})),
        Table(
            name="idle-gpus",
            caption=f"{total} idle GPU(s) on {len({g[0] for g in groups})} node(s), by node and reason",
            headers=("Node", "Type", "Node state", "Reason", "Idle GPUs", "Free GPU indexes"),
            rows=tuple(groups),
            extra={"label_columns": [3]},
        ),
        Table(
            name="idle-jobs",
            caption="Jobs pending at the round (with their latest reason)",
            headers=("Job", "Name", "Project", "GPUs", "Type", "Reason", "Why"),
            rows=tuple((j, n, p, c, t or "any", r, s) for j, n, p, c, t, r, s in pending),
            extra={"pending_columns": [5]},
        ),
    )


# ---- audit log ----


def audit_event_list(
    *,
    actor: str = "",
    verb: str = "",
    entity_type: str = "",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Audit events, newest first; ``actor`` matches a username or an actor label."""
    qs = AuditEvent.objects.select_related("actor").order_by("-at", "-id")
    if actor:
        qs = qs.filter(Q(actor__username=actor) | Q(actor_label=actor))
    if verb:
        qs = qs.filter(verb__startswith=verb)
    if entity_type:
        qs = qs.filter(entity_type=entity_type)
    if start_at:
        qs = qs.filter(at__gte=start_at)
    if end_at:
        qs = qs.filter(at__lt=end_at)
    return qs


@dataclass(frozen=True, slots=True)
class AuditChange:
    field: str
    before: str  # "" when the field is new
    after: str  # "" when the field is gone


def _audit_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def audit_changes(before: Any, after: Any) -> list[AuditChange]:
    """The fields an audit event changed, before -> after, in field order; a creation lists every
    field it set (before ""), a deletion every field it had (after "").  Non-dict states (rare)
    compare as one value."""
    if not isinstance(before, dict) and not isinstance(after, dict):
        if before == after:
            return []
        return [AuditChange("value", "" if before is None else _audit_value(before), _audit_value(after))]
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    changes = []
    for key in [*old, *(k for k in new if k not in old)]:
        if key in old and key in new and old[key] == new[key]:
            continue
        changes.append(
            AuditChange(
                str(key),
                _audit_value(old[key]) if key in old else "",
                _audit_value(new[key]) if key in new else "",
            )
        )
    return changes


def audit_entity_types() -> list[str]:
    return list(AuditEvent.objects.order_by().values_list("entity_type", flat=True).distinct())


def quota_list() -> list[Quota]:
    return list(
        Quota.objects.select_related("project", "gpu_type").order_by("project__name", "gpu_type__name")
    )


def project_list() -> list[Project]:
    return list(Project.objects.filter(is_active=True).order_by("name"))


def gpu_type_list() -> list[Any]:
    from scheduling.models import GpuType

    return list(GpuType.objects.order_by("name"))
